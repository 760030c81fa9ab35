"""One call from a checkpoint path to a ready ESM-2 model, for use from Python (notebooks, scripts)."""

from pathlib import Path

__all__ = ["load_model"]


def load_model(path: Path | str, *, device: str = "cpu"):
    """An :class:`~bionemo.esm2.model.ESM2Model` in eval mode with the weights of ``path``, on ``device``.

    ``path`` is a Hugging Face ESM-2 folder or a bionemo ``.safetensors`` file (see
    :func:`bionemo.esm2.checkpoint.load_checkpoint`). Sets up megatron's parallel state for one process
    (tensor / pipeline parallel size 1) if nothing else has.

    Raises:
        CheckpointError: The checkpoint cannot be used (the message says why).
    """
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    from bionemo.esm2.checkpoint import load_checkpoint
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.weights import apply_weights
    from bionemo.lightning import ensure_model_parallel

    checkpoint = load_checkpoint(Path(path))
    ensure_model_parallel()
    model = ESM2Config(**checkpoint.model).configure_model()
    apply_weights(model, checkpoint.tensors)
    return model.to(device).eval()
