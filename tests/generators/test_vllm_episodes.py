"""generator=vllm plays episodes (issue 23): `sample` with stop sequences and a per-call token limit ends every
completion by the HF loop's rule, with the policy's own log-probs; a stop string's text matched without its
ids continues the row; an episode round syncs the weights once (`weights_held`), not once per turn.

Needs the vllm venv (bash scripts/test_vllm.sh); skipped where vllm is not installed. The models have head_dim
32 (tests/generators/test_vllm.py's docstring: vLLM's CPU attention has no head_dim 16 kernel).
"""
from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")

import torch  # noqa: E402

from callbacks.episodes import sample as sample_round  # noqa: E402
from generators.base import stop_ids  # noqa: E402
from generators.hf import HFGenerator  # noqa: E402
from generators.vllm import VLLMGenerator, completion_end, cut_at_stop  # noqa: E402
from models.tiny import build_tiny  # noqa: E402
from tasks.base import Example, encode_prompt  # noqa: E402
from tests.envs.test_rollout import Echo  # noqa: E402
from tests.generators.test_vllm import (ENGINE, MAX_NEW, TINY, TOL, make_prompts, max_error,  # noqa: E402
                                        reference_logprobs)
from tests.helpers import chat_model, force_stop_after  # noqa: E402

pytestmark = pytest.mark.vllm

STOP_TEXTS = ["ab", "1", "x", "y", "z"]  # the char tokenizer: a two-token sequence and single tokens


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(**TINY)


@pytest.fixture(scope="module")
def gen():
    return VLLMGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=64, **ENGINE)


def encode(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def first_end(ids, stops, sequences):
    """Where the HF loop ends `ids` (written apart from generators.vllm.completion_end): after the first stop id
    or the first complete occurrence of a stop sequence; None when neither occurs."""
    ends = [i + 1 for i, t in enumerate(ids) if t in stops]
    for s in sequences:
        ends += [k + len(s) for k in range(len(ids) - len(s) + 1) if ids[k: k + len(s)] == s]
    return min(ends, default=None)


class Spy:
    """Wraps an engine's `llm.generate`, keeping the token ids it returned per call (what it decoded)."""

    def __init__(self, gen):
        self.gen, self.generate, self.calls = gen, gen.llm.generate, []

    def __call__(self, *args, **kwargs):
        outputs = self.generate(*args, **kwargs)
        self.calls.append([list(o.outputs[0].token_ids) for o in outputs])
        return outputs

    def __enter__(self):
        self.gen.llm.generate = self
        return self

    def __exit__(self, *exc):
        self.gen.llm.generate = self.generate


def test_stop_sequences_and_the_token_limit_end_completions_as_the_hf_loop_does(gen, tiny):
    policy, tok = tiny
    prompts, sequences, stops = make_prompts(tok), encode(tok, STOP_TEXTS), set(stop_ids(policy, tok))
    gen.sample(policy, tok, prompts[:1])  # the engine is up
    for limit in (12, 3):  # above and below the engine's max_new_tokens (8)
        torch.manual_seed(0)
        with Spy(gen) as spy:
            out = gen.sample(policy, tok, prompts, stop_sequences=sequences, max_new_tokens=limit)
        kinds = []
        for c, lp in zip(out.completions, out.logprobs):
            end = first_end(c, stops, sequences)
            assert len(lp) == len(c) and (end == len(c) or (end is None and len(c) == limit)), (c, limit)
            kinds.append("stop id" if c[-1] in stops else "length" if end is None else "sequence")
        assert {"sequence", "length"} <= set(kinds), kinds
        assert max(map(len, out.completions)) == limit
        # the engine stopped at the stop strings itself (one call, nothing decoded past an end)
        assert len(spy.calls) == 1 and spy.calls[0] == out.completions
        assert max_error(out.logprobs, reference_logprobs(policy, prompts, out.completions, 1.0)) < TOL


def test_greedy_with_stop_sequences_equals_the_hf_loop(gen, tiny):
    """Stop sequences taken from the greedy completions themselves, so that they end some of them."""
    policy, tok = tiny
    prompts = make_prompts(tok, n_distinct=12, repeats=1)
    hf = HFGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=64)
    free = hf.sample(policy, tok, prompts, greedy=True, max_new_tokens=10).completions
    sequences = [c[3:5] for c in free[:4] if len(c) >= 5]
    want = hf.sample(policy, tok, prompts, greedy=True, stop_sequences=sequences, max_new_tokens=10)
    out = gen.sample(policy, tok, prompts, greedy=True, stop_sequences=sequences, max_new_tokens=10)
    assert out.completions == want.completions
    assert sum(len(c) < 10 for c in out.completions) >= len(sequences)
    assert all(lp == [0.0] * len(c) for c, lp in zip(out.completions, out.logprobs))


def test_a_stop_strings_text_in_other_tokens_continues_the_row(tmp_path):
    """The BPE chat model with "The" (one token) forced after "=": a stop sequence "T" + "he" has the text
    "The", so vLLM's stop string fires on the forced token, but its ids do not end the turn (the HF loop
    runs on): the row is continued, and its ids and log-probs are those of one uninterrupted draw."""
    policy, tok = chat_model(tmp_path)
    the, trigger = tok.convert_tokens_to_ids("The"), tok.convert_tokens_to_ids("=")
    force_stop_after(policy, trigger, the)
    policy.eval()
    sequence = encode(tok, ["T"])[0] + encode(tok, ["he"])[0]
    assert len(sequence) == 2 and tok.decode(sequence) == "The" and encode(tok, ["The"]) == [[the]]
    prompts = [encode_prompt(tok, q, chat=True) + [trigger] for q in ("12+34", "7+8", "1+1", "99+1")] * 4
    g = VLLMGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=16, **ENGINE)
    torch.manual_seed(0)
    g.sample(policy, tok, prompts[:1])
    stops = set(stop_ids(policy, tok))
    with Spy(g) as spy:
        out = g.sample(policy, tok, prompts, stop_sequences=[sequence])
    assert spy.calls[0] == [[the]] * len(prompts) and len(spy.calls) >= 2  # stopped by the text, then continued
    for c in out.completions:
        assert c[0] == the and len(c) > 1 and first_end(c, stops, [sequence]) in (len(c), None)
    assert max_error(out.logprobs, reference_logprobs(policy, prompts, out.completions, 1.0)) < TOL
    hf = HFGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=16)
    greedy = [x.sample(policy, tok, prompts[:4], greedy=True, stop_sequences=[sequence]).completions for x in (g, hf)]
    assert greedy[0] == greedy[1] and all(c[0] == the and len(c) > 1 for c in greedy[0])


def count_syncs(gen, monkeypatch) -> list:
    synced = []
    original = gen.sync_weights
    monkeypatch.setattr(gen, "sync_weights", lambda model: (synced.append(model), original(model)))
    return synced


def test_weights_held_syncs_once_per_model_and_every_call_outside(gen, monkeypatch):
    policy, tok = build_tiny(**TINY)
    other, _ = build_tiny(**{**TINY, "seed": 2})
    prompts = make_prompts(tok, n_distinct=4, repeats=2)
    synced = count_syncs(gen, monkeypatch)
    with gen.weights_held():
        for model in (policy, policy, policy, other, other, policy):
            gen.sample(model, tok, prompts)
    assert synced == [policy, other, policy]
    gen.sample(policy, tok, prompts)
    gen.sample(policy, tok, prompts)
    assert synced[3:] == [policy, policy]
    with torch.no_grad():  # weights changed between two rounds: the next round's first call syncs them
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    with gen.weights_held():
        torch.manual_seed(0)
        out = gen.sample(policy, tok, prompts)
    assert len(synced) == 6
    assert max_error(out.logprobs, reference_logprobs(policy, prompts, out.completions, 1.0)) < TOL


class Chatty(Echo):
    """Echo (tests/envs/test_rollout.py) whose turns end at common characters: many episodes take 3 turns."""

    stop_strings = ("a", "e", "1", "=", "x", "7")


def test_an_episode_round_samples_every_turn_from_the_policy_with_one_sync(gen, tiny, monkeypatch):
    """callbacks.episodes.sample (what regenerate and evaluate call): one weight sync for the round, and every
    policy token's behaviour log-prob is the policy's own given the episode's ids before it (prompt, earlier
    turns, appended observations)."""
    policy, tok = tiny
    gen.sample(policy, tok, make_prompts(tok, n_distinct=1, repeats=1))
    synced = count_syncs(gen, monkeypatch)
    examples = [Example(f"{i}*7=", str(i * 7)) for i in range(16) for _ in range(2)]
    torch.manual_seed(0)
    played = sample_round(gen, policy, tok, [], examples, env=lambda: Chatty(max_turns=3), policy_version=4)
    assert synced == [policy]
    episodes = played.episodes
    assert sum(e.policy_turns == 3 for e in episodes) >= 3, [e.policy_turns for e in episodes]
    sequences, stops = encode(tok, Chatty.stop_strings), stop_ids(policy, tok)
    for e in episodes:
        ref = reference_logprobs(policy, [e.prompt_ids], [e.completion_ids], 1.0)[0]
        mask = torch.tensor(e.loss_mask, dtype=torch.bool)
        assert (torch.tensor(e.logprobs)[mask] - ref[mask]).abs().max() < TOL
        for t in e.turns[:-1]:  # a policy turn that an observation followed ended at a stop string's ids
            ids = e.completion_ids[t.start: t.start + t.length]
            assert t.kind == "observation" or (any(ids[-len(s):] == s for s in sequences)
                                               and completion_end(ids, stops, sequences) == len(ids))


def test_completion_end():
    assert completion_end([5, 6, 7, 8], [2], [[6, 7]]) == 3 and completion_end([5, 2, 6, 7], [2], [[6, 7]]) == 2
    assert completion_end([6, 6], [2], [[6, 7]]) is None and completion_end([7, 6, 7], [], [[7], [6, 7]]) == 1
    assert cut_at_stop([5, 6, 7, 2], [2], [[6, 7]]) == [5, 6, 7] and cut_at_stop([9], [2], [[6, 7]]) == [9]


def test_an_empty_stop_sequence_is_refused(gen, tiny):
    policy, tok = tiny
    with pytest.raises(ValueError, match="empty stop sequence"):
        gen.sample(policy, tok, make_prompts(tok, n_distinct=1, repeats=1), stop_sequences=[[]])
