"""NeMo's loss-reduction base, imported after making megatron-core importable on GPU-less machines."""

from bionemo.core.megatron_env import prepare_megatron_import

prepare_megatron_import()

from nemo.lightning.megatron_parallel import MegatronLossReduction  # noqa: E402

__all__ = ["MegatronLossReduction"]
