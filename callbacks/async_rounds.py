"""Asynchronous rounds at bounded staleness (`callbacks.regenerate.max_staleness=k > 0`; docs/scaling.md).

RegenerateExperience (callbacks/regenerate.py) makes round r+1's prompts as soon as round r is made and
hands them to an engine in its own process (generators/async_engine.py: generator=hf spawned; or
generators/async_server.py: generator=vllm_server's engines, driven from a thread), which generates while
the trainer trains round r. At round r's end the trainer collects round r+1, scores and annotates it in its
own process, and serves it. Staleness is counted in policy versions (optimizer steps), as
train/staleness_* are: a round served at version v may have been generated at version ≥ v - k.

past_bound=wait: the engine does not start a round before the weights it needs are pushed (version ≥
the round's forecast serving version - k; the trainer pushes after every optimizer step while the engine
waits), so every round arrives within the bound; one that does not (the forecast was off) is generated
again by the engine at the current weights. past_bound=drop: the engine generates at once with the
weights it holds, and a round past the bound is discarded (its samples counted in
rollout/async_dropped_records) and generated again in the trainer's process, synchronously.

While the engine process loads (its imports and its copy of the model: seconds, tens of seconds on a loaded
machine) the trainer would wait for it; with engine_startup=overlap it makes those rounds itself, fresh, as
the synchronous loop does (counted in rollout/async_startup_rounds), and hands the engine the first round
planned after it has loaded; engine_startup=wait keeps the schedule fixed by the seed (every round after the
first from the engine, whatever the machine's load).

Per round the ledger logs the trainer's and the engine's idle seconds, the weight syncs' seconds and
bytes, the trainer's tokens per second of training, and the round's staleness (rollout/async_staleness);
summary.json has their totals. k = 0 starts no engine: the synchronous path, untouched.
"""
from __future__ import annotations

import time

from generators.async_engine import AsyncEngine, Made
from generators.async_server import ServerEngine


class AsyncRounds:
    """The round loop's side of the engine: submit the next round, collect it within the bound."""

    def __init__(self, generator, max_staleness: int, past_bound: str, timeout_s: float, threads: int,
                 startup: str = "overlap"):
        self.generator, self.k, self.past_bound = generator, max_staleness, past_bound
        self.timeout_s, self.threads, self.startup = timeout_s, threads, startup
        self.engine: AsyncEngine | None = None
        self.in_flight: int | None = None  # the round index the engine is generating
        self.made_here: int | None = None  # startup=overlap: the round left to the trainer while the engine loads
        self.totals = {"trainer_idle_seconds": 0.0, "engine_idle_seconds": 0.0, "weight_sync_seconds": 0.0,
                       "weight_sync_bytes": 0.0, "async_waited_rounds": 0, "async_dropped_rounds": 0,
                       "async_dropped_records": 0, "async_startup_rounds": 0}
        self.round: dict[str, float] = {}  # the latest round's metrics
        self.trained_from = self.trained_tokens = 0.0  # the served round: wall clock at its start, its tokens
        self._synced, self._train, self._prompts = (0.0, 0.0), {}, []

    # ---- the trainer's calls --------------------------------------------------------------------
    def start(self, pl_module, dm) -> None:
        """Start the engine process (at fit start: it loads while the first round is made here)."""
        if self.engine is None:  # generator=vllm_server: its engines, from a thread; else a spawned generator=hf
            engine = ServerEngine if getattr(self.generator, "own_processes", False) else AsyncEngine
            self.engine = engine(self.generator, pl_module.policy, dm.tokenizer, self.threads, self.timeout_s)

    def submit(self, pl_module, dm, planned, round_index: int) -> None:
        """Hand round `round_index`'s planned groups to the engine, with the current weights pushed."""
        self.start(pl_module, dm)
        if self.startup == "overlap" and not self.engine.loaded:  # the trainer makes it, fresh, rather than
            self.made_here, self.in_flight = round_index, None    # wait seconds for the engine's start-up
            return
        version = pl_module.policy_version
        self.engine.push(pl_module.policy, version)
        forecast = version + max(int(getattr(dm, "steps_per_round", 1)), 1)  # the version it will be served at
        need = forecast - self.k if self.past_bound == "wait" else -1
        prompts = [ids for _, ids, _ in planned for _ in range(dm.group_size)]
        self.engine.submit(prompts, seed=dm.seed * 1_000_003 + 7_919 * round_index + 1, round_index=round_index,
                           need=need)
        self.in_flight = round_index
        self._prompts = prompts

    def after_step(self, pl_module) -> None:
        """After an optimizer step: push the new weights if the engine waits for them (past_bound=wait)."""
        if self.engine is not None and self.engine.waiting:
            self.engine.push(pl_module.policy, pl_module.policy_version)

    def collect(self, pl_module, round_index: int) -> Made | None:
        """Round `round_index` from the engine within the bound; None when there is none to collect
        (none in flight: the first round, a resumed one) or it was dropped (the caller generates it)."""
        if self.engine is None or self.in_flight != round_index:
            if self.made_here == round_index:
                self.totals["async_startup_rounds"] += 1
            self.round, self.made_here = {}, None
            return None
        start, serve = time.perf_counter(), pl_module.policy_version
        self._close_training(start)
        self.engine.lower_need(serve - self.k)  # the round ended early: the engine may start now
        if self.engine.waiting:  # else the engine keeps the version it was given (deterministic)
            self.engine.push(pl_module.policy, serve)
        made, self.in_flight = self.engine.collect(), None
        if serve - made.version > self.k:
            if self.past_bound == "drop":
                self.totals["async_dropped_rounds"] += 1
                self.totals["async_dropped_records"] += len(made.out.completions)
                self._account(start, made, serve, dropped=True)
                return None
            self.totals["async_waited_rounds"] += 1
            self.engine.push(pl_module.policy, serve)
            self.engine.submit(self._prompts, seed=made.version + 17, round_index=round_index, need=serve)
            made = self.engine.collect()
        self._account(start, made, serve)
        return made

    def started_round(self, records) -> None:
        """The round just put starts training now (its tokens: the trainer's tokens per second)."""
        self.trained_from = time.perf_counter()
        self.trained_tokens = float(sum(len(r.prompt_ids) + len(r.completion_ids) for r in records))

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
        self.in_flight = None

    # ---- the ledger -----------------------------------------------------------------------------
    def _close_training(self, now: float) -> None:
        seconds = now - self.trained_from if self.trained_from else 0.0
        self._train = {"perf/trainer_tokens_per_sec": self.trained_tokens / seconds} if seconds > 0 else {}

    def _account(self, start: float, made: Made, serve: int, dropped: bool = False) -> None:
        idle = time.perf_counter() - start
        sync_s, sync_b = self.engine.sync_seconds - self._synced[0], self.engine.sync_bytes - self._synced[1]
        self._synced = (self.engine.sync_seconds, self.engine.sync_bytes)
        t = self.totals
        t["trainer_idle_seconds"] += idle
        t["engine_idle_seconds"] += made.idle_seconds
        t["weight_sync_seconds"] += sync_s
        t["weight_sync_bytes"] += sync_b
        tokens = sum(len(c) for c in made.out.completions)
        self.round = {"rollout/async_staleness": float(serve - made.version), "perf/trainer_idle_seconds": idle,
                      "perf/engine_idle_seconds": made.idle_seconds, "perf/weight_sync_seconds": sync_s,
                      "perf/weight_sync_bytes": sync_b, "cost/weight_sync_seconds": t["weight_sync_seconds"],
                      "cost/weight_sync_bytes": t["weight_sync_bytes"],
                      "perf/engine_tokens_per_sec": tokens / max(made.out.seconds, 1e-9),
                      "rollout/async_dropped": float(dropped), **self._train}

    def summary(self) -> dict:
        t = self.totals
        return {"cost/trainer_idle_seconds": t["trainer_idle_seconds"],
                "cost/engine_idle_seconds": t["engine_idle_seconds"],
                "cost/weight_sync_seconds": t["weight_sync_seconds"], "cost/weight_sync_bytes": t["weight_sync_bytes"],
                "rollout/async_waited_rounds": t["async_waited_rounds"],
                "rollout/async_dropped_rounds": t["async_dropped_rounds"],
                "rollout/async_dropped_records": t["async_dropped_records"],
                "rollout/async_startup_rounds": t["async_startup_rounds"]}
