"""The rank arithmetic without processes: shares of a round and of a step, the reduction of per-rank
metrics, and the launcher's reading of the environment and of `trainer.devices`."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rewards.base import ScoreReport
from trainers import distributed, launch
from trainers.validation import ConfigError


def test_a_steps_shares_cover_the_one_process_batch_exactly():
    order = list(range(21))  # 21 records, 2 ranks: the odd one out is cut so both take as many steps
    shares = [distributed.shard_records(order, r, 2) for r in (0, 1)]
    assert shares == [list(range(0, 20, 2)), list(range(1, 20, 2))]
    batch = 8  # global: 4 per rank; step k of rank r = records r, r+2, ... of the step's 8
    for k in range(2):
        step = order[k * batch:(k + 1) * batch]
        assert sorted(distributed.shard(step, 0, 2) + distributed.shard(step, 1, 2)) == step


def test_groups_stay_whole_when_a_round_is_sharded():
    prompts = [(f"p{i}", i) for i in range(5)]  # one entry = one group (its samples are made on one rank)
    shares = [distributed.shard(prompts, r, 2) for r in (0, 1)]
    assert [gid for _, gid in shares[0]] == [0, 2, 4] and [gid for _, gid in shares[1]] == [1, 3]


def test_combine_weights_by_each_ranks_share_and_takes_maxima():
    parts = [(30.0, {"loss": 1.0, "ratio_max": 1.5, "train/ess_frac/source_replay": 0.5}),
             (10.0, {"loss": 3.0, "ratio_max": 2.5})]
    out = distributed.combine(parts)
    assert out["loss"] == pytest.approx(1.5)  # (30·1 + 10·3) / 40, not the mean of means (2.0)
    assert out["ratio_max"] == 2.5
    assert out["train/ess_frac/source_replay"] == 0.5  # a slice only rank 0 saw


def test_score_reports_merge_in_rank_order():
    a = ScoreReport([1.0, None], abstained=1, first_error=None, per_source={"v": [1.0, None]})
    b = ScoreReport([0.0], errors=1, first_error="boom", per_source={"v": [0.0], "gold": [1.0]})
    m = ScoreReport.merge([a, b])
    assert m.scores == [1.0, None, 0.0] and (m.abstained, m.errors, m.first_error) == (1, 1, "boom")
    assert m.per_source == {"v": [1.0, None, 0.0], "gold": [None, None, 1.0]}


def trainer(**kw):
    return OmegaConf.create({"accelerator": "cpu", "devices": 1, "num_nodes": 1, "strategy": "auto"} | kw)


@pytest.mark.parametrize("devices,expected", [(1, 1), (4, 4), ("2", 2), ("0,1,2", 3), ([0, 1], 2), ("auto", 1)])
def test_processes_per_node(devices, expected):
    assert launch.processes_per_node(trainer(devices=devices)) == expected  # "auto" on a CPU: 1


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
