"""Memory that perplexity logging allocates, against the size of the logits it is computed for.

Counts the bytes of every tensor created (a TorchDispatchMode sees each op's outputs) while each method
turns one validation step's micro-batch outputs into a perplexity:

* ``PerplexityLoggingCallback`` (this project): reads the ``[loss_sum, num_tokens]`` pairs the loss reduction
  already produced; never touches the logits,
* ``pad+clone`` (bionemo-llm's callback): pads and concatenates the micro-batches' logits, clones them and
  recomputes the per-token cross-entropy.

Target: under 5% of the logits' memory. Figures: docs/benchmarks.md#perplexity-logging-memory.

Usage: uv run python tools/bench_perplexity_memory.py [--seq 512 --batch 8 --vocab 32000 --micro-batches 4]
CPU smoke: uv run python tools/bench_perplexity_memory.py --seq 16 --batch 2 --vocab 64 --micro-batches 2
"""

import argparse
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bionemo.callbacks import PerplexityLoggingCallback
from bionemo.losses import MaskedTokenLossReduction, ParallelGroups


class AllocationCounter(TorchDispatchMode):
    """Sums the bytes of every tensor an op returns (an upper bound of what it allocates)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor) and not func.__name__.startswith(("view", "t.", "transpose", "detach")):
                self.bytes += leaf.numel() * leaf.element_size()
        return out


def micro_batches(n, seq, batch, vocab):
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        s = seq - 16 * i  # ragged, as real micro-batches are
        out.append(
            {
                "token_logits": torch.randn(s, batch, vocab, generator=gen),
                "labels": torch.randint(0, vocab, (batch, s), generator=gen),
                "loss_mask": torch.ones(batch, s),
            }
        )
    return out


def ours(outputs, reduced, trainer, module):
    callback = PerplexityLoggingCallback(groups=ParallelGroups())
    callback.on_validation_epoch_start(trainer, module)
    step: Any = SimpleNamespace(trainer=trainer, pl_module=module)
    callback.on_megatron_reduce_microbatches_end(step, reduced, MaskedTokenLossReduction(), None)
    callback.on_validation_epoch_end(trainer, module)
    return module.logged["val_ppl"]


def pad_clone(outputs):
    longest = max(o["token_logits"].shape[0] for o in outputs)
    logits = torch.cat(
        [F.pad(o["token_logits"], (0, 0, 0, 0, 0, longest - o["token_logits"].shape[0])) for o in outputs], 1
    )
    labels = torch.cat([F.pad(o["labels"], (0, longest - o["labels"].shape[1]), value=-100) for o in outputs], 0)
    mask = torch.cat([F.pad(o["loss_mask"], (0, longest - o["loss_mask"].shape[1])) for o in outputs], 0)
    per_token = F.cross_entropy(logits.clone().permute(1, 2, 0), labels.clone(), reduction="none", ignore_index=-100)
    return float(torch.exp((per_token * mask).sum() / mask.sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--micro-batches", type=int, default=4)
    args = parser.parse_args()
    outputs = micro_batches(args.micro_batches, args.seq, args.batch, args.vocab)
    reduction = MaskedTokenLossReduction(validation_step=True, groups=ParallelGroups())
    reduced = [reduction.forward(o, o)[2] for o in outputs]  # what the loss reduction hands over anyway
    logits_bytes = sum(o["token_logits"].numel() * o["token_logits"].element_size() for o in outputs)
    trainer = SimpleNamespace(sanity_checking=False, training=False, validating=True)
    module = SimpleNamespace(logged={}, device=torch.device("cpu"))
    module.log = lambda name, value, **kw: module.logged.__setitem__(name, float(value))

    with AllocationCounter() as counter:
        ppl_ours = ours(outputs, reduced, trainer, module)
    ours_bytes = counter.bytes
    with AllocationCounter() as counter:
        ppl_ref = pad_clone(outputs)
    ref_bytes = counter.bytes
    print(
        f"logits of the step: {logits_bytes / 2**20:.1f} MiB ({args.micro_batches} micro-batches, vocab {args.vocab})"
    )
    print(f"{'method':28} {'allocated':>12} {'% of logits':>12} {'perplexity':>11}")
    for name, nbytes, ppl in (
        ("PerplexityLoggingCallback", ours_bytes, ppl_ours),
        ("pad+clone (bionemo-llm)", ref_bytes, ppl_ref),
    ):
        print(f"{name:28} {nbytes:>10,d} B {100 * nbytes / logits_bytes:>11.4f}% {ppl:>11.4f}")


if __name__ == "__main__":
    main()
