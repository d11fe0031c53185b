"""CPU cost of one DPO optimizer step, with a reference model and with precomputed reference log-probs.

    python bench/bench_dpo.py                      # both cases, each run 5 times in its own subprocess;
                                                   # prints a markdown table, writes bench/results/dpo_latest.json
    python bench/bench_dpo.py --case dpo_precomputed    # one case in this process (prints its JSON)
    python bench/bench_dpo.py --repeats 5 --runs 30 --warmup 3 --threads 1

What runs. As in bench/bench_train.py: the project's Hydra config (conf/: algorithm=dpo,
data=static_preferences with its synthetic arithmetic pairs) with the overrides below, every part built
the way `run.stages.run_stage` builds it, and a real `lightning.Trainer` fit (closure, backward,
gradient clipping, scheduler, logging included; loggers, progress bar, held-out evaluation and
checkpointing not).

  dpo_reference    batch of 32 pairs, β = 0.1, the bench's tiny Llama (hidden 64, 2 layers, 4 heads,
                   intermediate 256); reference log-probs from a frozen copy of the policy, one extra
                   no-grad forward of the 64 sequences per step
  dpo_precomputed  the same with algorithm.precompute_reference=true: reference log-probs computed once
                   for the 2,000 training pairs when fit starts (`precompute_s`), no reference model

Chosen and rejected always go through ONE concatenated forward pass (64 sequences per step).

What is measured. `step_wall_s` is the time between the ends of two consecutive optimizer steps
(batch collation + train step), `train_step_s` the step alone, `pairs_per_s` = 32 / step_wall_s.
Step 0 and the next `--warmup` steps are dropped and each run's median is taken over the `--runs` steps
after them; the table shows the median of the `--repeats` runs' medians (each run a fresh process), and
the smallest and largest of them.
`peak_rss_mb` is ru_maxrss of the case's own process (imports included). `others_cpu_frac` is the share
of all cores other processes used during fit: well above 0 % means the machine was shared (see
bench/bench_train.py). Benchmarks are never part of the test suite's pass/fail.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_train import (MODEL, fit_measured, machine_env, peak_rss_mb, run_in_subprocess,  # noqa: E402
                               stats, step_timer, timed)

PAIRS = 32
COMMON = ["algorithm=dpo", "data=static_preferences", f"data.batch_size={PAIRS}", "algorithm.beta=0.1", *MODEL]
CASES = {
    "dpo_reference": [*COMMON, "algorithm.precompute_reference=false"],
    "dpo_precomputed": [*COMMON, "algorithm.precompute_reference=true"],
}


def run_case(case: str, warmup: int, runs: int, threads: int | None) -> dict:
    import lightning as L
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from run.stages import build
    from run.validation.config import validate

    if threads:
        torch.set_num_threads(threads)

    rss_imports = peak_rss_mb()
    steps = warmup + runs + 1
    overrides = ["experiment=single", "logger=none", f"trainer.max_steps={steps}", *CASES[case]]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    validate(cfg, case)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    task = instantiate(cfg.task)
    policy, tokenizer = instantiate(cfg.model)
    datamodule = build(cfg.data, task=task, tokenizer=tokenizer)
    module = build(cfg.algorithm, policy=policy, tokenizer=tokenizer)
    precompute_s: list[float] = []
    module.cache_reference = timed(module.cache_reference, precompute_s)
    timer = step_timer()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(**cfg.trainer, callbacks=[timer], logger=False, enable_progress_bar=False,
                            default_root_dir=tmp)
        others_frac = fit_measured(trainer, module, datamodule, steps)
    wall = [b - a for a, b in zip(timer.ends, timer.ends[1:])][warmup:]
    metrics = {"step_wall_s": stats(wall), "train_step_s": stats(timer.train_step_s[warmup + 1:]),
               "pairs_per_s": stats([PAIRS / w for w in wall])}
    return {
        "case": case, "overrides": overrides, "warmup": warmup, "runs": runs, "pairs_per_step": PAIRS,
        "sequences_per_forward": 2 * PAIRS, "training_pairs": len(datamodule.records),
        "reference_model": module.reference is not None, "precompute_s": sum(precompute_s),
        "parameters": sum(p.numel() for p in policy.parameters()),
        "metrics": metrics, "peak_rss_mb": peak_rss_mb(), "rss_after_imports_mb": rss_imports,
        "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
        "others_cpu_frac": others_frac,
    }


ROWS = {
    "step_wall_s": ("seconds / optimizer step", "s", "{:.4f}"),
    "train_step_s": ("  train step (fwd, ref, bwd, clip, AdamW)", "s", "{:.4f}"),
    "pairs_per_s": ("pairs / s", "pairs/s", "{:.0f}"),
}


def table(results: dict) -> str:
    lines = ["| case | metric | median | min | max | unit |", "|---|---|---:|---:|---:|---|"]
    for case, r in results.items():
        for key, (label, unit, fmt) in ROWS.items():
            m = r["metrics"][key]
            lines.append(f"| {case} | {label} | {fmt.format(m['median'])} | {fmt.format(m['min'])} "
                         f"| {fmt.format(m['max'])} | {unit} |")
        if r["precompute_s"]:
            lines.append(f"| {case} | one-time precompute ({r['training_pairs']} pairs) | "
                         f"{r['precompute_s']:.2f} | | | s |")
        lines.append(f"| {case} | peak RSS (process) | {r['peak_rss_mb']:.0f} | | | MB |")
    return "\n".join(lines)


def combine(runs: list[dict]) -> dict:
    """One case over several runs: each metric's median/min/max over the runs' medians."""
    out = dict(runs[0])
    out["metrics"] = {k: stats([r["metrics"][k]["median"] for r in runs]) for k in runs[0]["metrics"]}
    for key in ("peak_rss_mb", "precompute_s", "others_cpu_frac"):
        out[key] = statistics.median(r[key] for r in runs)
    out["repeats"], out["runs_detail"] = len(runs), runs
    return out


def run_all(args) -> None:
    results, started = {}, time.perf_counter()
    for case in args.cases:
        results[case] = combine([run_in_subprocess(__file__, case, args) for _ in range(args.repeats)])
    env = machine_env(results, "bench/bench_dpo.py", started)
    report = table(results)
    print(f"CPU: {env['cpu_model']} ({env['cpu_count']} cores) | torch {env['torch_version']}, "
          f"{env['torch_threads']} threads | median over {args.repeats} runs of each run's median of "
          f"{args.runs} steps after {args.warmup} warmup")
    print("CPU used by other processes during each case: " + ", ".join(
        f"{c} {r['others_cpu_frac']:.0%}" for c, r in results.items()) + "\n")
    print(report)
    dest = ROOT / "bench" / "results" / "dpo_latest.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"env": env, "cases": results, "table": report}, indent=2))
    print(f"\ntotal {env['total_seconds']} s; wrote {dest.relative_to(ROOT)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=list(CASES), help="run one case in this process")
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--repeats", type=int, default=5, help="runs per case (fresh processes)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own choice)")
    p.add_argument("--json", help="with --case: write the result here instead of stdout")
    args = p.parse_args()
    if args.runs < 5 or args.repeats < 1 or args.warmup < 0:
        p.error("--runs must be ≥ 5, --repeats ≥ 1 and --warmup ≥ 0")
    if args.case is None:
        return run_all(args)
    text = json.dumps(run_case(args.case, args.warmup, args.runs, args.threads), indent=2)
    Path(args.json).write_text(text) if args.json else print(text)


if __name__ == "__main__":
    main()
