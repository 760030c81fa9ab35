"""Where a prediction batch's time goes: our ESM-2 forward vs Hugging Face's on one batch, with a kernel table.

Usage (one GPU): python tools/profile_predict.py --shape 150m --tokens 65536 --length 270 [--fusions]
[--unpadded].
Prints milliseconds per batch of both (same random weights, bf16, inference mode) and the top CUDA kernels of
ours under torch.profiler; ``--unpadded`` times our unpadded step (variable-length attention) too.
For finding what holds back ``tools/bench_predict.py``'s ratio; not a benchmark.
"""

import argparse
import time

import torch


def build(shape: str, fusions: bool):
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    from bionemo.esm2.catalog import ESM2_SHAPES
    from bionemo.esm2.model import ESM2Config
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    size = ESM2_SHAPES[f"esm2-{shape}"]
    config = ESM2Config(
        num_layers=size.num_layers,
        hidden_size=size.hidden_size,
        num_attention_heads=size.num_attention_heads,
        ffn_hidden_size=size.ffn_hidden_size,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_cpu_initialization=False,
        bias_dropout_fusion=fusions,
    )
    return config.configure_model().to("cuda", torch.bfloat16).eval()


def batch(tokens: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    count = max(1, tokens // length)
    lengths = torch.randint(int(length * 0.97), length + 1, (count,))
    ids = torch.randint(4, 24, (count, length))
    mask = torch.arange(length)[None] < lengths[:, None]
    ids[~mask] = 1
    return ids.cuda(), mask.cuda()


def timed(fn, repeat: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat * 1000


def time_ours(shape: str, fusions: bool, ids: torch.Tensor, mask: torch.Tensor, unpadded: bool) -> float:
    """Milliseconds per batch of our predict step, after printing its CUDA kernel table."""
    from bionemo.esm2.steps import make_predict_step

    model = build(shape, fusions)
    step = make_predict_step(embeddings=True, logits=False, perplexity=False, unpadded=unpadded)
    inputs = {"tokens": ids, "attention_mask": mask, "padding": mask, "host_lengths": mask.sum(1).cpu()}

    def embeddings() -> torch.Tensor:
        outputs = step(model, inputs)
        assert isinstance(outputs, dict)  # the whole model (no pipeline stage) returns its outputs by name
        return outputs["embeddings"].cpu()

    with torch.inference_mode():
        ours = timed(embeddings)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            embeddings()
        print(f"unpadded={unpadded}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
    return ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shape", default="150m")
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--length", type=int, default=270)
    parser.add_argument("--fusions", action="store_true", help="fused bias-dropout-add")
    parser.add_argument("--unpadded", action="store_true", help="also time the unpadded step")
    args = parser.parse_args()
    ids, mask = batch(args.tokens, args.length)
    ours = time_ours(args.shape, args.fusions, ids, mask, unpadded=False)
    flat = time_ours(args.shape, args.fusions, ids, mask, unpadded=True) if args.unpadded else None
    torch.cuda.empty_cache()
    from transformers import EsmConfig, EsmModel

    from bionemo.esm2.catalog import ESM2_SHAPES

    shape = ESM2_SHAPES[f"esm2-{args.shape}"]
    hf_config = EsmConfig(
        vocab_size=33, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads, intermediate_size=shape.ffn_hidden_size,
        position_embedding_type="rotary", token_dropout=True, mask_token_id=32, pad_token_id=1,
        max_position_embeddings=1026, attn_implementation="sdpa",
    )  # fmt: skip
    hf = EsmModel(hf_config, add_pooling_layer=False).to(torch.bfloat16).eval()  # pyright: ignore[reportArgumentType]
    hf = hf.to(torch.device("cuda"))  # pyright: ignore[reportArgumentType]
    with torch.inference_mode():
        theirs = timed(lambda: hf(input_ids=ids, attention_mask=mask).last_hidden_state.mean(1).float().cpu())
    tokens = int(mask.sum())
    print(f"batch {tuple(ids.shape)}, {tokens} real tokens, fusions={args.fusions}")
    print(f"ours {ours:.1f} ms ({tokens / ours * 1000:,.0f} tokens/s); HF {theirs:.1f} ms "
          f"({tokens / theirs * 1000:,.0f} tokens/s); HF / ours {theirs / ours:.2f}")  # fmt: skip
    if flat is not None:
        speed = tokens / flat * 1000
        print(f"ours unpadded {flat:.1f} ms ({speed:,.0f} tokens/s); HF / ours unpadded {theirs / flat:.2f}")


if __name__ == "__main__":
    main()
