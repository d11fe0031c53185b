"""Weight-sync seconds and bytes of an engine that holds its own copy of the weights (generator=vllm,
vllm_server) reach the ledger: each round's share as perf/, the stage's sums as cost/, and a resumed run's
restored totals go on growing from the engine's fresh counters."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from callbacks.regenerate import RegenerateExperience


def callback(generator) -> RegenerateExperience:
    return RegenerateExperience(generator, reward=SimpleNamespace())


def test_each_round_logs_its_share_and_the_stage_its_sums():
    engine = SimpleNamespace(sync_seconds=0.0, sync_bytes=0.0)
    cb = callback(engine)
    engine.sync_seconds, engine.sync_bytes = 1.5, 1000
    first = cb._weight_sync()
    engine.sync_seconds, engine.sync_bytes = 2.0, 3000
    second = cb._weight_sync()
    assert first == {"perf/weight_sync_seconds": 1.5, "perf/weight_sync_bytes": 1000.0,
                     "cost/weight_sync_seconds": 1.5, "cost/weight_sync_bytes": 1000.0}
    assert second["perf/weight_sync_seconds"] == pytest.approx(0.5) and second["perf/weight_sync_bytes"] == 2000.0
    assert (second["cost/weight_sync_seconds"], second["cost/weight_sync_bytes"]) == (2.0, 3000.0)
    assert cb.totals["weight_sync_bytes"] == 3000.0  # summary.json's cost/weight_sync_bytes


def test_a_resumed_run_adds_the_fresh_engine_counts_to_its_restored_totals():
    before = callback(SimpleNamespace(sync_seconds=4.0, sync_bytes=800))
    before._weight_sync()
    resumed = callback(SimpleNamespace(sync_seconds=0.0, sync_bytes=0))  # a new engine counts from 0
    resumed.load_state_dict(before.state_dict())
    resumed.generator.sync_seconds, resumed.generator.sync_bytes = 1.0, 200
    assert resumed._weight_sync()["cost/weight_sync_bytes"] == 1000.0


def test_an_engine_that_samples_the_policy_itself_logs_nothing():
    assert callback(SimpleNamespace())._weight_sync() == {}


def test_asynchronous_rounds_leave_the_weight_syncs_to_their_own_ledger():
    """With callbacks.regenerate.max_staleness > 0 and generator=vllm_server, the engine's counters are the
    loads alone; the async ledger (callbacks/async_rounds.py) counts the staging of each version too. Before
    this, the round ledger's load-only totals overwrote the async ones in summary.json's cost/ keys."""
    engine = SimpleNamespace(sync_seconds=0.0, sync_bytes=0.0)
    cb = callback(engine)
    cb.ahead = SimpleNamespace()  # an AsyncRounds
    engine.sync_seconds, engine.sync_bytes = 1.5, 1000
    assert cb._weight_sync() == {} and "weight_sync_seconds" not in cb.totals
