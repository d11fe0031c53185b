"""The round economy through train.py (one run, ~45 s): dynamic sampling with measured refills and carried
surplus, screen-then-expand and stored successes together, on a reward that varies (tests/helpers.py
char_sum_scores: passes at ≥ 0.7 about 30 % of samples) and a pool of 16 prompts (revisited every few
rounds). The ledger's identities and every stored record's provenance, checked exactly."""
from __future__ import annotations

import json

import pyarrow.parquet as pq

from tests.callbacks.test_budget import GRPO
from tests.test_train_e2e import train

ECONOMY = [*GRPO, "trainer.max_steps=6", "algorithm.group_size=4", "data.batch_size=16", "task.operands_max=6",
           "reward=function", "reward.fn._target_=tests.helpers.char_sum_scores", "algorithm.pass_threshold=0.7",
           "algorithm.dynamic_sampling=true", "algorithm.refill=measured", "algorithm.carry_surplus=true",
           "algorithm.screen.size=2", "algorithm.stored_success.enabled=true"]


def test_screen_refill_carry_and_stored_successes_keep_the_ledger_exact(tmp_path):
    out = tmp_path / "run"
    proc = train(*ECONOMY, f"data.store={tmp_path / 'store'}", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())["grpo"]
    # both phases are generated tokens and records; the ledger has nothing else
    assert s["cost/records_generated"] == s["rollout/screen_samples_total"] + s["rollout/expand_samples_total"]
    assert s["cost/generated_tokens"] == s["rollout/screen_tokens_total"] + s["rollout/expand_tokens_total"]
    # every generated record is trained on, filtered out (tied or surplus), or carried past the end; stored
    # copies are trained on but were never generated
    reused = s["rollout/stored_success_groups_total"]
    assert reused >= 1
    assert s["cost/records_generated"] == (s["cost/records_used"] - reused + s["cost/records_filtered"]
                                           + s["cost/records_unused_at_end"])
    assert s["rollout/dynamic_carried_out_groups_total"] >= 1 and s["rollout/dynamic_carried_in_groups_total"] >= 1

    rows = pq.read_table(tmp_path / "store").to_pylist()  # every round as served (data.store)
    groups: dict[int, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group_id"], []).append(row)
    stored = [r for r in rows if r["served_as"] == "stored_success"]
    assert len(stored) == reused
    for r in stored:  # exactly one per group, in a group whose fresh samples all failed; older weights
        mates = [m for m in groups[r["group_id"]] if m is not r]
        assert sum(m["served_as"] == "stored_success" for m in groups[r["group_id"]]) == 1
        assert all(m["reward"] < 0.7 for m in mates) and r["reward"] >= 0.7
        assert r["prov_policy_version"] < mates[0]["prov_policy_version"]
        assert r["advantage"] > 0 and r["prov_phase"] in ("screen", "expand")
    for gid, members in groups.items():  # a screen of 2, and an expansion of 2 or none
        phases = [m["prov_phase"] for m in members if m["served_as"] != "stored_success"]
        assert phases.count("screen") == 2 and phases.count("expand") in (0, 2), (gid, phases)
