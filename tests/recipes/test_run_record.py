"""Which run a checkpoint folder belongs to: a rerun resumes its own run, refuses another's, and --no-resume clears."""

import json
from pathlib import Path

import pytest

from bionemo.recipes.run_record import (
    RUN_FILE,
    check_resumable,
    clear_checkpoints,
    records_digest,
    refuse_prediction_folder,
    run_identity,
    start_run_record,
    whole_checkpoint,
)
from bionemo.recipes.settings import RunSettings, SettingsError


def _settings(**values) -> RunSettings:
    return RunSettings(global_batch_size=16, **values)


def _megatron_checkpoint(folder: Path, name: str) -> Path:
    weights = folder / name / "weights"
    weights.mkdir(parents=True)
    (weights / "metadata.json").write_text("{}")
    return folder / name


def test_identity_makes_the_checkpoint_absolute_and_takes_the_global_batch_of_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    identity = run_identity(_settings(checkpoint=Path("base"), data=Path("a.fasta"), seed=3), {"model": {"layers": 4}})
    assert identity["checkpoint"] == str(tmp_path / "base")
    assert "data" not in identity  # the records are the data (the recipe's digest), not the file's path
    assert (identity["seed"], identity["global_batch_size"], identity["model"]) == (3, 16, {"layers": 4})
    by_tokens = run_identity(RunSettings(global_batch_tokens=4096, global_batch_size=7))
    assert by_tokens["global_batch_tokens"] == 4096
    assert "global_batch_size" not in by_tokens  # items per step follow the layout when batches are cut by tokens
    assert run_identity(_settings(), {"targets": ("qkv", "fc1")})["targets"] == ["qkv", "fc1"]  # as JSON reads back


def test_records_digest_tells_records_apart_by_every_field_and_their_order():
    records = [("a", "MKV", (1.0,)), ("b", "LLA", (0.0,))]
    digest = records_digest(records)
    assert digest == records_digest(iter(list(records)))
    assert digest["records"] == 2
    assert len(digest["sha256"]) == 16
    others = [records[::-1], [records[0]], [("a", "MKV", (1.0,)), ("b", "LLA", (1.0,))], [("a", "MK", "V"), records[1]]]
    assert all(records_digest(other)["sha256"] != digest["sha256"] for other in others)


def test_same_run_resumes_and_layout_changes_are_the_same_run(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    first = _settings(devices=1, max_steps=10, lr=1e-3)
    identity = run_identity(first)
    assert check_resumable(first, checkpoints, identity, megatron=False) is None  # nothing there: a fresh start
    start_run_record(first, checkpoints, identity)
    (checkpoints / "last.ckpt").write_bytes(b"checkpoint")
    later = first.model_copy(update={"devices": 2, "max_steps": 20, "lr": 5e-4, "micro_batch_size": 4})
    assert check_resumable(later, checkpoints, run_identity(later), megatron=False) == str(checkpoints / "last.ckpt")
    (checkpoints / RUN_FILE).unlink()  # written before run.json existed: resumed as before
    other = _settings(seed=1)
    assert check_resumable(other, checkpoints, run_identity(other), megatron=False) == str(checkpoints / "last.ckpt")


def test_another_run_is_refused_naming_what_differs(tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    first = _settings()
    start_run_record(first, checkpoints, run_identity(first, {"finetune": {"task": "regression", "head": {"k": 1}}}))
    _megatron_checkpoint(checkpoints, "step10")
    other = _settings(seed=1)
    identity = run_identity(other, {"finetune": {"task": "classification", "head": {"k": 1}}})
    with pytest.raises(SettingsError) as refused:
        check_resumable(other, checkpoints, identity, megatron=True)
    message = str(refused.value)
    assert message.startswith(f"--output-dir {tmp_path / 'run'} holds the checkpoints of another run (step10)")
    assert 'finetune.task "regression" -> "classification"; seed 0 -> 1.' in message
    assert "finetune.head" not in message  # only what differs
    assert 'data "' not in message
    assert "--no-resume" in message
    assert refused.value.option == "--output-dir"
    assert check_resumable(other.model_copy(update={"resume": False}), checkpoints, identity, megatron=True) is None


@pytest.mark.parametrize("megatron", [True, False])
def test_checkpoints_of_the_other_strategy_family_are_refused(tmp_path, megatron):
    checkpoints = tmp_path / "checkpoints"
    if megatron:
        (checkpoints).mkdir()
        (checkpoints / "last.ckpt").write_bytes(b"checkpoint")
    else:
        _megatron_checkpoint(checkpoints, "step4")
    settings = _settings()
    with pytest.raises(SettingsError, match="cannot resume from") as refused:
        check_resumable(settings, checkpoints, run_identity(settings), megatron=megatron)
    written = "Lightning's strategies" if megatron else "NeMo's MegatronStrategy"
    assert f"holds a checkpoint written under {written}" in str(refused.value)


def test_no_resume_removes_every_earlier_checkpoint_and_records_the_new_run(tmp_path, capsys):
    checkpoints = tmp_path / "checkpoints"
    _megatron_checkpoint(checkpoints, "step100")
    _megatron_checkpoint(checkpoints, "step5.ckpt")
    (checkpoints / "last.ckpt").write_bytes(b"checkpoint")
    (checkpoints / RUN_FILE).write_text(json.dumps({"seed": 9}))
    (checkpoints / "best-weights-rank0.safetensors").write_bytes(b"kept")
    (checkpoints / "stepX").mkdir()
    fresh = _settings(resume=False)
    identity = run_identity(fresh)
    start_run_record(fresh, checkpoints, identity)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best-weights-rank0.safetensors", RUN_FILE, "stepX"]
    assert json.loads((checkpoints / RUN_FILE).read_text()) == identity
    assert "removed the earlier checkpoints in" in capsys.readouterr().err
    assert whole_checkpoint(checkpoints, megatron=True) is None
    assert clear_checkpoints(tmp_path / "missing") == []


def test_a_prediction_folder_is_not_a_training_run_folder(tmp_path):
    refuse_prediction_folder(tmp_path / "new")  # nothing there: fine
    (tmp_path / "shards").mkdir()  # an interrupted prediction
    with pytest.raises(SettingsError, match="holds `run predict`'s outputs") as refused:
        refuse_prediction_folder(tmp_path)
    assert refused.value.option == "--output-dir"
