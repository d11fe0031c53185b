"""The launcher's reading of the environment: when train.py starts the ranks itself, and the
environments it refuses (leaked SLURM variables, self-launching strategies, nodes without a launcher)."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from run import launch
from run.errors import ConfigError


def trainer(**kw):
    return OmegaConf.create({"accelerator": "cpu", "devices": 1, "num_nodes": 1, "strategy": "auto"} | kw)


def test_a_job_asking_for_ranks_is_launched_unless_a_launcher_started_it(monkeypatch):
    for key in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    assert launch.needs_launch(trainer(devices=2)) and not launch.needs_launch(trainer(devices=1))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert not launch.needs_launch(trainer(devices=2))


def test_leaked_slurm_variables_are_named(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    with pytest.raises(ConfigError, match=r"SLURM_JOB_ID, SLURM_NTASKS\) with SLURM_NTASKS=1.*asks for 2"):
        launch.check_environment(trainer(devices=2, strategy="ddp"))
    monkeypatch.setenv("SLURM_NTASKS", "2")  # one SLURM task per rank: runs in place
    launch.check_environment(trainer(devices=2, strategy="ddp"))


def test_self_launching_strategies_and_nodes_without_a_launcher_are_refused(monkeypatch):
    for key in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="trainer.strategy=ddp_spawn"):
        launch.check_environment(trainer(devices=2, strategy="ddp_spawn"))
    with pytest.raises(ConfigError, match="trainer.num_nodes=2: start the job on every node"):
        launch.check_environment(trainer(devices=2, num_nodes=2, strategy="ddp"))
