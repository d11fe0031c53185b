"""generator=vllm_server without vLLM: which weights version a round is made with (`at_version`: a push every
`sync_every` versions, exact for evaluation), the one-line refusals at plan time, and an engine that hangs
or exits ending the call within its timeout in one line. The engines themselves: test_vllm_server.py."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest
from hydra.utils import instantiate

from generators.async_engine import EngineError
from generators.base import at_version
from generators.vllm_fleet import EngineFleet, layer_shards
from generators.vllm_server import VLLMServerGenerator
from run.errors import ConfigError
from run.validation.config import validate

SERVER = ["algorithm=grpo", "generator=vllm_server", "model.hidden_size=64", "model.num_heads=2"]


class Pushes(VLLMServerGenerator):
    """The generator with its push recorded instead of sent."""

    def push(self, model, tokenizer, version):
        self.pushed.append(version)
        self.held = version


def counting(hydra_conf, sync_every: int) -> Pushes:
    g = instantiate(hydra_conf(SERVER + [f"generator.sync_every={sync_every}"]).generator, _target_=
                    f"{__name__}.Pushes")
    g.pushed = []
    return g


@pytest.mark.parametrize("sync_every,held", [(1, [0, 1, 2, 3, 4]), (2, [0, 0, 2, 2, 4]), (3, [0, 0, 0, 3, 3])])
def test_rounds_carry_the_version_the_engines_hold(hydra_conf, sync_every, held):
    """Rounds at policy versions 0..4: the engines get the weights every `sync_every` versions, and each
    round is made with (and names) the version they hold then."""
    g = counting(hydra_conf, sync_every)
    seen = []
    for version in range(5):
        with at_version(g, None, None, version) as made:
            seen.append(made)
    assert seen == held and g.pushed == sorted(set(held))


def test_evaluation_pushes_the_exact_version_and_other_engines_pass_the_version_through(hydra_conf):
    g = counting(hydra_conf, 3)
    with at_version(g, None, None, 0):
        pass
    with at_version(g, None, None, 2, exact=True) as made:  # held-out evaluation: the current weights
        assert made == 2
    with at_version(g, None, None, 4) as made:  # 4 - 2 < 3: no push
        assert made == 2
    assert g.pushed == [0, 2]
    with at_version(object(), None, None, 5) as made:  # generator=hf: the policy itself
        assert made == 5


def test_tied_weights_are_written_once_each_per_layer_file():
    import torch
    emb = torch.ones(3, 2)
    groups = list(layer_shards([("model.embed_tokens.weight", emb), ("model.layers.0.w", torch.zeros(1)),
                                ("model.layers.0.v", torch.zeros(1)), ("model.layers.1.w", torch.zeros(1)),
                                ("model.norm.weight", torch.zeros(2)), ("lm_head.weight", emb)]))
    assert [g for g, _ in groups] == ["other", "layer-00000", "layer-00001", "other"]
    assert groups[-1][1]["lm_head.weight"].data_ptr() != emb.data_ptr()  # cloned: safetensors refuses shared storage


def refused(hydra_conf, overrides) -> str:
    with pytest.raises(ConfigError) as e:
        validate(hydra_conf(SERVER + overrides), "grpo")
    return "\n".join(e.value.problems)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_values_are_refused_before_anything_runs(hydra_conf):
    assert "generator.engines=0 with no generator.urls: nothing would generate" in refused(
        hydra_conf, ["generator.engines=0"])
    assert "generator.engines=-1 must be an integer ≥ 0" in refused(hydra_conf, ["generator.engines=-1"])
    assert "generator.sync_every=0 must be a positive integer" in refused(hydra_conf, ["generator.sync_every=0"])
    dead = f"http://127.0.0.1:{free_port()}"
    line = refused(hydra_conf, ["generator.engines=0", f"generator.urls=[{dead}]"])
    assert line.startswith(f"generator.urls[0]={dead}: no vLLM server there (did not answer /health"), line
    assert "start it with" not in line and "vllm serve" in line
    assert "generator.gpus has 1 entries for generator.engines=2" in refused(
        hydra_conf, ["generator.engines=2", "generator.gpus=['0']", "generator.python=/bin/sh"])
    assert "generator.python=/nonexistent/python: not an executable file" in refused(
        hydra_conf, ["generator.python=/nonexistent/python"])
    assert "generator.weight_dir=/nonexistent: not a writable folder" in refused(
        hydra_conf, ["generator.weight_dir=/nonexistent", "generator.python=/bin/sh"])
    assert "generator.sync_every=2 trains on samples up to 1 versions old, and correction=no_correction" in refused(
        hydra_conf, ["generator.sync_every=2", "correction=none", "generator.python=/bin/sh"])
    assert "with 2 ranks" in refused(hydra_conf, ["hardware=ddp", "trainer.devices=2", "generator.python=/bin/sh"])


def test_a_taken_port_is_refused(hydra_conf):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = refused(hydra_conf, [f"generator.port={port}", "generator.python=/bin/sh"])
    assert line.startswith(f"generator.port={port}: engine 0 would listen on 127.0.0.1:{port}, which is taken"), line


def test_a_port_the_last_run_just_released_is_not_refused():
    """The last run's engine closed its connections first: they sit in TIME_WAIT on its port for a minute,
    and a rerun at once was refused "Address already in use" though its server (SO_REUSEADDR) would bind."""
    from run.validation.vllm_server import _port_problem
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM's server (uvicorn) binds
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server's side closes first: its end of the connection enters TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    assert _port_problem("127.0.0.1", port) is None


def test_a_started_engine_runs_on_its_cpu_cores_only():
    """generator.cpu_cores pins every process of a started engine, not only the OpenMP threads vLLM binds:
    unpinned, its API server and engine core took the trainer's core (docs/scaling.md). The server the fleet
    starts inherits the affinity set between fork and exec; vLLM's own words (auto, nobind) pin nothing."""
    import functools
    import os

    from generators.vllm_fleet import _die_with_parent, cpu_set
    assert cpu_set("1") == {1} and cpu_set("0-3,8") == {0, 1, 2, 3, 8} and cpu_set("0-1|2-3") == {0, 1, 2, 3}
    assert cpu_set("auto") is None and cpu_set("nobind") is None and cpu_set(None) is None
    core = min(os.sched_getaffinity(0))
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           preexec_fn=functools.partial(_die_with_parent, {core}), capture_output=True, text=True)
    assert child.stdout.strip() == f"[{core}]", child.stdout + child.stderr


def silent_server() -> tuple[socket.socket, str]:
    """A server that accepts connections and never answers (an engine stuck)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    held = []
    threading.Thread(target=lambda: [held.append(s.accept()) for _ in range(4)], daemon=True).start()
    return s, f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_engine_that_stops_answering_ends_the_call_within_its_timeout_in_one_line():
    s, url = silent_server()
    fleet = EngineFleet([url], timeout_s=1.5, startup_timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(EngineError) as e:
        fleet.call(0, "/v1/completions", {"prompt": [1]}, "generating (version 3)")
    assert time.monotonic() - start < 10
    assert str(e.value) == (f"vLLM engine 0 ({url}) did not answer /v1/completions within 1.5 s while generating "
                            f"(version 3) (generator.timeout_s)")
    s.close()


def test_a_started_engine_that_exited_is_named_with_its_exit_code_and_log(tmp_path):
    fleet = EngineFleet([f"http://127.0.0.1:{free_port()}"], timeout_s=5, startup_timeout_s=5)
    fleet.processes[0] = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    fleet.processes[0].wait()
    fleet.logs[0] = str(tmp_path / "engine0.log")
    with pytest.raises(EngineError, match=r"^vLLM engine 0 \(http://127.0.0.1:\d+\) exited with code 3 while "
                                          r"generating; its log: .*engine0.log$"):
        fleet.call(0, "/v1/completions", {}, "generating")
