"""LoRA adapters on megatron-core's tensor-parallel linear layers, in plain torch (no Transformer Engine).

A :class:`LoRALinear` wraps a ``ColumnParallelLinear`` or ``RowParallelLinear`` (or a subclass, such as
:mod:`bionemo.layers.fused_bias_linear`'s) and adds ``scale * dropout(x) @ A.T @ B.T`` to its output, with
``A [rank, in]`` (kaiming-uniform, as peft), ``B [out, rank]`` (zeros) and ``scale = alpha / rank``: the model is
unchanged until ``B`` has trained. Under tensor parallelism the factors are split as NeMo's
``ParallelLinearAdapter`` splits its ``linear_in`` / ``linear_out``:

- column-parallel base (input replicated, output split): ``A`` split along ``rank`` (its output gathered),
  ``B`` along ``out``: this rank's update is its slice of the output, as the base's is;
- row-parallel base (input split, output all-reduced): ``A`` split along ``in`` (its partial products summed
  over ranks), ``B`` along ``out`` (gathered): every rank holds the whole update, as the base's output is whole.

So ``rank`` must be a multiple of the tensor-parallel size where a column-parallel layer is adapted. Sequence
parallelism is not supported. Dropout draws from torch's default generator: on a row-parallel layer's split input,
ranks seeded alike draw the same mask pattern on their shards (megatron's own split dropout forks its CUDA RNG
tracker instead). :func:`apply_lora` adapts a model in place; :func:`merge_lora` folds the updates
into the base weights; :func:`lora_state_dict` / :func:`load_lora_state_dict` save and load the whole factors.

Where an MLP's fc2 is adapted and its activation is an exact GELU, :func:`apply_lora` moves the GELU into the adapted
fc2 (the MLP passes the pre-activation on): with a frozen base on one tensor-parallel rank the backward then keeps
the pre-activation alone and recomputes the GELU, instead of keeping both ``[tokens, ffn]`` tensors, about a quarter
of a LoRA step's activations. :func:`merge_lora` puts the GELU back.

An adapted layer's ``state_dict`` and ``sharded_state_dict`` keep the base's keys (``weight``, ``bias``) where the
unadapted layer had them, next to ``lora_A.weight`` / ``lora_B.weight``: base checkpoints load into an adapted
model (``strict=False``: the adapters are then missing) and an adapted model's base weights save as before.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from bionemo.layers._tensor_parallel import gather_along, gather_last_dim, group_size, shard_of
from bionemo.layers.fused_bias_linear import accumulate_weight_gradient, computes_locally, into_main_grad

__all__ = [
    "LoRAConfig",
    "LoRALinear",
    "LoRATarget",
    "apply_lora",
    "load_lora_state_dict",
    "lora_modules",
    "lora_state_dict",
    "merge_lora",
]

_FACTORS = ("lora_A", "lora_B")


class LoRATarget(StrEnum):
    """The linear layers of a megatron-core transformer layer that can get adapters (values: their module paths)."""

    QKV = "self_attention.linear_qkv"
    """The fused query/key/value projection (column-parallel)."""
    PROJ = "self_attention.linear_proj"
    """The attention output projection (row-parallel)."""
    FC1 = "mlp.linear_fc1"
    """The MLP's first linear, hidden -> ffn (column-parallel)."""
    FC2 = "mlp.linear_fc2"
    """The MLP's second linear, ffn -> hidden (row-parallel)."""


def _valid_targets() -> str:
    return ", ".join(f"{t.name.lower()} ({t.value})" for t in LoRATarget)


@dataclass(kw_only=True, slots=True)
class LoRAConfig:
    """Which layers get LoRA adapters and their shape."""

    rank: int = 8
    """Inner dimension ``r`` of the update ``B @ A``; a multiple of the tensor-parallel size for column-parallel
    targets (qkv, fc1)."""
    alpha: float = 16.0
    """The update is scaled by ``alpha / rank``."""
    dropout: float = 0.0
    """Dropout probability on the adapter's input (the base layer sees the input undropped), in ``[0, 1)``."""
    targets: frozenset[LoRATarget] = frozenset(LoRATarget)
    """Layers to adapt in every transformer layer; members of :class:`LoRATarget` or their values."""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank={self.rank!r}: valid is an integer >= 1")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or not 0 < self.alpha < math.inf:
            raise ValueError(f"alpha={self.alpha!r}: valid is a finite number > 0")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r}: valid is a number in [0, 1)")
        if isinstance(self.targets, str) or not self.targets:
            raise ValueError(f"targets={self.targets!r}: valid is a non-empty set of {_valid_targets()}")
        targets = set()
        for target in self.targets:
            try:
                targets.add(LoRATarget(target))
            except ValueError:
                raise ValueError(f"targets: {target!r} is no LoRA target; valid: {_valid_targets()}") from None
        self.targets = frozenset(targets)

    @property
    def scale(self) -> float:
        """``alpha / rank``, the factor on ``B @ A``."""
        return self.alpha / self.rank


class _Factor(torch.nn.Module):
    """One LoRA factor: this rank's shard of ``A`` or ``B`` as ``weight``, tagged with megatron's TP attributes."""

    def __init__(self, shard: torch.Tensor, partition_dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(shard)
        # megatron's grad-norm clipping counts a tensor-parallel parameter on every rank (it is not a duplicate)
        set_tensor_model_parallel_attributes(self.weight, is_parallel=True, dim=partition_dim, stride=1)


class LoRALinear(torch.nn.Module):
    """A megatron parallel linear ``base`` plus a trainable low-rank update (see the module docstring).

    ``forward`` takes what ``base.forward`` takes and returns ``(output + update, bias)`` where ``base`` returns
    ``(output, bias)`` (with ``skip_bias_add`` the bias stays apart, otherwise it is ``None``); the update has the
    output's layout (this rank's slice for a column-parallel base, the whole output when it gathers or is
    row-parallel). ``lora_A.weight`` / ``lora_B.weight`` hold this rank's shards; ``A`` is drawn whole from torch's
    default generator and sliced, so ranks seeded alike (megatron's convention) hold the shards of one ``A``, the
    one tensor parallelism 1 draws from the same seed.

    ``activation``, when given, is applied to the input first, for the base and the update alike (an MLP's GELU
    moved into its fc2, see the module docstring).

    Raises:
        TypeError: ``base`` is neither a ``ColumnParallelLinear`` nor a ``RowParallelLinear``.
        ValueError: sequence parallelism, a row-parallel base that splits its input itself, or ``rank`` not a
            multiple of the tensor-parallel size for a column-parallel base.
    """

    def __init__(
        self,
        base: torch.nn.Module,
        config: LoRAConfig,
        activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.activation = activation
        if isinstance(base, ColumnParallelLinear):
            self.parallel: Literal["column", "row"] = "column"
        elif isinstance(base, RowParallelLinear):
            self.parallel = "row"
            if not base.input_is_parallel:
                raise ValueError("LoRA on a RowParallelLinear with input_is_parallel=False: not supported")
        else:
            raise TypeError(f"LoRA adapts megatron ColumnParallelLinear / RowParallelLinear, got {type(base).__name__}")
        if base.sequence_parallel:
            raise ValueError("LoRA under sequence parallelism: not supported; valid: sequence_parallel=False")
        if base.weight is None:
            raise ValueError(
                "LoRA on a linear layer without its own weight (skip_weight_param_allocation): not supported"
            )
        self.group = base.tp_group
        size = self.tp_size = group_size(self.group)
        if self.parallel == "column" and config.rank % size:
            raise ValueError(
                f"rank={config.rank} with tensor parallelism {size}: valid is a multiple of {size} "
                "(a column-parallel layer's A is split along rank)"
            )
        if base.output_size % size:
            raise ValueError(f"LoRA on a layer of {base.output_size} outputs: B splits them over {size} ranks")
        self.base: ColumnParallelLinear | RowParallelLinear = base
        self.rank, self.scale = config.rank, config.scale
        self.dropout = torch.nn.Dropout(config.dropout) if config.dropout > 0 else torch.nn.Identity()
        weight = base.weight
        whole_a = torch.empty(config.rank, base.input_size, dtype=torch.float32, device=weight.device)
        torch.nn.init.kaiming_uniform_(whole_a, a=math.sqrt(5))  # peft's (and torch Linear's) initialization
        a_dim = self.partition_dims[0]
        self.lora_A = _Factor(shard_of(whole_a, a_dim, self.group).to(weight.dtype), a_dim)
        out_local = base.output_size // size  # B is split along out for either base (NeMo's linear_out)
        self.lora_B = _Factor(torch.zeros(out_local, config.rank, dtype=weight.dtype, device=weight.device), 0)
        self.register_state_dict_post_hook(_base_keys_in_place)
        self.register_load_state_dict_pre_hook(_base_keys_under_base)

    @property
    def partition_dims(self) -> tuple[int, int]:
        """The dimensions along which ``A`` and ``B`` are split over tensor-parallel ranks."""
        return (0, 0) if self.parallel == "column" else (1, 0)

    def forward(self, input_: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``base(input_, *args, **kwargs)`` with the low-rank update added to its output."""
        a, b = self.lora_A.weight, self.lora_B.weight
        if self.activation is not None:
            if self._activates_in_one_node(input_):
                weight, bias = self.base.weight, self.base.bias
                into_main = (into_main_grad(a), into_main_grad(b))
                return _GeluLowRank.apply(input_, weight, bias, a, b, self.scale, into_main), None
            input_ = self.activation(input_)
        output, bias = self.base(input_, *args, **kwargs)
        if self.tp_size == 1 and _one_node_applies(output, input_, a, b):
            into_main = (into_main_grad(a), into_main_grad(b))  # before apply: its forward runs without grad mode
            return _LowRankUpdate.apply(output, self.dropout(input_), a, b, self.scale, into_main), bias
        return torch.add(output, self._unscaled(input_, self._gathers_output(args, kwargs)), alpha=self.scale), bias

    def update(self, input_: torch.Tensor, gather_output: bool = False) -> torch.Tensor:
        """``scale * dropout(input_) @ A.T @ B.T`` in the base output's layout; ``input_`` as the layer gets it."""
        if self.activation is not None:
            input_ = self.activation(input_)
        return self._unscaled(input_, gather_output) * self.scale

    def _unscaled(self, input_: torch.Tensor, gather_output: bool) -> torch.Tensor:
        """``dropout(input_) @ A.T @ B.T``; without tensor parallelism two GEMMs and nothing else (fewer launches)."""
        x = self.dropout(input_)
        if self.tp_size == 1:
            return F.linear(F.linear(x, self.lora_A.weight), self.lora_B.weight)
        group = self.group
        if self.parallel == "column":
            x = copy_to_tensor_model_parallel_region(x, group=group)  # backward: sum the input gradient over ranks
            hidden = gather_last_dim(F.linear(x, self.lora_A.weight), group)  # [..., rank]
        else:
            hidden = reduce_from_tensor_model_parallel_region(F.linear(x, self.lora_A.weight), group=group)
        hidden = copy_to_tensor_model_parallel_region(hidden, group=group)
        out = F.linear(hidden, self.lora_B.weight)  # this rank's slice of the output
        if self.parallel == "row" or gather_output:
            out = gather_last_dim(out, group)
        return out

    def _activates_in_one_node(self, input_: torch.Tensor) -> bool:
        """Whether :class:`_GeluLowRank` computes this call: GELU, a frozen base that runs locally, no dropout."""
        base, weight = self.base, self.base.weight
        return (
            self.activation is F.gelu
            and self.tp_size == 1
            and isinstance(self.dropout, torch.nn.Identity)
            and computes_locally(base)
            and not any(param.requires_grad for param in base.parameters())
            and weight is not None
            and _one_node_applies(weight, input_, self.lora_A.weight, self.lora_B.weight)
        )

    def _gathers_output(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        """Whether a column-parallel base gathers this call's output (megatron's ``runtime_gather_output``)."""
        if self.parallel == "row":
            return False
        runtime = kwargs.get("runtime_gather_output", args[1] if len(args) > 1 else None)
        return bool(self.base.gather_output if runtime is None else runtime)

    def whole_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of ``(A [rank, in], B [out, rank])``, gathered over tensor-parallel ranks (a collective)."""
        a_dim, b_dim = self.partition_dims
        whole = (
            gather_along(self.lora_A.weight.detach(), a_dim, self.group),
            gather_along(self.lora_B.weight.detach(), b_dim, self.group),
        )
        return whole if group_size(self.group) > 1 else (whole[0].clone(), whole[1].clone())

    def load_whole_factors(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Set the factors from whole ``A [rank, in]`` and ``B [out, rank]``; this rank keeps its shards."""
        a_dim, b_dim = self.partition_dims
        for factor, whole, dim, name in ((self.lora_A, a, a_dim, "lora_A"), (self.lora_B, b, b_dim, "lora_B")):
            shard = shard_of(whole, dim, self.group) if whole.shape[dim] % group_size(self.group) == 0 else None
            if shard is None or shard.shape != factor.weight.shape:
                expected = list(factor.weight.shape)
                expected[dim] *= group_size(self.group)
                raise ValueError(f"{name}.weight of shape {tuple(whole.shape)}: valid is {tuple(expected)}")
            with torch.no_grad():
                factor.weight.copy_(shard)

    def merged_weight(self) -> torch.Tensor:
        """This rank's base weight with ``scale * B @ A`` added (computed in fp32, returned in the weight's dtype)."""
        a, b = self.lora_A.weight.detach().float(), self.lora_B.weight.detach().float()
        if self.parallel == "column":
            a = gather_along(a, 0, self.group)  # the whole A against this rank's rows of B
        else:
            b = gather_along(b, 0, self.group)  # the whole B against this rank's columns of A
        weight = self.base.weight
        assert weight is not None  # checked when built
        return (weight.detach().float() + self.scale * (b @ a)).to(weight.dtype)

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        """Megatron's distributed-checkpoint view: the base's entries at its own keys, the factors split over TP."""
        entries = dict(self.base.sharded_state_dict(prefix, sharded_offsets, metadata))
        factors = {f"{name}.weight": getattr(self, name).weight for name in _FACTORS}
        axes = {f"{name}.weight": dim for name, dim in zip(_FACTORS, self.partition_dims, strict=True)}
        entries.update(make_sharded_tensors_for_checkpoint(factors, prefix, axes, sharded_offsets))
        return entries


def _one_node_applies(output: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether :class:`_LowRankUpdate` computes this update: one dtype throughout and no autocast to cast it."""
    return not torch.is_autocast_enabled(x.device.type) and output.dtype == x.dtype == a.dtype == b.dtype


class _LowRankUpdate(torch.autograd.Function):
    """``output + scale * x @ A.T @ B.T`` as one autograd node, for one tensor-parallel rank.

    Autograd's version of the same sum is four nodes whose scaled add costs a pass over the output in the forward
    and another in the backward; here the add is the second GEMM's epilogue (``addmm``) and the backward is four
    GEMMs on ``[tokens, rank]`` intermediates, which matters because a LoRA step is bound by the host's launches.
    Under megatron's DDP (a factor with an fp32 ``main_grad``) the factors' gradients go straight into
    ``main_grad``, as :class:`bionemo.layers.fused_bias_linear.LinearIntoMainGrad` does for weights. ``output``'s
    gradient passes through unchanged.
    """

    @staticmethod
    def forward(
        ctx: Any,
        output: torch.Tensor,
        x: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        scale: float,
        into_main: tuple[bool, bool],
    ) -> torch.Tensor:
        """``output [..., out] + scale * x @ a.T @ b.T`` for ``x [..., in]``, ``a [r, in]``, ``b [out, r]``."""
        hidden = x.reshape(-1, x.shape[-1]) @ a.t()
        updated = torch.addmm(output.reshape(-1, output.shape[-1]), hidden, b.t(), alpha=scale)
        ctx.save_for_backward(x, hidden, a, b)
        ctx.scale = scale
        ctx.into_main_grad = into_main
        return updated.view(output.shape)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Gradients of ``output`` (passed through), ``x``, ``a`` and ``b`` (``into_main``: into ``main_grad``)."""
        (grad,) = grad_outputs
        x, hidden, a, b = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        grad_hidden = (rows @ b).mul_(ctx.scale)  # [tokens, r]
        grad_a = _factor_gradient(a, grad_hidden, x.reshape(-1, x.shape[-1]), ctx.into_main_grad[0])
        grad_b = _factor_gradient(b, rows, hidden * ctx.scale, ctx.into_main_grad[1])
        grad_x = (grad_hidden @ a).view(x.shape) if ctx.needs_input_grad[1] else None
        return grad, grad_x, grad_a, grad_b, None, None


class _GeluLowRank(torch.autograd.Function):
    """A frozen base's ``F.linear(gelu(x), weight, bias) + scale * gelu(x) @ A.T @ B.T`` as one autograd node.

    It keeps ``x`` (the pre-activation) and not ``gelu(x)``: the backward recomputes the GELU, one elementwise pass.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        a: torch.Tensor,
        b: torch.Tensor,
        scale: float,
        into_main: tuple[bool, bool],
    ) -> torch.Tensor:
        """``[..., out]`` from ``x [..., in]``, ``weight [out, in]``, ``a [r, in]``, ``b [out, r]``."""
        activated = F.gelu(x.reshape(-1, x.shape[-1]))
        output = F.linear(activated, weight, bias)
        hidden = activated @ a.t()
        output.addmm_(hidden, b.t(), alpha=scale)
        ctx.save_for_backward(x, hidden, weight, a, b)
        ctx.scale, ctx.into_main_grad = scale, into_main
        return output.view(*x.shape[:-1], output.shape[-1])

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Gradients of ``x``, ``a`` and ``b`` (the base is frozen: none for ``weight`` and ``bias``)."""
        (grad,) = grad_outputs
        x, hidden, weight, a, b = ctx.saved_tensors
        rows, x_rows = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        grad_hidden = (rows @ b).mul_(ctx.scale)  # [tokens, r]
        grad_a = _factor_gradient(a, grad_hidden, F.gelu(x_rows), ctx.into_main_grad[0])
        grad_b = _factor_gradient(b, rows, hidden * ctx.scale, ctx.into_main_grad[1])
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_activated = (rows @ weight).addmm_(grad_hidden, a)
            grad_x = torch.ops.aten.gelu_backward(grad_activated, x_rows).view(x.shape)
        return grad_x, None, None, grad_a, grad_b, None, None


def _applied_by_fc2(hidden: torch.Tensor) -> torch.Tensor:
    """An MLP's activation once :func:`apply_lora` has moved its GELU into the adapted fc2: the identity."""
    return hidden


def _moves_gelu(parent: torch.nn.Module, child: str) -> bool:
    """Whether ``parent.<child>`` is a megatron MLP's fc2 after a plain exact GELU (no GLU, no fused or TE GELU)."""
    config = getattr(parent, "config", None)
    return (
        child == "linear_fc2"
        and getattr(parent, "activation_func", None) is F.gelu
        and config is not None
        and not config.gated_linear_unit
        and not config.bias_activation_fusion
        and not getattr(config, "use_te_activation_func", False)
    )


def _factor_gradient(factor: Any, grad_rows: torch.Tensor, input_rows: torch.Tensor, into_main: bool) -> torch.Tensor:
    """``grad_rows.T @ input_rows``, or, under megatron's DDP, that added into ``factor.main_grad`` (then a dummy)."""
    if not into_main:
        return grad_rows.t() @ input_rows
    accumulate_weight_gradient(factor.main_grad, grad_rows, input_rows)
    factor.grad_added_to_main_grad = True
    return torch.empty_like(factor)  # megatron's dummy: DDP's hook skips it (grad_added_to_main_grad)


def _base_keys_in_place(module: torch.nn.Module, state: dict[str, Any], prefix: str, _metadata: Any) -> None:
    """State-dict post-hook: ``<prefix>base.<key>`` becomes ``<prefix><key>``, the unadapted layer's key."""
    under_base = prefix + "base."
    for key in [k for k in state if k.startswith(prefix)]:
        value = state.pop(key)
        state[prefix + key[len(under_base) :] if key.startswith(under_base) else key] = value


def _base_keys_under_base(module: torch.nn.Module, state: dict[str, Any], prefix: str, *_args: Any) -> None:
    """Load-state-dict pre-hook: the inverse of :func:`_base_keys_in_place` (older ``base.`` keys load too)."""
    own = (*(f"{name}." for name in _FACTORS), "base.", "dropout.")
    for key in [k for k in state if k.startswith(prefix) and not k[len(prefix) :].startswith(own)]:
        state[prefix + "base." + key[len(prefix) :]] = state.pop(key)


def _is_target(name: str, targets: frozenset[LoRATarget]) -> bool:
    return any(name == t.value or name.endswith("." + t.value) for t in targets)


def lora_modules(model: torch.nn.Module) -> dict[str, LoRALinear]:
    """Every :class:`LoRALinear` in ``model`` by its module name."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def apply_lora(model: torch.nn.Module, config: LoRAConfig) -> list[str]:
    """Wrap every target linear of ``model`` in a :class:`LoRALinear` in place; freeze everything else.

    Targets are the modules whose name ends with a target's path (``decoder.layers.3.self_attention.linear_qkv``).
    Every parameter of ``model`` stops requiring gradients except the new adapters' (unfreeze a head
    afterwards). Returns the adapted modules' names in ``named_modules`` order.

    Raises:
        ValueError: no module matches, ``model`` already has adapters, or :class:`LoRALinear` refuses a layer.
        TypeError: a target is not a megatron parallel linear.
    """
    if adapted := lora_modules(model):
        raise ValueError(f"the model already has LoRA adapters ({sorted(adapted)[0]}, ...); merge_lora first")
    names = [name for name, _ in model.named_modules() if _is_target(name, config.targets)]
    if not names:
        wanted = ", ".join(sorted(t.value for t in config.targets))
        raise ValueError(f"no module of {type(model).__name__} is named *.{{{wanted}}}; valid: {_valid_targets()}")
    for param in model.parameters():
        param.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        if _moves_gelu(parent, child):
            setattr(parent, "activation_func", _applied_by_fc2)  # noqa: B010 (a plain function, not a Module)
            setattr(parent, child, LoRALinear(getattr(parent, child), config, activation=F.gelu))
        else:
            setattr(parent, child, LoRALinear(getattr(parent, child), config))
    return names


def merge_lora(model: torch.nn.Module) -> list[str]:
    """Fold every adapter's ``scale * B @ A`` into its base weight and put the base layer back in its place.

    Correct under tensor parallelism (a collective: every rank of a tensor-parallel group calls it). The base
    layers keep their ``requires_grad``. Returns the merged modules' names.
    """
    merged = lora_modules(model)
    for name, module in merged.items():
        weight = module.base.weight
        assert weight is not None  # checked when built
        with torch.no_grad():
            weight.copy_(module.merged_weight())
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, module.base)
        if module.activation is not None:
            setattr(parent, "activation_func", module.activation)  # noqa: B010 (a plain function, not a Module)
    return list(merged)


def lora_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the whole adapters: ``{"<m>.lora_A.weight": A [rank, in], "<m>.lora_B.weight": B [out, rank]}``.

    Gathered over tensor-parallel ranks (a collective; every rank returns the same tensors), in megatron's
    layout of the base weight (for ``linear_qkv`` its per-query-group q/k/v interleaving), so that an export
    needs no knowledge of the parallel layout. Raises ``ValueError`` for a gated fc1 (GLU) under tensor
    parallelism, whose shards do not concatenate to the whole layout.
    """
    state: dict[str, torch.Tensor] = {}
    for name, module in lora_modules(model).items():
        if (
            group_size(module.group) > 1
            and getattr(module.base.config, "gated_linear_unit", False)
            and (name.endswith(LoRATarget.FC1.value))
        ):
            raise ValueError(f"{name}: whole adapters of a gated fc1 under tensor parallelism are not supported")
        a, b = module.whole_factors()
        state[f"{name}.lora_A.weight"], state[f"{name}.lora_B.weight"] = a, b
    return state


def load_lora_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load whole adapters (as :func:`lora_state_dict` gives them) into ``model``'s adapters, each rank its shards.

    Raises:
        ValueError: keys missing or unexpected (both listed), or a tensor of the wrong shape.
    """
    modules = lora_modules(model)
    expected = {f"{name}.{factor}.weight" for name in modules for factor in _FACTORS}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"LoRA state dict: missing keys {missing}, unexpected keys {unexpected}")
    for name, module in modules.items():
        try:
            module.load_whole_factors(state[f"{name}.lora_A.weight"], state[f"{name}.lora_B.weight"])
        except ValueError as error:
            raise ValueError(f"{name}.{error}") from None
