"""Run a function in N real gloo processes (torch.multiprocessing) and collect what each returns."""

import contextlib
import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessRaisedException, start_processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, out_dir: str) -> None:
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()  # a spawned process: before its workers import megatron-core (as conftest does here)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save({"ok": result}, os.path.join(out_dir, f"{rank}.pt"))
    except BaseException:
        torch.save({"error": traceback.format_exc()}, os.path.join(out_dir, f"{rank}.pt"))
        raise
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], world_size: int = 2, *args: Any) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes; return their results by rank."""
    with tempfile.TemporaryDirectory() as out_dir:
        # A failing worker's traceback is read from its result file below.
        with contextlib.suppress(ProcessRaisedException):
            start_processes(
                _worker, args=(world_size, _free_port(), fn, args, out_dir), nprocs=world_size, start_method="spawn"
            )
        results = []
        for rank in range(world_size):
            path = os.path.join(out_dir, f"{rank}.pt")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {rank} of {world_size} produced no result")
            record = torch.load(path, weights_only=False)
            if "error" in record:
                raise RuntimeError(f"rank {rank} failed:\n{record['error']}")
            results.append(record["ok"])
        return results
