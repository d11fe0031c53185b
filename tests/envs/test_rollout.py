"""envs/rollout.py with the real tiny model and HF generator: the trained ids are exactly the sampled ids
and the appended observation ids, masks and behaviour log-probs line up, and the limits hold."""
from __future__ import annotations

import pytest
import torch

from data_modules.experience import collate
from envs.base import Environment, StepResult
from envs.rollout import run_episodes
from generators.hf import HFGenerator
from tasks.base import Example
from tests.helpers import tiny_model

CLOSE = "]"


class Echo(Environment):
    """Answers every turn that ends at the close tag with a numbered observation; done after `done_after`."""

    stop_strings = (CLOSE,)

    def __init__(self, done_after: int = 99, observation: str = "<obs{}>", max_turns: int = 3,
                 max_observation_tokens: int = 8):
        super().__init__(max_turns=max_turns, max_observation_tokens=max_observation_tokens)
        self.done_after, self.observation, self.turns = done_after, observation, 0

    def reset(self, example):
        self.turns = 0
        return example.prompt

    def step(self, text):
        self.turns += 1
        return StepResult(self.observation.format(self.turns), reward=0.25, done=self.turns >= self.done_after,
                          tool="echo", seconds=0.001)


class Recording(HFGenerator):
    """The HF generator, remembering every sampled turn (ids and log-probs) it returned."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def sample(self, *args, **kwargs):
        out = super().sample(*args, **kwargs)
        self.calls.append(out)
        return out


@pytest.fixture
def policy():
    """The tiny model with its head nudged towards the close tag (+4 on its logit), so turns end there
    after a few tokens, and not at eos (−30); the hook is part of the forward the sampler runs."""
    model, tok = tiny_model(seed=3)
    close, eos = tok.convert_tokens_to_ids(CLOSE), tok.eos_token_id

    def nudge(module, args, logits):
        logits = logits.clone()
        logits[..., close] += 4.0
        logits[..., eos] -= 30.0
        return logits
    model.lm_head.register_forward_hook(nudge)
    return model, tok


def play(policy, env_factory, n=6, max_new_tokens=12):
    model, tok = policy
    torch.manual_seed(0)
    gen = Recording(max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, batch_size=4)
    examples = [Example(f"{i}*7=", str(i * 7)) for i in range(n)]
    return gen, run_episodes(gen, model, tok, env_factory, examples, policy_version=5), tok


def test_trained_ids_are_the_sampled_ids_and_the_appended_observation_ids(policy):
    gen, played, tok = play(policy, lambda: Echo(done_after=2, max_turns=3))
    sampled = [[] for _ in played.episodes]  # each episode's turns in order, from the generator's own outputs
    active = list(range(len(played.episodes)))
    for out in gen.calls:  # batch_size 4: one sample() call a turn holds every active episode
        nxt = []
        for i, ids, lps in zip(active, out.completions, out.logprobs):
            sampled[i].append((ids, lps))
            if ids[-1:] == tok(CLOSE, add_special_tokens=False)["input_ids"] and len(sampled[i]) < 2:
                nxt.append(i)
        active = nxt
    for i, (ep, turns) in enumerate(zip(played.episodes, sampled)):
        assert ep.prompt_ids == tok(f"{i}*7=")["input_ids"]  # the environment's first observation
        want_ids, want_lp, want_mask = [], [], []
        for k, (ids, lps) in enumerate(turns):
            want_ids += ids
            want_lp += lps
            want_mask += [1] * len(ids)
            if k < len(turns) - 1:
                obs = tok(f"<obs{k + 1}>", add_special_tokens=False)["input_ids"]
                want_ids += obs
                want_lp += [0.0] * len(obs)
                want_mask += [0] * len(obs)
        assert ep.completion_ids == want_ids and ep.logprobs == want_lp and ep.loss_mask == want_mask
    assert any(len(t) == 2 for t in sampled), "no episode reached its second turn: the test proves nothing"
    batch = collate([_record(ep) for ep in played.episodes], tok.pad_token_id)
    for row, ep in enumerate(played.episodes):  # the trained row: prompt then exactly those ids
        n = len(ep.prompt_ids) + len(ep.completion_ids)
        assert batch.input_ids[row, :n].tolist() == ep.prompt_ids + ep.completion_ids


def test_turn_provenance_and_the_environments_rewards(policy):
    _, played, tok = play(policy, lambda: Echo(done_after=2, max_turns=3))
    two = [ep for ep in played.episodes if ep.policy_turns == 2]
    assert two
    ep = two[0]
    kinds = [t.kind for t in ep.turns]
    assert kinds == ["policy", "observation", "policy"]
    assert [t.policy_version for t in ep.turns] == [5, None, 5]
    assert ep.turns[1].tool == "echo" and ep.turns[1].seconds == pytest.approx(0.001)
    assert sum(t.length for t in ep.turns) == len(ep.completion_ids)
    assert ep.env_reward == pytest.approx(0.5) and ep.tool_calls == 2
    last = ep.turns[-1]
    assert ep.final_text == tok.decode(ep.completion_ids[last.start:], skip_special_tokens=True)
    assert played.stats()["tool_calls"] == sum(e.tool_calls for e in played.episodes)


def test_max_turns_ends_an_episode_after_that_many_policy_turns(policy):
    _, played, _ = play(policy, lambda: Echo(max_turns=2))
    assert max(ep.policy_turns for ep in played.episodes) == 2
    assert all(ep.turns[-1].kind == "policy" for ep in played.episodes)


def test_observations_are_cut_at_max_observation_tokens(policy):
    _, played, _ = play(policy, lambda: Echo(observation="x" * 50 + "{}", max_observation_tokens=5))
    obs = [t for ep in played.episodes for t in ep.turns if t.kind == "observation"]
    assert obs and all(t.length == 5 for t in obs)


def test_episodes_never_outgrow_the_models_context(policy):
    model, _ = policy
    _, played, _ = play(policy, lambda: Echo(max_turns=50, observation="{}" + "o" * 7), max_new_tokens=12)
    limit = model.config.max_position_embeddings
    assert all(len(ep.prompt_ids) + len(ep.completion_ids) <= limit for ep in played.episodes)
    assert max(ep.policy_turns for ep in played.episodes) > 2


def _record(ep):
    from data_modules.experience import ExperienceRecord, Provenance
    return ExperienceRecord(ep.prompt_ids, ep.completion_ids, Provenance("policy_rollout", 0, 0),
                            behaviour_logprobs=ep.logprobs, loss_mask=ep.loss_mask, turns=ep.turn_records())
