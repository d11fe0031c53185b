"""generator=vllm: the HFGenerator contract, behaviour log-probs equal to the policy's, in-place weight sync.

Needs the vllm venv (bash scripts/test_vllm.sh); skipped where vllm is not installed. The tiny policy has
head_dim 32 (hidden 64, 2 heads): vLLM's CPU attention has no head_dim 16 kernel ("Unsupported CPU
attention configuration: head_dim=16").
"""
from __future__ import annotations

import copy
import random

import pytest

vllm = pytest.importorskip("vllm")

import torch  # noqa: E402
from transformers.generation.logits_process import TopPLogitsWarper  # noqa: E402

from generators.base import stop_ids, weights_held, weights_loaded  # noqa: E402
from generators.hf import HFGenerator  # noqa: E402
from generators.vllm import VLLMGenerator, check_vllm_available, cut_at_stop  # noqa: E402
from losses.correction import importance_diagnostics  # noqa: E402
from models.forward import sequence_token_logprobs  # noqa: E402
from models.bpe import IM_END  # noqa: E402
from models.tiny import build_tiny  # noqa: E402
from tests.generators.test_behaviour_policy import behaviour_on_targets, right_padded  # noqa: E402
from tests.generators.test_stop_ids import chat_prompts  # noqa: E402
from tests.helpers import chat_model, force_stop_after  # noqa: E402

pytestmark = pytest.mark.vllm

TINY = dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256,
            max_position_embeddings=64, seed=1)
MAX_NEW = 8
TOL = 1e-4
# block_size 32 (CPU default 128) so that the 40-token prompts below fill a prefix-cache block: a
# missing cache reset after a weight sync then shows as log-probs of the old weights.
ENGINE = dict(dtype="policy", kv_cache_memory_bytes=64 << 20, engine_kwargs={"block_size": 32})


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(**TINY)


@pytest.fixture(scope="module")
def gen():
    """One engine for the module (weights are synced from whichever policy each call passes)."""
    return VLLMGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=64, **ENGINE)


def make_prompts(tok, n_distinct=16, repeats=4, length=40):
    rng = random.Random(0)
    texts = ["".join(rng.choice("abcdefghij0123456789+= ") for _ in range(length - 1))
             for _ in range(n_distinct)]
    return [tok(t)["input_ids"] for t in texts for _ in range(repeats)]  # groups: prompts repeated


@torch.no_grad()
def reference_logprobs(policy, prompts, completions, temperature, top_p=1.0):
    """log_softmax(logits / T) (top-p filtered and renormalised if top_p < 1) of each sampled token."""
    policy.eval()
    warp = TopPLogitsWarper(top_p) if top_p < 1 else None
    out = []
    for p, c in zip(prompts, completions):
        logits = policy(torch.tensor([p + c])).logits[0, len(p) - 1 : len(p) - 1 + len(c)].float()
        logits = logits / temperature
        if warp is not None:
            logits = warp(None, logits)
        out.append(logits.log_softmax(-1).gather(-1, torch.tensor(c)[:, None])[:, 0])
    return out


def max_error(logprobs, reference):
    return max((torch.tensor(lp) - ref).abs().max().item() for lp, ref in zip(logprobs, reference))


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9)])
def test_contract_and_logprobs_equal_a_policy_forward(gen, tiny, temperature, top_p):
    policy, tok = tiny
    prompts = make_prompts(tok)
    gen.temperature, gen.top_p = temperature, top_p
    try:
        torch.manual_seed(0)
        out = gen.sample(policy, tok, prompts)
    finally:
        gen.temperature, gen.top_p = 1.0, 1.0
    assert len(out.completions) == len(out.logprobs) == len(prompts) and out.seconds > 0
    for c, lp in zip(out.completions, out.logprobs):
        assert 1 <= len(c) <= MAX_NEW and len(lp) == len(c)
        assert tok.eos_token_id not in c[:-1]  # cut after the first eos, eos included
        assert all(x <= 0 for x in lp)
    ended = [c for c in out.completions if c[-1] == tok.eos_token_id]
    assert ended and any(len(c) == MAX_NEW and c[-1] != tok.eos_token_id for c in out.completions)
    assert max_error(out.logprobs, reference_logprobs(policy, prompts, out.completions,
                                                      temperature, top_p)) < TOL


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.7, 0.7, 20), (1.0, 1.0, 20), (1.3, 0.5, 5)])
def test_fresh_samples_have_ratio_one_under_the_trainers_logprobs(gen, tiny, temperature, top_p, top_k):
    """vLLM's processed log-probs (temperature, top-k, top-p) are what the trainer scores
    (losses/sampling.py): ratio 1 ± 1e-4 and ESS ≥ 0.9999 on fresh samples (issue 19's done-when)."""
    policy, tok = tiny
    prompts = make_prompts(tok)
    gen.temperature, gen.top_p, gen.top_k = temperature, top_p, top_k
    try:
        torch.manual_seed(0)
        out = gen.sample(policy, tok, prompts)
    finally:
        gen.temperature, gen.top_p, gen.top_k = 1.0, 1.0, 0
    ids, mask, targets = right_padded(prompts, out.completions, tok.pad_token_id)
    with torch.no_grad():
        logp = sequence_token_logprobs(policy.eval(), ids, mask, temperature, top_k=top_k, top_p=top_p)
    d = importance_diagnostics(logp, behaviour_on_targets(out.logprobs, targets), targets)
    assert abs(d["ratio_mean"].item() - 1) < TOL and abs(d["ratio_max"].item() - 1) < TOL, d
    assert d["ess_frac"].item() >= 0.9999, d


def test_greedy_matches_hf_with_zero_logprobs(gen, tiny):
    policy, tok = tiny
    prompts = make_prompts(tok, n_distinct=8, repeats=1)
    out = gen.sample(policy, tok, prompts, greedy=True)
    hf = HFGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=64).sample(policy, tok, prompts,
                                                                              greedy=True)
    assert out.completions == hf.completions
    assert all(lp == [0.0] * len(c) for c, lp in zip(out.completions, out.logprobs))


def test_optimizer_step_reaches_the_engine_and_the_prefix_cache_is_reset(gen):
    """Same prompts and RNG before and after a (fused) AdamW step: outputs change, and the log-probs are
    those of the NEW policy. Fused AdamW leaves parameter version counters alone, so a sync that
    trusted them would miss it; a missing prefix-cache reset would give the old weights' log-probs."""
    policy, tok = build_tiny(**TINY)
    prompts = make_prompts(tok)
    torch.manual_seed(0)
    before = gen.sample(policy, tok, prompts)  # also fills the prefix cache
    old = copy.deepcopy(policy)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-2, fused=True)
    policy.train()
    for _ in range(3):  # raise the likelihood of what was sampled
        nll = 0.0
        for p, c in zip(prompts[:8], before.completions[:8]):
            logits = policy(torch.tensor([p + c])).logits[0, len(p) - 1 : len(p) - 1 + len(c)]
            nll = nll - logits.log_softmax(-1).gather(-1, torch.tensor(c)[:, None]).sum()
        opt.zero_grad()
        nll.backward()
        opt.step()
    torch.manual_seed(0)
    after = gen.sample(policy, tok, prompts)
    assert after.completions != before.completions
    assert max_error(after.logprobs, reference_logprobs(policy, prompts, after.completions, 1.0)) < TOL
    assert max_error(after.logprobs, reference_logprobs(old, prompts, after.completions, 1.0)) > 1e-2


def test_weights_loaded_syncs_once_for_its_block_and_nested_holds_keep_it(gen, tiny):
    """A round (generators.base.weights_loaded) syncs at its start and not in its `sample` calls, an
    episode round's hold nested inside included; after the block every call syncs again."""
    policy, tok = tiny
    prompts = make_prompts(tok, n_distinct=2, repeats=2)
    gen.sample(policy, tok, prompts)  # the engine exists: a load below is a sync
    bytes_before = gen.sync_bytes
    synced, sync = [], gen.sync_weights
    gen.sync_weights = lambda model: (synced.append(model), sync(model))
    try:
        with weights_loaded(gen, policy, tok):
            assert len(synced) == 1
            gen.sample(policy, tok, prompts)
            with weights_held(gen):
                gen.sample(policy, tok, prompts)
            gen.sample(policy, tok, prompts)  # the inner block's end kept the outer's loaded weights
            assert len(synced) == 1
        gen.sample(policy, tok, prompts)
        assert len(synced) == 2
        # the ledger's cost/weight_sync_bytes: each sync hands over every tensor of the state dict once
        state_bytes = sum(t.numel() * t.element_size() for t in policy.state_dict().values())
        assert gen.sync_bytes - bytes_before == 2 * state_bytes
    finally:
        gen.sync_weights = sync


def test_lora_policy_is_merged_without_being_touched(gen):
    policy, tok = build_tiny(**TINY, lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
    with torch.no_grad():  # lora_B starts at zero: make the adapter matter
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    prompts = make_prompts(tok, n_distinct=8, repeats=2)
    out = gen.sample(policy, tok, prompts)
    assert max_error(out.logprobs, reference_logprobs(policy, prompts, out.completions, 1.0)) < TOL
    base = policy.get_base_model()
    with policy.disable_adapter():  # the adapter changes the distribution, so the merge was needed
        assert max_error(out.logprobs, reference_logprobs(base, prompts, out.completions, 1.0)) > 1e-2
    after = policy.state_dict()
    assert state.keys() == after.keys() and all(torch.equal(state[k], after[k]) for k in state)


def sample_ignoring_eos(gen, policy, tok, prompts):
    """The engine's samples with `ignore_eos` on (the shared engine is left as it was)."""
    gen.ignore_eos = True
    try:
        return gen.sample(policy, tok, prompts)
    finally:
        gen.ignore_eos = False


def test_ignore_eos_gives_full_length(gen, tiny):
    policy, tok = tiny
    prompts = make_prompts(tok)
    out = sample_ignoring_eos(gen, policy, tok, prompts)
    assert all(len(c) == len(lp) == MAX_NEW for c, lp in zip(out.completions, out.logprobs))
    assert any(tok.eos_token_id in c[:-1] for c in out.completions)  # sampled through an eos


def test_engine_start_leaves_the_global_rng_and_threads_alone(tiny):
    policy, tok = tiny
    set_num_threads = torch.set_num_threads
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    g = VLLMGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=8, **ENGINE)
    g._build(policy, tok)
    assert torch.equal(torch.rand(3), expected)
    assert g.llm.llm_engine.model_config.dtype == torch.float32  # dtype="policy"
    assert torch.set_num_threads is set_num_threads and g.startup_seconds > 0


def test_provenance_and_install_hint(gen, monkeypatch):
    assert gen.name == "vllm" and gen.exact_logprobs is False and HFGenerator.name == "hf"
    assert gen.version == vllm.__version__ == check_vllm_available()
    assert gen.sampling == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": MAX_NEW,
                            "vllm_version": vllm.__version__}
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ImportError, match="scripts/install_vllm.sh"):
        check_vllm_available()


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """The BPE chat model (turn end <|im_end|>, tokenizer eos <|endoftext|>) with <|im_end|> forced after
    "The" and "The" after <|im_end|> (tests.helpers.force_stop_after), and an engine of its own."""
    policy, tok = chat_model(tmp_path_factory.mktemp("chat"))
    stop, trigger = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids("The")
    force_stop_after(policy, trigger, stop)
    return policy.eval(), tok, stop, trigger, VLLMGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=16,
                                                            **ENGINE)


def test_stops_at_the_models_turn_end_not_only_the_tokenizers_eos(chat):
    """Forced rows end with <|im_end|> at step 1 and 2 (the id kept, its log-prob the policy's), free rows
    never pass a stop id; greedy equals the HF loop; ignore_eos runs through every stop id."""
    policy, tok, stop, trigger, gen = chat
    assert tok.eos_token_id != stop and stop_ids(policy, tok) == [stop, tok.eos_token_id]
    prompts = chat_prompts(tok, stop, trigger)
    torch.manual_seed(0)
    out = gen.sample(policy, tok, prompts)
    for i in (0, 3):
        assert out.completions[i] == [stop] and out.completions[i + 1] == [trigger, stop]
    assert all(len(lp) == len(c) and stop not in c[:-1] and tok.eos_token_id not in c[:-1]
               for c, lp in zip(out.completions, out.logprobs))
    assert max_error(out.logprobs, reference_logprobs(policy, prompts, out.completions, 1.0)) < TOL
    greedy = gen.sample(policy, tok, prompts, greedy=True)
    hf = HFGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=16).sample(policy, tok, prompts, greedy=True)
    assert greedy.completions == hf.completions and greedy.completions[0] == [stop]
    full = sample_ignoring_eos(gen, policy, tok, prompts)
    assert all(len(c) == len(lp) == MAX_NEW for c, lp in zip(full.completions, full.logprobs))
    assert full.completions[0] == [stop, trigger] * (MAX_NEW // 2)


def test_cut_at_stop():
    assert cut_at_stop([5, 2, 6, 0], [2, 0]) == [5, 2] and cut_at_stop([5, 0, 2], [2, 0]) == [5, 0]
    assert cut_at_stop([5, 6], [2, 0]) == [5, 6] and cut_at_stop([], [2]) == []


def test_config_instantiates_lazily(hydra_conf):
    from hydra.utils import instantiate

    g = instantiate(hydra_conf(["generator=vllm"]).generator)
    assert isinstance(g, VLLMGenerator) and g.llm is None  # the engine starts on the first sample
    assert g.engine_args["max_num_seqs"] == g.batch_size and g.engine_args["dtype"] == "policy"
