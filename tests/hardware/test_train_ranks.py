"""`train.py` with 2 ranks (hardware=ddp, fsdp) as a user runs it: one job = one folder written by rank 0
alone, the round sharded by whole groups and counted once, sweeps (basic, Optuna) giving one folder and
one W&B run per job with both ranks on the job's settings, and start-up failures that are clean."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from data_modules.store import load_experience
from models.tokenizer import build_char_tokenizer
from tests.test_train_e2e import TINY_MODEL, train

RANKS = TINY_MODEL + ["algorithm=grpo", "trainer.max_steps=4", "data.prompts_per_round=8", "data.batch_size=32",
                      "data.micro_batch_size=8", "task.num_heldout=20", "callbacks.evaluate.num_examples=20",
                      "callbacks.progress.refresh_rate=0", "generator.max_new_tokens=6", "reward=function",
                      "reward.fn._target_=tests.helpers.char_sum_scores", "logger=csv"]
RUN_FILES = {".hydra", "checkpoints", "config.yaml", "csv", "plots", "policy", "run.json", "summary.json", "train.log"}


def test_ddp_job_shards_the_round_and_rank0_writes_alone(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()  # a MASTER_PORT already taken: torchrun --standalone rendezvouses on a free one
    out = tmp_path / "run"
    proc = train("hardware=ddp", *RANKS, f"hydra.run.dir={out}", env={"MASTER_PORT": str(busy.getsockname()[1])})
    busy.close()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == RUN_FILES  # no file of rank 1's
    assert proc.stdout.count("policyshift run summary") == 1 and proc.stdout.count("[batch] grpo") == 1
    assert "8 prompts per round × 8 samples = 64 records per round, 32 per rank" in proc.stdout
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["rollout/rounds"] == 2  # 64 records / 32 per step = 2 steps a round, 4 steps
    assert grpo["cost/records_generated"] == 2 * 64  # both ranks' samples, each counted once
    assert grpo["cost/records_used"] == 2 * 64  # each rank trained on its half: the ledger adds them up
    assert grpo["cost/trained_tokens"] > 0 and 0 <= grpo["val/accuracy_after"] <= 1
    assert (out / "policy" / "config.json").is_file()


def test_fsdp_job_trains_and_saves_a_loadable_policy(tmp_path):
    from transformers import AutoModelForCausalLM
    out = tmp_path / "run"
    proc = train("hardware=fsdp", *RANKS, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    config = json.loads((out / "policy" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]  # not FSDP2's renamed class
    model = AutoModelForCausalLM.from_pretrained(out / "policy")
    assert sum(p.numel() for p in model.parameters()) > 0
    assert json.loads((out / "summary.json").read_text())["grpo"]["train/steps"] == 4


def jobs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())


def test_basic_sweep_gives_one_folder_and_one_wandb_run_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = train("-m", "seed=1,2", "hardware=ddp", *RANKS[:-1], "logger=wandb", f"hydra.sweep.dir={sweep}",
                 wandb_mode="offline")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert [p.name for p in jobs(sweep)] == ["0", "1"]
    for job, seed in zip(jobs(sweep), (1, 2)):
        assert json.loads((job / "summary.json").read_text())["grpo"]["train/steps"] == 4
        assert len(list((job / "wandb").glob("offline-run-*"))) == 1
        assert yaml.safe_load((job / "config.yaml").read_text())["grpo"]["seed"] == seed


@pytest.mark.slow  # 80 s: the basic sweep above covers ranks under -m in the default suite (≤ 15 min)
def test_optuna_trials_run_their_own_settings_on_both_ranks(tmp_path):
    """Each trial's job has its trial's values; SameSettingsOnRanks fails a job whose ranks disagree."""
    sweep = tmp_path / "study"
    proc = train("-m", "hparams_search=grpo_lr", "hydra.sweeper.n_trials=2", "hardware=ddp", *RANKS,
                 f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (sweep / "optimization_results.yaml").is_file()
    assert len(jobs(sweep)) == 2
    for job in jobs(sweep):
        asked = dict(o.split("=", 1) for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
        ran = yaml.safe_load((job / "config.yaml").read_text())["grpo"]["algorithm"]
        assert ran["beta"] == pytest.approx(float(asked["algorithm.beta"]))
        assert ran["group_size"] == int(asked["algorithm.group_size"])


@pytest.mark.slow
def test_submitit_local_launcher_runs_the_ranks(tmp_path):
    sweep = tmp_path / "sweep"
    proc = train("-m", "hydra/launcher=submitit_local", "seed=1", "hardware=ddp", *RANKS,
                 f"hydra.sweep.dir={sweep}", timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert json.loads((jobs(sweep)[0] / "summary.json").read_text())["grpo"]["train/steps"] == 4


def test_leaked_slurm_variables_are_named_and_nothing_is_written(tmp_path):
    out = tmp_path / "run"
    proc = train("hardware=ddp", *RANKS, f"hydra.run.dir={out}", env={"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"})
    assert proc.returncode == 1
    assert "SLURM_NTASKS=1" in proc.stderr and "asks for 2 process" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(p.name in RUN_FILES - {"train.log"} for p in out.iterdir())


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_step_and_resume_continues_on_ranks(tmp_path):
    """SIGTERM to train.py reaches every rank (through torchrun); they stop after the same step (one
    reduced decision), write one last.ckpt and exit 143; `resume=true` alone relaunches the ranks."""
    import signal

    import torch

    from tests.test_resume import start_train, wait_for
    out = tmp_path / "run"
    proc = start_train("hardware=ddp", *RANKS, "trainer.max_steps=400", "checkpoint_every_n_rounds=1",
                       f"hydra.run.dir={out}")
    wait_for(out / "checkpoints" / "grpo" / "epoch=0-step=2.ckpt", proc)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=180)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    step = torch.load(out / "checkpoints" / "grpo" / "last.ckpt", weights_only=False)["global_step"]
    assert f"stopped by SIGTERM at step {step}" in output and 2 <= step < 400
    resumed = train("resume=true", f"hydra.run.dir={out}", timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "[launch] 2 ranks" in resumed.stdout and "(resuming from" in resumed.stdout
    assert json.loads((out / "summary.json").read_text())["grpo"]["train/steps"] == 400


def test_ddp_plays_tool_episodes_and_sums_their_statistics_over_ranks(tmp_path):
    """experiment=tool_use's GRPO stage with 2 ranks: each rank plays its shard of the round's episodes;
    the tool statistics and the generated-token count are the whole round's (summed over ranks): the
    stored records' sampled tokens (loss mask 1) add up to cost/generated_tokens exactly."""
    out, store = tmp_path / "run", tmp_path / "store"
    proc = train("hardware=ddp", *TINY_MODEL, "experiment=tool_use", "task.tool_rate=1.0", "task.num_heldout=16",
                 "generator.max_new_tokens=24", "callbacks.progress.refresh_rate=0", "logger=csv",
                 "stages.0.overrides=['algorithm=sft','data=episode_demonstrations','data.max_examples=128',"
                 "'trainer.max_steps=150']",
                 "stages.1.overrides=['algorithm=grpo','data=fresh_rollouts','data.prompts_per_round=4',"
                 "'data.batch_size=32','data.micro_batch_size=16','trainer.max_steps=2']",
                 f"++data.store={store}", f"hydra.run.dir={out}")
    # every rank's error lines too: a rank that dies first is otherwise cut from the tail (flaky once under load)
    errors = "\n".join(line for line in proc.stderr.splitlines() if "Error" in line)
    assert proc.returncode == 0, proc.stdout[-2000:] + "\n[error lines]\n" + errors[-4000:] + proc.stderr[-3000:]
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    records = load_experience(store, build_char_tokenizer())
    assert len(records) == grpo["cost/records_generated"] == 2 * 4 * 8  # 2 rounds (32 records, one step each)
    assert grpo["cost/generated_tokens"] == sum(sum(r.loss_mask) for r in records)
    observed = sum(len(r.loss_mask) - sum(r.loss_mask) for r in records)
    assert grpo["rollout/tool_calls_per_episode_mean"] * len(records) == pytest.approx(grpo["cost/tool_calls"])
    assert observed > 0 and grpo["cost/tool_calls"] > 0
