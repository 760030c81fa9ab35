"""Hardware checks and Trainer construction shared by recipes (heavy imports happen inside functions)."""

import os
from pathlib import Path
from typing import Any

from bionemo.recipes.settings import Accelerator, Precision, RunSettings, SettingsError, StrategyChoice

__all__ = [
    "build_trainer",
    "check_hardware",
    "check_output_dir",
    "is_launching_rank",
    "megatron_trainer",
    "uses_megatron",
]


def _cuda_devices() -> int:
    from bionemo.core.cuda_devices import cuda_device_count

    return cuda_device_count()  # torch.cuda.device_count(), without importing torch where there is plainly no GPU


def accelerator(settings: RunSettings) -> str:
    """``"cpu"`` or ``"gpu"`` (``auto`` picks GPUs when there are any)."""
    if settings.accelerator == Accelerator.AUTO:
        return "gpu" if _cuda_devices() > 0 else "cpu"
    return settings.accelerator.value


def uses_megatron(settings: RunSettings, *, training: bool = True) -> bool:
    """Whether the run goes through NeMo's MegatronStrategy or Lightning's own strategies.

    ``auto`` trains on GPUs with MegatronStrategy; prediction uses it only for tensor, pipeline or context
    parallelism (one device or data parallelism needs no model-parallel machinery).
    """
    if settings.strategy == StrategyChoice.AUTO:
        return accelerator(settings) == "gpu" and (training or settings.model_parallel_size() > 1)
    return settings.strategy == StrategyChoice.MEGATRON


def check_hardware(settings: RunSettings, *, training: bool = True) -> None:
    """Refuse layouts that cannot run here, before any process group starts.

    Raises:
        SettingsError: GPUs asked for without any, more devices than there are, devices not divisible by
            TP x PP x CP, model parallelism without MegatronStrategy, or MegatronStrategy on CPU.
    """
    gpus = _cuda_devices()
    if settings.accelerator == Accelerator.GPU and gpus == 0:
        raise SettingsError(
            "--accelerator gpu was asked for, but this machine has no CUDA GPU; use cpu or auto", "--accelerator"
        )
    chosen = accelerator(settings)
    if chosen == "gpu" and settings.devices > gpus:
        raise SettingsError(f"--devices {settings.devices} asked for, but this machine has {gpus} GPU(s)", "--devices")
    world = settings.devices * settings.num_nodes
    if world % settings.model_parallel_size():
        raise SettingsError(
            f"--devices x --num-nodes = {world} is not divisible by tensor x pipeline x context parallel = "
            f"{settings.tensor_parallel} x {settings.pipeline_parallel} x {settings.context_parallel}",
            "--devices",
        )
    if settings.model_parallel_size() > 1 and not uses_megatron(settings, training=training):
        raise SettingsError(
            "tensor, pipeline and context parallelism need --strategy megatron (on GPUs)", "--tensor-parallel"
        )
    if uses_megatron(settings, training=training) and chosen == "cpu":
        raise SettingsError(
            "--strategy megatron needs GPUs (megatron's DDP and optimizers are CUDA-only); on CPU use auto or ddp",
            "--strategy",
        )


def check_output_dir(path: Path, *, create: bool = True) -> None:
    """Create ``path`` if needed and make sure files can be written there.

    ``create=False`` changes nothing on disk: a missing ``path`` passes when its nearest existing parent is a
    writable directory (so a run can refuse its output directory first and leave nothing behind when a later,
    slower check fails).
    """
    if path.exists() and not path.is_dir():
        raise SettingsError(
            f"output directory {path} is an existing file, not a directory; give a directory", "--output-dir"
        )
    if not create:
        _check_creatable(path)
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SettingsError(f"output directory {path} cannot be created: {error.strerror}", "--output-dir") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise SettingsError(f"output directory {path} is not writable", "--output-dir")


def _check_creatable(path: Path) -> None:
    """What ``check_output_dir`` would refuse, found without creating anything."""
    import errno

    parent = path
    while not parent.exists() and parent.parent != parent:
        parent = parent.parent
    if parent == path:
        if not os.access(path, os.W_OK | os.X_OK):
            raise SettingsError(f"output directory {path} is not writable", "--output-dir")
        return
    problem = None
    if not parent.is_dir():
        problem = errno.ENOTDIR
    elif os.statvfs(parent).f_flag & os.ST_RDONLY:
        problem = errno.EROFS
    elif not os.access(parent, os.W_OK | os.X_OK):
        problem = errno.EACCES
    if problem is not None:
        raise SettingsError(f"output directory {path} cannot be created: {os.strerror(problem)}", "--output-dir")


def is_launching_rank() -> bool:
    """True in the process the user started (Lightning's launcher sets LOCAL_RANK > 0 in the ones it starts)."""
    return (
        int(os.environ.get("LOCAL_RANK", "0")) == 0
        and int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))) == 0
    )


def build_trainer(
    settings: RunSettings,
    *,
    training: bool,
    callbacks: list[Any],
    logger: Any = False,
    max_steps: int = -1,
    val_check_interval: int | None = None,
    default_root_dir: Path | None = None,
) -> Any:
    """A Lightning Trainer (CPU, DDP) or NeMo Trainer with MegatronStrategy, per ``settings``.

    Prediction under Lightning's strategies runs at precision 32 whatever ``settings.precision`` says: the
    recipe builds the model's parameters in that precision's type instead (no autocast on every op).
    """
    precision = (settings.precision or Precision.FP32).value
    common: dict[str, Any] = {
        "devices": settings.devices,
        "num_nodes": settings.num_nodes,
        "max_steps": max_steps,
        "callbacks": callbacks,
        "logger": logger,
        # a str: NeMo's Trainer wraps the class of every argument for its IO capture, and wrapping
        # pathlib.PosixPath breaks every later Path() in the process (seen on the GPU machine)
        "default_root_dir": None if default_root_dir is None else str(default_root_dir),
        "num_sanity_val_steps": 0,
        "enable_model_summary": False,
    }
    if training:
        common.update(
            val_check_interval=val_check_interval,
            check_val_every_n_epoch=None,
            limit_val_batches=1.0,
            log_every_n_steps=max(1, min(50, (val_check_interval or 50) // 5)),
        )
    if uses_megatron(settings, training=training):
        return megatron_trainer(settings, training=training, precision=precision, common=common)
    import lightning.pytorch as pl

    from bionemo.recipes.safe_checkpoint_io import SafeCheckpointIO

    world = settings.devices * settings.num_nodes
    return pl.Trainer(
        accelerator=accelerator(settings),
        strategy="ddp" if world > 1 else "auto",
        precision=precision if training else "32",
        plugins=[SafeCheckpointIO(), *_cluster_environment()],
        **common,
    )


_MPI_LAUNCHER_VARIABLES = frozenset((
    "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE",
    "PALS_RANKID",
))  # fmt: skip
"""Variables that Open MPI's mpirun, a PMIx server (Open MPI 5's prterun, ``srun --mpi=pmix``), MPICH / Intel MPI's
Hydra, MVAPICH and Cray PALS set in each process they start. Settings such as ``OMPI_MCA_*`` and ``PMIX_MCA_*``,
which images with an MPI stack export in every shell (the GPU machine's does), say nothing about a launcher."""


def _cluster_environment() -> list[Any]:
    """``[LightningEnvironment()]`` where Lightning would choose it, told without importing mpi4py; else ``[]``.

    Lightning asks TorchElastic, SLURM, LSF, then MPI whether they started the process, and falls back to its own
    environment. Its MPI question imports ``mpi4py.MPI`` wherever mpi4py is installed (as in NVIDIA's PyTorch
    images: 0.37 s of a one-GPU ``run predict``; on a cluster's login node it also initialises MPI) to learn
    that a process no MPI launcher started is an MPI world of one. Here the first three are asked as Lightning
    asks them, and MPI by its launchers' environment variables; where any says yes, Lightning chooses as usual.
    """
    from lightning.fabric.plugins.environments.lightning import LightningEnvironment
    from lightning.fabric.plugins.environments.lsf import LSFEnvironment
    from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
    from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment

    launched = any(environment.detect() for environment in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment))
    if launched or not _MPI_LAUNCHER_VARIABLES.isdisjoint(os.environ):
        return []
    return [LightningEnvironment()]


def megatron_trainer(settings: RunSettings, *, training: bool, precision: str, common: dict[str, Any]) -> Any:
    """NeMo's Trainer with MegatronStrategy (TP / PP / CP from ``settings``) and its mixed precision.

    Pipeline stages exchange activations in the precision's type: NeMo copies the strategy's ``pipeline_dtype``
    onto the model config (None without a mixed-precision plugin, which megatron refuses for PP > 1).
    """
    from nemo import lightning as nl

    strategy = nl.MegatronStrategy(
        tensor_model_parallel_size=settings.tensor_parallel,
        pipeline_model_parallel_size=settings.pipeline_parallel,
        context_parallel_size=settings.context_parallel,
        pipeline_dtype=Precision(precision).torch_dtype(),
        ckpt_async_save=False,
        ckpt_optim_fully_reshardable=True,
        ckpt_load_optimizer=training,
        setup_optimizers=training,
    )
    plugins = nl.MegatronMixedPrecision(precision=precision) if precision != "32" else None  # pyright: ignore[reportArgumentType]
    return nl.Trainer(accelerator="gpu", strategy=strategy, plugins=plugins, use_distributed_sampler=False, **common)
