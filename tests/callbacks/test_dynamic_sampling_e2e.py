"""algorithm.dynamic_sampling=true through train.py (a subprocess each, ~45 s): what each round generated
and served, against hand-worked counts. A round plans data.prompts_per_round=4 groups × 8 samples."""
from __future__ import annotations

import csv
import json

from tests.callbacks.test_budget import GRPO
from tests.test_train_e2e import train


def rounds(out) -> list[dict]:
    rows = list(csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()))
    return [r for r in rows if r.get("rollout/gen_batches") not in ("", None)]


def test_no_signal_anywhere_generates_every_batch_and_counts_it(tmp_path):
    """The exact verifier scores an untrained model 0 on every sample: every group ties, so each round
    makes all max_gen_batches=3 batches (3 × 4 = 12 groups dropped, 12 × 8 = 96 samples generated) and
    serves its last batch as it is (4 groups). 3 rounds: 288 records generated, 96 trained on."""
    out = tmp_path / "run"
    proc = train(*GRPO, "trainer.max_steps=3", "algorithm.dynamic_sampling=true", "algorithm.max_gen_batches=3",
                 f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = rounds(out)
    assert len(made) == 3
    for r in made:
        assert float(r["rollout/gen_batches"]) == 3 and float(r["rollout/dynamic_dropped_groups"]) == 12
        assert float(r["rollout/dynamic_no_signal"]) == 1 and float(r["rollout/dynamic_kept_groups"]) == 4
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["cost/records_generated"] == 3 * 3 * 4 * 8
    assert grpo["cost/records_used"] == 3 * 4 * 8 and grpo["train/steps"] == 3
    assert grpo["rollout/gen_batches_total"] == 9 and grpo["rollout/dynamic_dropped_groups_total"] == 36


def test_groups_with_signal_fill_the_round_with_replay_too(tmp_path):
    """A reward that varies between samples (character codes mod 10): a group of 8 almost never ties,
    so the round keeps its 2 planned fresh groups (replay_ratio 0.5 plans 2 replayed, 2 fresh from the
    second round on; the first has no buffer yet, so 4 fresh) in one batch, and each round's generated
    records = gen_batches × planned fresh groups × 8."""
    out = tmp_path / "run"
    proc = train(*GRPO, "trainer.max_steps=3", "algorithm.dynamic_sampling=true", "data=replay_mix",
                 "data.replay_ratio=0.5", "reward=function", "reward.fn._target_=tests.helpers.char_sum_scores",
                 f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = rounds(out)
    assert len(made) == 3
    planned = [4, 2, 2]
    for r, fresh in zip(made, planned):
        kept, batches = float(r["rollout/dynamic_kept_groups"]), float(r["rollout/gen_batches"])
        assert kept == fresh and float(r["rollout/dynamic_no_signal"]) == 0
        assert float(r["rollout/dynamic_dropped_groups"]) + kept + float(r["rollout/dynamic_surplus_groups"]) \
            == batches * fresh
    generated = sum(float(r["rollout/gen_batches"]) * fresh * 8 for r, fresh in zip(made, planned))
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["cost/records_generated"] == generated
    kept = sum(fresh * 8 for fresh in planned)  # the kept groups' records; the rest were filtered out
    assert grpo["cost/records_filtered"] == generated - kept and grpo["cost/records_dropped"] == 0


def test_on_two_ranks_the_loop_and_the_budget_decide_alike(tmp_path):
    """hardware=ddp, 2 ranks, 8 planned groups a round (4 per rank), the exact verifier on an untrained
    model (no signal anywhere): each round makes its 3 batches (3 × 64 samples, counted once over the
    ranks) and serves the last batch (64 records = 2 steps of 32). budget.generated_tokens=1500: one round
    is at most 3 × 64 × 6 = 1,152 tokens, so the stage ends after the first round whose cumulative count
    reaches 1,500 (round 2 at the earliest), on both ranks at once (the job ends cleanly)."""
    out = tmp_path / "run"
    proc = train("hardware=ddp", *GRPO, "data.prompts_per_round=8", "data.micro_batch_size=8",
                 "trainer.max_steps=20", "algorithm.dynamic_sampling=true", "algorithm.max_gen_batches=3",
                 "budget.generated_tokens=1500", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    made = rounds(out)
    totals = [int(float(r["cost/generated_tokens"])) for r in made]
    k = next(i + 1 for i, t in enumerate(totals) if t >= 1500)
    assert k >= 2 and len(made) == k
    assert all(float(r["rollout/gen_batches"]) == 3 and float(r["rollout/dynamic_dropped_groups"]) == 24
               for r in made)
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["cost/records_generated"] == k * 3 * 64 and grpo["cost/records_used"] == k * 64
    assert grpo["cost/records_filtered"] == k * 2 * 64  # the 2 batches a round not served: scored, never trained
    assert grpo["train/steps"] == 2 * k
    assert grpo["stop_reason"] == f"budget.generated_tokens ({totals[-1]:,} ≥ 1,500)"
