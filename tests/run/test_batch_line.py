"""The batch line (run/stages.py batch_arithmetic) counts what a round trains on (issue 31, item 12).

Online DPO with 4 prompts × 8 samples, batch 4 pairs, 2 passes: a round is 32 sampled records but at most
4 pairs (one per prompt), so at most ⌈2 × 4 / 4⌉ = 2 optimizer steps; the line used to count the sampled
records: 2 × 32 / 4 = 16. Rejection sampling keeps keep_per_group records a prompt, SPIN a pair per sample."""
from __future__ import annotations

from hydra.utils import instantiate

from run.stages import batch_arithmetic, plan_stages, run_stage, set_run_fields
from tests.helpers import TINY

ONLINE_DPO = TINY + ["algorithm=online_dpo", "data=filtered_rollouts", "data.prompts_per_round=4",
                     "algorithm.group_size=8", "data.batch_size=4", "algorithm.epochs_per_round=2",
                     "generator.max_new_tokens=6", "callbacks.evaluate.every_n_steps=0", "reward=function",
                     "reward.fn._target_=tests.helpers.char_sum_scores"]


def line(hydra_conf, overrides):
    [stage] = plan_stages(hydra_conf(overrides), overrides)
    return batch_arithmetic(stage.cfg)


def test_online_dpo_counts_pairs(hydra_conf):
    text = line(hydra_conf, ONLINE_DPO)
    assert text == ("4 prompts per round × 8 samples = 32 records per round, 32 per rank; at most 4 pairs kept "
                    "(1 per prompt); micro-batch 4 × accumulation 1 × 1 rank(s) = 4 pairs per optimizer step; "
                    "at most 2 optimizer steps per round (2 passes)"), text


def test_filtered_algorithms_count_what_they_keep(hydra_conf):
    rs = line(hydra_conf, TINY + ["algorithm=rejection_sampling", "data.prompts_per_round=4", "algorithm.group_size=8",
                                  "algorithm.keep_per_group=3", "data.batch_size=8", "algorithm.epochs_per_round=1"])
    assert "at most 12 records kept (3 per prompt)" in rs and "at most 2 optimizer steps per round" in rs, rs  # ⌈12/8⌉
    spin = line(hydra_conf, TINY + ["algorithm=spin", "data.prompts_per_round=4", "algorithm.group_size=2",
                                    "data.batch_size=4", "algorithm.epochs_per_round=2"])
    assert "at most 8 pairs kept (2 per prompt)" in spin and "at most 4 optimizer steps per round" in spin, spin
    grpo = line(hydra_conf, TINY + ["algorithm=grpo", "data.prompts_per_round=4", "algorithm.group_size=4",
                                    "data.batch_size=8"])
    assert grpo.endswith("= 8 records per optimizer step; 2 optimizer steps per round"), grpo


def test_an_online_dpo_round_takes_the_steps_the_line_says(hydra_conf, tmp_path):
    """3 steps: the first round's 4 pairs × 2 passes are 2 steps, so a second round is made for the third."""
    overrides = ONLINE_DPO + ["trainer.max_steps=3"]
    [stage] = plan_stages(hydra_conf(overrides), overrides)
    set_run_fields(stage.cfg, tmp_path, stage.name, "test", "test")
    policy, tokenizer = instantiate(stage.cfg.model)
    _, _, metrics = run_stage(stage, policy, tokenizer)
    assert metrics["train/steps"] == 3 and metrics["rollout/rounds"] == 2, metrics
