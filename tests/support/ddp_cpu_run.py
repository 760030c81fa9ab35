"""Train and predict the tiny GPT with Lightning DDP on 2 CPU processes (run as a script: Lightning relaunches it).

Usage: python tests/support/ddp_cpu_run.py OUT_DIR
Writes OUT_DIR/result.json (losses, metrics), OUT_DIR/weights.pt (final weights) and OUT_DIR/predictions/.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bionemo.core.megatron_env import prepare_megatron_import  # noqa: E402

prepare_megatron_import()

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402

from bionemo.callbacks import PerplexityLoggingCallback, PredictionWriter  # noqa: E402
from bionemo.lightning import MegatronDataModule  # noqa: E402
from support.tiny_gpt import BigramDataset, LossRecorder, make_module  # noqa: E402


def main(out_dir: Path) -> None:
    torch.manual_seed(0)
    module = make_module()
    datamodule = MegatronDataModule(
        train=BigramDataset(512, 16, 32, seed=1),
        val=BigramDataset(16, 16, 32, seed=2),
        predict=BigramDataset(21, 16, 32, seed=3, labels=False),
        micro_batch_size=4,
        seq_length=16,
    )
    recorder = LossRecorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=30,
        val_check_interval=15,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[recorder, PerplexityLoggingCallback(log_train=True), PredictionWriter(out_dir / "predictions")],
    )
    trainer.fit(module, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    trainer.predict(module, datamodule=datamodule, return_predictions=False)
    if trainer.global_rank == 0:
        torch.save(module.module.state_dict(), out_dir / "weights.pt")
        (out_dir / "result.json").write_text(
            json.dumps({"losses": recorder.losses, "metrics": metrics, "world_size": trainer.world_size})
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
