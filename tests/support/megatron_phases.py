"""Train, validate, checkpoint, resume, reload and predict the tiny GPT under nemo's Trainer + MegatronStrategy.

Run through tests/support/megatron_run.py (see there). Each phase records into OUT_DIR/result.json (rank 0),
with the error instead of a result if it fails, so one run reports everything.
"""

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from bionemo.core.megatron_env import prepare_megatron_import

prepare_megatron_import()

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from megatron.core.optimizer import OptimizerConfig  # noqa: E402
from nemo import lightning as nl  # noqa: E402

from bionemo.callbacks import PerplexityLoggingCallback, PredictionWriter, merge_predictions  # noqa: E402
from bionemo.lightning import (  # noqa: E402
    BionemoLightningModule,
    MegatronDataModule,
    MegatronOptimizerModule,  # noqa: E402
)
from support.tiny_gpt import BigramDataset, TinyGPTConfig, data_step, forward_step  # noqa: E402

SEQ, VOCAB, N_PREDICT = 32, 64, 37


class StepRecorder(pl.Callback):
    def __init__(self):
        self.losses, self.times = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        torch.cuda.synchronize()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._start)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))


class PredictProbe(pl.Callback):
    """Records what the predict loop hands to callbacks (diagnostics for the record)."""

    def __init__(self):
        self.calls = []

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        keys = sorted(outputs) if isinstance(outputs, dict) else None
        self.calls.append({"batch_idx": batch_idx, "type": type(outputs).__name__, "keys": keys})


def make_module(lr: float) -> BionemoLightningModule:
    config = TinyGPTConfig(
        vocab_size=VOCAB,
        seq_length=SEQ,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        use_cpu_initialization=False,
    )
    optimizer = MegatronOptimizerModule(
        config=OptimizerConfig(lr=lr, optimizer="adam", use_distributed_optimizer=True, bf16=True, weight_decay=0.0)
    )
    return BionemoLightningModule(config, forward_step=forward_step, data_step=data_step, optimizer=optimizer)


def make_datamodule(micro_batch_size: int = 4, global_batch_size: int = 16) -> MegatronDataModule:
    return MegatronDataModule(
        train=BigramDataset(4096, SEQ, VOCAB, seed=1),
        val=BigramDataset(64, SEQ, VOCAB, seed=2),
        predict=BigramDataset(N_PREDICT, SEQ, VOCAB, seed=3, labels=False),
        micro_batch_size=micro_batch_size,
        global_batch_size=global_batch_size,
        seq_length=SEQ,
        num_workers=2,
    )


def make_trainer(args, fitting: bool, callbacks, ckpt_load_optimizer: bool = True) -> nl.Trainer:
    strategy = nl.MegatronStrategy(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=1,
        ckpt_async_save=False,
        ckpt_optim_fully_reshardable=True,
        ckpt_load_optimizer=ckpt_load_optimizer,
        setup_optimizers=fitting,
    )
    return nl.Trainer(
        devices=args.devices,
        accelerator="gpu",
        strategy=strategy,
        plugins=nl.MegatronMixedPrecision(precision="bf16-mixed"),
        max_steps=args.steps,
        val_check_interval=args.steps // 2,
        limit_val_batches=2,  # steps; MegatronDataModule makes NeMo count them as such
        num_sanity_val_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        use_distributed_sampler=False,
        callbacks=callbacks,
    )


def _adam_states(optimizer) -> list[dict]:
    """The per-parameter states of the torch Adam inside NeMo's and megatron's optimizer wrappers."""
    inner = optimizer.mcore_optimizer
    return [state for each in getattr(inner, "chained_optimizers", [inner]) for state in each.optimizer.state.values()]


def _adam_settings(optimizer) -> dict:
    """Whether the torch Adam's param groups run fused, and where its step counters live (fused: on the GPU)."""
    inner = optimizer.mcore_optimizer
    torch_adams = [each.optimizer for each in getattr(inner, "chained_optimizers", [inner])]
    return {
        "adam_fused": sorted({bool(group.get("fused")) for adam in torch_adams for group in adam.param_groups}),
        "adam_step_devices": sorted({str(s["step"].device.type) for s in _adam_states(optimizer)}),
    }


def phase(record: dict, name: str, fn) -> None:
    start = time.perf_counter()
    try:
        record[name] = {"ok": True, **(fn() or {})}
    except Exception as error:  # recorded for the test to report
        record[name] = {"ok": False, "error": repr(error), "traceback": traceback.format_exc()[-4000:]}
    record[name]["seconds"] = round(time.perf_counter() - start, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    record: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    module = make_module(lr=3e-3)
    datamodule = make_datamodule()
    recorder = StepRecorder()
    trainer = make_trainer(args, True, [recorder, PerplexityLoggingCallback(log_train=True)])
    ckpt = args.out_dir / "ckpt" / "last.ckpt"

    def fit():
        trainer.fit(module, datamodule=datamodule)
        times = sorted(recorder.times[5:])
        return {
            "losses": recorder.losses,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "median_step_s": times[len(times) // 2] if times else None,
            "global_step": trainer.global_step,
            "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
            **_adam_settings(trainer.optimizers[0]),
        }

    def save():
        trainer.save_checkpoint(ckpt)
        saved = ckpt.with_suffix("") if ckpt.with_suffix("").exists() else ckpt
        return {"path": str(saved), "entries": sorted(p.name for p in saved.iterdir()) if saved.is_dir() else "file"}

    def resume():
        """A fresh module and optimizer continue the saved run for 10 more steps from its checkpoint."""
        recorder_resumed = StepRecorder()
        more = argparse.Namespace(**{**vars(args), "steps": args.steps + 10})
        resumer = make_trainer(more, True, [recorder_resumed])
        resumer.fit(make_module(lr=3e-3), datamodule=make_datamodule(), ckpt_path=record["save"]["path"])
        return {
            "global_step": resumer.global_step,
            "losses": recorder_resumed.losses,
            "adam_steps": sorted({float(s["step"]) for s in _adam_states(resumer.optimizers[0])}),
            **_adam_settings(resumer.optimizers[0]),
        }

    def predict_trained():
        writer, probe = PredictionWriter(args.out_dir / "pred_trained"), PredictProbe()
        predictor = make_trainer(args, False, [writer, probe])
        out = predictor.predict(module, datamodule=datamodule)
        return {
            "calls": probe.calls[:3],
            "n_calls": len(probe.calls),
            "returned": None if out is None else len(out),
            "num_predict_batches": str(predictor.num_predict_batches),
            "writer_pending": len(writer._pending),
            "holds_full_output": writer.groups.holds_full_output(),
        }

    def predict_reloaded():
        fresh = make_module(lr=3e-3)
        writer = PredictionWriter(args.out_dir / "pred_reloaded")
        predictor = make_trainer(args, False, [writer], ckpt_load_optimizer=False)
        predictor.predict(
            fresh, datamodule=make_datamodule(), ckpt_path=record["save"]["path"], return_predictions=False
        )

    phase(record, "fit", fit)
    if record["fit"]["ok"]:
        phase(record, "save", save)
        phase(record, "predict_trained", predict_trained)
        if record["save"]["ok"]:
            phase(record, "predict_reloaded", predict_reloaded)
            phase(record, "resume", resume)
    if trainer.global_rank == 0:
        for name in ("pred_trained", "pred_reloaded"):

            def merge(name=name):
                merged = merge_predictions(args.out_dir / name)
                torch.save(merged, args.out_dir / f"{name}.pt")
                return {"index": merged["sample_index"].tolist()}

            phase(record, f"merge_{name}", merge)
        (args.out_dir / "result.json").write_text(json.dumps(record, indent=1))
    failed = [name for name, value in record.items() if isinstance(value, dict) and value.get("ok") is False]
    sys.exit(1 if failed else 0)
