"""The rank arithmetic without processes: shares of a round and of a step, the reduction of per-rank
metrics, and the reading of `trainer.devices` (the launcher's reading of the environment: tests/run/test_launch.py)."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from hardware import distributed, processes
from rewards.base import ScoreReport


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
    assert processes.processes_per_node(trainer(devices=devices)) == expected  # "auto" on a CPU: 1


def test_close_destroys_the_process_group_and_is_a_no_op_without_one(tmp_path):
    """train.py (and the rank scripts) end with close(): gloo left to interpreter exit can abort a
    finished rank (SIGABRT), which failed a 2-rank FSDP test in CI. A 1-process gloo group here."""
    import torch.distributed as dist
    distributed.close()  # nothing to destroy: no error
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    assert dist.is_initialized()
    distributed.close()
    assert not dist.is_initialized()
