"""Padded against packed training forward (`model.packing=false` / `true`), policyshift alone: each
workload's `python train.py ...` command of the side-by-side bench (bench/workloads/policyshift_side.py)
run A B A B in fresh processes, one override apart; median over runs of each run's median s/step, and the
packed ÷ padded speed-up per pair. Every run's load (1-minute average before it, cores other processes
used during it) is printed beside it: on a shared machine the figure says so.

    python bench/packing_ab.py --workloads grpo_mixed_lengths,tiny_grpo_b0.04 --pairs 3
    python bench/packing_ab.py --workloads grpo_mixed_lengths --pairs 1 --steps 4   # the plumbing
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure import measure, run_metrics  # noqa: E402
from bench.workloads.policyshift_side import command  # noqa: E402
from bench.workloads.prepare import prepare  # noqa: E402
from bench.workloads.spec import WORKLOADS  # noqa: E402

SIDES = {"padded": "model.packing=false", "packed": "model.packing=true"}


def one_run(w, side: str, paths: dict, scratch: Path, tag: str, env: dict, timeout: float) -> dict:
    out, run_dir = scratch / f"{tag}.json", scratch / f"{tag}-run"
    cmd = command(sys.executable, w, paths[f"model_{w.model}"], run_dir, out) + [SIDES[side]]
    run = measure(cmd, env, scratch / f"{tag}.log", timeout)
    if run["rc"] != 0:
        tail = Path(run["log"]).read_text(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"{tag} failed (rc {run['rc']}): " + " | ".join(tail))
    return run | run_metrics(json.loads(out.read_text()), w)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--workloads", default="grpo_mixed_lengths", help=f"comma-separated, of: {', '.join(WORKLOADS)}")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, help="measured steps per run (default: the workload's)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "policyshift-bench")
    p.add_argument("--out", type=Path, help="the runs and the summary as JSON")
    args = p.parse_args()
    names = [n.strip() for n in args.workloads.split(",")]
    workloads = [WORKLOADS[n] if args.steps is None else dataclasses.replace(WORKLOADS[n], measure=args.steps)
                 for n in names]
    env = dict(os.environ) | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
                              "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    paths = prepare(args.cache, workloads)
    summary, runs = {}, []
    with tempfile.TemporaryDirectory(prefix="policyshift-packing-ab-") as scratch:
        for w in workloads:
            per = {side: [] for side in SIDES}
            for pair in range(args.pairs):
                for side in SIDES:  # A B, A B, ...
                    run = one_run(w, side, paths, Path(scratch), f"{w.name}-{pair}-{side}", env, args.timeout)
                    per[side].append(run["s_per_step"])
                    runs.append({"workload": w.name, "side": side, "pair": pair,
                                 **{k: run.get(k) for k in ("s_per_step", "throughput", "load_before",
                                                             "others_frac", "peak_rss_mb")}})
                    print(f"{w.name} pair {pair} {side}: {run['s_per_step']:.4f} s/step, load1 "
                          f"{run['load_before']:.2f}, others {run['others_frac']:.0%} of the cores", flush=True)
            ratios = [a / b for a, b in zip(per["padded"], per["packed"])]
            summary[w.name] = {"padded_s_per_step": statistics.median(per["padded"]),
                               "packed_s_per_step": statistics.median(per["packed"]),
                               "speedup_per_pair": ratios, "speedup_median": statistics.median(ratios)}
            print(f"== {w.name}: padded {summary[w.name]['padded_s_per_step']:.4f}, packed "
                  f"{summary[w.name]['packed_s_per_step']:.4f} s/step; packed speed-up per pair "
                  + ", ".join(f"{r:.2f}×" for r in ratios), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "runs": runs, "threads": args.threads}, indent=1))


if __name__ == "__main__":
    main()
