"""Which checkpoint a rerun resumes from, on Lightning's strategies and under MegatronStrategy."""

from pathlib import Path
from types import SimpleNamespace

import torch

from bionemo.recipes.checkpoints import checkpoint_callback, resume_checkpoint
from bionemo.recipes.settings import RunSettings, StrategyChoice

MEGATRON = RunSettings(strategy=StrategyChoice.MEGATRON)
LIGHTNING = RunSettings(strategy=StrategyChoice.DDP)


def _distributed_checkpoint(root: Path, name: str, complete: bool) -> None:
    weights = root / name / "weights"
    weights.mkdir(parents=True)
    (weights / "__0_0.distcp").write_bytes(b"shard")
    if complete:
        (weights / "metadata.json").write_text("{}")


def test_megatron_resumes_from_the_newest_whole_checkpoint(tmp_path):
    assert resume_checkpoint(MEGATRON, tmp_path) is None
    _distributed_checkpoint(tmp_path, "step5", complete=True)
    _distributed_checkpoint(tmp_path, "step10", complete=True)
    _distributed_checkpoint(tmp_path, "step20", complete=False)  # a save cut short by kill -9
    _distributed_checkpoint(tmp_path, "stepX", complete=True)
    (tmp_path / "last.ckpt").write_bytes(b"not this strategy's")
    assert resume_checkpoint(MEGATRON, tmp_path) == str(tmp_path / "step10")
    _distributed_checkpoint(tmp_path, "step100", complete=True)  # numeric order, not string order
    assert resume_checkpoint(MEGATRON, tmp_path) == str(tmp_path / "step100")


def test_lightning_resumes_from_last_ckpt(tmp_path):
    _distributed_checkpoint(tmp_path, "step10", complete=True)
    assert resume_checkpoint(LIGHTNING, tmp_path) is None
    (tmp_path / "last.ckpt").write_bytes(b"checkpoint")
    assert resume_checkpoint(LIGHTNING, tmp_path) == str(tmp_path / "last.ckpt")


def test_megatron_keeps_the_two_newest_step_checkpoints(tmp_path):
    megatron = checkpoint_callback(MEGATRON, tmp_path, every_n_train_steps=7)
    assert (megatron.monitor, megatron.mode, megatron.save_top_k, megatron.save_last) == ("step", "max", 2, None)
    assert megatron._every_n_train_steps == 7
    lightning = checkpoint_callback(LIGHTNING, tmp_path, every_n_train_steps=7)
    assert (lightning.save_top_k, lightning.save_last) == (0, True)


def test_checkpoints_are_named_by_optimizer_steps_taken(tmp_path):
    """NeMo logs a `step` metric one below the trainer's global step; the name follows the global step."""
    callback = checkpoint_callback(MEGATRON, tmp_path, every_n_train_steps=10)
    trainer = SimpleNamespace(callback_metrics={"step": torch.tensor(29.0)}, current_epoch=0, global_step=30)
    candidates = callback._monitor_candidates(trainer)
    assert int(candidates["step"]) == 30
    assert callback.format_checkpoint_name(candidates) == str(tmp_path / "step30.ckpt")
