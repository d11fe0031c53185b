"""Asynchronous rounds at bounded staleness (callbacks.regenerate.max_staleness; callbacks/async_rounds.py)
through a real Lightning Trainer: k = 0 is the synchronous loop bit for bit with no engine started; k = 1
trains every round after the first one version behind (the engine's version in each record's provenance);
a killed engine ends the run in one line and no engine outlives a fit; bad values are refused at plan time."""
from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import open_dict

from callbacks.async_rounds import AsyncRounds
from generators.async_engine import AsyncEngine, EngineError, Made
from generators.base import GenerationOutput
from run.checkpointing import ResumeState
from run.errors import ConfigError, format_error, user_error
from run.stages import plan_stages
from tests.conftest import CONF
from tests.data_modules.test_replay_mix import OVERRIDES, ServedRecorder, build_parts, stage_cfg

ONE_STEP_ROUNDS = ["data.replay_ratio=0", "data.max_reuse=null", "data.max_staleness=null",
                   "algorithm.epochs_per_round=1", "data.batch_size=16"]  # 16 records a round: 1 step
ASYNC = ONE_STEP_ROUNDS + ["correction=decoupled_ppo", "callbacks.regenerate.max_staleness=1",
                          "callbacks.regenerate.engine_startup=wait"]  # the schedule fixed by the seed


def engines_alive() -> list:
    return [p for p in mp.active_children() if p.name == "policyshift-engine"]


def test_staleness_zero_is_the_synchronous_path_bit_for_bit(tmp_path):
    """max_staleness=0 (whatever past_bound says) starts no engine, and its final weights and summary
    equal those of the callback built as before the key existed (no async keys at all)."""
    runs = []
    for extra in ([], ["callbacks.regenerate.max_staleness=0", "callbacks.regenerate.past_bound=drop"]):
        stage = stage_cfg(tmp_path / str(len(runs)), ONE_STEP_ROUNDS + extra)
        if not extra:  # the callback exactly as main built it: no async key in its node
            with open_dict(stage.cfg):
                for key in ("max_staleness", "past_bound", "engine_timeout_s", "engine_threads",
                            "engine_startup"):
                    del stage.cfg.callbacks.regenerate[key]
        trainer, module, dm, regenerate = build_parts(stage, 3)
        trainer.fit(module, datamodule=dm)
        assert regenerate.ahead is None and not engines_alive()
        summary = {k: v for k, v in regenerate.summary().items() if "seconds" not in k}  # timings differ
        runs.append(({k: v.clone() for k, v in module.policy.state_dict().items()}, summary))
    (weights_a, summary_a), (weights_b, summary_b) = runs
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert summary_a == summary_b and summary_a["rollout/rounds"] == 3


def test_staleness_one_trains_each_round_one_version_behind(tmp_path):
    """Round 1 is made here at version 0; every next round by the engine while the previous one trains,
    with the weights it was handed (the version at that round's start), so it is served one version
    behind: provenance.policy_version = step - 1, train/staleness_hist/1 = 1, decoupled PPO's π_prox
    a forward at the step's start. The engine is stopped when the fit ends."""
    stage = stage_cfg(tmp_path, ASYNC)
    recorder = ServedRecorder()
    trainer, module, dm, regenerate = build_parts(stage, 4, [recorder])
    trainer.fit(module, datamodule=dm)
    behind = [{step - version for _, version, _, _ in served} for step, served in recorder.epochs]
    assert behind == [{0}, {1}, {1}, {1}]
    assert float(trainer.callback_metrics["train/staleness_hist/1"]) == 1.0
    assert module.proximal_forwards == 16  # every record of the last round: π_prox ≠ μ
    summary = regenerate.summary()
    assert summary["rollout/rounds"] == 4 and summary["cost/records_generated"] == 4 * 16
    assert summary["rollout/async_dropped_rounds"] == 0 and summary["rollout/async_waited_rounds"] == 0
    assert summary["cost/weight_sync_bytes"] > 0 and summary["cost/trainer_idle_seconds"] >= 0
    assert regenerate.last_round["rollout/async_staleness"] == 1.0
    assert not engines_alive()


@pytest.mark.parametrize(("past_bound", "behind", "dropped"), [("wait", 1, 0), ("drop", 0, 3)])
def test_rounds_of_two_steps_past_a_bound_of_one(tmp_path, past_bound, behind, dropped):
    """Two optimizer steps a round, max_staleness=1: a round generated at the previous round's start would
    be 2 versions behind. wait: the engine starts it only once the round's first step is pushed, so it
    is served 1 behind; drop: the engine starts at once, the round arrives 2 behind, is dropped and made
    again here (0 behind), counted."""
    extra = [o.replace("data.batch_size=16", "data.batch_size=8") for o in ASYNC]
    stage = stage_cfg(tmp_path, extra + [f"callbacks.regenerate.past_bound={past_bound}"])
    recorder = ServedRecorder()
    trainer, module, dm, regenerate = build_parts(stage, 8, [recorder])
    trainer.fit(module, datamodule=dm)
    first_steps = [{step - version for _, version, _, _ in served} for step, served in recorder.epochs][:4]
    assert first_steps == [{0}] + [{behind}] * 3
    summary = regenerate.summary()
    assert summary["rollout/async_dropped_rounds"] == dropped and summary["rollout/async_dropped_records"] == 16 * dropped
    assert summary["cost/records_generated"] == 4 * 16  # a dropped round's samples are not counted as trained-on


class LoadingEngine:
    """Stands in for AsyncEngine: loaded once `loaded` is set; records what it is asked."""

    def __init__(self):
        self.loaded, self.submitted, self.pending = False, [], None
        self.sync_seconds = self.sync_bytes = 0.0

    def push(self, policy, version):
        pass

    def submit(self, prompts, seed, round_index, need):
        self.submitted.append(round_index)
        self.need = need

    @property
    def waiting(self):
        return False

    def lower_need(self, need):
        pass

    def collect(self):
        return Made(GenerationOutput([[1, 2]], [[-0.5, -0.5]], 0.1), version=3, idle_seconds=0.0)


def test_the_trainer_makes_the_rounds_itself_while_the_engine_loads():
    """engine_startup=overlap: a round planned while the engine is still loading is not handed to it (the
    trainer makes it, fresh: collect gives None) and is counted; the first round planned after it has
    loaded goes to the engine. engine_startup=wait hands every round to the engine, loaded or not."""
    module, dm = SimpleNamespace(policy=None, policy_version=3), SimpleNamespace(steps_per_round=1, group_size=1, seed=0)
    planned = [(None, [5, 6], 0)]
    overlap = AsyncRounds(None, 1, "wait", 10.0, 1, "overlap")
    overlap.engine = engine = LoadingEngine()
    overlap.submit(module, dm, planned, round_index=1)
    assert engine.submitted == [] and overlap.collect(module, 1) is None
    overlap.submit(module, dm, planned, round_index=2)
    assert overlap.collect(module, 2) is None and overlap.summary()["rollout/async_startup_rounds"] == 2
    engine.loaded = True
    overlap.submit(module, dm, planned, round_index=3)
    made = overlap.collect(module, 3)
    assert engine.submitted == [3] and made.version == 3 and overlap.round["rollout/async_staleness"] == 0.0
    assert overlap.summary()["rollout/async_startup_rounds"] == 2
    wait = AsyncRounds(None, 1, "wait", 10.0, 1, "wait")
    wait.engine = LoadingEngine()
    wait.submit(module, dm, planned, round_index=1)
    assert wait.engine.submitted == [1] and wait.collect(module, 1) is not None
    assert wait.summary()["rollout/async_startup_rounds"] == 0


@pytest.mark.parametrize(("k", "need"), [(1, 4), (2, 3), (3, 3)])
def test_a_bound_of_a_whole_round_lets_the_engine_start_at_once(k, need):
    """Two steps a round, handed over at version 3 (served from version 5): past_bound=wait asks for weights of
    version ≥ 5 - k. k = 1: the round's first step (4), so the engine overlaps only the second; k ≥ 2 (≥ the
    round's steps): the weights it is handed (3), so it starts at once and overlaps the whole round."""
    module, dm = SimpleNamespace(policy=None, policy_version=3), SimpleNamespace(steps_per_round=2, group_size=1, seed=0)
    rounds = AsyncRounds(None, k, "wait", 10.0, 1, "wait")
    rounds.engine = LoadingEngine()
    rounds.submit(module, dm, [(None, [5, 6], 0)], round_index=1)
    assert max(rounds.engine.need, module.policy_version) == need


def test_an_engine_that_exits_while_loading_ends_the_run_in_one_line():
    """Under engine_startup=overlap the trainer asks whether the engine has loaded before each round: one that
    exited first raises (else the trainer would make every round itself, silently)."""
    engine = AsyncEngine.__new__(AsyncEngine)
    engine.ready, engine.process = mp.get_context("spawn").Event(), SimpleNamespace(exitcode=-9, pid=4321)
    with pytest.raises(EngineError, match=r"process 4321\) exited with code -9 while loading") as err:
        engine.loaded  # noqa: B018
    assert len(format_error(err.value).splitlines()) == 1
    engine.process = SimpleNamespace(exitcode=None, pid=4321)
    assert engine.loaded is False
    engine.ready.set()
    assert engine.loaded is True


class KillEngine(L.Callback):
    """SIGKILL the engine process before the second optimizer step."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        regenerate = next(c for c in trainer.callbacks if hasattr(c, "ahead"))
        if trainer.global_step == 1:
            os.kill(regenerate.ahead.engine.process.pid, signal.SIGKILL)


def test_a_killed_engine_ends_the_run_in_one_line(tmp_path):
    stage = stage_cfg(tmp_path, ASYNC)
    trainer, module, dm, regenerate = build_parts(stage, 4, [KillEngine()])
    with pytest.raises(EngineError, match=r"generation engine \(process \d+\) exited with code -9") as err:
        trainer.fit(module, datamodule=dm)
    assert user_error(err.value) is err.value and len(format_error(err.value).splitlines()) == 1
    assert not engines_alive()


def plan(*extra: str) -> ConfigError:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        overrides = OVERRIDES + ONE_STEP_ROUNDS + list(extra)
        with pytest.raises(ConfigError) as err:
            plan_stages(compose("train", overrides=overrides), overrides)
    GlobalHydra.instance().clear()
    return err.value


@pytest.mark.parametrize(("extra", "said"), [
    (["callbacks.regenerate.max_staleness=-1"], "callbacks.regenerate.max_staleness"),
    (["callbacks.regenerate.max_staleness=1", "callbacks.regenerate.past_bound=later"], "wait or drop"),
    (["callbacks.regenerate.max_staleness=1", "correction=none"], "correction=decoupled_ppo"),
    (["callbacks.regenerate.max_staleness=1", "correction=decoupled_ppo", "trainer.devices=2"], "2 ranks"),
    (["callbacks.regenerate.max_staleness=2", "correction=decoupled_ppo", "env=calculator"], "env="),
    (["callbacks.regenerate.max_staleness=1", "correction=decoupled_ppo", "trainer.accelerator=gpu"], "CPU only"),
    (["callbacks.regenerate.max_staleness=1", "correction=decoupled_ppo", "trainer.precision=bf16-mixed"],
     "not the engine's older version"),  # the mixed-precision rescoring would relabel stale samples as fresh
    (["callbacks.regenerate.max_staleness=1", "correction=decoupled_ppo", "algorithm.dynamic_sampling=true"],
     "dynamic sampling"),
    (["callbacks.regenerate.max_staleness=1", "correction=decoupled_ppo", "generator=vllm_server",
      "generator.urls=[http://127.0.0.1:9]", "generator.sync_every=2"], "use sync_every=1"),
    (["callbacks.regenerate.max_staleness=1", "correction=decoupled_ppo", "generator=vllm"], "engine per rank"),
])
def test_bad_async_values_are_refused_at_plan_time_in_one_line(extra, said):
    problems = plan(*extra).problems
    assert any(said in p for p in problems), problems
    assert all("\n" not in p for p in problems)


def test_vllm_server_engines_take_asynchronous_rounds_on_a_gpu_trainer_too():
    """generator=vllm_server runs its engines on devices of their own: the CPU-only and mixed-precision
    refusals of the spawned generator=hf engine are not its (the URL does not answer: that is refused)."""
    problems = plan("callbacks.regenerate.max_staleness=1", "correction=decoupled_ppo", "generator=vllm_server",
                    "generator.urls=[http://127.0.0.1:9]", "trainer.accelerator=gpu",
                    "trainer.precision=bf16-mixed").problems
    assert not [p for p in problems if "max_staleness" in p], problems


def test_a_resumed_run_generates_the_round_in_flight_again_and_counts_it_once(tmp_path):
    """A round-end checkpoint holds the next round's prompts, handed to the engine but neither trained nor
    counted: a run resumed from it (as after kill -9 during the next round) hands exactly those to a new
    engine, so it serves the same groups at the same steps as the run never stopped, and counts each
    generated record once."""
    stage = stage_cfg(tmp_path, ASYNC)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="round{epoch}", save_top_k=-1, every_n_epochs=1,
                                 save_on_train_epoch_end=True, enable_version_counter=False)
    whole, resumed = ServedRecorder(), ServedRecorder()
    trainer, module, dm, regenerate = build_parts(stage, 4, [ResumeState(tmp_path / "l.ckpt"), checkpoint, whole])
    trainer.fit(module, datamodule=dm)
    assert regenerate.totals["records_generated"] == 4 * 16
    whole_bytes = regenerate.summary()["cost/weight_sync_bytes"]  # one push a round the engine made: 3
    never_stopped = {step: sorted({g for g, _, _, _ in s}) for step, s in whole.epochs}

    after_two = tmp_path / "ckpt" / "roundepoch=1.ckpt"  # the end of round 2: round 3 made, round 4 in flight
    state = next(v for k, v in torch.load(after_two, weights_only=False)["callbacks"].items() if "Regenerate" in k)
    assert state["rounds"] == 3 and state["totals"]["records_generated"] == 3 * 16
    assert [gid for _, _, gid in state["pending_prompts"]] == never_stopped[3]
    assert state["async_totals"]["weight_sync_bytes"] == whole_bytes * 2 / 3  # rounds 2 and 3's pushes
    trainer, module, dm, regenerate = build_parts(stage, 4, [ResumeState(tmp_path / "l.ckpt"), resumed])
    trainer.fit(module, datamodule=dm, ckpt_path=after_two)
    served = {step: sorted({g for g, _, _, _ in s}) for step, s in resumed.epochs}  # the later entry wins
    assert served == {2: never_stopped[2], 3: never_stopped[3]}
    assert regenerate.totals["records_generated"] == 4 * 16 and not engines_alive()
    assert regenerate.summary()["rollout/async_waited_rounds"] == 0  # handed over at the restored version
    assert regenerate.summary()["cost/weight_sync_bytes"] == whole_bytes  # the ledger's totals resumed, not restarted
