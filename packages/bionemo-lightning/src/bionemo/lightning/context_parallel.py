"""Old import path: the public names of :mod:`bionemo.layers.context_parallel`, where this module now lives."""

from bionemo.layers.context_parallel import (
    chunk_length,
    context_parallel_group,
    gather_keys,
    gather_sequence,
    local_chunk,
)

__all__ = ["chunk_length", "context_parallel_group", "gather_keys", "gather_sequence", "local_chunk"]
