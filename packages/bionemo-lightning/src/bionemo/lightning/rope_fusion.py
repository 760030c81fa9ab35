"""Rotary position embeddings for megatron-core without Transformer Engine, compiled into fused kernels.

megatron-core fuses RoPE only through Transformer Engine (``apply_rope_fusion``). Without it every
application to a query or key runs about six elementwise kernels over the whole tensor (cos and sin of the
frequencies, two multiplies, a negate and a concatenation for the half rotation, an add, and a final
concatenation), forward and backward: 22% of the GPU time of a training step of the ``esm2-gpu`` recipe
(12 x 1024, 1024 residues) on an H200. :func:`install_compiled_rope` compiles megatron's own function with
megatron's fuser (``torch.compile``), so the same arithmetic runs as one kernel per direction.
"""

from collections.abc import Callable
from typing import Any

__all__ = ["install_compiled_rope"]


def install_compiled_rope(compile: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None) -> bool:
    """Replace megatron-core's unfused ``[s, b, h, d]`` RoPE with a compiled version of the same function.

    Affects every megatron model in the process that applies RoPE without ``apply_rope_fusion``; other
    position embeddings and packed (THD) sequences are untouched.

    Args:
        compile: How to compile the function; megatron-core's ``jit_fuser`` (``torch.compile``) by default.

    Returns:
        ``True`` when installed now, ``False`` when it already was.
    """
    from megatron.core.models.common.embeddings import rope_utils

    original = rope_utils._apply_rotary_pos_emb_bshd
    if getattr(original, "_bionemo_compiled", False):
        return False
    if compile is None:
        from megatron.core.jit import jit_fuser

        compile = jit_fuser
    compiled = compile(original)

    def apply_rotary_pos_emb_bshd(*args: Any, **kwargs: Any) -> Any:
        return compiled(*args, **kwargs)

    apply_rotary_pos_emb_bshd._bionemo_compiled = True  # type: ignore[attr-defined]
    apply_rotary_pos_emb_bshd.__wrapped__ = original  # type: ignore[attr-defined]
    rope_utils._apply_rotary_pos_emb_bshd = apply_rotary_pos_emb_bshd
    return True
