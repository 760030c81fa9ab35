"""Small random Hugging Face ESM-2 models built in the test (nothing downloaded), inputs for them, damage to them."""

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

RESIDUES = "LAGVSERTIDPKQNFYMHWCXBUZO"


def random_hf_esm(
    path: Path | None = None,
    *,
    hidden: int = 64,
    heads: int = 4,
    layers: int = 2,
    ffn: int | None = None,
    token_dropout: bool = True,
    seed: int = 0,
    safetensors: bool = True,
):
    """An ``EsmForMaskedLM`` with every parameter random (LayerNorms too), saved to ``path`` if given."""
    from transformers import EsmConfig, EsmForMaskedLM

    config = EsmConfig(
        vocab_size=33,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn or 4 * hidden,
        max_position_embeddings=1026,
        position_embedding_type="rotary",
        token_dropout=token_dropout,
        mask_token_id=32,
        pad_token_id=1,
        emb_layer_norm_before=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(seed)
    model = EsmForMaskedLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                param.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(param))
            else:
                param.copy_(
                    torch.randn_like(param) / param.shape[-1] ** 0.5
                    if param.dim() > 1
                    else 0.1 * torch.randn_like(param)
                )
    if path is not None:
        model.save_pretrained(path, safe_serialization=safetensors)
    return model


def mutate_config(folder: Path, **changes) -> None:
    """Change entries of a Hugging Face folder's ``config.json``."""
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def edit_weights(folder: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Rewrite a Hugging Face folder's ``model.safetensors`` after ``edit`` changed its tensors in place."""
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def random_sequences(count: int, seed: int = 0, low: int = 5, high: int = 40) -> list[str]:
    """Protein strings of random lengths over every residue letter ESM-2 knows."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=gen).tolist()
    return ["".join(RESIDUES[i] for i in torch.randint(len(RESIDUES), (n,), generator=gen).tolist()) for n in lengths]


def hf_outputs(model, sequences: list[str]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per sequence: Hugging Face's logits ``[L + 2, 33]`` and the mean last hidden state over residues."""
    from bionemo.esm2.tokenizer import ProteinTokenizer

    tokenizer = ProteinTokenizer()
    logits, embeddings = [], []
    with torch.no_grad():
        for sequence in sequences:  # one at a time: no padding in the reference
            ids = tokenizer.encode(sequence)[None]
            out = model(input_ids=ids, output_hidden_states=True)
            logits.append(out.logits[0])
            embeddings.append(out.hidden_states[-1][0, 1:-1].mean(0))
    return logits, torch.stack(embeddings)


def padded_batch(sequences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    from bionemo.esm2.tokenizer import ProteinTokenizer

    tokenizer = ProteinTokenizer()
    encoded = [tokenizer.encode(s) for s in sequences]
    length = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), length), tokenizer.pad_id)
    mask = torch.zeros(len(encoded), length, dtype=torch.bool)
    for row, e in enumerate(encoded):
        ids[row, : len(e)] = e
        mask[row, : len(e)] = True
    return ids, mask


def bionemo_outputs(folder, sequences: list[str], tp: int = 1, keep: dict | None = None):
    """Our logits per sequence ``[L + 2, 33]`` and mean residue embeddings, from one padded batch.

    ``keep["model"]`` receives the model when given.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state

    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.model import ESM2Config

    checkpoint = load_checkpoint(folder)
    config = ESM2Config(tensor_model_parallel_size=tp, **checkpoint.model)
    model = config.configure_model().eval()
    apply_weights(model, checkpoint.tensors)
    if keep is not None:
        keep["model"] = model
    ids, mask = padded_batch(sequences)
    with torch.no_grad():
        logits, hidden = model(ids, mask, output_hidden=True)
    if tp > 1:  # gather the vocabulary slices (megatron's own gather needs CUDA)
        shards = [torch.empty_like(logits) for _ in range(tp)]
        dist.all_gather(shards, logits.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        logits = torch.cat(shards, dim=-1)
    logits, hidden = logits.transpose(0, 1)[..., :33], hidden.transpose(0, 1)
    lengths = mask.sum(1).tolist()
    per_sequence = [logits[i, :n] for i, n in enumerate(lengths)]
    embeddings = torch.stack([hidden[i, 1 : n - 1].mean(0) for i, n in enumerate(lengths)])
    return per_sequence, embeddings


def esm2_hf_tp_worker(rank, world_size, folder, sequences):
    from megatron.core import parallel_state

    from bionemo.esm2.checkpoints.weights import full_state_dict

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    keep: dict = {}
    logits, embeddings = bionemo_outputs(folder, sequences, tp=world_size, keep=keep)
    return {"logits": logits, "embeddings": embeddings, "full": full_state_dict(keep["model"])}
