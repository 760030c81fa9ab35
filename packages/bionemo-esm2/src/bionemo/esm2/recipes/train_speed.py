"""How fast a training run trained: tokens per second over its timed steps and, on GPUs, model FLOP/s against peak.

What ``bionemo run train`` reports in its summary and ``summary.json``, so that a run of the recipe's defaults is its
own throughput measurement (docs/benchmarks.md#training-throughput-as-a-share-of-peak).
"""

from collections.abc import Mapping
from typing import Any

from bionemo.esm2.model.flops import training_flops
from bionemo.esm2.recipes._measured import shown
from bionemo.recipes.peak_flops import bf16_dense_peak_tflops

__all__ = ["speed_rows", "training_speed"]

_BF16 = ("bf16-mixed", "bf16", "bf16-true")


def training_speed(
    timer: Any,
    dataset: Any,
    items_per_step: int,
    model: Mapping[str, Any],
    vocab: int,
    *,
    devices: int,
    device_name: str | None,
    precision: str,
) -> dict[str, Any]:
    """Throughput of the steps ``timer`` (a :class:`~bionemo.recipes.step_timer.StepTimer`) timed.

    Args:
        timer: The run's step timer, after the fit.
        dataset: The training dataset: item ``k`` of step ``s`` is ``s * items_per_step + k``, and
            ``dataset.item_lengths(item)`` its sequences' tokens (residues + 2).
        items_per_step: Dataset items per optimizer step over every data-parallel rank.
        model: The model settings (:func:`~bionemo.esm2.model.flops.training_flops`).
        vocab: The LM head's output size.
        devices: Processes training (GPUs), among which the FLOPs are shared.
        device_name: The CUDA device's name, or None off CUDA (then no FLOP/s are reported).
        precision: The run's precision; the share of peak is of the bf16 dense peak, for bf16 runs only.

    Returns:
        ``timed_steps``, ``timed_seconds``, ``train_tokens_per_second``, ``model_tflops_per_gpu``, ``peak_tflops``,
        ``peak_fraction`` and ``peak_memory_gib``; None for what was not measured.
    """
    lengths: list[int] = []
    if timer.steps and timer.seconds > 0:
        for first, end in timer.spans:
            for item in range(first * items_per_step, end * items_per_step):
                lengths.extend(dataset.item_lengths(item))
    seconds = timer.seconds if lengths else None
    tflops = peak = fraction = None
    if seconds and device_name is not None:
        tflops = training_flops(model, vocab, lengths) / seconds / devices / 1e12
        peak = bf16_dense_peak_tflops(device_name) if precision in _BF16 else None
        fraction = None if peak is None else tflops / peak
    return {
        "timed_steps": timer.steps,
        "timed_seconds": seconds,
        "train_tokens_per_second": sum(lengths) / seconds if seconds else None,
        "model_tflops_per_gpu": tflops,
        "peak_tflops": peak,
        "peak_fraction": fraction,
        "peak_memory_gib": None if timer.peak_memory_bytes is None else timer.peak_memory_bytes / 2**30,
    }


def speed_rows(speed: Mapping[str, Any], device_name: str | None) -> list[tuple[str, str]]:
    """The summary rows of :func:`training_speed`'s figures (none where nothing was timed)."""
    rows = []
    if speed["train_tokens_per_second"]:
        rows.append(
            (
                "training speed",
                f"{speed['train_tokens_per_second']:,.0f} tokens/s ({speed['timed_steps']} steps in "
                f"{speed['timed_seconds']:.1f} s; the first 3, validation and checkpoint saves left out)",
            )
        )
    if speed["model_tflops_per_gpu"] is not None:
        value = f"{shown(speed['model_tflops_per_gpu'], 1)} TFLOP/s per GPU (matmuls of the real tokens)"
        if speed["peak_fraction"] is not None:
            value += f" = {speed['peak_fraction']:.1%} of the {device_name}'s {speed['peak_tflops']:.0f} bf16 peak"
        rows.append(("model FLOP/s", value))
    if speed["peak_memory_gib"] is not None:
        rows.append(("peak device memory", f"{speed['peak_memory_gib']:.1f} GiB"))
    return rows
