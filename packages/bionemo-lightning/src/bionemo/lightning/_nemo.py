"""NeMo and megatron imports of this package, made after megatron-core is importable on GPU-less machines."""

from bionemo.core.megatron_env import prepare_megatron_import

prepare_megatron_import()

from nemo.lightning import io  # noqa: E402
from nemo.lightning.megatron_parallel import CallbackConnector, MegatronStep  # noqa: E402
from nemo.lightning.pytorch.optim import MegatronOptimizerModule  # noqa: E402
from nemo.lightning.pytorch.strategies import MegatronStrategy  # noqa: E402

__all__ = ["CallbackConnector", "MegatronOptimizerModule", "MegatronStep", "MegatronStrategy", "io"]
