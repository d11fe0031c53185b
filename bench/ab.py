"""A/B of two policyshift settings on one bench workload: `python train.py` with the workload's overrides
(bench/workloads/policyshift_side.py) plus A's or B's, alternating A B A B in fresh processes, timed by the
bench's callback (bench/workloads/ps_timer.py). Prints, per side, the median over runs of each run's median
seconds per optimizer step, train step (forward, backward, optimizer), reference annotation and generation
per round, with the load average before each run: on a shared machine say so when quoting them.

    python bench/ab.py --workload grpo_long_prompt --a algorithm.shared_prefix=false \\
        --b algorithm.shared_prefix=true --pairs 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure import measure, run_metrics  # noqa: E402
from bench.workloads import policyshift_side  # noqa: E402
from bench.workloads.prepare import prepare  # noqa: E402
from bench.workloads.spec import WORKLOADS, quick  # noqa: E402

PARTS = ("train_step", "annotate", "generation")  # per-step seconds the timer records beside the step ends


def one_run(w, paths: dict, extra: list[str], scratch: Path, tag: str, env: dict, timeout: float) -> dict:
    out, run_dir = scratch / f"{tag}.json", scratch / f"{tag}-run"
    cmd = policyshift_side.command(sys.executable, w, paths[f"model_{w.model}"], run_dir, out, paths["data"]) + extra
    run = measure(cmd, env, scratch / f"{tag}.log", timeout)
    if run["rc"] != 0:
        tail = Path(run["log"]).read_text(errors="replace").strip().splitlines()[-5:]
        raise SystemExit(f"{tag} failed (rc {run['rc']}):\n" + "\n".join(tail))
    result = json.loads(out.read_text())
    run |= run_metrics(result, w)
    keep = slice(1 + w.warmup, 1 + w.warmup + w.measure)
    for part in PARTS:
        values = result.get(part, [])[keep]
        run[part] = statistics.median(values) if values else None
    return run


def summary(runs: list[dict]) -> dict:
    out = {"s_per_step": statistics.median(r["s_per_step"] for r in runs),
           "load_before": [round(r["load_before"], 2) for r in runs],
           "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs)}
    for part in PARTS:
        values = [r[part] for r in runs if r.get(part) is not None]
        out[part] = statistics.median(values) if values else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--a", nargs="*", default=[], help="train.py overrides of side A")
    p.add_argument("--b", nargs="*", default=[], help="train.py overrides of side B")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run")
    p.add_argument("--quick", action="store_true", help="plumbing only: few steps")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "policyshift-bench")
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    a = p.parse_args()
    w = quick(WORKLOADS[a.workload]) if a.quick else WORKLOADS[a.workload]
    paths = prepare(a.cache, [w])
    env = os.environ | {"OMP_NUM_THREADS": str(a.threads), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
                        "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    scratch = Path(tempfile.mkdtemp(prefix="policyshift-ab-"))
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for i in range(a.pairs):
        for side, extra in (("A", a.a), ("B", a.b)):
            run = one_run(w, paths, extra, scratch, f"{side}{i}", env, a.timeout)
            runs[side].append(run)
            print(f"pair {i} {side}: {run['s_per_step']:.4f} s/step (load1 before {run['load_before']:.2f})", flush=True)
    result = {"workload": w.name, "A": a.a, "B": a.b, "threads": a.threads, "pairs": a.pairs,
              "summary": {side: summary(r) for side, r in runs.items()}}
    sa, sb = result["summary"]["A"], result["summary"]["B"]
    print(json.dumps(result["summary"], indent=1))
    print(f"{w.name}: A {sa['s_per_step']:.4f} s/step, B {sb['s_per_step']:.4f} s/step: "
          f"B is {sa['s_per_step'] / sb['s_per_step']:.2f}x A's steps/s")
    if a.json:
        a.json.write_text(json.dumps(result | {"runs": runs}, indent=1, default=str))


if __name__ == "__main__":
    main()
