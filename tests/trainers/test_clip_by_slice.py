"""clip_frac and adv_clip_frac per data source and per staleness bucket (trainers/rollout.py's step diagnostics),
on a hand-made batch whose clipped tokens per slice are known, through the step's real stitching of micro-batch
log-probs and advantages and the real correction (ppo_clip, ε = 0.2: ratios outside [0.8, 1.2] on the
advantage's side are clipped)."""
from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from losses.correction import ppo_clip
from trainers.rollout import RolloutModule

L2 = math.log(2.0)


class Batch(SimpleNamespace):
    def __len__(self):
        return self.completion_mask.shape[0]


def diagnostics(micro_rows: int) -> dict[str, float]:
    """4 rows × 2 tokens at policy version 10, ratios ρ = π/μ and advantages A:
        row 0  fresh,  v10 (staleness 0)  ρ = [1, 1]    A = 1    nothing clipped
        row 1  fresh,  v10 (staleness 0)  ρ = [1, 1]    A = -1   nothing clipped
        row 2  replay, v9  (staleness 1)  ρ = [2, 2]    A = 2    both clipped (2·2 = 4 > 1.2·2)
        row 3  replay, v7  (staleness 3)  ρ = [.5, 2]   A = -3   token 0 clipped (min(-1.5, -2.4) = -2.4),
                                                                 token 1 not (min(-6, -3.6) = -6)
    fed as micro-batches of `micro_rows` rows, as the training step keeps them."""
    logp = torch.full((4, 2), -1.0)
    behaviour = logp - torch.tensor([[0.0, 0.0], [0.0, 0.0], [L2, L2], [-L2, L2]])
    adv = torch.tensor([1.0, -1.0, 2.0, -3.0]).unsqueeze(-1).expand(4, 2)
    batch = Batch(completion_mask=torch.ones(4, 2), behaviour_logprobs=behaviour, prox_logprobs=None,
                  policy_versions=torch.tensor([10, 10, 9, 7]),
                  served_as=["fresh", "fresh", "replay", "replay"])
    module = SimpleNamespace(policy_version=10, correction=partial(ppo_clip, clip_low=0.2, clip_high=0.2),
                             _step_logps=list(logp.split(micro_rows)), _step_advs=list(adv.split(micro_rows)))
    module.slice_clipping = lambda *a: RolloutModule.slice_clipping(module, *a)
    out = RolloutModule.offpolicy_diagnostics(module, batch, RolloutModule.step_logps(module, batch))
    return {k: float(v) for k, v in out.items()}


@pytest.mark.parametrize("micro_rows", [4, 2, 1])
def test_clip_fractions_per_source_and_staleness_bucket_by_hand(micro_rows):
    """replay: 3 of 4 tokens clipped = .75; |A|-weighted: (2 + 2 + 3) / (2 + 2 + 3 + 3) = .7. fresh: 0.
    staleness 1 (row 2): 1 and 1; staleness 2_3 (row 3): .5 and 3/6 = .5; staleness 0: 0."""
    d = diagnostics(micro_rows)
    assert d["train/clip_frac/source_replay"] == pytest.approx(0.75)
    assert d["train/adv_clip_frac/source_replay"] == pytest.approx(0.7)
    assert d["train/clip_frac/source_fresh"] == 0.0 and d["train/adv_clip_frac/source_fresh"] == 0.0
    assert d["train/clip_frac/staleness_0"] == 0.0
    assert d["train/clip_frac/staleness_1"] == pytest.approx(1.0)
    assert d["train/adv_clip_frac/staleness_1"] == pytest.approx(1.0)
    assert d["train/clip_frac/staleness_2_3"] == pytest.approx(0.5)
    assert d["train/adv_clip_frac/staleness_2_3"] == pytest.approx(0.5)


def test_the_corrections_report_the_advantage_weighted_clip_share():
    """The whole batch through ppo_clip: 3 of 8 tokens clipped; by |A|: 7 of (1+1+1+1+2+2+3+3) = 7/14 = .5."""
    logp = torch.full((4, 2), -1.0)
    behaviour = logp - torch.tensor([[0.0, 0.0], [0.0, 0.0], [L2, L2], [-L2, L2]])
    _, m = ppo_clip(logp, behaviour, torch.tensor([1.0, -1.0, 2.0, -3.0]), torch.ones(4, 2), 0.2, 0.2)
    assert float(m["clip_frac"]) == pytest.approx(3 / 8) and float(m["adv_clip_frac"]) == pytest.approx(0.5)
    _, m = ppo_clip(logp, behaviour, torch.zeros(4), torch.ones(4, 2), 0.2, 0.2)
    assert float(m["adv_clip_frac"]) == 0.0  # no advantage anywhere: nothing to take away
