import os
import subprocess
import sys

import pytest
import torch

from bionemo.core.skip_unified_memory_build import SWITCH


def run_clean(code: str, *, skip_build: bool) -> str:
    """``code`` in a fresh interpreter without the two variables (and with the build skip on or off); its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME", SWITCH)}
    if not skip_build:
        env[SWITCH] = "1"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the quirk exists only on GPU-less machines")
def test_megatron_imports_after_prepare_in_a_clean_process_without_the_build_skip():
    # megatron builds its extension: the environment variables make the build fail cleanly
    code = (
        "from bionemo.core.megatron_env import prepare_megatron_import\n"
        "assert prepare_megatron_import()\n"
        "import megatron.core.parallel_state\n"
        "print('imported')\n"
    )
    assert "imported" in run_clean(code, skip_build=False)


def test_with_the_build_skip_no_environment_variable_is_set():
    code = (
        "import os\n"
        "from bionemo.core.megatron_env import prepare_megatron_import\n"
        "assert not prepare_megatron_import()\n"
        "import megatron.core.parallel_state\n"
        "print(os.environ.get('CUDA_HOME'), os.environ.get('TORCH_CUDA_ARCH_LIST'))\n"
    )
    assert run_clean(code, skip_build=True).split() == ["None", "None"]


def test_prepare_keeps_user_values(monkeypatch):
    from bionemo.core.megatron_env import prepare_megatron_import

    monkeypatch.setenv(SWITCH, "1")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    monkeypatch.setenv("CUDA_HOME", "/opt/user-cuda")  # also keeps the session's environment as it was
    needed = prepare_megatron_import()
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0"
    assert os.environ["CUDA_HOME"] == "/opt/user-cuda"
    assert needed is (not torch.cuda.is_available())
