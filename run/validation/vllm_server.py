"""Checks of `generator=vllm_server` across keys (generators/vllm_server.py, docs/scaling.md), each refused in
one line at plan time, before a model loads or a file is written: engines to start or addresses to reach
(one of them), a device list per started engine, an interpreter with vllm, free ports, servers that answer,
a writable hand-off folder, one trainer rank, a correction for samples `sync_every` makes stale. Each key's own type and range: the schema
(run/validation/schemas/generator.py)."""
from __future__ import annotations

import importlib.util
import os
import socket

from omegaconf import DictConfig, ListConfig

from hardware.processes import world_size_of
from run.validation.async_rounds import STALE_CORRECTIONS
from run.validation.values import is_int, raw

TARGET = "generators.vllm_server.VLLMServerGenerator"
HEALTH_TIMEOUT_S = 5.0
START_HINT = ("start one with `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --logprobs-mode processed_logprobs "
              "--generation-config vllm` (docs/scaling.md)")


def check_vllm_server(cfg: DictConfig, errors: list[str]) -> None:
    if raw(cfg, "generator._target_") != TARGET:
        return
    engines, urls = raw(cfg, "generator.engines"), _listed(raw(cfg, "generator.urls"))
    if not is_int(engines) or not isinstance(urls, list):
        return  # the schema says what is wrong
    if engines == 0 and not urls:
        errors.append("generator.engines=0 with no generator.urls: nothing would generate; start engines "
                      "(generator.engines=1) or give the servers' addresses (generator.urls=[http://host:8000])")
    elif engines > 0 and urls:
        errors.append(f"generator.engines={engines} with generator.urls={urls}: start engines or connect to yours, "
                      f"not both (set generator.engines=0 to use the urls)")
    elif engines > 0:
        _check_started(cfg, engines, errors)
    else:
        _check_reachable(urls, errors)
    _check_weight_dir(raw(cfg, "generator.weight_dir"), errors)
    every, correction = raw(cfg, "generator.sync_every"), raw(cfg, "algorithm.correction._target_")
    if is_int(every) and every > 1 and correction is not None and correction not in STALE_CORRECTIONS:
        errors.append(f"generator.sync_every={every} trains on samples up to {every - 1} versions old, and "
                      f"correction={correction.rsplit('.', 1)[-1]} does not correct for that: use "
                      f"correction=decoupled_ppo (or ppo_clip, truncated_is), or generator.sync_every=1")
    trainer = cfg.get("trainer")
    if trainer is not None and is_int(trainer.get("devices", 1)) and is_int(trainer.get("num_nodes", 1)) \
            and world_size_of(trainer) > 1:
        errors.append(f"generator=vllm_server with {world_size_of(trainer)} ranks (trainer.devices × "
                      f"trainer.num_nodes): the engines serve one trainer process for now; use one rank "
                      f"(the engines take the other devices: generator.gpus)")


def _check_started(cfg: DictConfig, engines: int, errors: list[str]) -> None:
    """Engines the run starts: a device entry each (if any), an interpreter with vllm, free ports."""
    for key in ("gpus", "cpu_cores"):
        given = _listed(raw(cfg, f"generator.{key}"))
        if isinstance(given, list) and given and len(given) != engines:
            errors.append(f"generator.{key} has {len(given)} entries for generator.engines={engines}: one per "
                          f"engine (engine i runs on entry i), or [] to leave it to the engines")
    python = raw(cfg, "generator.python")
    if python is None:
        if importlib.util.find_spec("vllm") is None:
            errors.append("generator=vllm_server starts its engines with this interpreter, which has no vllm: run "
                          "with the vllm venv's python, or set generator.python=/path/to/venv/bin/python "
                          "(bash scripts/install_vllm.sh builds one)")
    elif isinstance(python, str) and not (os.path.isfile(python) and os.access(python, os.X_OK)):
        errors.append(f"generator.python={python}: not an executable file (the interpreter of a venv with vllm)")
    host, port = raw(cfg, "generator.host"), raw(cfg, "generator.port")
    if isinstance(host, str) and is_int(port):
        for i in range(engines):
            problem = _port_problem(host, port + i)
            if problem:
                errors.append(f"generator.port={port}: engine {i} would listen on {host}:{port + i}, {problem}; "
                              f"pick another generator.port")
                break


def _listed(value):
    """A list node as a list (None: []); anything else as it is (the schema refuses it)."""
    return list(value) if isinstance(value, (list, ListConfig)) else [] if value is None else value


def _port_problem(host: str, port: int) -> str | None:
    if port > 65535:
        return "beyond the last port (65535)"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the server binds (uvicorn sets SO_REUSEADDR): the last run's connections in TIME_WAIT do not
        # hold the port for a minute, a listening process still does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return f"which is taken or not available ({e.strerror or e})"
    return None


def _check_reachable(urls: list, errors: list[str]) -> None:
    """The user's servers answer GET /health (a few seconds each at most)."""
    import httpx

    for i, url in enumerate(urls):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            errors.append(f"generator.urls[{i}]={url!r}: not a base URL (http://host:port)")
            continue
        try:
            status = httpx.get(f"{url.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S).status_code
            problem = None if status == 200 else f"answered /health with HTTP {status}"
        except httpx.HTTPError as e:
            problem = f"did not answer /health within {HEALTH_TIMEOUT_S:g} s ({type(e).__name__})"
        if problem:
            errors.append(f"generator.urls[{i}]={url}: no vLLM server there ({problem}); {START_HINT}")


def _check_weight_dir(folder, errors: list[str]) -> None:
    if isinstance(folder, str) and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        errors.append(f"generator.weight_dir={folder}: not a writable folder (the weights hand-off; engines on "
                      f"other machines need it on a filesystem they share with the trainer)")
