"""GPU time of the fused RoPE + variable-length attention kernel against Triton RoPE then torch's flash attention.

Batches as ``tools/bench_predict.py`` makes them: ``--sequences`` proteins of its ``random_proteins``, sorted by length,
each ``+ 2`` tokens; from the position ``--fractions`` of that order on, as many sequences as fit ``--tokens`` padded
tokens (count x longest). Per batch and head shape (``--shapes``, heads x d): query, key and value are strided views of
one ``[T, 3, heads, d]`` bf16 buffer, cos / sin ``[T, d]`` tables of random angles. Reference: ``rotate_strided``
(``bionemo.layers._rotary_triton``) on the query and the key, then ``torch.ops.aten._flash_attention_forward``; ours:
``varlen_rotary_attention`` (``bionemo.layers._varlen_attention_triton``) at its default tiling, with the keys rotated
where ``keys_rotated_first`` puts them for the batch, then at the other place (before the kernel or in its loop), then,
unless ``--no-sweep``, at every tiling of BLOCK_M and BLOCK_N in 32, 64, 128, 4 or 8 warps and 1 to 3 stages
(tilings that fail are skipped and counted). Printed per batch: milliseconds (CUDA events, mean of ``--repeats`` calls
after a warm-up), TFLOP/s counting 4 x heads x d x sum(L^2), the largest difference from the reference's output, and
the best 5 tilings. The sweep's kernels are compiled first by ``--jobs`` processes into Triton's cache (one compile per
head shape and tiling), which keeps the whole run around a minute or two on an H100.

Usage (GPU machine): python tools/bench_varlen_attention.py [--sequences 20000] [--tokens 131072]
    [--fractions 0.05,0.5,0.95] [--shapes 20x64,20x32] [--repeats 10] [--jobs 8] [--no-sweep]
GPU smoke (CUDA and Triton only, no CPU run): python tools/bench_varlen_attention.py --sequences 200 --tokens 4096
    --fractions 0.5 --shapes 4x32 --no-sweep
Figures: docs/benchmarks.md#prediction-kernels.
"""

import argparse
import itertools
import math
import multiprocessing
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

Tiling = tuple[int, int, int, int]

SWEEP: list[Tiling] = list(itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (1, 2, 3)))
"""``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` tried per batch."""


def length_sorted_batches(count: int, seed: int, tokens: int, fractions: list[float]) -> list[list[int]]:
    """Token counts (protein length + 2) of the batches that start at ``fractions`` of the length-sorted order.

    Each is greedy: sequences in ascending length while (sequences x the last one's length) <= ``tokens``.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_predict import random_proteins

    lengths = sorted(len(protein) + 2 for protein in random_proteins(count, seed))
    batches = []
    for fraction in fractions:
        batch: list[int] = []
        for length in lengths[int(fraction * (len(lengths) - 1)) :]:
            if (len(batch) + 1) * length > tokens:
                break
            batch.append(length)
        batches.append(batch)
    return batches


def make_inputs(lengths: list[int], heads: int, d: int, seed: int = 0) -> dict[str, Any]:
    """Query, key, value (views of one ``[T, 3, heads, d]`` bf16 buffer), cos, sin, bounds, longest on the GPU."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    tokens = sum(lengths)
    fused = torch.randn(tokens, 3, heads, d, device="cuda", dtype=torch.bfloat16, generator=generator)
    angles = torch.rand(tokens, d, device="cuda", generator=generator) * (2 * math.pi)
    starts = [0, *itertools.accumulate(lengths)]
    return {
        "query": fused[:, 0], "key": fused[:, 1], "value": fused[:, 2],
        "cos": angles.cos().to(torch.bfloat16), "sin": angles.sin().to(torch.bfloat16),
        "bounds": torch.tensor(starts, dtype=torch.int32, device="cuda"), "longest": max(lengths),
    }  # fmt: skip


def reference(inputs: dict[str, Any], rope: bool = True) -> Any:
    """``rotate_strided`` on query and key (if ``rope``), then torch's variable-length flash forward: ``[T, h * d]``."""
    import torch

    from bionemo.layers._rotary_triton import rotate_strided

    query, key, value = inputs["query"], inputs["key"], inputs["value"]
    if rope:
        query, key = (rotate_strided(t.unsqueeze(1), inputs["cos"], inputs["sin"]).squeeze(1) for t in (query, key))
    bounds, longest, d = inputs["bounds"], inputs["longest"], query.shape[-1]
    out = torch.ops.aten._flash_attention_forward(
        query, key, value, bounds, bounds, longest, longest, 0.0, False, False, scale=d**-0.5
    )[0]
    return out.reshape(out.shape[0], -1)


def fused(inputs: dict[str, Any], tiling: Tiling | None) -> Any:
    """``varlen_rotary_attention`` at ``tiling`` (``None``: its default)."""
    from bionemo.layers._varlen_attention_triton import varlen_rotary_attention

    d = inputs["query"].shape[-1]
    return varlen_rotary_attention(
        inputs["query"], inputs["key"], inputs["value"], inputs["bounds"], inputs["longest"], d**-0.5,
        inputs["cos"], inputs["sin"], tiling,
    )  # fmt: skip


def milliseconds(call: Callable[[], Any], repeats: int) -> float:
    """Mean GPU time of ``call()`` between CUDA events, after two untimed calls."""
    import torch

    for _ in range(2):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def compile_tiling(heads: int, d: int, tiling: Tiling) -> str | None:
    """Compile the kernel for one head shape and tiling into Triton's cache (a worker process); the error if any."""
    import torch

    try:
        fused(make_inputs([40, 17], heads, d), tiling)  # the sweep's argument layout: the same compiled kernel
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001  # any failure only removes this tiling from the sweep
        return f"{type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
    return None


def precompile(shapes: list[tuple[int, int]], tilings: list[Tiling], jobs: int) -> dict[tuple[int, int, Tiling], str]:
    """Compile every (head shape, tiling) in ``jobs`` processes; the failures by key."""
    keys = [(heads, d, tiling) for heads, d in shapes for tiling in tilings]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        errors = pool.map(compile_tiling, *zip(*keys, strict=True))
        return {key: error for key, error in zip(keys, errors, strict=True) if error is not None}


def row(label: str, ms: float, flops: float, diff: float | None = None, base: float | None = None) -> str:
    extra = "" if diff is None else f"  max |diff| {diff:.2e}"
    extra += "" if base is None else f"  {base / ms:5.2f}x"
    return f"  {label:32s} {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s{extra}"


def bench_batch(lengths: list[int], heads: int, d: int, args: argparse.Namespace, skip: set[Tiling]) -> None:
    import torch

    from bionemo.layers import _varlen_attention_triton as kernel
    from bionemo.layers._varlen_attention_triton import default_tiling

    inputs = make_inputs(lengths, heads, d)
    flops = 4.0 * heads * d * sum(length * length for length in lengths)
    expected = reference(inputs)
    base = milliseconds(lambda: reference(inputs), args.repeats)
    print(row("rotate_strided x2 + flash (ref)", base, flops))
    print(row("flash alone (no RoPE)", milliseconds(lambda: reference(inputs, rope=False), args.repeats), flops))
    tiling = default_tiling(d, inputs["longest"])
    setting = kernel.KEYS_ROTATED_FIRST
    default = kernel.keys_rotated_first(inputs["longest"])
    for keys_first in (default, not default):  # the default, then the other place of the keys' rotation
        kernel.KEYS_ROTATED_FIRST = keys_first
        label = f"fused, {tiling}, keys rotated {'first' if keys_first else 'in the loop'}"
        diff = float((fused(inputs, tiling).float() - expected.float()).abs().max())
        print(row(label, milliseconds(lambda: fused(inputs, tiling), args.repeats), flops, diff, base))
    kernel.KEYS_ROTATED_FIRST = setting
    if args.no_sweep:
        return
    results: list[tuple[float, Tiling, float]] = []
    failed = 0
    for tiling in SWEEP:
        if tiling in skip:
            failed += 1
            continue
        try:
            diff = float((fused(inputs, tiling).float() - expected.float()).abs().max())
            results.append((milliseconds(lambda tiling=tiling: fused(inputs, tiling), args.repeats), tiling, diff))
        except Exception:  # noqa: BLE001  # a tiling that does not run here is skipped
            failed += 1
        torch.cuda.synchronize()
    print(f"  best of {len(results)} tilings (BLOCK_M, BLOCK_N, warps, stages); {failed} failed:")
    for ms, tiling, diff in sorted(results)[:5]:
        print(row(f"  {tiling}", ms, flops, diff, base))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sequences", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=131072, help="padded tokens per batch (count x longest)")
    parser.add_argument("--fractions", type=lambda text: [float(x) for x in text.split(",")], default=[0.05, 0.5, 0.95])
    parser.add_argument(
        "--shapes",
        type=lambda text: [tuple(int(n) for n in shape.split("x")) for shape in text.split(",")],
        default=[(20, 64), (20, 32)],
        help="heads x head_dim, comma-separated",
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=8, help="processes compiling the sweep's kernels first")
    parser.add_argument("--no-sweep", action="store_true", help="the default tiling only")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_varlen_attention needs a CUDA GPU")
    batches = length_sorted_batches(args.sequences, args.seed, args.tokens, args.fractions)
    failures = {} if args.no_sweep else precompile(args.shapes, SWEEP, args.jobs)
    for key, error in sorted(failures.items()):
        print(f"compile failed, heads {key[0]} x d {key[1]}, tiling {key[2]}: {error}")
    print(f"{torch.cuda.get_device_name()}, bf16; {args.sequences} proteins sorted by length, <= {args.tokens} padded "
          "tokens per batch")  # fmt: skip
    for heads, d in args.shapes:
        skip = {tiling for (h, dim, tiling) in failures if (h, dim) == (heads, d)}
        for fraction, lengths in zip(args.fractions, batches, strict=True):
            print(f"\n{heads} heads x d {d}, batch at {fraction}: {len(lengths)} sequences of {lengths[0]}-"
                  f"{lengths[-1]} tokens, T {sum(lengths):,}")  # fmt: skip
            bench_batch(lengths, heads, d, args, skip)


if __name__ == "__main__":
    main()
