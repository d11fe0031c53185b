"""generator=vllm_server with real vLLM servers (one engine started on CPU): the weights in the engine after a
push are the trainer's (log-probs of sampled tokens equal the policy's forward before and after an update that
changed them), a known weights version reaches the samples, a killed engine ends the call in one line, and
`python train.py` GRPO runs end to end with every record naming the version that generated it.

Needs the vllm venv (bash scripts/test_vllm.sh; marked `vllm`). Each engine start takes ~1-2 min on the loaded
2-core machine: one engine for the module's direct tests, one for the train.py run (marked `slow` too).
"""
from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest

vllm = pytest.importorskip("vllm")

import torch  # noqa: E402

from generators.async_engine import EngineError  # noqa: E402
from generators.base import at_version  # noqa: E402
from generators.vllm_server import VLLMServerGenerator  # noqa: E402
from models.tiny import build_tiny  # noqa: E402
from tests.generators.test_vllm import TINY, make_prompts, max_error, reference_logprobs  # noqa: E402
from tests.generators.test_vllm_server_checks import free_port  # noqa: E402
from tests.test_train_e2e import SMALL, train  # noqa: E402

pytestmark = pytest.mark.vllm

TOL = 1e-4  # float32 on CPU: vLLM's kernels against the trainer's forward (generator=vllm measures ~1e-6)


def server(**overrides) -> VLLMServerGenerator:
    keys = dict(max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0, batch_size=32, ignore_eos=False, engines=1,
                urls=[], host="127.0.0.1", port=free_port(), gpus=[], cpu_cores=[], python=None, dtype="policy",
                max_model_len=None, enforce_eager=True, seed=0, gpu_memory_utilization=0.9,
                kv_cache_memory_bytes=64 << 20, tensor_parallel_size=1, server_args=["--block-size", "32"],
                sync_every=1, weight_dir=None, timeout_s=60, startup_timeout_s=400)
    return VLLMServerGenerator(**(keys | overrides))


@pytest.fixture(scope="module")
def engine():
    g = server()
    yield g
    g.close()


def test_pushed_weights_are_the_trainers_and_the_version_reaches_the_samples(engine):
    """Version 0: the engine's log-probs of its samples are the policy's forward's. An optimizer step that
    changes them, pushed as version 1: they are the updated policy's (and not the old one's); the engine
    reports version 1 and the samples carry it. 40-token prompts fill a 32-token prefix-cache block: a push
    without the cache reset would answer with the old weights' keys and values."""
    policy, tok = build_tiny(**TINY)
    prompts = make_prompts(tok, n_distinct=4, repeats=2)
    with at_version(engine, policy, tok, 0) as version:
        out = engine.sample(policy, tok, prompts)
    assert version == 0 and out.policy_version == 0
    assert len(set(map(tuple, out.completions))) > 1  # each request its own seed: a group's samples differ
    assert max_error(out.logprobs, reference_logprobs(policy, prompts, out.completions, 1.0)) < TOL
    old = [lp.clone() for lp in reference_logprobs(policy, prompts, out.completions, 1.0)]

    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    policy.train()
    logits = policy(torch.tensor([prompts[0]])).logits
    logits[0, -1].log_softmax(-1)[5].neg().backward()
    opt.step()
    new = reference_logprobs(policy, prompts, out.completions, 1.0)
    assert max((a - b).abs().max().item() for a, b in zip(old, new)) > 1e-2  # the update changed them
    with at_version(engine, policy, tok, 1) as version:
        again = engine.sample(policy, tok, prompts)
    assert version == 1 and again.policy_version == 1 and engine.fleet.weight_version(0) == "1"
    assert max_error(again.logprobs, reference_logprobs(policy, prompts, again.completions, 1.0)) < TOL
    assert engine.sync_bytes > 0 and engine.pushes == 2


def test_a_known_version_is_what_the_samples_carry_under_sync_every(engine):
    policy, tok = build_tiny(**TINY)
    engine.sync_every = 3
    try:
        made = []
        for version in (7, 8, 9, 10):
            with at_version(engine, policy, tok, version) as held:
                made.append((held, engine.sample(policy, tok, make_prompts(tok, 2, 1)).policy_version))
        assert made == [(7, 7), (7, 7), (7, 7), (10, 10)] and engine.fleet.weight_version(0) == "10"
    finally:
        engine.sync_every = 1


def test_a_killed_engine_ends_the_call_within_its_timeout_in_one_line(engine):
    """Last in the module: it kills the module's engine."""
    policy, tok = build_tiny(**TINY)
    process = engine.fleet.processes[0]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    with pytest.raises(EngineError) as e:
        with at_version(engine, policy, tok, 11):
            pass
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"vLLM engine 0 ({engine.urls[0]}) exited with code -9 while "
                                                f"loading weights version 11"), line


@pytest.mark.slow
def test_grpo_through_train_py_with_a_started_engine(tmp_path):
    """4 rounds of one step each at sync_every=2: the engine gets the weights at versions 0 and 2, so the
    stored records of rounds 1..4 name versions 0, 0, 2, 2; no engine outlives the run."""
    out, store, port = tmp_path / "run", tmp_path / "store", free_port()
    proc = train(*SMALL, "algorithm=grpo", "generator=vllm_server", "model.hidden_size=64", "model.num_heads=2",
                 "generator.sync_every=2", f"generator.port={port}", "generator.kv_cache_memory_bytes=67108864",
                 "logger=none", f"++data.store={store}", f"hydra.run.dir={out}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    assert summary["rollout/rounds"] == 4 and summary["train/steps"] == 4
    from data_modules.store import load_experience
    from models.tokenizer import build_char_tokenizer
    records = load_experience(store, build_char_tokenizer())
    per_round = len(records) // 4
    assert Counter(r.provenance.policy_version for r in records) == {0: 2 * per_round, 2: 2 * per_round}
    assert {r.provenance.generator for r in records} == {"vllm_server"}
    assert all(len(r.behaviour_logprobs) == len(r.completion_ids) for r in records)
    assert f"--port {port}" not in os.popen("ps -eo args").read()  # the engine is gone


@pytest.mark.slow
def test_asynchronous_rounds_on_a_started_engine_through_train_py(tmp_path):
    """max_staleness=1 on the server (generators/async_server.py): round 1 is made in the trainer at version
    0; every next round by the engine while the previous one trains, from the weights at that round's
    start, so the 4 rounds name versions 0, 0, 1, 2 and each after the first is served one version
    behind; the ledger has the engine's side and its weight syncs; no engine outlives the run."""
    out, store, port = tmp_path / "run", tmp_path / "store", free_port()
    proc = train(*SMALL, "algorithm=grpo", "generator=vllm_server", "model.hidden_size=64", "model.num_heads=2",
                 f"generator.port={port}", "generator.kv_cache_memory_bytes=67108864", "correction=decoupled_ppo",
                 "callbacks.regenerate.max_staleness=1", "callbacks.regenerate.engine_startup=wait",
                 "logger=none", f"++data.store={store}", f"hydra.run.dir={out}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    assert summary["rollout/rounds"] == 4 and summary["train/steps"] == 4
    assert summary["rollout/async_waited_rounds"] == 0 and summary["rollout/async_dropped_rounds"] == 0
    assert summary["cost/weight_sync_bytes"] > 0
    from data_modules.store import load_experience
    from models.tokenizer import build_char_tokenizer
    records = load_experience(store, build_char_tokenizer())
    per_round = len(records) // 4
    assert Counter(r.provenance.policy_version for r in records) == {0: 2 * per_round, 1: per_round, 2: per_round}
    assert f"--port {port}" not in os.popen("ps -eo args").read()
