"""``--best-metric``: the validation metric that picks the exported weights (and ``--patience``'s), per task.

The option's checks, then runs whose exported weights are those of the best validation by the chosen metric, read
back from the run's own logged metrics.
"""

import csv
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from bionemo.esm2.finetune.api import finetune
from bionemo.esm2.finetune.metric_names import BEST_METRIC, BestMetric, Mode
from bionemo.esm2.finetune.options import finetune_options
from bionemo.esm2.finetune.tasks import OptionError, Task
from bionemo.recipes.settings import RunSettings, SettingsError
from support.finetune_data import rows


def _options(task: str, best: str | None):
    return finetune_options(RunSettings(task=task, label_column=["y"], best_metric=best))


def test_a_metric_the_task_logs_or_the_loss_with_its_direction():
    assert _options("classification", None).best_metric == BEST_METRIC[Task.CLASSIFICATION]
    assert _options("classification", "mcc") == _options("classification", None)  # the default named: the same run
    assert _options("classification", "AUROC").best_metric == BestMetric("val_auroc", Mode.MAX)
    assert _options("regression", "val_mse").best_metric == BestMetric("val_mse", Mode.MIN)
    assert _options("token-classification", "loss").best_metric == BestMetric("val_loss", Mode.MIN)
    with pytest.raises(OptionError, match="--task regression logs mse, pearson, spearman, loss") as error:
        _options("regression", "mcc")
    assert error.value.option == "--best-metric"


def _validations(run: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of every validation the run logged (steps count from 1, as the exported ``best`` has them)."""
    with (run / "logs" / "metrics.csv").open() as f:
        return [(int(row["step"]) + 1, float(row[key])) for row in csv.DictReader(f) if row.get(key)]


@pytest.mark.parametrize(("best", "key", "pick"), [("loss", "val_loss", min), ("accuracy", "val_accuracy", max)])
def test_the_exported_weights_are_the_best_validation_by_the_chosen_metric(base, tmp_path, best, key, pick):
    train, val = rows(64, seed=1), rows(16, seed=2)
    common = {
        "task": "classification", "val_sequences": [r["sequence"] for r in val], "val_labels": [r["kind"] for r in val],
        "max_steps": 12, "val_check_interval": 3, "lr": 3e-3, "accelerator": "cpu",
    }  # fmt: skip
    out = tmp_path / best
    model = finetune(base, [r["sequence"] for r in train], [r["kind"] for r in train], best_metric=best,
                     output_dir=out, **common)  # fmt: skip
    logged = _validations(out, key)
    assert len(logged) == 4
    value = pick(v for _, v in logged)
    first_step = next(step for step, v in logged if v == value)  # ties: the first such validation is kept
    assert model.metrics["best"] == {"metric": key, "value": pytest.approx(value), "step": first_step}
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert json.loads((f.metadata() or {})["best"])["metric"] == key
    assert json.loads((out / "summary.json").read_text())["best"]["metric"] == key

    # the choice is part of the run: another one over its checkpoints is refused
    with pytest.raises(SettingsError, match="best_metric"):
        finetune(base, [r["sequence"] for r in train], [r["kind"] for r in train], best_metric="f1_macro",
                 output_dir=out, **common)  # fmt: skip
