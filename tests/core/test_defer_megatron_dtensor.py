"""megatron-core without torch's DTensor and FSDP packages in the ``bionemo`` command, until a run uses them.

(bionemo.core.defer_megatron_dtensor)
"""

import hashlib
import importlib
import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bionemo.core.defer_megatron_dtensor import (
    LAZY,
    LINES,
    SWITCH,
    UPSTREAM_SHA256,
    DTensor,
    Shard,
    defer_megatron_dtensor,
    distributed_getattr,
)
from bionemo.core.skip_unified_memory_build import VERIFIED_MEGATRON_CORE, UnverifiedMegatronWarning
from support.import_hooks import (
    check_already_imported_modules_are_left_alone,
    check_another_version_is_left_alone_and_said_once,
)
from support.import_hooks import clean_meta_path as clean_hooks
from support.import_hooks import run_bionemo_probe as probe

# A clean process running the real `bionemo` entry point with a command added to its app: it imports megatron-core,
# reports whether torch's DTensor / FSDP packages came with it, then asks for the FSDP classes by name and hands
# megatron's DTensor helpers a real DTensor (a one-process gloo group).
CHILD = textwrap.dedent(
    """
    import json, sys
    import typer
    from bionemo.cli import app as cli
    from bionemo.core.megatron_env import prepare_megatron_import

    @cli.app.command("probe")
    def probe() -> None:
        prepare_megatron_import()
        import megatron.core
        from megatron.core import utils
        grads = sys.modules["megatron.core.distributed.finalize_model_grads"]  # the package's name is a function

        imported = {name: name in sys.modules for name in ("torch.distributed.tensor", "torch.distributed.fsdp")}
        from megatron.core.distributed import FullyShardedDataParallel, TorchFullyShardedDataParallel

        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        whole = torch.arange(6.0)
        dtensor = distribute_tensor(whole, init_device_mesh("cpu", (1,)), [Shard(0)])
        sharded = grads._reshard_if_dtensor(whole * 2, dtensor)
        print(json.dumps({
            "imported_with_megatron": imported,
            "stand_in_module": utils.DTensor.__module__,
            "fsdp_classes": [FullyShardedDataParallel.__module__, TorchFullyShardedDataParallel.__module__],
            "to_local": utils.to_local_if_dtensor(dtensor).tolist(),
            "plain_kept": utils.to_local_if_dtensor(whole) is whole,
            "unsharded": grads._unshard_if_dtensor(dtensor).tolist(),
            "resharded_type": type(sharded).__name__,
            "resharded": sharded.full_tensor().tolist(),
        }))
        dist.destroy_process_group()
        raise typer.Exit(0)

    sys.argv = ["bionemo", "probe"]
    cli.main()
    """
)


def run_bionemo_probe(value: str | None) -> dict:
    return probe(CHILD, SWITCH, value)


def test_canary_the_installed_upstream_files_are_the_verified_ones():
    """Fails when megatron-core changes: re-verify the work-around (or drop it) and update the digests."""
    assert importlib.metadata.version("megatron-core").split("+")[0] == VERIFIED_MEGATRON_CORE
    distribution = importlib.metadata.distribution("megatron-core")
    for (path, digest), (name, lines) in zip(UPSTREAM_SHA256.items(), LINES.items(), strict=True):
        source = Path(str(distribution.locate_file(path))).read_bytes()
        assert hashlib.sha256(source).hexdigest() == digest, path
        assert path.removesuffix(".py").removesuffix("/__init__").replace("/", ".") == name
        assert all(source.decode().count(line) == 1 for line in lines), path


def test_the_command_imports_megatron_without_dtensor_and_its_helpers_still_see_dtensors():
    report = run_bionemo_probe(None)
    assert report["imported_with_megatron"] == {"torch.distributed.tensor": False, "torch.distributed.fsdp": False}
    assert report["stand_in_module"] == "bionemo.core.defer_megatron_dtensor"
    assert report["fsdp_classes"] == [
        "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
        "megatron.core.distributed.torch_fully_sharded_data_parallel",
    ]
    assert report["to_local"] == report["unsharded"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert report["plain_kept"] is True
    assert (report["resharded_type"], report["resharded"]) == ("DTensor", [0.0, 2.0, 4.0, 6.0, 8.0, 10.0])


def test_switched_off_megatron_imports_dtensor_as_upstream_does():
    report = run_bionemo_probe("1")
    assert report["imported_with_megatron"] == {"torch.distributed.tensor": True, "torch.distributed.fsdp": True}
    assert report["stand_in_module"] == "torch.distributed.tensor"  # torch sets DTensor.__module__ so
    assert report["to_local"] == report["unsharded"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert report["resharded"] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


# Run in its own process: a default process group left by another test of the same worker would refuse a second.
STAND_INS = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor as TorchDTensor
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as TorchShard

    from bionemo.core.defer_megatron_dtensor import DTensor, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    whole = torch.arange(4.0)
    dtensor = distribute_tensor(whole, init_device_mesh("cpu", (1,)), [TorchShard(0)])  # the function stand-in
    assert type(dtensor) is TorchDTensor
    assert torch.equal(dtensor.full_tensor(), whole)
    assert isinstance(dtensor, DTensor)
    assert not isinstance(whole, DTensor)
    assert issubclass(TorchDTensor, DTensor)
    assert not issubclass(torch.Tensor, DTensor)
    assert isinstance(dtensor.placements[0], Shard)
    assert not isinstance(Replicate(), Shard)
    assert isinstance(dtensor, (torch.nn.Module, DTensor))
    dist.destroy_process_group()
    print("ok")
    """
)


def test_the_stand_ins_answer_as_torchs_classes():
    result = subprocess.run([sys.executable, "-c", STAND_INS], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_the_stand_ins_answer_false_while_torchs_module_is_not_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch.distributed.tensor", raising=False)
    monkeypatch.delitem(sys.modules, "torch.distributed.tensor.placement_types", raising=False)
    assert not isinstance(torch.ones(2), DTensor)
    assert not issubclass(torch.Tensor, DTensor)
    assert not isinstance(object(), Shard)


def test_the_package_imports_its_fsdp_classes_on_first_use_only(monkeypatch):
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    package = importlib.import_module("megatron.core.distributed")
    for name, module in LAZY.items():
        monkeypatch.delattr(package, name)
        value = distributed_getattr(name)
        assert value is getattr(importlib.import_module(module), name) is getattr(package, name)
        assert value.__name__ == name
    with pytest.raises(AttributeError, match="'megatron.core.distributed' has no attribute 'Nothing'"):
        distributed_getattr("Nothing")


@pytest.fixture
def clean_meta_path(monkeypatch):
    return clean_hooks(monkeypatch, SWITCH, *LINES)


def test_already_imported_modules_are_left_alone(monkeypatch, clean_meta_path):
    check_already_imported_modules_are_left_alone(monkeypatch, LINES, defer_megatron_dtensor, clean_meta_path)


def test_another_version_is_left_alone_and_said_once_per_module(monkeypatch, clean_meta_path):
    check_another_version_is_left_alone_and_said_once(
        monkeypatch, LINES, defer_megatron_dtensor, clean_meta_path, UnverifiedMegatronWarning, "megatron-core"
    )
