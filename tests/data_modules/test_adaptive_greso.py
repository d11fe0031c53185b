"""data.policy.selection=greso on the real data module and through train.py: the stream walked with GRESO's
draws (the cursor past all it read), dynamic sampling's refills asking the same rule, the groups dynamic
sampling drops counted as visits (their prompts' runs and the round's tie shares), and the decisions logged."""
from __future__ import annotations

import json

import pytest

from rewards.base import RewardSource
from tests.data_modules.test_adaptive import GROUP, stage_cfg
from tests.data_modules.test_replay_mix import build_parts

GRESO = ["data.policy.selection=greso", "data.policy.decay=1.0", "data.policy.min_fresh_frac=1",
         "data.policy.max_fresh_frac=1", "task.operands_max=4", "task.num_heldout=4",
         "callbacks.evaluate.num_examples=4"]


def tied_by_prompt(prompts, completions, examples):
    """A reward whose groups often tie: a prompt whose character codes sum to 0 mod 3 always passes, 1 mod 3
    always fails, 2 mod 3 passes when the completion's codes sum to an even number (signal)."""
    out = []
    for p, c in zip(prompts, completions):
        kind = sum(map(ord, p)) % 3
        out.append(1.0 if kind == 0 else 0.0 if kind == 1 else float(sum(map(ord, c)) % 2 == 0))
    return out


class TiedByPrompt(RewardSource):
    name, version = "tied_by_prompt", "test"

    def score(self, prompts, completions, examples):
        return tied_by_prompt(prompts, completions, examples)


def test_greso_walks_the_stream_and_the_refill_asks_the_same_rule(tmp_path):
    """p_skip = 1 for every run (e = 0, floor 0): prompts with a run of ties are passed over by the round's plan
    and by dynamic sampling's refill (dm.fresh_prompts) alike, and counted per kind."""
    zero = ["data.policy.greso.explore_init=0", "data.policy.greso.explore_min=0", "data.policy.greso.revisit_floor=0"]
    _, _, dm, _ = build_parts(stage_cfg(tmp_path, GRESO + zero), 1)
    order = list(dm._order)
    dm.policy.observe(order[1], [1.0] * GROUP, 0)          # a run of 1 all-pass visit
    dm.policy.observe(order[2], [0.0] * GROUP, 0)          # all-fail
    dm.policy.observe(order[3], [1.0, 0.0] * 2, 0)         # signal: no run
    planned = dm._choose(3)
    assert [dm.group_prompt[g] for _, _, g in planned["prompts"]] == [order[0], order[3], order[4]]
    assert (planned["skipped"], planned["skipped_pass"], planned["skipped_fail"], dm.cursor) == (2, 1, 1, 5)
    dm.policy.observe(order[6], [0.0] * GROUP, 0)
    refill = dm.fresh_prompts(2)
    assert [dm.group_prompt[g] for _, _, g in refill] == [order[5], order[7]] and dm.cursor == 8
    assert dm.decision["mix/prompts_skipped_fail"] == 1.0  # the refill's skip joins the round's counts


@pytest.mark.parametrize("carry", [False, True])
def test_dynamic_sampling_drops_count_as_visits_and_move_the_controller(tmp_path, carry):
    """With algorithm.dynamic_sampling=true only groups with signal are put, yet every generated sample is in the
    prompts' evidence (decay 1: weight = samples generated) and every tied group extends its prompt's run; the
    exploration probabilities moved from 0.5 by the round's measured tie shares. With the surplus carried, a
    carried group is counted once, in the round that generated it (it was once counted again when put)."""
    stage = stage_cfg(tmp_path, GRESO + ["algorithm.dynamic_sampling=true", "algorithm.max_gen_batches=2",
                                         f"algorithm.carry_surplus={str(carry).lower()}"])
    trainer, module, dm, regenerate = build_parts(stage, 8, reward=TiedByPrompt())
    trainer.fit(module, datamodule=dm)
    generated = regenerate.totals["records_generated"]
    assert sum(e[2] for e in dm.policy.evidence.values()) == generated
    g = dm.policy.greso
    always = {k: sum(map(ord, dm.task.train[k].prompt)) % 3 for k in dm.policy.evidence}
    always = {k: kind for k, kind in always.items() if kind < 2}  # prompts whose every group ties (pass 0, fail 1)
    assert always
    for k, kind in always.items():  # every visit, dropped or not, extended the run: run = visits = weight / G
        assert g.runs[k] == [("pass", "fail")[kind], dm.policy.evidence[k][2] / GROUP]
    assert g.explore != {"pass": 0.5, "fail": 0.5}


def test_train_py_end_to_end_with_greso(tmp_path):
    """python train.py data=adaptive data.policy.selection=greso (tiny): prompts revisited over passes of a 12-prompt
    pool (fresh data only, so only the selection acts: the mix would value mostly tied fresh rounds low and serve
    replay), GRESO's decisions in summary.json and each round's row."""
    import csv

    from tests.helpers import TINY_MODEL
    from tests.test_train_e2e import train
    out = tmp_path / "run"
    proc = train(*TINY_MODEL, "algorithm=grpo", "data=adaptive", "data.policy.selection=greso", "trainer.max_steps=8",
                 "data.prompts_per_round=4", "data.batch_size=16", "algorithm.group_size=4",
                 "generator.max_new_tokens=4", "task.operands_max=4", "task.num_heldout=4",
                 "callbacks.evaluate.num_examples=4", "callbacks.progress.refresh_rate=0", "logger=csv",
                 "data.policy.greso.explore_step=0.1", "data.policy.min_fresh_frac=1", "data.policy.max_fresh_frac=1",
                 "reward=function",
                 "reward.fn._target_=tests.data_modules.test_adaptive_greso.tied_by_prompt", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    assert summary["rollout/rounds"] == 8
    for key in ("mix/greso_explore_pass", "mix/greso_explore_fail", "mix/prompts_skipped_pass",
                "mix/prompts_skipped_fail", "mix/greso_tie_share_pass", "mix/greso_tie_share_fail"):
        assert key in summary, key
    rows = [r for r in csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()) if r.get("mix/greso_explore_pass")]
    assert len(rows) == 8
    explore = [float(r["mix/greso_explore_pass"]) for r in rows]
    assert explore[0] == 0.5 and explore[-1] != 0.5  # the controller moved (12 prompts, 8 rounds: revisited)
    assert sum(float(r["mix/prompts_skipped"]) for r in rows) > 0  # settled prompts were passed over


# ---- the mix's value over informative records (data_modules/adaptive.py `_measure`) -------------------
def _record(gid: int, reward: float, advantage: float, version: int, served_as: str):
    from data_modules.experience import ExperienceRecord, Provenance
    prov = Provenance("policy_rollout", created_step=version, policy_version=version, generator="hf",
                      sampling={"temperature": 1.0}, reward_source="verifier", reward_version="1", times_used=1)
    return ExperienceRecord([1, 5], [7, 8, 2], prov, group_id=gid, reward=reward, advantage=advantage,
                            served_as=served_as)


def test_fresh_and_replay_equally_good_on_their_informative_groups_are_valued_alike(tmp_path):
    """A round with tie share z = ½: fresh serves 2 groups with signal (rewards 1, 0; A = ±1) and 2 tied groups
    (A = 0); replay serves 2 groups with signal like fresh's. Every record is 5 tokens trained once, generated
    tokens priced 0: cost c = 5 · 1e-6 $ each. Over informative records both realise mean|A| = 1: u = 1/c = 2·10⁵
    each (over every record, fresh's would be ½/c: replay valued 1/(1 − z) = 2× too high). With the replay's
    measured ESS 0.8 and |A|-weighted clip share 0.25: u_replay = 0.8 · 0.75 / c = 1.2·10⁵. A source whose groups
    all tied realised nothing: 0."""
    stage = stage_cfg(tmp_path, ["data.policy.ema=1", "data.policy.usd_per_mtok_generated=0",
                                 "data.policy.usd_per_mtok_trained=1", "algorithm.epochs_per_round=1"])
    _, _, dm, _ = build_parts(stage, 1)
    fresh = [_record(g, r, a, 5, "fresh") for g in (0, 1) for r, a in ((1.0, 1.0), (0.0, -1.0))]
    fresh += [_record(g, 1.0, 0.0, 5, "fresh") for g in (2, 3) for _ in range(2)]
    replay = [_record(g, r, a, 3, "replay") for g in (10, 11) for r, a in ((1.0, 1.0), (0.0, -1.0))]
    dm.epoch_records, dm.rounds_put = (lambda: fresh + replay), 1
    dm._measure()
    assert dm.policy.values == pytest.approx({"fresh": 2e5, "replay": 2e5})
    dm._diagnostics = lambda: {"train/ess_frac/source_replay": 0.8, "train/adv_clip_frac/source_replay": 0.25}
    dm._measure()
    assert dm.policy.values == pytest.approx({"fresh": 2e5, "replay": 1.2e5})
    dm.epoch_records = lambda: fresh[4:] + replay  # fresh served only tied groups
    dm._measure()
    assert dm.policy.values["fresh"] == 0.0


@pytest.mark.slow
def test_two_ranks_skip_alike_with_dynamic_sampling(tmp_path):
    """hardware=ddp, selection=greso with dynamic sampling on a 12-prompt pool: every round both ranks hold the same
    decision (GRESO's skips and strengths included), the same fresh prompts (refills too) and the same replay
    (SameDecisionOnRanks raises otherwise)."""
    from tests.hardware.test_train_ranks import RANKS
    from tests.test_train_e2e import train
    out = tmp_path / "run"
    ranks = [a for a in RANKS if not a.startswith(("reward.fn", "task.num_heldout", "callbacks.evaluate.num_examples"))]
    proc = train("hardware=ddp", *ranks, "data=adaptive", "data.policy.selection=greso", "trainer.max_steps=6",
                 "algorithm.dynamic_sampling=true", "algorithm.max_gen_batches=2", "task.operands_max=4",
                 "task.num_heldout=4", "callbacks.evaluate.num_examples=4", "data.policy.greso.explore_step=0.1",
                 "reward.fn._target_=tests.data_modules.test_adaptive_greso.tied_by_prompt",
                 "+callbacks.same_mix._target_=tests.data_modules.test_adaptive.SameDecisionOnRanks",
                 f"hydra.run.dir={out}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    rounds = int(summary["rollout/rounds"])
    assert f"[same_mix] {rounds} rounds decided alike on 2 ranks" in proc.stdout
    assert summary["mix/greso_explore_fail"] != 0.5 or summary["mix/greso_explore_pass"] != 0.5
