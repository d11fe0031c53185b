"""Fresh data has importance ratio 1 under every precision (issue 31, item 10): the sampler's behaviour
log-probs and the trainer's scoring of the same tokens are computed in the same dtype. Under
`trainer.precision=bf16-mixed` the trainer scores inside the precision plugin's autocast (bfloat16 matmuls);
a sampler outside it ran in float32, so a fresh round's first step showed ratio_max 1.0047 (float32:
1.0000009): a floor under every ESS, KL and staleness diagnostic. Through the real stage runner: one
GRPO round of 2 prompts × 4 samples, one step, its train/ratio_* read before any update."""
from __future__ import annotations

import pytest
from hydra.utils import instantiate

from run.stages import plan_stages, run_stage, set_run_fields
from tests.helpers import TINY

GRPO = TINY + ["algorithm=grpo", "reward._target_=tests.helpers.LengthReward", "data.prompts_per_round=2",
               "algorithm.group_size=4", "data.batch_size=8", "trainer.max_steps=1", "generator.max_new_tokens=8",
               "callbacks.evaluate.every_n_steps=0", "algorithm.scheduler=null"]


@pytest.mark.parametrize("precision, micro", [("32-true", 8), ("bf16-mixed", 8), ("bf16-mixed", 2)])
def test_fresh_round_has_ratio_one(hydra_conf, tmp_path, precision, micro):
    """micro 2: the step's micro-batches (shuffled, padded to their own width) are not the annotation's."""
    overrides = GRPO + [f"trainer.precision={precision}", f"data.micro_batch_size={micro}"]
    [stage] = plan_stages(hydra_conf(overrides), overrides)
    set_run_fields(stage.cfg, tmp_path, stage.name, "test", "test")
    policy, tokenizer = instantiate(stage.cfg.model)
    _, _, metrics = run_stage(stage, policy, tokenizer)
    assert metrics["train/steps"] == 1
    ratio_max, ess = metrics["train/ratio_max"], metrics["train/ess_frac"]
    print(f"{precision}: ratio_max {ratio_max:.7f} ess_frac {ess:.7f}")
    assert abs(ratio_max - 1) < 1e-4 and abs(metrics["train/ratio_mean"] - 1) < 1e-4, metrics
    assert ess > 1 - 1e-4, metrics
    if precision == "bf16-mixed":  # the sampler's own bfloat16 decode, kept as the logged mismatch
        assert 0 < metrics["rollout/logp_mismatch_abs"] < 0.05, metrics
