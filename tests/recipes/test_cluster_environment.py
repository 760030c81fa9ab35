"""The cluster environment of Lightning-strategy runs: Lightning's own choice, without asking mpi4py needlessly.

(bionemo.recipes.trainers._cluster_environment)
"""

import os

import lightning.pytorch as pl
import pytest
from lightning.fabric.plugins.environments.mpi import MPIEnvironment

from bionemo.recipes.settings import Accelerator, RunSettings
from bionemo.recipes.trainers import build_trainer

LAUNCHER_PREFIXES = (
    *("SLURM_", "LSB_", "TORCHELASTIC_"),
    *("OMPI_", "OPAL_", "PMI_", "PMIX_", "MV2_", "MPI_", "HYDRA_", "PALS_"),
)
SCENARIOS = {
    "plain process": {},
    "Open MPI": {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"},
    "MPICH / Hydra": {"PMI_RANK": "0", "PMI_SIZE": "1"},
    "PMIx (srun --mpi=pmix, prterun)": {"PMIX_RANK": "0", "PMIX_NAMESPACE": "job"},
    # MPI settings the GPU machine's image exports in every shell (seen with `env` there): not a launcher
    "container MPI settings": {
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMPI_MCA_plm": "isolated",
        "PMIX_MCA_gds": "hash",
    },
    "SLURM (srun)": {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "job", "SLURM_NODELIST": "n1", "SLURM_PROCID": "0"},
    "torchrun": {
        "TORCHELASTIC_RUN_ID": "r",
        "RANK": "0",
        "GROUP_RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29555",
    },
}


@pytest.fixture
def mpi_questions(monkeypatch):
    """A clean environment; MPIEnvironment.detect counts its calls and answers as a world of one would."""
    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES) or name in ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name)
    calls = []

    def detect() -> bool:
        calls.append(1)
        return False

    monkeypatch.setattr(MPIEnvironment, "detect", staticmethod(detect))
    return calls


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_environment_is_lightnings_choice_and_mpi_is_asked_only_under_an_mpi_launcher(
    monkeypatch, mpi_questions, scenario
):
    for name, value in SCENARIOS[scenario].items():
        monkeypatch.setenv(name, value)
    lightnings = pl.Trainer(accelerator="cpu", devices=1, logger=False)._accelerator_connector.cluster_environment
    asked_by_lightning = len(mpi_questions)
    ours = build_trainer(RunSettings(accelerator=Accelerator.CPU), training=False, callbacks=[])
    chosen = ours._accelerator_connector.cluster_environment  # noqa: SLF001 - where Lightning keeps its choice
    assert type(chosen) is type(lightnings)
    launched_by_mpi = scenario in ("Open MPI", "MPICH / Hydra", "PMIx (srun --mpi=pmix, prterun)")
    assert len(mpi_questions) - asked_by_lightning == int(launched_by_mpi)  # ours asks MPI only where launched
    assert asked_by_lightning == int(scenario not in ("SLURM (srun)", "torchrun"))


def test_a_one_process_predict_does_not_import_an_installed_mpi4py(tmp_path):
    """NVIDIA's PyTorch images have mpi4py; Lightning's MPI question imports ``mpi4py.MPI`` (MPI_Init)."""
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "mpi4py").mkdir(parents=True)
    (site / "mpi4py" / "__init__.py").write_text("raise ImportError('mpi4py was imported')\n")
    (site / "mpi4py-0.0.1.dist-info").mkdir()
    (site / "mpi4py-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mpi4py\nVersion: 0.0.1\n")
    (site / "mpi4py-0.0.1.dist-info" / "RECORD").write_text("mpi4py/__init__.py,,\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env |= SCENARIOS["container MPI settings"]  # as in those images' shells
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "bionemo.cli", "run", "predict", "--accelerator", "cpu"]
    result = subprocess.run(
        [*command, "--output-dir", str(tmp_path / "out")], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / "predictions.safetensors").exists()
    probe = "import lightning.fabric.plugins.environments.mpi as m; print(bool(m._MPI4PY_AVAILABLE))"
    seen = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert seen.stdout.strip() == "True"  # Lightning sees it installed, and would have imported it
