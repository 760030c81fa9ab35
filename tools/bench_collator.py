"""Benchmark batch_collator against writing each output byte once, and against pad-then-cat.

Prints the time of three ways to collate the same micro-batch outputs (ragged ``token_logits [s, b, v]``,
``labels [b, s]``, ``loss_mask [b, s]``, ``embeddings [b, h]``):

* ``write-once``: a preallocated output, each input copied into place and each padding tail filled (the
  floor: every output byte written exactly once),
* ``batch_collator``: this project,
* ``pad-then-cat``: what bionemo-llm users did (``F.pad`` each input, then ``torch.cat``).

Usage: uv run python tools/bench_collator.py [--micro-batches 8] [--vocab 1024] [--repeat 20] [--device cpu|cuda]
CPU smoke: uv run python tools/bench_collator.py --micro-batches 2 --vocab 64 --repeat 2
Figures: docs/benchmarks.md#batch_collator.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bionemo.collate import batch_collator


def make_batches(n: int, device: str, vocab: int, gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
    batches = []
    for _ in range(n):
        seq = int(torch.randint(192, 257, (1,), generator=gen))
        b = 8
        batches.append(
            {
                "token_logits": torch.randn(seq, b, vocab, generator=gen).to(device),
                "labels": torch.randint(0, vocab, (b, seq), generator=gen).to(device),
                "loss_mask": torch.ones(b, seq, dtype=torch.bool).to(device),
                "embeddings": torch.randn(b, 512, generator=gen).to(device),
            }
        )
    return batches


# key, batch dim, sequence dim, pad value: the layout batch_collator's defaults assume
LEAVES = (("token_logits", 1, 0, 0), ("labels", 0, 1, -100), ("loss_mask", 0, 1, 0), ("embeddings", 0, None, 0))


def write_once(batches):
    out = {}
    for key, bdim, sdim, pad in LEAVES:
        tensors = [b[key] for b in batches]
        shape = list(tensors[0].shape)
        shape[bdim] = sum(t.shape[bdim] for t in tensors)
        if sdim is not None:
            shape[sdim] = max(t.shape[sdim] for t in tensors)
        dst = torch.empty(shape, dtype=tensors[0].dtype, device=tensors[0].device)
        offset = 0
        for t in tensors:
            view = dst.narrow(bdim, offset, t.shape[bdim])
            if sdim is not None:
                view.narrow(sdim, t.shape[sdim], shape[sdim] - t.shape[sdim]).fill_(pad)
                view = view.narrow(sdim, 0, t.shape[sdim])
            view.copy_(t)
            offset += t.shape[bdim]
        out[key] = dst
    return out


def pad_then_cat(batches):
    out = {}
    for key, bdim, sdim, pad in LEAVES:
        tensors = [b[key] for b in batches]
        if sdim is not None:
            longest = max(t.shape[sdim] for t in tensors)
            tensors = [
                F.pad(t, [0, 0] * (t.dim() - 1 - sdim) + [0, longest - t.shape[sdim]], value=pad) for t in tensors
            ]
        out[key] = torch.cat(tensors, dim=bdim)
    return out


def timed(fn, batches, repeat: int, device: str) -> float:
    samples = []
    for _ in range(repeat + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(batches)
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    batches = make_batches(args.micro_batches, args.device, args.vocab, torch.Generator().manual_seed(0))
    out_bytes = sum(t.numel() * t.element_size() for t in batch_collator(batches).values())
    floor = timed(write_once, batches, args.repeat, args.device)
    ours = timed(batch_collator, batches, args.repeat, args.device)
    legacy = timed(pad_then_cat, batches, args.repeat, args.device)
    print(f"device {args.device}, {args.micro_batches} micro-batches, output {out_bytes / 2**20:.1f} MiB")
    print(f"{'method':16} {'median ms':>10} {'GB/s':>8} {'x write-once':>13}")
    for name, t in (("write-once", floor), ("batch_collator", ours), ("pad-then-cat", legacy)):
        print(f"{name:16} {t * 1e3:10.2f} {out_bytes / t / 1e9:8.2f} {t / floor:13.2f}")


if __name__ == "__main__":
    main()
