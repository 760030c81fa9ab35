"""GPU time of TritonLayerNorm against torch's LayerNorm: a gradient-free forward, and a training forward + backward.

Times the kernels with torch.profiler (GPU time summed over the kernels of each call, so host overheads do not
count) on ``--rows`` rows (default 16,416: a micro-batch of 16 x 1026 of the GPU recipe) of each ``--widths``, in
bf16, and prints torch's figure, ours and their ratio; ``--per-sm`` tries the backward with that many programs per
multiprocessor (``bionemo.layers._layer_norm_triton.BACKWARD_PROGRAMS_PER_SM``; ``width``: the default choice by
width, 16 up to width 640 and 4 above), ``--forward-tiling`` the gradient-free forward with that many rows per
program and warps (``FORWARD_TILING``, ``ROWSxWARPS``; ``width``: the default by width), with its memory traffic per
second. Figures: docs/benchmarks.md#layernorm-kernels.

Usage (GPU machine): python tools/bench_layer_norm.py [--rows 16416] [--widths 640,1280] [--per-sm width,4,16,64]
    [--forward-tiling width,1x4,2x4,4x4,8x4,4x8]
GPU smoke (CUDA and Triton only, no CPU run): python tools/bench_layer_norm.py --rows 1024 --widths 64
"""

import argparse
from collections.abc import Callable
from typing import Any


def gpu_microseconds(call: Callable[[], None], repeats: int = 20) -> float:
    """Summed GPU kernel time of one ``call()``, averaged over ``repeats`` after a warm-up."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / repeats


def inference(norm: Any, x: Any) -> Callable[[], None]:
    """A gradient-free forward of ``norm`` on ``x``."""
    import torch

    def call() -> None:
        with torch.no_grad():
            norm(x)

    return call


def training(norm: Any, x: Any, dy: Any) -> Callable[[], None]:
    """A forward and a backward of ``norm`` on ``x`` with output gradient ``dy``."""

    def call() -> None:
        x.grad = None  # no accumulation kernel
        norm(x).backward(dy)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=16 * 1026)
    parser.add_argument("--widths", default="640,1280")
    parser.add_argument(
        "--per-sm", default="width,4,16,64", help="backward programs per multiprocessor to try ('width': the default)"
    )
    parser.add_argument(
        "--forward-tiling", default="width", help="forward rows per program x warps to try ('width': the default)"
    )
    args = parser.parse_args()

    import torch

    import bionemo.layers._layer_norm_triton as kernels
    from bionemo.layers._triton import next_power_of_2
    from bionemo.layers.layer_norm import TritonLayerNorm

    for width in (int(w) for w in args.widths.split(",")):
        x = torch.randn(args.rows, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn_like(x)
        theirs = torch.nn.LayerNorm(width, device="cuda", dtype=torch.bfloat16)
        ours = TritonLayerNorm(width, device="cuda", dtype=torch.bfloat16)

        reference = gpu_microseconds(inference(theirs, x))
        terabytes = 2 * x.numel() * x.element_size() / 1e12  # read and written once
        for setting in args.forward_tiling.split(","):
            kernels.FORWARD_TILING = None if setting == "width" else tuple(int(n) for n in setting.split("x"))
            rows, warps = kernels.forward_tiling(next_power_of_2(width))  # the lanes a row is held in
            mine = gpu_microseconds(inference(ours, x))
            chosen = ", the default for this width" if setting == "width" else ""
            print(f"width {width}, {args.rows:,} rows, bf16: forward without gradient  torch {reference:7.1f} us  "
                  f"ours {mine:7.1f} us  ({reference / mine:.2f}x, {terabytes / mine * 1e6:.2f} TB/s, "
                  f"{rows} rows per program x {warps} warps{chosen})")  # fmt: skip
        kernels.FORWARD_TILING = None
        reference = gpu_microseconds(training(theirs, x, dy))
        for setting in args.per_sm.split(","):
            kernels.BACKWARD_PROGRAMS_PER_SM = None if setting == "width" else int(setting)
            per_sm = kernels.backward_programs_per_sm(width)
            mine = gpu_microseconds(training(ours, x, dy))
            chosen = ", the default for this width" if setting == "width" else ""
            print(f"width {width}, {args.rows:,} rows, bf16: forward + backward  torch {reference:7.1f} us  "
                  f"ours {mine:7.1f} us  ({reference / mine:.2f}x, {per_sm} programs per SM{chosen})")  # fmt: skip


if __name__ == "__main__":
    main()
