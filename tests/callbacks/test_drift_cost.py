"""The regeneration policy (rounds ended early on drift, with the reason logged) and the cost ledger,
with a real Lightning Trainer."""
from __future__ import annotations

import lightning as L
import pytest

from callbacks.cost import CostLedger
from callbacks.drift import DriftTrigger
from tests.data_modules.test_replay_mix import fit, stage_cfg

# pure on-policy rounds of 16 records served twice (μ = 2) in batches of 8: 4 steps a round on schedule
ON_POLICY = ["data.replay_ratio=0", "algorithm.epochs_per_round=2"]


class StepsPerEpoch(L.Callback):
    def __init__(self):
        self.steps = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.steps.append(0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps[-1] += 1


def test_rounds_run_their_schedule_without_triggers(tmp_path):
    counter = StepsPerEpoch()
    trainer, _, regenerate = fit(stage_cfg(tmp_path, ON_POLICY), 8, [counter])
    assert counter.steps == [4, 4] and regenerate.triggers == {"start": 1, "schedule": 1}


@pytest.mark.parametrize("thresholds, reason", [
    ({"min_ess_frac": 0.999, "max_kl": None, "max_staleness": None}, "ess"),
    ({"min_ess_frac": None, "max_kl": 1e-6, "max_staleness": None}, "kl"),
    ({"min_ess_frac": None, "max_kl": None, "max_staleness": 1}, "staleness"),
])
def test_drift_ends_rounds_early_and_names_the_reason(tmp_path, thresholds, reason):
    """Step 1 of a round is on-policy (ESS 1, KL 0, age 0): no trigger. After one update the next step's
    data is off-policy (ESS < 0.999, KL > 1e-6); after the second the round's data is 2 versions old
    (> 1). Either way the check after step 2 fires and the round ends there, through
    on_train_batch_start returning -1, instead of serving its 4 steps."""
    counter = StepsPerEpoch()
    trainer, _, regenerate = fit(stage_cfg(tmp_path, ON_POLICY), 8, [DriftTrigger(**thresholds), counter])
    assert trainer.global_step == 8
    assert counter.steps == [2, 2, 2, 2]
    assert regenerate.triggers == {"start": 1, reason: 3}
    assert regenerate.summary()[f"rollout/trigger/{reason}"] == 3


def test_a_trigger_on_the_last_step_of_a_round_makes_the_next_round(tmp_path):
    """One optimizer step a round (16 records, batch 16): every request is made on a round's last step.
    It must not lapse: the next round is made for that reason (and replay_mix makes it all fresh)."""
    stage = stage_cfg(tmp_path, ["data.replay_ratio=0.5", "algorithm.epochs_per_round=1", "data.batch_size=16"])
    trigger = DriftTrigger(min_ess_frac=1.01, max_kl=None, max_staleness=None)  # ESS ≤ 1: fires every step
    trainer, dm, regenerate = fit(stage, 4, [trigger])
    assert trainer.global_step == 4
    assert regenerate.triggers == {"start": 1, "ess": 3}
    assert regenerate.replay_fracs[1:] == [0.0, 0.0, 0.0]  # refresh_on_drift: each triggered round all fresh


class TokenCounter(L.Callback):
    def __init__(self):
        self.tokens = self.records = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.tokens += int(batch.attention_mask.sum())
        self.records += len(batch)


def test_cost_ledger_by_hand(tmp_path):
    """usd = generated Mtok × 2.0 + trained Mtok × 3.0; records served = 10 steps × 8; with replay 0.5
    every record after round 1 is used once or twice, so 1 ≤ mean reuse ≤ max_reuse."""
    ledger, counter = CostLedger(usd_per_mtok_generated=2.0, usd_per_mtok_trained=3.0), TokenCounter()
    trainer, dm, regenerate = fit(stage_cfg(tmp_path), 10, [counter, ledger])
    s = ledger.summary()
    generated = regenerate.totals["generated_tokens"]
    assert s["cost/trained_tokens"] == counter.tokens and counter.records == 80
    assert s["cost/usd"] == pytest.approx(generated / 1e6 * 2.0 + counter.tokens / 1e6 * 3.0)
    assert s["cost/usd_generation"] == pytest.approx(generated / 1e6 * 2.0)
    assert 0 < s["cost/records_used"] <= regenerate.totals["records_generated"]
    assert s["cost/mean_reuse"] == pytest.approx(80 / s["cost/records_used"])
    assert 1.0 < s["cost/mean_reuse"] <= 2.0
    assert s["cost/train_seconds"] > 0
    gain = (regenerate.reward_means[-1] - regenerate.reward_means[0]) / (generated / 1e6)
    assert s["cost/reward_gain_per_mtok"] == pytest.approx(gain)
    never = sum(r.provenance.times_used == 0 for g in dm.buffer.groups.values() for r in g)
    assert s["cost/records_unused_at_end"] == never
    assert s["cost/records_evicted_unused"] == dm.buffer.evicted_unused


def test_a_drift_trigger_makes_the_next_replay_round_all_fresh(tmp_path):
    """replay 0.5 with refresh_on_drift: a staleness trigger ends each round after 2 steps, and every
    round it triggers is followed by one that replays nothing."""
    stage = stage_cfg(tmp_path, ["algorithm.epochs_per_round=2"])
    trainer, dm, regenerate = fit(stage, 8, [DriftTrigger(None, None, max_staleness=1)])
    assert regenerate.triggers["staleness"] >= 1
    assert regenerate.replay_fracs == [0.0] * len(regenerate.replay_fracs)
