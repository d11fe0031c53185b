"""data=adaptive through a real Lightning Trainer: per round, what was generated (fresh prompts × group
size) and what was served (fresh + replayed groups) match the logged mix; the prompts' evidence grows from
every fresh group; the controller's state is in the checkpoint and restored exactly on resume."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from data_modules.adaptive_policy import REASONS
from rewards.base import RewardSource
from tests.data_modules.test_replay_mix import build_parts
from tests.data_modules import test_replay_mix as replay

PROMPTS, GROUP, BATCH = 4, 4, 8  # 16 records a round: 2 steps
OVERRIDES = ["algorithm=grpo", "data=adaptive", f"data.prompts_per_round={PROMPTS}", f"algorithm.group_size={GROUP}",
             f"data.batch_size={BATCH}", "data.max_staleness=3", "data.max_reuse=2", "generator.max_new_tokens=4",
             "algorithm.scheduler.num_warmup_steps=0", "algorithm.optimizer.lr=1e-2", "data.policy.min_fresh_frac=0.25",
             "data.policy.max_fresh_frac=0.75"]


class PassFail(RewardSource):
    """A binary reward that varies inside a group: the completion's character codes summed, even → 1."""

    name, version = "pass_fail", "test"

    def score(self, prompts, completions, examples):
        return [float(sum(map(ord, c)) % 2 == 0) for c in completions]


def stage_cfg(out, extra=()):
    saved = replay.OVERRIDES
    replay.OVERRIDES = OVERRIDES + replay.OVERRIDES[-len(replay.TINY):]  # the tiny model and logger=none
    try:
        return replay.stage_cfg(out, extra)
    finally:
        replay.OVERRIDES = saved


class RoundRecorder(L.Callback):
    """Per epoch: the round's logged decision, the records generated for it and the records it serves."""

    def __init__(self):
        self.rounds, self.generated = [], 0

    def on_train_epoch_start(self, trainer, pl_module):
        regen = next(cb for cb in trainer.callbacks if type(cb).__name__ == "RegenerateExperience")
        made = regen.totals["records_generated"] - self.generated
        self.generated = regen.totals["records_generated"]
        served = trainer.datamodule.epoch_records()
        self.rounds.append({"metrics": dict(regen.last_round), "generated": made,
                            "served": [(r.group_id, r.served_as, r.provenance.policy_version) for r in served]})


def fit(stage, max_steps, callbacks=(), ckpt_path=None):
    trainer, module, dm, regenerate = build_parts(stage, max_steps, callbacks, reward=PassFail())
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, dm, regenerate


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory):
    recorder = RoundRecorder()
    trainer, dm, regenerate = fit(stage_cfg(tmp_path_factory.mktemp("adaptive")), 16, [recorder])
    return trainer, dm, regenerate, recorder


def test_each_round_generates_and_serves_what_its_logged_mix_says(adaptive_run):
    trainer, dm, regenerate, recorder = adaptive_run
    assert trainer.global_step == 16 and len(recorder.rounds) == 8
    replayed_rounds = 0
    for i, rnd in enumerate(recorder.rounds):
        m, served = rnd["metrics"], rnd["served"]
        fresh = {g for g, s, _ in served if s == "fresh"}
        replayed = {g for g, s, _ in served if s == "replay"}
        assert len(served) == PROMPTS * GROUP  # the round keeps its size: its steps are constant
        assert len(fresh) == round(m["mix/fresh_frac"] * PROMPTS) == m["mix/fresh_prompts"]
        assert len(replayed) == round(m["mix/replay_frac"] * PROMPTS) and m["mix/harvest_frac"] == 0
        assert rnd["generated"] == len(fresh) * GROUP == m["mix/fresh_prompts"] * m["mix/samples_per_prompt"]
        assert m["rollout/replay_frac"] == m["mix/replay_frac"]
        for key in ("mix/prompts_skipped", "mix/reuse_limit", "mix/reason_code", "mix/zero_var_expected",
                    "mix/zero_var_realised", "mix/skipped_share"):
            assert key in m, key
        reason = REASONS[int(m["mix/reason_code"])]
        if i == 0:
            assert replayed == set() and m["mix/fresh_frac"] == 1.0 and reason == "short_replay"  # nothing yet
        elif reason == "short_replay":  # the buffer could not supply the replay share: fresh groups fill in
            assert m["mix/fresh_frac"] > 0.25
        else:
            assert 0.25 <= m["mix/fresh_frac"] <= 0.75  # the user's bounds
        replayed_rounds += bool(replayed)
        limit = m["mix/reuse_limit"]
        for g, s, version in served:
            if s == "replay":  # an older round's, within the adaptive limit and the max_staleness cap
                assert 1 <= 2 * i - version <= min(3, limit)
    assert replayed_rounds >= 3


def test_the_evidence_counts_every_fresh_sample_and_the_summary_has_the_decisions(adaptive_run):
    trainer, dm, regenerate, recorder = adaptive_run
    fresh_groups = sum(len({g for g, s, _ in r["served"] if s == "fresh"}) for r in recorder.rounds)
    weight = sum(e[2] for e in dm.policy.evidence.values())
    decayed_max = fresh_groups * GROUP
    assert decayed_max * 0.99 ** 8 <= weight <= decayed_max  # every fresh sample, faded by decay per round
    assert set(dm.group_prompt) >= {g for r in recorder.rounds for g, s, _ in r["served"] if s == "fresh"}
    summary = dm.summary()
    assert sum(v for k, v in summary.items() if k.startswith("mix/reasons/")) == 8
    assert isinstance(summary["mix/reason"], str) and "/" in summary["mix/reason"]
    assert {"fresh", "replay"} <= set(dm.policy.values)  # both sources were valued


@pytest.mark.parametrize("selection", ["stream", "thompson", "greso"])
def test_resume_restores_the_controller_exactly(tmp_path, selection):
    stage = stage_cfg(tmp_path, [f"data.policy.selection={selection}"])
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=1, every_n_epochs=1,
                                 save_on_train_epoch_end=True, enable_version_counter=False)
    _, dm, _ = fit(stage, 6, [checkpoint])
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["AdaptiveDataModule"]
    assert saved == dm.state_dict() and saved["policy"]["evidence"]  # posteriors, EMAs, limit, rng
    seen = {}

    class AtResume(L.Callback):
        def on_fit_start(self, trainer, pl_module):
            seen["state"] = trainer.datamodule.state_dict()

    _, dm2, _ = fit(stage, 8, [AtResume()], ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    assert seen["state"] == saved
    assert dm2.cursor > dm.cursor  # the stream read on from where it stopped
    if selection == "thompson":
        assert dm2.policy.rng.getstate() != dm.policy.rng.getstate()  # and it went on drawing from there


def test_train_py_end_to_end_logs_the_mix_to_summary_and_csv(tmp_path):
    """python train.py algorithm=grpo data=adaptive: the mix metrics reach summary.json and metrics.csv."""
    import csv
    import json

    from tests.helpers import TINY_MODEL
    from tests.test_train_e2e import train
    out = tmp_path / "run"
    proc = train(*TINY_MODEL, "algorithm=grpo", "data=adaptive", "trainer.max_steps=6", "data.prompts_per_round=4",
                 "data.batch_size=16", "algorithm.group_size=4", "generator.max_new_tokens=4", "task.num_heldout=20",
                 "callbacks.evaluate.num_examples=20", "callbacks.progress.refresh_rate=0", "logger=csv",
                 "reward=function", "reward.fn._target_=tests.helpers.char_sum_scores", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[mix] round 1: 4 fresh prompts × 4" in proc.stdout
    assert "all fresh: nothing servable to replay or harvest yet" in proc.stdout  # words, not a reason code
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    for key in ("mix/fresh_frac", "mix/replay_frac", "mix/harvest_frac", "mix/prompts_skipped",
                "mix/samples_per_prompt", "mix/reuse_limit", "mix/reason", "mix/fresh_frac_mean"):
        assert key in summary, key
    assert sum(v for k, v in summary.items() if k.startswith("mix/reasons/")) == summary["rollout/rounds"] == 6
    assert summary["mix/decision_seconds"] > 0  # the controller's own bookkeeping, timed
    rows = [r for r in csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()) if r.get("mix/fresh_frac")]
    assert len(rows) == 6 and all(float(r["mix/decision_ms"]) > 0 for r in rows)
    assert all(float(r["mix/fresh_frac"]) + float(r["mix/replay_frac"]) + float(r["mix/harvest_frac"]) == 1.0
               for r in rows)


class SameDecisionOnRanks(L.Callback):
    """Added with +callbacks.same_mix._target_=...: every round, every rank holds the same decision (the mix
    metrics, the replayed groups, the fresh prompts' indices), checked by gathering them across the ranks."""

    def on_train_epoch_start(self, trainer, pl_module):
        from hardware import distributed
        dm = trainer.datamodule
        mine = (dm.decision, list(dm.replay_ids), sorted(dm.group_prompt.items())[-dm.prompts_per_round:])
        every = distributed.gather(mine)
        assert all(d == every[0] for d in every), f"ranks decided differently at step {trainer.global_step}"
        self.agreed = getattr(self, "agreed", 0) + 1

    def on_train_end(self, trainer, pl_module):
        from hardware.console import say
        say(trainer, f"[same_mix] {getattr(self, 'agreed', 0)} rounds decided alike on {trainer.world_size} ranks")


def test_two_ranks_make_one_decision(tmp_path):
    """hardware=ddp: both ranks plan every round alike (SameDecisionOnRanks raises otherwise)."""
    import json

    from tests.hardware.test_train_ranks import RANKS
    from tests.test_train_e2e import train
    out = tmp_path / "run"
    proc = train("hardware=ddp", *RANKS, "data=adaptive", "trainer.max_steps=6",
                 "+callbacks.same_mix._target_=tests.data_modules.test_adaptive.SameDecisionOnRanks",
                 f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    assert sum(v for k, v in summary.items() if k.startswith("mix/reasons/")) == summary["rollout/rounds"] == 3
    assert "[same_mix] 3 rounds decided alike on 2 ranks" in proc.stdout


def test_harvested_experience_is_served_and_updates_the_prompts_evidence(tmp_path):
    """Run 1 writes a store; run 2 (data=adaptive, data.harvest) loads it: its groups count as evidence about
    their prompts (matched by text) before any fresh sample, and are served as harvest by the mix."""
    store = tmp_path / "store"
    _, dm1, _ = fit(stage_cfg(tmp_path / "one", [f"data.store={store}"]), 4)
    recorder = RoundRecorder()
    trainer, module, dm2, _ = build_parts(stage_cfg(tmp_path / "two", [f"data.harvest={store}"]), 4, [recorder],
                                          reward=PassFail())
    before_fresh, real_observe, real_put = [], dm2.policy.observe, dm2.put

    def observe(key, rewards, round_, *rest):
        if not dm2.rounds_put and not putting:
            before_fresh.append(key)
        real_observe(key, rewards, round_, *rest)

    def put(records):
        putting.append(True)
        real_put(records)

    putting: list = []
    dm2.policy.observe, dm2.put = observe, put
    trainer.fit(module, datamodule=dm2)
    assert set(before_fresh) == set(dm1.group_prompt.values())  # every harvested group's prompt, before any fresh
    served = [s for r in recorder.rounds for _, s, _ in r["served"]]
    assert "dataset" in served
    assert any(r["metrics"]["mix/harvest_frac"] > 0 for r in recorder.rounds)
    assert "harvest" in dm2.policy.values  # harvest was valued per cost like the other sources


def test_stream_selection_walks_the_prompt_stream_and_skips_settled_prompts(tmp_path):
    """data.policy.selection=stream on the real data module: with no evidence a round takes the stream's next
    prompts exactly as fresh_rollouts does; a prompt the evidence says is solved or hopeless is passed over, a
    coin flip is taken where it comes, and the cursor moves past everything read."""
    _, _, dm, _ = build_parts(stage_cfg(tmp_path, ["data.policy.selection=stream"]), 1)
    order = list(dm._order)

    def chosen(planned):
        return [dm.group_prompt[gid] for _, _, gid in planned["prompts"]]

    assert chosen(dm._choose(4)) == order[:4] and dm.cursor == 4
    dm.policy.observe(order[5], [1.0] * 40, 0)        # solved
    dm.policy.observe(order[6], [0.0] * 40, 0)        # hopeless
    dm.policy.observe(order[7], [1.0, 0.0] * 10, 0)   # a coin flip
    planned = dm._choose(4)
    assert chosen(planned) == [order[4], order[7], order[8], order[9]]
    assert planned["skipped"] == 2 and dm.cursor == 10
