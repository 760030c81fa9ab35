"""Resuming megatron-core's distributed optimizer over torch Adam: ``step`` stays out of the copied moments.

Resuming ``fit`` with megatron-core 0.15.3's distributed optimizer over torch Adam (no Apex or
TransformerEngine) failed twice. Building the sharded state dict asserts one ``step`` per parameter state, which
a fresh optimizer has not made yet (``BionemoLightningModule.configure_optimizers`` makes it up front, see
:func:`bionemo.lightning.init_adam_state`). And every parameter-state loader hands
``DistributedOptimizer._set_main_param_and_optimizer_states`` the moments without ``step`` (the step is restored
from the param groups) while that method copies every key of the live state: ``KeyError: 'step'``.
:func:`install` wraps the method to leave ``step`` alone, and to give each parameter its own ``step`` tensor: the
one restored from the param groups is a single tensor shared by all of them, which torch Adam would advance once
per parameter per step. Applied for ``fit`` only (where optimizer state is loaded); restored at teardown.
"""

import functools
from typing import Any

from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = ["DISTRIBUTED_OPTIMIZER_STEP", "install"]


def install(patches: Patches) -> None:
    """Wrap ``DistributedOptimizer._set_main_param_and_optimizer_states`` through ``patches`` (once)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states
    if getattr(original, "_bionemo_keeps_step", False):
        return

    @functools.wraps(original)
    def set_states(self: Any, model_param: Any, tensors: dict[str, Any]) -> None:
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
            if "step" in state:
                # load_state_dict restored it from the param groups as ONE tensor shared by every parameter,
                # which Adam would advance once per parameter per step: each parameter gets its own copy
                state["step"] = state["step"].clone()
                tensors = {**tensors, "step": state["step"]}
        original(self, model_param, tensors)

    set_states._bionemo_keeps_step = True  # type: ignore[attr-defined]
    patches.set(DistributedOptimizer, "_set_main_param_and_optimizer_states", set_states)


DISTRIBUTED_OPTIMIZER_STEP = Workaround(
    name="distributed_optimizer_step",
    upstream="megatron-core's DistributedOptimizer copies a 'step' the torch Adam moments it loads do not have",
    verified={"megatron-core": "0.15.3"},
    sources={
        "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer._set_main_param_and_optimizer_states": (
            "93c254228283b2df"
        ),
    },
    stages=frozenset({"fit"}),
    install=install,
)
