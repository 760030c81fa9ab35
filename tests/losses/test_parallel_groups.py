"""``ParallelGroups.current()`` runs once per micro-batch: it must not redo the megatron import preparation."""

import importlib

import torch.distributed as dist

from bionemo.core import megatron_env
from bionemo.losses import ParallelGroups


def test_current_prepares_megatron_only_before_its_first_import(monkeypatch):
    """The preparation lists ``/dev`` and may ask torch for the GPUs: it was 5 ``os.listdir`` per training step."""
    importlib.import_module("megatron.core.parallel_state")  # imported: nothing is left to prepare
    calls = []
    monkeypatch.setattr(megatron_env, "prepare_megatron_import", lambda: calls.append("prepared"))
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    for _ in range(3):
        assert isinstance(ParallelGroups.current(), ParallelGroups)  # megatron's groups, or the world as data parallel
    assert calls == []
