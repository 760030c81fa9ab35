"""metrics.csv and the curve survive a resume and a rerun of a finished run in the same --output-dir."""

import csv

import pytest
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.recipes.metrics_log import ResumableCSVLogger
from bionemo.recipes.plots import read_curves

runner = CliRunner()


def train(out, max_steps: int) -> str:
    args = ["run", "train", "--max-steps", str(max_steps), "--val-check-interval", "2", "--output-dir", str(out)]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def rows(out) -> list[dict[str, str]]:
    if not (out / "logs" / "metrics.csv").is_file():
        return []
    with (out / "logs" / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def steps(table: list[dict[str, str]], key: str) -> list[int]:
    return [int(row["step"]) for row in table if row[key]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two steps, then resumed to four, then the finished run again: metrics.csv after each."""
    out = tmp_path_factory.mktemp("logs") / "r"
    train(out, 2)
    first = rows(out)
    train(out, 4)  # resumes from the checkpoint at step 2
    resumed = rows(out)
    rerun_output = train(out, 4)  # max_steps already reached: trains nothing
    return {"out": out, "first": first, "resumed": resumed, "rerun": rows(out), "rerun_output": rerun_output}


def test_resumed_run_keeps_the_rows_before_the_resume_and_appends(runs):
    first, resumed = runs["first"], runs["resumed"]
    # the untrained validation and steps 0 and 1 stay; the validation after step 2, which the resumed run
    # runs again, is there once
    assert resumed[:3] == first[:3]
    assert steps(resumed, "reduced_train_loss") == [0, 1, 2, 3]
    assert steps(resumed, "val_ppl") == [0, 1, 3]  # untrained, after step 2, after step 4
    curves = read_curves(runs["out"] / "logs" / "metrics.csv")
    assert [step for step, _ in curves["reduced_train_loss"]] == [0, 1, 2, 3]
    assert [step for step, _ in curves["val_ppl"]] == [0, 1, 3]


def test_rerunning_a_finished_run_keeps_its_logs(runs):
    assert runs["rerun"] == runs["resumed"]
    assert (runs["out"] / "training_curves.png").is_file()
    assert "not written" not in runs["rerun_output"]


def test_rows_saved_before_the_checkpoint_are_never_replaced(tmp_path):
    # validation after every step: the untrained model's and the first step's validation share step 0
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text(
        "epoch,reduced_train_loss,step,val_ppl\n0,,0,30.0\n0,3.5,0,\n0,,0,29.0\n0,3.4,1,\n0,,1,28.0\n"
    )
    logger = ResumableCSVLogger(tmp_path, name="logs", version="", resume=True)
    logger.rows_at_checkpoint = 1  # the checkpoint after step 1 came before the row of its training step
    logger.log_metrics({"val_ppl": 29.5}, step=0)  # the resumed run validates again after step 1
    logger.log_metrics({"reduced_train_loss": 3.3}, step=1)
    logger.save()
    table = rows(tmp_path)
    assert [(row["step"], row["reduced_train_loss"], row["val_ppl"]) for row in table] == [
        ("0", "", "30.0"),  # before the checkpoint: kept although the resumed run logs val_ppl at step 0
        ("0", "3.5", ""),
        ("0", "", "29.5"),
        ("1", "3.3", ""),
    ]
