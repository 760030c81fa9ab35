"""Keep the libraries' chatter off the terminal of ``bionemo run`` and of the Python API's runs.

The notes megatron-core, NeMo and torch print while they are imported are hidden wherever bionemo is imported,
by :mod:`bionemo.core.import_notes` (the one list of them); this module adds what only a run hides:
Lightning's informational lines, hints addressed to the authors of the model code, deprecation notices raised
inside the libraries, and megatron-core's and OneLogger's log lines below errors. Errors, bionemo's own messages
and any other warning still reach stderr.

:func:`quiet_libraries` silences them for the rest of the process (``bionemo run``; ``--verbose`` lets them
through); :func:`libraries_quieted` for a ``with`` block only, then puts every filter and logger level back (the
Python API: :func:`bionemo.esm2.finetune.api.finetune` leaves the caller's process as it found it). Standard
library only.
"""

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from bionemo.core.import_notes import SHOW_IMPORT_NOTES, quiet_import_notes

__all__ = ["libraries_quieted", "quiet_libraries"]

# Regexes matched against the start of warnings the CLI user cannot act on. They are filtered under the
# category ``Warning``, not ``UserWarning``: NeMo's warning hook drops *every* warning of a category that has
# any "ignore" filter, so a filter on ``UserWarning`` itself would hide unrelated warnings too.
_IGNORED_MESSAGES = (
    # Lightning hints for module authors: bionemo's modules reduce their metrics and shard data themselves.
    r"It is recommended to use `self\.log\(.*sync_dist=True",
    r"Using `DistributedSampler` with the dataloaders\. During `trainer\.(validate|test)\(\)`",
    # Lightning on machines with more than two cores: bionemo chooses the loader workers itself (4 for GPU
    # prediction, 2 for GPU training; none on CPUs, where the model's compute needs the cores and tokenizing is a
    # small share).
    r"The '\w+_dataloader' does not have many workers",
    # Lightning on a resume from a mid-epoch checkpoint: bionemo's datamodule skips the consumed samples itself
    # (bionemo.lightning.data), and a resumed run matches an uninterrupted one (tests/cli/test_cli_runs.py).
    r"You're resuming from a checkpoint that ended before the epoch ended",
)

# Deprecation notices raised from inside these libraries are for their callers' authors, not for CLI users.
# (These categories already carry "ignore" filters from Python and Lightning, so NeMo's hook drops them anyway.)
_LIBRARY_MODULES = (
    r"(megatron|nemo|lightning|lightning_fabric|lightning_utilities|pytorch_lightning|torch|torchmetrics"
    r"|transformers|huggingface_hub|nv_one_logger|modelopt|apex|transformer_engine)(\..*)?$"
)
_DEPRECATIONS: tuple[type[Warning], ...] = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

# Loggers whose warnings and notes are for the libraries' developers (megatron-core's, NeMo's telemetry set-up when a
# Trainer is built): only errors pass.
_ERRORS_ONLY = ("megatron", "nv_one_logger")
# Lightning's informational lines ("GPU available: ...", "`Trainer.fit` stopped: ...", "Initializing
# distributed: ...", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: ...") come from these loggers; their warnings pass.
# Lightning sets its package logger ("lightning.pytorch") to INFO when first imported, so the level is set
# on the loggers that speak, which it leaves alone.
_WARNINGS_AND_UP = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.distributed",
    "lightning.pytorch.accelerators.cuda",
)


def _drop_info(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def quiet_libraries(verbose: bool = False) -> None:
    """Silence the named library warnings and log lines for the rest of this process.

    Call at the start of a command, before torch, Lightning, NeMo or megatron-core are imported: several of the
    silenced warnings are raised while those modules are imported. Nothing is imported here.

    Args:
        verbose: Change no filter or logger, so that every library line shows (``--verbose``); the environment
            then holds ``BIONEMO_SHOW_IMPORT_NOTES=1``, so that this process and those it starts also show the
            import notes bionemo's packages hide.
    """
    if verbose:
        os.environ[SHOW_IMPORT_NOTES] = "1"
        return
    quiet_import_notes()
    for message in _IGNORED_MESSAGES:
        warnings.filterwarnings("ignore", message=message, category=Warning)
    for category in _DEPRECATIONS:
        warnings.filterwarnings("ignore", category=category, module=_LIBRARY_MODULES)
    for name in _ERRORS_ONLY:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in _WARNINGS_AND_UP:
        logging.getLogger(name).setLevel(logging.WARNING)
    # NeMo resets its logger's level (and its handlers') when imported; a logger filter survives that.
    nemo_logger = logging.getLogger("nemo_logger")
    if _drop_info not in nemo_logger.filters:
        nemo_logger.addFilter(_drop_info)


@contextmanager
def libraries_quieted(verbose: bool = False) -> Iterator[None]:
    """:func:`quiet_libraries` inside the ``with`` block only.

    At exit the warning filters and ``warnings.showwarning`` (NeMo replaces it when first imported), the levels of
    the loggers :func:`quiet_libraries` sets and the NeMo logger's filters are as they were at entry. Not thread-safe
    (``warnings.catch_warnings`` is not).

    Args:
        verbose: Change nothing: every library line shows (the environment is left alone too).
    """
    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in (*_ERRORS_ONLY, *_WARNINGS_AND_UP)]
    levels = [logger.level for logger in loggers]
    nemo_logger = logging.getLogger("nemo_logger")
    nemo_filters = list(nemo_logger.filters)
    with warnings.catch_warnings():
        try:
            quiet_libraries()
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)
            nemo_logger.filters[:] = nemo_filters
