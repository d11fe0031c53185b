"""DAPO dynamic sampling (callbacks/dynamic_sampling.py) on constructed rounds: which groups are kept,
dropped and cut, how many generation batches are made; and GRPO's overlong options in `annotate`."""
from __future__ import annotations

import torch

from callbacks.dynamic_sampling import GenBatch, fill_round, merged, select_groups
from data_modules.experience import ExperienceRecord, Provenance
from generators.base import GenerationOutput
from losses.advantages import groups_with_signal
from rewards.base import ScoreReport
from tests.helpers import TINY, tiny_model


def group(gid: int, rewards: list[float], tokens: int = 3) -> list[ExperienceRecord]:
    prov = Provenance("policy_rollout", created_step=0, policy_version=0)
    return [ExperienceRecord([1, 5], [7] * tokens, prov, group_id=gid, behaviour_logprobs=[-1.0] * tokens,
                             reward=r) for r in rewards]


def batch(groups: list[list[ExperienceRecord]]) -> GenBatch:
    records = [r for g in groups for r in g]
    out = GenerationOutput([r.completion_ids for r in records], [r.behaviour_logprobs for r in records], 1.0)
    report = ScoreReport([r.reward for r in records], 0, 0, 0, None, {})
    return GenBatch(records, [r.reward for r in records], out, report, {}, 2 * len(records))


def test_groups_with_signal_keeps_groups_whose_rewards_differ():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5])
    groups = torch.tensor([3, 3, 8, 8, 5, 5, 9])  # 3: all 1 (solved), 8: 0/1, 5: all 0, 9: one sample
    assert groups_with_signal(rewards, groups).tolist() == [False, False, True, True, False, False, False]


def test_select_groups_keeps_the_first_target_groups_with_signal():
    """Groups 0..5 with rewards [1,1], [0,1], [0,0], [1,0], [.5,.5], [0,1]: 0, 2, 4 tie (dropped), 1, 3, 5
    have signal; a target of 2 keeps 1 and 3 and leaves 5 as surplus."""
    rows = [[1, 1], [0, 1], [0, 0], [1, 0], [.5, .5], [0, 1]]
    records = [r for gid, rw in enumerate(rows) for r in group(gid, rw)]
    kept, counts = select_groups(records, 2)
    assert [r.group_id for r in kept] == [1, 1, 3, 3]
    assert counts == {"signal": 3, "dropped": 3, "surplus": 1}


def test_a_round_refills_until_it_has_its_groups_with_signal():
    """A round plans 4 groups. Batch 1 (groups 0-3): one with signal; batch 2 (4-7): two; batch 3
    (8-11): two more, so 5 ≥ 4 and the loop stops at 3 batches (of max 5). Kept: 1, 5, 6, 8 (first four
    with signal); dropped: the 7 tied groups; surplus: 10. Every batch's tokens are in the merged cost."""
    tied, mixed = [1.0, 1.0], [0.0, 1.0]
    plans = {0: [tied, mixed, tied, tied], 4: [tied, mixed, mixed, tied], 8: [mixed, tied, mixed, tied]}
    asked = []

    def scored(prompts):
        start = prompts[0]
        return batch([group(start + i, rw) for i, rw in enumerate(plans[start])])

    def more(n):
        asked.append(n)
        start = 4 * len(asked)
        return list(range(start, start + n))

    filled = fill_round([0, 1, 2, 3], more, scored, max_gen_batches=5)
    batches, chosen, metrics = filled.batches, filled.chosen, filled.metrics
    assert asked == [4, 4] and len(batches) == 3
    assert sorted({r.group_id for r in chosen}) == [1, 5, 6, 8]
    assert metrics == {"rollout/gen_batches": 3.0, "rollout/dynamic_dropped_groups": 7.0,
                       "rollout/dynamic_kept_groups": 4.0, "rollout/dynamic_kept_records": 8.0,
                       "rollout/dynamic_surplus_groups": 1.0, "rollout/dynamic_no_signal": 0.0,
                       "rollout/dynamic_generated_groups": 12.0, "rollout/dynamic_refill_groups": 8.0,
                       "rollout/dynamic_carried_in_groups": 0.0, "rollout/dynamic_carried_out_groups": 0.0,
                       "rollout/dynamic_filtered_records": 16.0}  # 24 scored − 8 kept
    assert filled.surplus == []  # carry off: group 10 is discarded
    rewards, out, report, _, prompt_tokens = merged(batches)
    assert len(out.completions) == len(rewards) == 24 and sum(map(len, out.completions)) == 72
    assert out.seconds == 3.0 and prompt_tokens == 48 and len(report.scores) == 24


def test_the_cap_ends_the_round_with_what_it_has():
    """max_gen_batches=2: batch 1 has one group with signal, batch 2 none; the round trains on 1 group."""
    tied, mixed = [0.0, 0.0], [0.0, 1.0]
    plans = {0: [mixed, tied, tied], 3: [tied, tied, tied]}
    batches, chosen, metrics, _ = vars(fill_round(
        [0, 1, 2], lambda n: [3, 4, 5], lambda p: batch([group(p[0] + i, rw) for i, rw in enumerate(plans[p[0]])]),
        max_gen_batches=2)).values()
    assert len(batches) == 2 and {r.group_id for r in chosen} == {0}
    assert metrics["rollout/dynamic_dropped_groups"] == 5.0 and metrics["rollout/dynamic_kept_groups"] == 1.0


def test_no_signal_anywhere_serves_the_last_batch_as_it_is():
    batches, chosen, metrics, _ = vars(fill_round([0, 1], lambda n: [2, 3],
                                                  lambda p: batch([group(g, [1.0, 1.0]) for g in p]),
                                                  max_gen_batches=2)).values()
    assert {r.group_id for r in chosen} == {2, 3} and metrics["rollout/dynamic_no_signal"] == 1.0


def test_grpo_adds_the_overlong_penalty_before_advantages_and_filters_truncated(hydra_conf):
    """generator.max_new_tokens=6, overlong_cache=2: lengths 3, 5, 6 (no stop id) get 0, −0.5, −1.
    Group 0: rewards [1, 1, 1] → shaped [1, 0.5, 0]: advantages ∝ [1, 0, −1] (std-scaled: ±1.2247).
    With overlong_filter the 6-token sample is not returned (it still counted in the group's mean)."""
    from run.stages import build
    policy, tok = tiny_model(seed=2)
    cfg = hydra_conf(TINY + ["algorithm=grpo", "algorithm.beta=0", "generator.max_new_tokens=6",
                             "algorithm.overlong_cache=2", "algorithm.overlong_filter=true"])
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    prov = Provenance("policy_rollout", created_step=0, policy_version=0)
    records = [ExperienceRecord([1, 5], [7] * n, prov, group_id=0, behaviour_logprobs=[-1.0] * n, reward=1.0)
               for n in (3, 5, 6)]
    kept = module.annotate(records)
    assert [len(r.completion_ids) for r in kept] == [3, 5]
    assert [round(r.advantage, 4) for r in records] == [1.2247, 0.0, -1.2247]
    assert module.last_round_stats["overlong_penalty_mean"] == -0.5
    assert module.last_round_stats["overlong_filtered"] == 1.0
    assert [r.reward for r in records] == [1.0, 1.0, 1.0]  # the records keep their scored reward


def test_bad_dapo_keys_are_refused_at_plan_time(hydra_conf):
    """Before any model: a cache longer than the length limit, and a zero cap on generation batches."""
    import pytest

    from run.errors import ConfigError
    from run.stages import plan_stages
    for overrides, message in (
            (["generator.max_new_tokens=6", "algorithm.overlong_cache=8"],
             "algorithm.overlong_cache=8 must be at most algorithm.overlong_max_len=6"),
            (["algorithm.max_gen_batches=0"], "algorithm.max_gen_batches=0 must be a positive integer"),
            (["algorithm.overlong_cache=-2"], "algorithm.overlong_cache=-2 must be a positive integer, or null (off)")):
        args = ["algorithm=grpo", *overrides]
        with pytest.raises(ConfigError) as err:
            plan_stages(hydra_conf(args), args)
        assert message in str(err.value)


def test_short_rounds_print_the_first_then_one_line_every_short_every_rounds(monkeypatch):
    """The default run hits max_gen_batches most rounds: 120 short rounds give lines at rounds 1, 50, 100
    (not 120 lines); a round with no signal at all is always said."""
    import callbacks.regenerate as regenerate
    lines = []
    monkeypatch.setattr(regenerate, "say", lambda trainer, text: lines.append(text))
    cb = regenerate.RegenerateExperience(generator=None, reward=None)
    short = {"rollout/dynamic_kept_groups": 50, "rollout/dynamic_no_signal": 0, "rollout/gen_batches": 3,
             "rollout/dynamic_dropped_groups": 140}
    for r in range(120):
        cb.rounds, cb.round_extra = r, dict(short)
        cb._say_short(None, 64)
    assert [t.split(":")[0] for t in lines] == ["[rollout] round 1", "[rollout] round 50", "[rollout] round 100"]
    assert "120" not in lines[-1] and "100 such rounds so far" in lines[-1]
    cb.rounds, cb.round_extra = 120, dict(short, **{"rollout/dynamic_no_signal": 1})
    cb._say_short(None, 64)
    assert len(lines) == 4 and "none with signal" in lines[-1]
    cb.rounds, cb.round_extra = 121, dict(short, **{"rollout/dynamic_kept_groups": 64})
    cb._say_short(None, 64)
    assert len(lines) == 4  # a full round says nothing
