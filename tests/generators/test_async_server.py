"""Asynchronous rounds on vLLM servers without vLLM (generators/async_server.py): a fake generator=vllm_server
that records what the engines were told. A round waits for the version it needs; a push while a round is
generated changes nothing in it (the round names the version it was made with, the next round loads the new
one); a staged version replaced before any round loaded it is removed, never loaded; each round's samples
come from its own seed, never torch's global RNG; a failing or silent engine ends collect in one line; the
trainer's own pushes wait for the round in flight. The real engines: test_vllm_server.py."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import pytest
import torch

from generators.async_engine import EngineError
from generators.async_server import ServerEngine
from generators.base import GenerationOutput


class FakeServer:
    """VLLMServerGenerator's surface that ServerEngine uses; `gate` (when set) holds a round mid-generation."""

    own_processes = True

    def __init__(self):
        self.held, self.fleet, self.lock = None, None, threading.RLock()
        self.sync_seconds = self.sync_bytes = 0.0
        self.loads: list[int] = []  # versions the engines loaded, in order
        self.sampled_at: list[int | None] = []  # the version held at each round's sampling
        self.gate: threading.Event | None = None
        self.fail: str | None = None
        self.folders: list[str] = []

    def connect(self, model, tokenizer):
        self.fleet = "started"

    def stage(self, model, version):
        folder = tempfile.mkdtemp(prefix=f"fake-weights-v{version}-")
        self.folders.append(folder)
        return folder, 100

    def load_staged(self, folder, version, nbytes):
        assert os.path.isdir(folder), "a staged folder was removed before it was loaded"
        shutil.rmtree(folder)
        self.held, self.sync_bytes = version, self.sync_bytes + nbytes
        self.loads.append(version)

    def sample_held(self, model, tokenizer, prompts, rng):
        self.sampled_at.append(self.held)
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail:
            raise EngineError(self.fail)
        ids = [torch.randint(0, 1000, (3,), generator=rng).tolist() for _ in prompts]
        return GenerationOutput(ids, [[-1.0] * 3 for _ in ids], 0.01, policy_version=self.held)


@pytest.fixture
def engine():
    made = []

    def make(timeout_s: float = 10.0):
        g = FakeServer()
        e = ServerEngine(g, policy=None, tokenizer=None, threads=1, timeout_s=timeout_s)
        made.append(e)
        return g, e
    yield make
    for e in made:
        e.stop()


def test_a_round_waits_for_the_version_it_needs_and_names_it(engine):
    g, e = engine()
    e.push(None, 0)
    e.submit([[1], [2]], seed=5, round_index=1, need=2)
    time.sleep(0.3)
    assert e.waiting and g.sampled_at == []  # version 0 is too old: nothing generated yet
    e.push(None, 1)  # staged, then replaced by 2 before the engines could use it
    e.push(None, 2)
    made = e.collect()
    assert made.version == 2 and made.out.policy_version == 2
    assert g.loads == [2] and not os.path.isdir(g.folders[1]) and not os.path.isdir(g.folders[0])
    assert e.sync_bytes == 100.0  # one load of 100 bytes


def test_a_push_during_a_round_changes_nothing_in_it(engine):
    g, e = engine()
    g.gate = threading.Event()
    e.push(None, 3)
    e.submit([[1]], seed=1, round_index=1, need=-1)
    while not g.sampled_at:
        time.sleep(0.01)
    e.push(None, 4)  # the trainer stepped while the engines generate
    g.gate.set()
    assert e.collect().version == 3 and g.loads == [3]
    e.submit([[1]], seed=2, round_index=2, need=-1)
    assert e.collect().version == 4 and g.loads == [3, 4]


def test_the_trainers_own_push_waits_for_the_round_in_flight(engine):
    g, e = engine()
    g.gate = threading.Event()
    e.push(None, 0)
    e.submit([[1]], seed=1, round_index=1, need=0)
    while not g.sampled_at:
        time.sleep(0.01)
    assert not g.lock.acquire(timeout=0.2)  # an evaluation's push would land mid-round: it waits
    g.gate.set()
    e.collect()
    assert g.lock.acquire(timeout=1)
    g.lock.release()


def test_each_rounds_samples_come_from_its_seed_not_torchs_global_rng(engine):
    outs = []
    for i in range(2):
        g, e = engine()
        e.push(None, 0)
        torch.manual_seed(123 + i)  # the trainer's RNG in another state: the round's samples do not change
        e.submit([[1], [2]], seed=77, round_index=1, need=0)
        outs.append(e.collect().out.completions)
    assert outs[0] == outs[1]
    g, e = engine()
    e.push(None, 0)
    state = torch.get_rng_state()
    e.submit([[1]], seed=78, round_index=1, need=0)
    other = e.collect().out.completions
    assert torch.equal(torch.get_rng_state(), state)  # the thread drew nothing from the trainer's RNG
    assert other != outs[0][:1]


def test_an_engine_that_fails_or_stays_silent_ends_collect_in_one_line(engine):
    g, e = engine()
    g.fail = "vLLM engine 0 (http://127.0.0.1:8000) exited with code -9 while generating"
    e.push(None, 0)
    e.submit([[1]], seed=1, round_index=1, need=0)
    with pytest.raises(EngineError, match="exited with code -9"):
        e.collect()
    g, e = engine(timeout_s=0.5)
    g.gate = threading.Event()
    e.push(None, 0)
    e.submit([[1]], seed=1, round_index=4, need=0)
    with pytest.raises(EngineError, match=r"round 5 within 0.5 s \(callbacks.regenerate.engine_timeout_s\)"):
        e.collect()
    g.gate.set()
