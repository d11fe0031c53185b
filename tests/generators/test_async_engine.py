"""The generation engine in its own process (generators/async_engine.py): the weights version it was
handed comes back with its round, its samples are the in-process generator's under the same seed and
weights, a round waits for the version it needs, and an engine that does not answer ends in one line."""
from __future__ import annotations

import time

import pytest
import torch

from generators.async_engine import AsyncEngine, EngineError
from generators.hf import HFGenerator
from tests.helpers import tiny_model

PROMPTS = [[5, 6, 7], [5, 6, 7], [8, 9], [10, 11, 12, 13]]


@pytest.fixture
def engine_and_model():
    policy, tok = tiny_model(seed=3)
    generator = HFGenerator(max_new_tokens=5, temperature=1.0, top_p=1.0, batch_size=8)
    engine = AsyncEngine(generator, policy, tok, threads=1, timeout_s=120)
    yield engine, generator, policy, tok
    engine.stop()
    assert not engine.process.is_alive()


def test_a_known_version_comes_back_with_samples_equal_to_the_in_process_generator(engine_and_model):
    engine, generator, policy, tok = engine_and_model
    with torch.no_grad():
        for p in policy.parameters():  # weights the engine's copy did not start with
            p.add_(0.01 * torch.randn_like(p))
    engine.push(policy, 41)
    engine.submit(PROMPTS, seed=123, round_index=0, need=41)
    made = engine.collect()
    assert made.version == 41
    torch.manual_seed(123)
    here = generator.sample(policy, tok, PROMPTS)
    assert made.out.completions == here.completions and made.out.logprobs == here.logprobs
    assert engine.sync_bytes == sum(t.numel() * t.element_size() for t in AsyncEngine._unique(policy))


def test_a_round_waits_for_the_version_it_needs(engine_and_model):
    engine, _, policy, _ = engine_and_model
    engine.push(policy, 3)
    engine.submit(PROMPTS, seed=1, round_index=0, need=5)
    time.sleep(1.0)
    assert engine.waiting and engine.results.empty()  # version 3 < 5: not started
    engine.push(policy, 5)
    assert engine.collect().version == 5


def test_an_engine_that_does_not_answer_ends_in_one_line(engine_and_model):
    engine, _, policy, _ = engine_and_model
    engine.timeout_s = 1.0
    engine.push(policy, 0)
    engine.submit(PROMPTS, seed=1, round_index=2, need=10**9)  # never pushed: the engine never answers
    with pytest.raises(EngineError, match=r"did not answer round 3 within 1 s \(callbacks.regenerate.engine_timeout_s\)"):
        engine.collect()
    assert not engine.process.is_alive()
