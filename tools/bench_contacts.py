"""Contact prediction on one GPU: parity with transformers' ``predict_contacts`` and the cost of the maps.

A random ``EsmForMaskedLM`` (random contact head) of the given shape, converted as ``--checkpoint`` would be;
one padded batch of random-length proteins. Prints the largest difference to transformers' fp32 contacts
(ours in fp32 and in bf16) and the forward time and peak memory with and without contacts.

    python3 tools/bench_contacts.py --layers 30 --hidden 640 --heads 20 --batch 16 --longest 512
"""

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bionemo.core.megatron_env import prepare_megatron_import

prepare_megatron_import()


def main() -> None:
    parser = argparse.ArgumentParser(description="Contact prediction on one GPU: parity and cost.")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=480)
    parser.add_argument("--heads", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--longest", type=int, default=256, help="residues of the longest protein")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from transformers import EsmConfig, EsmForMaskedLM

    from bionemo.esm2.checkpoint import load_checkpoint
    from bionemo.esm2.contacts import ContactHead
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.weights import apply_weights
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    config = EsmConfig(
        vocab_size=33, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden, max_position_embeddings=1026, position_embedding_type="rotary",
        token_dropout=True, mask_token_id=32, pad_token_id=1, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = EsmForMaskedLM(config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
    folder = Path(tempfile.mkdtemp()) / "hf"
    hf.save_pretrained(folder)
    loaded: Any = EsmForMaskedLM.from_pretrained(folder, attn_implementation="eager")
    hf = loaded.eval().cuda()

    lengths = torch.randint(args.longest // 4, args.longest + 1, (args.batch,)).tolist()
    lengths[0] = args.longest
    s = args.longest + 2
    ids = torch.full((args.batch, s), 1, dtype=torch.long)
    mask = torch.zeros(args.batch, s, dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, 0], ids[row, 1 : n + 1], ids[row, n + 1] = 0, torch.randint(4, 24, (n,)), 2
        mask[row, : n + 2] = True
    ids, mask = ids.cuda(), mask.cuda()
    with torch.no_grad():  # one protein at a time: transformers holds every layer's maps at once
        reference = [hf.predict_contacts(ids[i : i + 1, : n + 2], mask[i : i + 1, : n + 2].long())[0].float()
                     for i, n in enumerate(lengths)]  # fmt: skip
    del hf

    checkpoint = load_checkpoint(folder)
    head = ContactHead.from_tensors(checkpoint.tensors, checkpoint.model)
    for dtype in (torch.float32, torch.bfloat16):
        model = ESM2Config(**checkpoint.model, params_dtype=dtype, bf16=dtype == torch.bfloat16).configure_model()
        apply_weights(model, checkpoint.tensors)
        model = model.to(dtype).cuda().eval()

        def run(contacts: bool, model=model):
            maps = head.logits(ids, mask) if contacts else None
            with torch.no_grad():
                model(ids, mask, output_hidden=True, output_logits=False, **({"attention_maps": maps} if maps else {}))
            return maps

        maps = run(True)
        assert maps is not None
        ours = maps.probabilities()
        worst = max((ours[i, :n, :n] - reference[i]).abs().max().item() for i, n in enumerate(lengths))
        for contacts in (False, True):
            run(contacts)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            for _ in range(args.repeats):
                run(contacts)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - start) / args.repeats * 1000
            peak = torch.cuda.max_memory_allocated() / 2**30
            print(
                f"{str(dtype):15s} contacts={contacts!s:5s} {ms:8.1f} ms/forward  peak {peak:6.2f} GiB"
                + (f"  max |ours - transformers fp32| = {worst:.2e}" if contacts else "")
            )
        del model


if __name__ == "__main__":
    main()
