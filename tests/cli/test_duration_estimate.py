"""A training run says once, after its first steps, how fast it goes and how long max_steps take (a fake clock)."""

from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from bionemo.recipes.duration import DurationEstimate, format_duration, format_rate


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.2, "1 s"), (45, "45 s"), (31 * 60 + 10, "31 min"), (2 * 3600 + 5 * 60, "2 h 5 min"), (3 * 3600, "3 h"),
     (21 * 86400 + 10 * 3600 + 600, "21 days 10 h")],
)  # fmt: skip
def test_durations_read_in_two_units_at_most(seconds, shown):
    assert format_duration(seconds) == shown


def test_rates_have_two_significant_digits():
    assert [format_rate(r) for r in (0.2712, 3.74, 42.4)] == ["0.27", "3.7", "42"]


class SteppedClock(Callback):
    """A clock reading ``seconds_per_step`` x the trainer's optimizer steps (updated before the estimate reads it)."""

    def __init__(self, seconds_per_step: float) -> None:
        self.seconds_per_step = seconds_per_step
        self.now = 1000.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.now = 1000.0 + self.seconds_per_step * trainer.global_step

    def __call__(self) -> float:
        return self.now


class TinyModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_lightning_run_prints_the_rate_and_the_duration_once_counting_optimizer_steps(tmp_path):
    clock, said = SteppedClock(seconds_per_step=3.7), []
    estimate = DurationEstimate(after_steps=5, skip_steps=1, clock=clock, echo=said.append)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=12, accumulate_grad_batches=2, callbacks=[clock, estimate], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(TinyModule())
    rate = 1 / 3.7  # steps 1 -> 6 timed on the fake clock
    assert said == [f"about {format_rate(rate)} steps/s: 12 steps in about {format_duration(12 / rate)}"]
    assert said == ["about 0.27 steps/s: 12 steps in about 44 s"]


def fake_trainer(step: int, *, max_steps: int = 1000, rank_zero: bool = True) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, max_steps=max_steps, is_global_zero=rank_zero)


def run_steps(estimate: DurationEstimate, trainer: SimpleNamespace, steps: range, times: dict[int, float]) -> None:
    now = {"t": 0.0}
    estimate.clock = lambda: now["t"]
    estimate.on_train_start(trainer, None)  # type: ignore[arg-type]
    for step in steps:
        trainer.global_step, now["t"] = step, times[step]
        estimate.on_train_batch_end(trainer, None, None, None, 0)  # type: ignore[arg-type]


def test_a_resumed_run_also_says_the_time_left():
    said: list[str] = []
    estimate = DurationEstimate(after_steps=4, skip_steps=2, echo=said.append)
    trainer = fake_trainer(400, max_steps=1000)
    run_steps(estimate, trainer, range(401, 412), {s: 2.0 * s for s in range(401, 412)})  # 0.5 steps/s
    # timed from step 402 to 406: 2000 s for the 1000 steps, 594 steps left after step 406
    assert said == [f"about 0.5 steps/s: 1000 steps in about {format_duration(2000)}, {format_duration(1188)} from now"]


def test_only_global_rank_zero_speaks_and_short_runs_say_nothing():
    said: list[str] = []
    run_steps(
        DurationEstimate(echo=said.append),
        fake_trainer(0, rank_zero=False),
        range(1, 20),
        dict.fromkeys(range(20), 1.0),
    )
    run_steps(
        DurationEstimate(echo=said.append), fake_trainer(0, max_steps=5), range(1, 6), {s: float(s) for s in range(6)}
    )
    assert said == []


def test_after_steps_must_be_positive():
    with pytest.raises(ValueError, match="after_steps must be >= 1"):
        DurationEstimate(after_steps=0)
