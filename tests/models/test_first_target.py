"""The LM head skips prompt positions: log-probs from `first_target` on equal the full pass, 0 before."""
import torch

from models.forward import sequence_token_logprobs
from models.tiny import build_tiny
from trainers.base import first_target


def test_first_target_equals_the_full_pass_where_it_computes():
    model, _ = build_tiny(32, 1, 2, 64, 64, seed=0)
    ids = torch.randint(3, 30, (4, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    full = sequence_token_logprobs(model, ids, mask, 1.0)
    part = sequence_token_logprobs(model, ids, mask, 1.0, first_target=5)
    assert part.shape == full.shape
    assert torch.allclose(part[:, 5:], full[:, 5:], atol=1e-6) and not part[:, :5].any()


def test_first_target_is_the_first_completion_column():
    cmask = torch.zeros(3, 8)
    cmask[0, 4:6], cmask[1, 2:7], cmask[2, 5:] = 1, 1, 1
    assert first_target(cmask) == 2 and first_target(torch.zeros(2, 5)) == 0
