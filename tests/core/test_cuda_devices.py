"""The environment-only GPU probe: "certainly no GPU" only where torch would say so too; otherwise torch answers."""

import sys

import pytest
import torch

from bionemo.core import cuda_devices
from bionemo.core.cuda_devices import cuda_available, cuda_device_count, no_cuda_by_environment


def machine(tmp_path, dev_files=(), proc_gpus=()):
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    dev.mkdir()
    for name in dev_files:
        (dev / name).touch()
    gpus = proc / "driver" / "nvidia" / "gpus"
    gpus.mkdir(parents=True)
    for name in proc_gpus:
        (gpus / name).mkdir()
    return {"dev": dev, "proc": proc}


@pytest.mark.parametrize(
    ("dev_files", "proc_gpus", "none"),
    [
        ((), (), True),  # a CPU machine
        (("null", "nvidiactl", "nvidia-uvm"), (), True),  # the driver's control files, no GPU
        (("nvidia0",), (), False),
        (("nvidia0", "nvidia1", "nvidiactl"), (), False),
        (("dxg",), (), False),  # WSL
        ((), ("0000:17:00.0",), False),  # driver loaded, device files not made yet (nvidia-modprobe makes them)
    ],
)
def test_no_cuda_only_without_device_files_or_driver_gpus(tmp_path, monkeypatch, dev_files, proc_gpus, none):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert no_cuda_by_environment(**machine(tmp_path, dev_files, proc_gpus)) is none


@pytest.mark.parametrize(("visible", "none"), [("", True), ("-1", True), ("-1,0", True), ("0", False), ("1,0", False)])
def test_cuda_visible_devices_hiding_every_device_means_no_cuda(tmp_path, monkeypatch, visible, none):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(sys, "platform", "linux")
    assert no_cuda_by_environment(**machine(tmp_path, ("nvidia0",))) is none


def test_other_systems_always_ask_torch(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(sys, "platform", "win32")
    assert no_cuda_by_environment(**machine(tmp_path)) is False


def test_the_counts_are_torch_s_on_this_machine():
    assert cuda_device_count() == torch.cuda.device_count()
    assert cuda_available() is torch.cuda.is_available()


def test_a_possible_gpu_is_counted_by_torch(monkeypatch):
    monkeypatch.setattr(cuda_devices, "no_cuda_by_environment", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_device_count() == 3
    assert cuda_available() is True
