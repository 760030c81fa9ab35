"""LoRA on one megatron parallel linear, built from whole tensors: run at TP1 in the test process and at TP2 in gloo
workers (importable by spawned processes)."""

import torch
import torch.distributed as dist

IN, OUT, RANK, ALPHA = 6, 8, 4, 3.0
TOKENS, BATCH = 5, 3


def whole_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Base weight/bias, non-zero LoRA factors, an input and an output gradient, the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(OUT, IN, generator=gen),
        "bias": torch.randn(OUT, generator=gen),
        "A": torch.randn(RANK, IN, generator=gen),
        "B": torch.randn(OUT, RANK, generator=gen),
        "x": torch.randn(TOKENS, BATCH, IN, generator=gen),
        "grad": torch.randn(TOKENS, BATCH, OUT, generator=gen),
    }


def transformer_config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=1, hidden_size=IN, num_attention_heads=1, use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
    )  # fmt: skip


def parallel_linear(kind: str, fused: bool, skip_bias_add: bool, tensors: dict[str, torch.Tensor]):
    """A column- or row-parallel layer (megatron's, or bionemo.layers' fused-bias subclass) holding this rank's
    shards of the whole ``weight`` / ``bias``."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    from bionemo.layers.fused_bias_linear import FusedBiasColumnParallelLinear, FusedBiasRowParallelLinear

    if kind == "column":
        cls = FusedBiasColumnParallelLinear if fused else ColumnParallelLinear
        extra = {"gather_output": False}
    else:
        cls = FusedBiasRowParallelLinear if fused else RowParallelLinear
        extra = {"input_is_parallel": True}
    layer = cls(
        IN, OUT, config=transformer_config(), init_method=torch.nn.init.zeros_, bias=True,
        skip_bias_add=skip_bias_add, **extra,
    )  # fmt: skip
    size = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    with torch.no_grad():
        if kind == "column":
            layer.weight.copy_(tensors["weight"].chunk(size, 0)[rank])
            layer.bias.copy_(tensors["bias"].chunk(size, 0)[rank])
        else:
            layer.weight.copy_(tensors["weight"].chunk(size, 1)[rank])
            layer.bias.copy_(tensors["bias"])
    return layer


def _gather(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    from megatron.core import parallel_state

    size = parallel_state.get_tensor_model_parallel_world_size()
    if size == 1:
        return tensor
    shards = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(shards, tensor.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    return torch.cat(shards, dim=dim)


def lora_case(kind: str, fused: bool = False, skip_bias_add: bool = False, seed: int = 0) -> dict:
    """Whole outputs, whole gradients and whole merged weight of one adapted layer at the current TP size."""
    from megatron.core import parallel_state

    from bionemo.layers import LoRAConfig, LoRALinear, lora_state_dict, merge_lora

    size = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    tensors = whole_tensors(seed)
    base = parallel_linear(kind, fused, skip_bias_add, tensors)
    torch.manual_seed(seed + 100)
    layer = LoRALinear(base, LoRAConfig(rank=RANK, alpha=ALPHA))
    drawn = lora_state_dict(torch.nn.ModuleDict({"linear": layer}))  # the whole A as initialized, B zeros
    layer.load_whole_factors(tensors["A"], tensors["B"])
    for param in base.parameters():
        param.requires_grad_(False)
    x = tensors["x"] if kind == "column" else tensors["x"].chunk(size, -1)[rank]
    x = x.clone().requires_grad_()
    output, bias = layer(x)
    if bias is not None:
        output = output + bias
    grad = tensors["grad"].chunk(size, -1)[rank] if kind == "column" else tensors["grad"]
    output.backward(grad)
    whole_output = _gather(output.detach(), -1) if kind == "column" else output.detach()
    whole_x_grad = x.grad if kind == "column" else _gather(x.grad, -1)
    a_dim, b_dim = layer.partition_dims
    result = {
        "output": whole_output,
        "x_grad": whole_x_grad,
        "A_grad": _gather(layer.lora_A.weight.grad, a_dim),
        "B_grad": _gather(layer.lora_B.weight.grad, b_dim),
        "base_grads": [p.grad for p in base.parameters()],
        "drawn_A": drawn["linear.lora_A.weight"],
        "drawn_B": drawn["linear.lora_B.weight"],
    }
    container = torch.nn.ModuleDict({"linear": layer})
    assert merge_lora(container) == ["linear"]
    assert container["linear"] is base
    with torch.no_grad():
        merged_output, merged_bias = base(x.detach())
    if merged_bias is not None:
        merged_output = merged_output + merged_bias
    result["merged_output"] = _gather(merged_output, -1) if kind == "column" else merged_output
    result["merged_weight"] = _gather(base.weight.detach(), 0 if kind == "column" else 1)
    return result


def tp_worker(rank: int, world_size: int) -> dict:
    """Every case at TP=world_size, plus the rank check on a column-parallel layer."""
    from megatron.core import parallel_state

    from bionemo.layers import LoRAConfig, LoRALinear

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    results = {(kind, fused): lora_case(kind, fused) for kind in ("column", "row") for fused in (False, True)}
    try:
        LoRALinear(parallel_linear("column", False, False, whole_tensors()), LoRAConfig(rank=3))
    except ValueError as error:
        results["rank_error"] = str(error)
    return results
