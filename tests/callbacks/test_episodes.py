"""callbacks/episodes.py: an episode becomes a record (masks, turns, transcript text, the env's rewards)."""
from __future__ import annotations

import pytest

from callbacks.episodes import as_episode
from data_modules.experience import ExperienceRecord, Provenance
from envs.rollout import Episode
from models.tokenizer import build_char_tokenizer


def test_an_episode_record_keeps_its_masks_turns_transcript_and_the_environments_reward():
    tok = build_char_tokenizer()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    ep = Episode(tok("2*3=")["input_ids"])
    ep.add_policy(enc("[c:2*3]"), [-0.5] * 7, 4, 0.01)
    ep.add_observation(enc("=6;"), "c", 0.002, False)
    ep.add_policy(enc("6") + [tok.eos_token_id], [-0.1, -0.2], 4, 0.01)
    ep.env_rewards = [0.25]
    record = ExperienceRecord(ep.prompt_ids, ep.completion_ids, Provenance("policy_rollout", 4, 4),
                              behaviour_logprobs=ep.logprobs, completion_text="6", reward=1.0,
                              rewards={"verifier": 1.0})
    out = as_episode(record, ep, tok)
    assert out.loss_mask == [1] * 7 + [0] * 3 + [1] * 2
    assert out.behaviour_logprobs == [-0.5] * 7 + [0.0] * 3 + [-0.1, -0.2]
    assert out.completion_text == "[c:2*3]=6;6"
    assert out.reward == pytest.approx(1.25) and out.rewards == {"verifier": 1.0, "env": 0.25}
    assert [(t["kind"], t["start"], t["length"], t["tool"]) for t in out.turns] == [
        ("policy", 0, 7, None), ("observation", 7, 3, "c"), ("policy", 10, 2, None)]
    assert as_episode(record, None, tok) is record
