"""Episodes survive store → harvest (docs/episodes.md): a short GRPO run on tool episodes writes a store
(`data.store=DIR`); its records come back with their completion ids, loss masks (observations 0), zero
behaviour log-probs on observations and per-turn provenance, survive the buffer's checkpoint state, collate
with the observation tokens out of the loss, and a second run harvests them (`data=replay_mix
data.harvest=DIR`). A store of episodes read with another tokenizer is refused, even with
`data.harvest_mismatch=retokenize` (re-encoding the texts would lose the masks)."""
from __future__ import annotations

import io
import json

import pytest
import torch

import models.tokenizer as char_tokenizer
from data_modules.buffer import ExperienceBuffer
from data_modules.experience import collate
from data_modules.store import ExperienceStore, load_experience
from models.tokenizer import build_char_tokenizer
from tests.helpers import TINY, TOOL_EPISODES
from tests.test_train_e2e import train


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The store of a short run: SFT on teacher episodes, then 16 GRPO rounds of 32 episodes."""
    root = tmp_path_factory.mktemp("episode_store")
    proc = train(*TINY, *TOOL_EPISODES, "seed=3", f"++data.store={root / 'store'}", f"hydra.run.dir={root / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "store"


@pytest.fixture(scope="module")
def episodes(store):
    """The harvested records that have an observation turn (the run's seed is fixed: some do)."""
    records = load_experience(store, build_char_tokenizer())
    assert records and len(records) % 4 == 0  # whole groups of 4 episodes (the fresh ones of each round)
    found = [r for r in records if any(t["kind"] == "observation" for t in r.turns)]
    assert found, "no episode of the run made a call: nothing to test"
    return found


def spans(record, kind: str) -> list[slice]:
    return [slice(t["start"], t["start"] + t["length"]) for t in record.turns if t["kind"] == kind]


def test_harvested_episodes_keep_ids_masks_logprobs_and_turns(episodes):
    tok = build_char_tokenizer()
    for r in episodes:
        assert len(r.loss_mask) == len(r.completion_ids) == len(r.behaviour_logprobs)
        assert sum(t["length"] for t in r.turns) == len(r.completion_ids)
        assert [t["kind"] for t in r.turns][::2] == ["policy"] * len(r.turns[::2])  # policy, observation, policy...
        for span in spans(r, "policy"):
            assert set(r.loss_mask[span]) == {1} and all(lp <= 0.0 for lp in r.behaviour_logprobs[span])
        for span in spans(r, "observation"):
            assert set(r.loss_mask[span]) == {0} and set(r.behaviour_logprobs[span]) == {0.0}
            assert tok.decode(r.completion_ids[span]).startswith("=")  # experiment=tool_use's result prefix
        policy = [t for t in r.turns if t["kind"] == "policy"]
        assert all(isinstance(t["policy_version"], int) for t in policy)
        assert all(t["policy_version"] is None for t in r.turns if t["kind"] == "observation")
        assert r.provenance.source == "policy_rollout" and r.provenance.policy_version == policy[0]["policy_version"]


def test_episodes_survive_the_buffer_checkpoint_and_train_with_observations_masked(episodes):
    buffer = ExperienceBuffer(capacity=1000)
    buffer.put(episodes)
    saved = io.BytesIO()
    torch.save(buffer.state_dict(), saved)
    restored = ExperienceBuffer(capacity=1000)
    restored.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    back = [r for g in restored.groups.values() for r in g]
    assert back == [r for g in buffer.groups.values() for r in g]

    batch = collate(back, build_char_tokenizer().pad_token_id)
    for i, r in enumerate(back):
        start = len(r.prompt_ids) - 1  # target position of the first completion token
        mask, behaviour = batch.completion_mask[i], batch.behaviour_logprobs[i]
        for kind, want in (("policy", 1.0), ("observation", 0.0)):
            for span in spans(r, kind):
                at = slice(start + span.start, start + span.stop)
                assert set(mask[at].tolist()) == {want}, (kind, r.completion_text)
                assert behaviour[at].tolist() == pytest.approx(r.behaviour_logprobs[span])
        assert batch.input_ids[i, : len(r.prompt_ids) + len(r.completion_ids)].tolist() == r.prompt_ids + r.completion_ids


def test_a_second_run_harvests_the_episodes(store, tmp_path):
    out = tmp_path / "harvest"
    proc = train(*TINY, "algorithm=grpo", "env=calculator", "task=tool_arithmetic", "env.format.open='['",
                 "env.format.close=']'", "data=replay_mix", f"data.harvest={store}", "data.replay_ratio=0.75",
                 "data.prompts_per_round=4", "algorithm.group_size=4", "data.batch_size=16", "trainer.max_steps=2",
                 "generator.max_new_tokens=8", "seed=3", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["rollout/replay_frac_mean"] == 0.75  # 3 of each round's 4 groups were harvested episodes


def test_retokenizing_a_store_of_episodes_is_refused(tmp_path, episodes, monkeypatch):
    ExperienceStore(tmp_path, build_char_tokenizer()).write_round(episodes, 0)
    monkeypatch.setattr(char_tokenizer, "CHARACTERS", list(reversed(char_tokenizer.CHARACTERS)))
    with pytest.raises(ValueError, match="data.harvest_mismatch=retokenize") as err:
        load_experience(tmp_path, build_char_tokenizer(), on_mismatch="retokenize")
    assert "loss_mask" in str(err.value) and "round_00000.parquet" in str(err.value)
