"""Seconds from `python train.py <wrong command line>` to its one-line refusal (issue 34 item 2): the
command line is checked before torch, Lightning and transformers are imported, so a typo answers in about
the time Python and Hydra take to start. Not a test: timings depend on the machine and its load.

    python bench/refusal_seconds.py                 # this checkout, 3 runs of each command line
    python bench/refusal_seconds.py --root DIR -n 5 # another checkout (e.g. `git archive <ref> | tar -x -C DIR`)
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMAND_LINES = (["learning_rate=1e-5"], ["algorithm.betta=0.1"], ["experimnt=quickstart"], ["+typo=1"])


def seconds(root: Path, args: list[str]) -> tuple[float, int, str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "train.py", *args, "hydra.run.dir=/tmp/refusal_seconds_run",
                           "trainer.max_steps=1"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    lines = (proc.stderr.strip() or proc.stdout.strip() or "(nothing)").splitlines()
    return time.perf_counter() - start, proc.returncode, lines[-1][:110]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--skip-plus", action="store_true", help="leave out +typo=1 (a checkout that accepts it trains)")
    a = parser.parse_args()
    for args in COMMAND_LINES[:-1] if a.skip_plus else COMMAND_LINES:
        runs = [seconds(a.root, args) for _ in range(a.n)]
        times = [t for t, _, _ in runs]
        print(f"{' '.join(args):24s} exit {runs[0][1]}  median {statistics.median(times):5.1f} s  "
              f"(runs: {', '.join(f'{t:.1f}' for t in times)})  {runs[0][2]}")


if __name__ == "__main__":
    main()
