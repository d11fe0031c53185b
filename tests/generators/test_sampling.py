"""The large-vocabulary sampler (inverse CDF): the right distribution, exact log-probs, top-p respected."""
import torch

from generators.hf import MULTINOMIAL_MAX_VOCAB, sample_token
from losses.sampling import truncate


def _row(vocab: int, live: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat([2 * torch.randn(1, live, generator=g), torch.full((1, vocab - live), -30.0)], 1)


def test_inverse_cdf_draws_from_the_softmax():
    """50k draws over a 3,000-token support: the total-variation distance from softmax is that of
    torch.multinomial with as many draws (sampling noise, ≈ 0.05), and far below a wrong sampler's."""
    vocab = MULTINOMIAL_MAX_VOCAB * 2
    row = _row(vocab, 3000)
    probs = row.softmax(-1)[0]
    torch.manual_seed(0)
    ours, reference = torch.zeros(vocab), torch.zeros(vocab)
    for _ in range(50):
        token, logp = sample_token(row.expand(1000, -1).contiguous(), 1.0, 1.0)
        ours.index_add_(0, token, torch.ones(1000))
        assert torch.allclose(logp, probs.log()[token], atol=1e-5)
        reference.index_add_(0, torch.multinomial(probs.expand(1000, -1), 1).squeeze(-1), torch.ones(1000))
    tv_ours = 0.5 * (ours / ours.sum() - probs).abs().sum()
    tv_reference = 0.5 * (reference / reference.sum() - probs).abs().sum()
    flat = 0.5 * (torch.full_like(probs, 1 / 3000).masked_fill(probs < 1e-9, 0) - probs).abs().sum()
    assert tv_ours < 1.3 * tv_reference and tv_ours < flat / 4, (tv_ours, tv_reference, flat)


def test_inverse_cdf_never_draws_a_top_p_removed_token():
    row = _row(MULTINOMIAL_MAX_VOCAB * 2, 3000, seed=1)
    kept = torch.isfinite(truncate(row, 0, 0.5))[0]
    torch.manual_seed(0)
    for _ in range(10):
        token, _ = sample_token(row.expand(1000, -1).contiguous(), 0.9, 0.5)
        assert kept[token].all()


def test_small_vocabularies_keep_the_multinomial_stream():
    logits = torch.randn(8, MULTINOMIAL_MAX_VOCAB)
    torch.manual_seed(3)
    token, _ = sample_token(logits, 1.0, 1.0)
    torch.manual_seed(3)
    assert torch.equal(token, torch.multinomial(logits.softmax(-1), 1).squeeze(-1))
