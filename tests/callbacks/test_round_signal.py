"""Per-round signal metrics (callbacks/round_signal.py; issue 33 measurement v2): z, tokens per informative
group, the PG:KL weight (hand-worked) and KL(behaviour ‖ current) after an update, through a real stage."""
from __future__ import annotations

import math

import pytest

import callbacks.regenerate as regenerate_module
from callbacks.round_signal import kl_after_update, previous_round, round_signal
from data_modules.experience import ExperienceRecord, Provenance
from tests.data_modules.test_replay_mix import build_parts, stage_cfg


def rec(group: int, reward: float, advantage: float = 0.0) -> ExperienceRecord:
    return ExperienceRecord(prompt_ids=[1], completion_ids=[2], provenance=Provenance(source="test", created_step=0),
                            group_id=group, reward=reward, advantage=advantage)


def test_round_signal_hand_worked():
    """3 groups of 2: group 0 ties (1, 1), groups 1 and 2 do not. z = 1/3; 120 tokens over 2 informative
    groups = 60; advantages ±1 on 4 records, 0 on 2: RMS √(4/6), over β = 0.04: 20.41."""
    records = [rec(0, 1.0), rec(0, 1.0), rec(1, 1.0, 1.0), rec(1, 0.0, -1.0), rec(2, 0.0, -1.0), rec(2, 1.0, 1.0)]
    out = round_signal(records, 120, {}, 0.04)
    assert out["rollout/z"] == pytest.approx(1 / 3)
    assert out["rollout/tokens_per_informative_group"] == pytest.approx(60.0)
    assert out["rollout/pg_kl_weight"] == pytest.approx(math.sqrt(4 / 6) / 0.04)
    assert "rollout/pg_kl_weight" not in round_signal(records, 120, {}, 0.0)  # β = 0: no KL term


def test_round_signal_counts_dynamic_samplings_dropped_groups():
    """DAPO keeps only groups with signal: z comes from its counts, 6 dropped of 6 + 4 kept + 2 surplus."""
    dynamic = {"rollout/dynamic_dropped_groups": 6.0, "rollout/dynamic_kept_groups": 4.0,
               "rollout/dynamic_surplus_groups": 2.0}
    out = round_signal([rec(1, 1.0, 1.0), rec(1, 0.0, -1.0)], 600, dynamic, 0.04)
    assert out["rollout/z"] == pytest.approx(0.5)
    assert out["rollout/tokens_per_informative_group"] == pytest.approx(100.0)
    everything_tied = round_signal([rec(0, 1.0), rec(0, 1.0)], 10, {}, 0.04)
    assert everything_tied["rollout/z"] == 1.0 and "rollout/tokens_per_informative_group" not in everything_tied


def test_a_stage_logs_them_each_round_and_the_kl_after_an_update_is_positive(tmp_path, monkeypatch):
    logged: list[dict] = []
    real = regenerate_module.log_now
    monkeypatch.setattr(regenerate_module, "log_now", lambda trainer, m: (logged.append(dict(m)), real(trainer, m)))
    stage = stage_cfg(tmp_path, ["data.replay_ratio=0"])
    trainer, module, dm, regenerate = build_parts(stage, max_steps=4)
    trainer.fit(module, datamodule=dm)
    rounds = [m for m in logged if "rollout/z" in m]
    assert len(rounds) == regenerate.rounds >= 2
    assert all(0.0 <= m["rollout/z"] <= 1.0 for m in rounds)
    assert "rollout/kl_after_update" not in rounds[0]  # the first round has no round before it
    kls = [m["rollout/kl_after_update"] for m in rounds[1:]]
    assert kls and all(k > 0 for k in kls), kls  # the round's update moved the policy off its data
    # records whose behaviour log-probs are the current weights' own: KL 0
    same = previous_round(dm)[:4]
    for chunk, batch in module.annotation_batches(same, module.collate):
        for r, lp in zip(chunk, module.frozen_logprobs(module.policy, batch)):
            r.behaviour_logprobs = lp
    assert kl_after_update(module, same)["rollout/kl_after_update"] == pytest.approx(0.0, abs=1e-9)
