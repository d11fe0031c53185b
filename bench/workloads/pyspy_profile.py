"""Where policyshift's time goes on one workload: `train.py` (the bench's overrides) under py-spy, the
samples of the training loop grouped by what the code is doing.

    pip install py-spy        # any env: a standalone binary (bench/PROFILE.md used /work/venv-trl/bin/py-spy)
    python bench/workloads/pyspy_profile.py --workload tiny_grpo_b0.04 --steps 60 [--py-spy PATH] [--keep DIR]

Each py-spy sample is a whole Python stack; it is put in the first group below whose pattern occurs in
it (most specific first). Shares are of the samples taken inside `trainer.fit` (imports, config and
model building are left out; the first round is in, a small part over 60 steps) and are printed
with the seconds per step they amount to. The raw collapsed stacks stay in --keep for a flame graph or a closer look.
(Not named profile.py: a script's folder comes first on sys.path, and that would shadow the standard
library's `profile`, which torch imports.)
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.workloads import policyshift_side  # noqa: E402
from bench.workloads.prepare import prepare  # noqa: E402
from bench.workloads.spec import WORKLOADS  # noqa: E402

# (group, substrings of a frame "function (file:line)"), most specific first
GROUPS = [
    ("generation: HFGenerator.sample (KV-cached loop)", ["sample (generators/hf.py", "_batch (generators/hf.py",
                                                         "sample_tokens (generators/hf.py"]),
    ("annotate: reference log-probs", ["annotate_reference (trainers/rollout.py"]),
    ("annotate: advantages, the rest", ["annotate (trainers/grpo.py"]),
    ("reward scoring", ["safe_score (rewards/", "score (rewards/"]),
    ("round: records, decode, bookkeeping", ["regenerate (callbacks/regenerate.py", "on_train_epoch_end (callbacks/regenerate.py"]),
    ("train step: off-policy diagnostics + logging", ["log_step (trainers/"]),
    ("train step: policy forward (micro_loss)", ["micro_loss (trainers/"]),
    ("train step: backward", ["manual_backward", "backward (torch/"]),
    ("train step: clip, optimizer, scheduler", ["clip_gradients", "step (torch/optim", "_use_grad (torch/optim",
                                               "gradients_finite (trainers/base.py"]),
    ("train step: the rest (collate to device, metrics, finite check)", ["training_step (trainers/"]),
    ("dataloader rebuild / collate", ["train_dataloader", "collate (data_modules/", "_reload_dataloader",
                                      "setup_data (lightning/"]),
    ("Lightning loop and callbacks (other)", ["fit_loop", "run (lightning/pytorch/loops", "_call_callback_hooks",
                                              "_call_lightning_module_hook"]),
]
FIT = "fit (lightning/pytorch/trainer/trainer.py"


def classify(stack: str) -> str:
    for name, patterns in GROUPS:
        if any(p in stack for p in patterns):
            return name
    return "other, inside fit"


def normalize(stack: str) -> str:
    """Frames as "function (path:line)" with the repository's and site-packages' prefixes cut, so
    the patterns read "micro_loss (trainers/" and "step (torch/optim"."""
    return re.sub(r"\((?:[^();]*site-packages/|" + re.escape(str(ROOT)) + "/)", "(", stack)


def summarize(raw: Path) -> list[tuple[str, int, float]]:
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        stack = normalize(stack)
        if FIT in stack:
            counts[classify(stack)] += int(n)
    total = sum(counts.values()) or 1
    return [(name, n, n / total) for name, n in counts.most_common()] + [("total inside fit", total, 1.0)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="tiny_grpo_b0.04", choices=list(WORKLOADS))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "/work/venv-trl/bin/py-spy")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "policyshift-bench")
    p.add_argument("--keep", type=Path, help="folder for the raw stacks and train.py's log")
    a = p.parse_args()
    w = replace(WORKLOADS[a.workload], warmup=0, measure=a.steps - 1)
    paths = prepare(a.cache, [w])
    out = a.keep or Path(tempfile.mkdtemp(prefix="policyshift-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    cmd = policyshift_side.command(sys.executable, w, paths[f"model_{w.model}"], out / "run", out / "timer.json",
                                  paths["data"])
    raw = out / "stacks.txt"
    with open(out / "train.log", "w") as log:
        subprocess.run([a.py_spy, "record", "--rate", str(a.rate), "--format", "raw", "--output", str(raw),
                        "--", *cmd], cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT,
                       env=os.environ | {"PYTHONUNBUFFERED": "1"})
    import json
    ends = json.loads((out / "timer.json").read_text())["ends"]
    per_step = (ends[-1] - ends[0]) / (len(ends) - 1)
    print(f"{a.workload}: {len(ends)} steps, {per_step:.4f} s/step (steps 1..{len(ends) - 1} under py-spy at "
          f"{a.rate} Hz; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); raw stacks: {raw}")
    print("| where | samples | share | ≈ s/step |\n|---|---:|---:|---:|")
    for name, n, share in summarize(raw):
        print(f"| {name} | {n} | {share:.1%} | {share * per_step:.4f} |")


if __name__ == "__main__":
    main()
