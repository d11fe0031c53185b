"""Starting the ranks of a multi-process job (`hardware=ddp|fsdp|deepspeed_*`, `trainer.devices=N`).

One Hydra job = one run folder, whatever launched it. When this process was not started by a launcher
(torchrun, or SLURM's srun with one task per rank), train.py validates the job, then runs it under
`torchrun --standalone --nproc-per-node N` (torch's elastic launcher: a free rendezvous port, and when
one rank fails the others are stopped, none left behind) with the job's own overrides and its output
dir, waits, and returns the job's metric from summary.json. So every launcher and sweeper of Hydra
(basic, Optuna, submitit) hands the ranks exactly the job's settings, each job gets its own ranks and
folder, and rank 0 alone writes files. The launching process owns the folder (run/run_folder.py) for
the job's life; its ranks run under that lock.

Lightning's own way (re-running `sys.argv` for each rank, or spawning) is not used: under `-m` it
replays the whole sweep in rank 1, under the Optuna sweeper rank 1 runs its own study, and spawned
ranks keep the round's data and callback state in processes that end with `fit`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig

from hardware.processes import launched, processes_per_node, strategy_name, world_size_of
from run.errors import ConfigError
from run.run_folder import OWNER_ENV

TRAIN_PY = Path(__file__).resolve().parent.parent / "train.py"
SELF_LAUNCHING = ("ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_spawn_find_unused_parameters_true")
NAME_ENV = ("POLICYSHIFT_WANDB_GROUP", "POLICYSHIFT_WANDB_NAME")  # the sweep's names, for the ranks


def check_environment(trainer: DictConfig) -> None:
    """Refuse, naming the variables, an environment that would quietly run another number of ranks:
    SLURM variables left over from an allocation (Lightning follows SLURM_NTASKS over trainer.devices),
    a strategy that launches ranks itself, or several nodes without a launcher on each."""
    want, strategy = world_size_of(trainer), strategy_name(trainer)
    if strategy in SELF_LAUNCHING:
        raise ConfigError(f"trainer.strategy={strategy}: policyshift starts the ranks itself (under torchrun); "
                          f"use hardware=ddp (trainer.strategy=ddp)")
    ntasks = os.environ.get("SLURM_NTASKS")
    if ntasks is not None and ntasks != str(want):
        names = sorted(k for k in os.environ if k.startswith("SLURM_"))
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ConfigError(
            f"the environment holds SLURM variables ({shown}) with SLURM_NTASKS={ntasks}, but this job asks for "
            f"{want} process(es) (trainer.devices × trainer.num_nodes): Lightning would follow SLURM. Inside an "
            f"allocation run `srun --ntasks-per-node={processes_per_node(trainer)} python train.py ...`; to run "
            f"on this machine alone, clear them: env $(env | grep -o '^SLURM_[A-Z_]*' | sed 's/^/-u /') "
            f"python train.py ...")
    if int(trainer.get("num_nodes", 1)) > 1 and not launched():
        raise ConfigError(f"trainer.num_nodes={trainer.num_nodes}: start the job on every node, with torchrun or "
                          f"SLURM (hydra/launcher=slurm); see docs/hardware.md")


def needs_launch(trainer: DictConfig) -> bool:
    """Whether train.py must start the ranks: more than one process asked for, none started yet."""
    return world_size_of(trainer) > 1 and not launched()


def run_ranks(trainer: DictConfig, overrides: list[str], out: Path, group: str, name: str) -> dict:
    """Run this job's ranks under torchrun; the job's summary.json (raises if a rank failed)."""
    n = processes_per_node(trainer)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           str(TRAIN_PY), *overrides, f"hydra.run.dir='{out}'"]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))  # torchrun would say 1, loudly
    env.update(dict(zip(NAME_ENV, (group, name))))
    env[OWNER_ENV] = f"{os.getpid()}:{out}"  # this process holds the folder's lock: the ranks run under it
    print(f"[launch] {n} ranks under torchrun into {out}", flush=True)
    rc, signum = _wait_forwarding_signals(subprocess.Popen(cmd, env=env))
    if signum is not None:  # stopped on purpose: the ranks wrote their checkpoint (resume=true continues)
        raise SystemExit(128 + signum)
    if rc != 0:
        raise RankFailure(f"a rank of the job in {out} failed (torchrun exit status {rc}); its error is above")
    path = out / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _wait_forwarding_signals(proc: subprocess.Popen) -> tuple[int, int | None]:
    """Wait for `proc`, passing SIGTERM/SIGINT on to it (torchrun passes it to the ranks, which stop
    after the same step and checkpoint); (its exit status, the first signal forwarded or None)."""
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        proc.send_signal(signum)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait(), (received[0] if received else None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def sweep_names() -> tuple[str, str] | None:
    """(W&B group, run name) that the launching job passed to its ranks, or None."""
    group, name = (os.environ.get(k) for k in NAME_ENV)
    return (group, name) if group and name else None


class RankFailure(ConfigError):
    """A rank of a launched job failed (its own one-line error was printed by that rank)."""
