"""The cluster environment of Lightning-strategy runs: Lightning's own choice, without asking mpi4py needlessly.

(bionemo.recipes.trainers._cluster_environment)
"""

import os

import lightning.pytorch as pl
import pytest
from lightning.fabric.plugins.environments.mpi import MPIEnvironment

from bionemo.recipes.settings import Accelerator, RunSettings
from bionemo.recipes.trainers import build_trainer

LAUNCHER_PREFIXES = ("SLURM_", "LSB_", "TORCHELASTIC_", "OMPI_", "PMI_", "PMIX_", "MV2_", "MPI_", "HYDRA_")
SCENARIOS = {
    "plain process": {},
    "Open MPI": {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"},
    "MPICH / Hydra": {"PMI_RANK": "0", "PMI_SIZE": "1"},
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
    launched_by_mpi = scenario in ("Open MPI", "MPICH / Hydra")
    assert len(mpi_questions) - asked_by_lightning == int(launched_by_mpi)  # ours asks MPI only where launched
    assert asked_by_lightning == int(scenario in ("plain process", "Open MPI", "MPICH / Hydra"))
