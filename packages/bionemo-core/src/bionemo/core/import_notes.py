"""Hide the notes megatron-core, NeMo and torch print while they are imported on a machine without TE, Apex or CUDA.

Importing megatron-core 0.15.3 without Transformer Engine or Apex warns four times that it falls back to torch
code, logs that one of its experimental functions "has reached end of life", and makes torch log
``No CUDA runtime is found, using CUDA_HOME=...`` on a machine with the CUDA toolkit but no GPU; importing NeMo
adds two lines of its telemetry (OneLogger) set-up. None of them asks anything of the user. These notes, and
only these, are hidden by :func:`quiet_import_notes`: each is matched by its message and by the module or logger
that raises it, so the same warning raised by other code, and any other warning or log line of these libraries,
still shows. ``BIONEMO_SHOW_IMPORT_NOTES=1`` in the environment shows them (``bionemo run --verbose`` sets it).

Standard library only: called before torch or megatron-core are imported (by
:func:`bionemo.core.megatron_env.prepare_megatron_import`, which every bionemo package calls before it imports
megatron-core or NeMo).
"""

import logging
import os
import re
import warnings

__all__ = ["IMPORT_LOG_NOTES", "IMPORT_WARNINGS", "SHOW_IMPORT_NOTES", "quiet_import_notes"]

SHOW_IMPORT_NOTES = "BIONEMO_SHOW_IMPORT_NOTES"
"""Environment variable: ``1`` leaves warning filters and loggers as they are (every import note shows)."""

IMPORT_WARNINGS: tuple[tuple[str, str], ...] = (
    # megatron-core without Apex / Transformer Engine: it falls back to torch code (optimizers, norms, multi-tensor
    # kernels; its vendored megatron_fsdp says it too)
    (r"Transformer Engine and Apex are not installed", r"megatron(_fsdp)?(\.|$)"),
    (r"Apex is not installed", r"megatron(_fsdp)?(\.|$)"),
    (r"Transformer Engine is not installed", r"megatron(_fsdp)?(\.|$)"),
    # megatron-core's inference unified-memory pool, which bionemo never uses, cannot be built without a GPU
    (r"Failed to create unified memory mempool", r"megatron\."),
)
"""``(message, module)`` regexes, matched at the start of a warning's text and of the raising module's name."""

IMPORT_LOG_NOTES: dict[str, str] = {
    # torch.utils.cpp_extension, imported by megatron-core, where the CUDA toolkit is installed but no GPU shows
    "torch.utils.cpp_extension": r"No CUDA runtime is found, using CUDA_HOME=",
    # megatron-core's experimental-API decorator about one of its own functions
    "megatron.core.utils": r"\w+ has reached end of life\. Please migrate to a non-experimental function",
    # NeMo's telemetry (OneLogger) set-up: disabled on this rank, nothing exported
    "nv_one_logger.api.config": r"OneLogger: Setting error_handling_strategy to DISABLE_QUIETLY",
    "nv_one_logger.training_telemetry.api.training_telemetry_provider": r"No exporters were provided",
}
"""Logger name -> regex matched at the start of the logged message: the log lines hidden, each on its own logger."""


class _KnownNote(logging.Filter):
    """Drops the records of one logger whose message starts with one known note."""

    def __init__(self, logger: str, message: str) -> None:
        super().__init__(logger)
        self.note = re.compile(message)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != self.name or self.note.match(record.getMessage()) is None


_FILTERS = {name: _KnownNote(name, message) for name, message in IMPORT_LOG_NOTES.items()}


def quiet_import_notes() -> bool:
    """Hide the known import notes (:data:`IMPORT_WARNINGS`, :data:`IMPORT_LOG_NOTES`) for the rest of the process.

    Call before megatron-core, NeMo or torch's ``cpp_extension`` are imported; calling again changes nothing.
    The warning filters are filed under the category ``Warning``, not ``UserWarning``: NeMo's warning hook drops
    every warning of a category that has any "ignore" filter, so a filter on ``UserWarning`` would hide unrelated
    warnings too.

    Returns:
        False when :data:`SHOW_IMPORT_NOTES` is ``1`` (nothing was changed), else True.
    """
    if os.environ.get(SHOW_IMPORT_NOTES) == "1":
        return False
    for message, module in IMPORT_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=Warning, module=module)
    for name, note in _FILTERS.items():
        logger = logging.getLogger(name)
        if note not in logger.filters:
            logger.addFilter(note)
    return True
