"""The best validation's weights survive a resume: written beside each checkpoint, read back for the same step."""

from types import SimpleNamespace

import torch

from bionemo.esm2.finetune.best import BestWeights
from bionemo.esm2.finetune.metrics import BestMetric, Mode

METRIC = BestMetric(key="val_mcc", mode=Mode.MAX)


def _trainer(step: int, value: float) -> SimpleNamespace:
    return SimpleNamespace(
        sanity_checking=False, global_step=step, global_rank=0, callback_metrics={"val_mcc": torch.tensor(value)}
    )


def _validate(callback: BestWeights, model: torch.nn.Module, step: int, value: float) -> None:
    callback.on_validation_end(_trainer(step, value), model)  # type: ignore[arg-type]


def test_a_resumed_run_restores_the_best_weights_of_before_the_resume(tmp_path):
    model = torch.nn.Linear(3, 2)
    first = BestWeights(METRIC, tmp_path)
    _validate(first, model, 4, 0.8)
    best = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    _validate(first, model, 8, 0.5)  # worse: the copy stays step 4's
    first.on_save_checkpoint(_trainer(8, 0.5), model, {})  # type: ignore[arg-type]
    state = first.state_dict()
    assert state == {"best": 0.800000011920929, "best_step": 4}

    resumed = BestWeights(METRIC, tmp_path)
    resumed.load_state_dict(state)
    resumed.on_train_start(_trainer(8, 0.0), model)  # type: ignore[arg-type]
    _validate(resumed, model, 12, 0.6)  # still worse than before the resume
    assert resumed.best_step == 4
    assert resumed.restore(model)  # type: ignore[arg-type]
    for name, value in model.state_dict().items():
        assert torch.equal(value, best[name]), name


def test_a_copy_of_another_step_is_not_taken_and_the_best_starts_over(tmp_path):
    model = torch.nn.Linear(3, 2)
    first = BestWeights(METRIC, tmp_path)
    _validate(first, model, 4, 0.8)
    first.on_save_checkpoint(_trainer(4, 0.8), model, {})  # type: ignore[arg-type]
    resumed = BestWeights(METRIC, tmp_path)
    resumed.load_state_dict({"best": 0.9, "best_step": 2})  # an older checkpoint's best
    resumed.on_train_start(_trainer(2, 0.0), model)  # type: ignore[arg-type]
    assert resumed.best is None
    assert not resumed.restore(model)  # type: ignore[arg-type]
    _validate(resumed, model, 6, 0.1)
    assert resumed.best_step == 6


def test_the_copy_is_rewritten_only_after_a_better_validation(tmp_path):
    model = torch.nn.Linear(3, 2)
    callback = BestWeights(METRIC, tmp_path)
    _validate(callback, model, 4, 0.8)
    callback.on_save_checkpoint(_trainer(4, 0.8), model, {})  # type: ignore[arg-type]
    path = tmp_path / "best-weights-rank0.safetensors"
    written = path.stat().st_mtime_ns
    path.touch()
    touched = path.stat().st_mtime_ns
    callback.on_save_checkpoint(_trainer(6, 0.8), model, {})  # type: ignore[arg-type]
    assert path.stat().st_mtime_ns == touched >= written
