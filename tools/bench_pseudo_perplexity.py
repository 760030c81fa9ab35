"""Seconds of the pseudo-perplexity step per batch at several token budgets per forward pass of masked copies.

Builds the model of ``--checkpoint`` (default: the bundled demo weights), one length-sorted batch of
``--sequences`` random proteins of ``--length`` residues (+-20%), and times
``bionemo.esm2.model.steps._pseudo_loss_sums`` on it at each ``--budget`` (0 = the batch's own padded size: the copies
``micro-batch`` at a time, as before budgets), in alternating rounds; prints the best of ``--rounds`` per budget,
the copies per second and whether every budget gave the same sums. Its efficiency: residues scored per second
against the embedding path's residues per second (``--include embeddings``: one forward of the unmasked batch,
timed in the same rounds); pseudo-perplexity runs one forward per residue, so the ratio is near 1 / length.

Usage: uv run python tools/bench_pseudo_perplexity.py [--length 300 --sequences 16 --budget 0 4096 16384 65536]
[--device cuda --dtype bfloat16 --shape 150m | --checkpoint HF_DIR_OR_FILE] [--unpadded] [--rounds 3]
CPU smoke: uv run python tools/bench_pseudo_perplexity.py --sequences 2 --length 20 --budget 0 512 --rounds 1
Figures: docs/benchmarks.md#pseudo-perplexity-token-budget.
"""

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _timed(call: Callable[[], Any], device: str) -> tuple[Any, float]:
    """``call()``'s result (tensors moved to the host) and its wall seconds, the device's queue drained first."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        result = call()
    result = {k: v.cpu() for k, v in result.items()} if isinstance(result, dict) else result.cpu()  # device waits
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--shape", default=None, help="a random HF model of this shape (bench_predict's: 150m, ...)")
    parser.add_argument("--length", type=int, default=300)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--budget", type=int, nargs="+", default=[0, 1024, 4096, 16384, 65536])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--unpadded", action="store_true")
    args = parser.parse_args()

    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.data import collate_proteins
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.model.steps import _pseudo_loss_sums, make_predict_step
    from bionemo.esm2.tokenizer import AMINO_ACIDS, ProteinTokenizer
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    dtype = getattr(torch, args.dtype)
    bundled = (
        Path(__file__).resolve().parents[1] / "packages/bionemo-esm2/src/bionemo/esm2/resources/esm2_demo.safetensors"
    )
    if args.shape:  # a random Hugging Face model of that shape, as tools/bench_predict.py makes them
        import sys
        import tempfile

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_predict import model_shape, save_random_hf

        args.checkpoint = Path(tempfile.mkdtemp()) / f"hf_{args.shape}"
        save_random_hf(args.checkpoint, model_shape(args.shape), seed=0)
    checkpoint = load_checkpoint(args.checkpoint or bundled)
    model = ESM2Config(**{**checkpoint.model, "params_dtype": dtype}).configure_model().eval()
    apply_weights(model, checkpoint.tensors)
    model = model.to(args.device, dtype)
    rng = random.Random(0)
    lengths = sorted((int(args.length * rng.uniform(0.8, 1.2)) for _ in range(args.sequences)), reverse=True)
    tokenizer = ProteinTokenizer()
    items = [{"tokens": tokenizer.encode("".join(rng.choice(AMINO_ACIDS) for _ in range(n)))} for n in lengths]
    batch = collate_proteins(items, tokenizer.pad_id)
    batch = {k: v.to(args.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    padded = min(batch["host_lengths"]) < batch["tokens"].shape[1]
    batch["padding"] = batch["attention_mask"] if padded else None
    copies = sum(lengths)
    best = dict.fromkeys(args.budget, float("inf"))
    sums = {}
    embed = make_predict_step(embeddings=True, logits=False, perplexity=False, unpadded=args.unpadded)
    embedding_seconds = float("inf")
    with torch.no_grad():
        embed(model, batch)  # untimed warm-up (the first forward allocates)
    for _ in range(args.rounds):
        out, seconds = _timed(lambda: embed(model, batch), args.device)
        assert isinstance(out, dict)  # one pipeline stage: the outputs, not a stage's hidden states
        embedding_seconds = min(embedding_seconds, seconds)
        for budget in args.budget:
            sums[budget], seconds = _timed(
                lambda budget=budget: _pseudo_loss_sums(
                    model, batch, tokenizer.mask_id, unpadded=args.unpadded, tokens_per_forward=budget or None
                ),
                args.device,
            )
            best[budget] = min(best[budget], seconds)
    print(f"{args.sequences} sequences of ~{args.length} residues: {copies} masked copies, {args.device} {args.dtype}")
    for budget, seconds in best.items():
        label = f"{budget:>7,} tokens" if budget else "  batch's size"
        print(
            f"  {label} per forward: {seconds:8.2f} s  {copies / seconds:9,.0f} copies/s (residues scored per second; "
            f"{seconds / embedding_seconds:,.1f}x the embedding path's time)"
        )
    print(f"  embedding path (reference): {embedding_seconds:8.4f} s  {copies / embedding_seconds:9,.0f} residues/s")
    reference = sums[args.budget[0]]
    worst = max(float((s - reference).abs().max() / reference.abs().max()) for s in sums.values())
    print(f"  largest relative difference of the sums between budgets: {worst:.2e}")


if __name__ == "__main__":
    main()
