"""Host (CPU) time per call of the GPU training kernels of bionemo.lightning against their torch counterparts.

A training step of the ESM-2 650M shape on one H200 spends nearly as much host time launching work as the GPU
spends running it, so every microsecond of Python per launch counts. This times, on inputs small enough that the
GPU keeps up (the host is what is measured), the calling thread's wall time per call of a forward + backward of:
LayerNorm (torch's against :class:`bionemo.lightning.layer_norm.TritonLayerNorm`), RoPE of one tensor (the eager
arithmetic against the Triton kernel, :func:`bionemo.lightning.rotary.apply_rotary`), a linear layer with bias
(``F.linear`` against ``LinearIntoMainGrad``), and, as yardsticks, one torch elementwise op and one launch of an
empty Triton kernel. Prints the median over ``--repeats`` blocks of ``--calls`` calls each.

Measured on one H200's host (2026-12-01): torch elementwise op 7.0 us, empty Triton launch 15.7 us; LayerNorm
forward without gradient torch 23.4 vs Triton 59.5 us, forward + backward 162.1 vs 456.1 us; RoPE eager 337.8 vs
Triton 289.0 us; linear + bias ``F.linear`` 242.5 vs ``LinearIntoMainGrad`` 279.9 us. In the same session the
Triton LayerNorm still made the 650M step faster (707-708 vs 714-726 ms): its GPU time saved more than its host
time cost, but the host time is what to cut next (``tools/bench_recipe_throughput.py --profile`` shows the GPU
idle between these launches).

Usage (GPU machine): python tools/bench_host_overhead.py [--rows 1024 --width 1280 --calls 200 --repeats 9]
"""

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def host_microseconds(call: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over ``repeats`` blocks of the host time per call, the GPU synchronized between blocks."""
    import torch

    for _ in range(20):
        call()
    torch.cuda.synchronize()
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        blocks.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--heads", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F
    import triton

    from bionemo.lightning.fused_bias_linear import LinearIntoMainGrad
    from bionemo.lightning.layer_norm import TritonLayerNorm
    from bionemo.lightning.rotary import _rotate_half, apply_rotary, rotary_tables

    empty_kernel: Any = triton.jit(_empty_kernel)
    rows, width = args.rows, args.width
    x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    theirs = torch.nn.LayerNorm(width, device="cuda", dtype=torch.bfloat16)
    ours = TritonLayerNorm(width, device="cuda", dtype=torch.bfloat16)

    d = width // args.heads
    qkv = torch.randn(rows // 4, 4, args.heads, 3 * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    angles = torch.randn(rows // 4, 1, 1, d, device="cuda")
    cos, sin = rotary_tables(angles, torch.bfloat16)
    grad_q = torch.randn(rows // 4, 4, args.heads, d, device="cuda", dtype=torch.bfloat16)

    def eager_rope() -> torch.Tensor:
        q = qkv[..., :d]
        return q * cos[:, None, None, :] + _rotate_half(q) * sin[:, None, None, :]

    weight = torch.nn.Parameter(torch.randn(width, width, device="cuda", dtype=torch.bfloat16) / width**0.5)
    bias = torch.nn.Parameter(torch.zeros(width, device="cuda", dtype=torch.bfloat16))
    weight.main_grad = torch.zeros(width, width, device="cuda", dtype=torch.float32)  # pyright: ignore[reportAttributeAccessIssue]
    ones = torch.ones(1, device="cuda")

    cases: list[tuple[str, Callable[[], object]]] = [
        ("torch elementwise op (ones.add_(1))", lambda: ones.add_(1)),
        ("empty Triton kernel launch", lambda: empty_kernel[(1,)](ones, 1)),
        ("LayerNorm forward, no grad: torch", lambda: _no_grad(lambda: theirs(x))),
        ("LayerNorm forward, no grad: Triton", lambda: _no_grad(lambda: ours(x))),
        ("LayerNorm forward + backward: torch", lambda: theirs(x).backward(dy)),
        ("LayerNorm forward + backward: Triton", lambda: ours(x).backward(dy)),
        ("RoPE forward + backward: eager", lambda: eager_rope().backward(grad_q)),
        ("RoPE forward + backward: Triton", lambda: apply_rotary(qkv[..., :d], cos, sin).backward(grad_q)),
        ("linear + bias forward + backward: F.linear", lambda: F.linear(x, weight, bias).backward(dy)),
        (
            "linear + bias forward + backward: into main_grad",
            lambda: LinearIntoMainGrad.apply(x, weight, bias).backward(dy),  # pyright: ignore[reportOptionalMemberAccess]
        ),
    ]
    print(f"{rows} rows x {width}, bf16; host time per call, median of {args.repeats} blocks of {args.calls} calls")
    for name, call in cases:
        print(f"{name:52s} {host_microseconds(call, args.calls, args.repeats):8.1f} us")


def _empty_kernel(x_ptr, n):  # a Triton kernel that does nothing: what one launch costs the host
    pass


def _no_grad(call: Callable[[], object]) -> object:
    import torch

    with torch.no_grad():
        return call()


if __name__ == "__main__":
    main()
