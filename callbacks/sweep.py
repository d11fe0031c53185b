"""End-of-sweep summary: a Hydra callback comparing the jobs of a multirun on accuracy vs rollout cost.

Registered in conf/train.yaml under `hydra.callbacks`. Reads every job dir `<sweep dir>/<n>/` (its
`summary.json` and `.hydra/overrides.yaml`) and writes into the sweep dir:

- `sweep_summary.csv`: one row per job (JOB_COLUMNS); a job without a complete summary.json is `failed`.
- `sweep_summary_by_config.csv`: one row per config (= the job's overrides minus `seed`) over its seeds
  (CONFIG_COLUMNS; `acc_std` is the sample std, empty for a single seed).
- `sweep_accuracy_vs_tokens.png`: held-out accuracy against generated tokens (last stage's `val/curve`),
  one line per config: mean over seeds, band = min..max; seeds aligned by eval index.

The tables are also rewritten after every job, so a sweep that aborts (Hydra's basic sweeper raises
before `on_multirun_end` when a job fails) still leaves them. Nothing here ever raises into Hydra.
"""
from __future__ import annotations

import csv
import json
import os
import statistics
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

JOB_COLUMNS = ["job", "status", "overrides", "config", "seed", "accuracy_after", "accuracy_before",
               "generated_tokens", "cost_usd", "reward_gain_per_mtok", "wall_seconds"]
CONFIG_COLUMNS = ["config", "n_seeds", "n_failed", "acc_mean", "acc_std", "acc_min", "acc_max",
                  "generated_tokens_mean"]
_LAST_STAGE_KEYS = {"accuracy_after": "val/accuracy_after", "accuracy_before": "val/accuracy_before",
                    "generated_tokens": "cost/generated_tokens", "cost_usd": "cost/usd",
                    "reward_gain_per_mtok": "cost/reward_gain_per_mtok"}


class SweepSummary(Callback):
    def on_job_end(self, config, job_return=None, **kwargs) -> None:
        if str(OmegaConf.select(config, "hydra.mode", default="MULTIRUN")).endswith("MULTIRUN"):
            _guarded("tables", lambda: write_tables(Path(config.hydra.sweep.dir)))

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        jobs = _guarded("tables", lambda: write_tables(sweep))
        if jobs:
            _guarded("plot", lambda: plot(jobs, sweep / "sweep_accuracy_vs_tokens.png"))
            print(f"[sweep] {len(jobs)} jobs summarised in {sweep}/sweep_summary*.csv")


def _guarded(what: str, fn):
    """fn() or None: a summary must never take the sweep's results down with it."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        print(f"[sweep] WARNING: could not write the sweep {what}: {type(e).__name__}: {e}")
        return None


def write_tables(sweep: Path) -> list[dict]:
    jobs = collect_jobs(sweep)
    _write_csv(sweep / "sweep_summary.csv", JOB_COLUMNS, jobs)
    _write_csv(sweep / "sweep_summary_by_config.csv", CONFIG_COLUMNS, by_config(jobs))
    return jobs


def collect_jobs(sweep: Path) -> list[dict]:
    """Every job dir of the sweep: `<n>` for this multirun's jobs, and any other subdir holding a Hydra job
    (a second multirun into the same dir with hydra.sweep.subdir=drift_${hydra.job.num}, say)."""
    dirs = [d for d in sweep.iterdir() if d.is_dir() and (d.name.isdigit() or (d / ".hydra").is_dir())]
    return [read_job(d) for d in sorted(dirs, key=lambda d: (not d.name.isdigit(), d.name.zfill(8)))]


def read_job(job_dir: Path) -> dict:
    """One CSV row (plus the private `_curve`) for the job in `job_dir`."""
    overrides = _read_yaml(job_dir / ".hydra" / "overrides.yaml") or []
    rest = [o for o in overrides if _key(o) != "seed"]
    seeds = [o.split("=", 1)[1] for o in overrides if _key(o) == "seed" and "=" in o]
    seed = seeds[0] if seeds else (_read_yaml(job_dir / ".hydra" / "config.yaml") or {}).get("seed", "")
    row = {"job": job_dir.name, "status": "failed", "overrides": " ".join(overrides),
           "config": " ".join(rest), "seed": seed, "_curve": []}
    stages = _finished_stages(job_dir)
    if stages:
        last = list(stages.values())[-1]
        row |= {col: last.get(key) for col, key in _LAST_STAGE_KEYS.items()}
        row |= {"status": "ok", "_curve": last.get("val/curve") or [],
                "wall_seconds": sum(s.get("wall_seconds") or 0.0 for s in stages.values())}
    return row


def _finished_stages(job_dir: Path) -> dict | None:
    """summary.json's {stage: metrics} if every planned stage (config.yaml's keys) finished, else None."""
    path = job_dir / "summary.json"
    if not path.is_file():
        return None
    stages = json.loads(path.read_text())
    planned = _read_yaml(job_dir / "config.yaml") or {}
    if not stages or any(name not in stages for name in planned):
        return None
    return stages


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _read_yaml(path: Path):
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def by_config(jobs: list[dict]) -> list[dict]:
    rows = []
    for config, group in _group(jobs).items():
        ok = [j for j in group if j["status"] == "ok" and j["accuracy_after"] is not None]
        accs = [float(j["accuracy_after"]) for j in ok]
        toks = [float(j["generated_tokens"]) for j in ok if j["generated_tokens"] is not None]
        rows.append({"config": config, "n_seeds": len(accs), "n_failed": len(group) - len(ok),
                     "acc_mean": statistics.fmean(accs) if accs else None,
                     "acc_std": statistics.stdev(accs) if len(accs) > 1 else None,
                     "acc_min": min(accs, default=None), "acc_max": max(accs, default=None),
                     "generated_tokens_mean": statistics.fmean(toks) if toks else None})
    return rows


def _group(jobs: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for j in jobs:
        groups.setdefault(j["config"], []).append(j)
    return groups


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # atomic: jobs may end in parallel
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: ("" if r.get(k) is None else r[k]) for k in columns} for r in rows)
    os.replace(tmp, path)


def mean_curve(curves: list[list[dict]]) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x = mean tokens, mean, min, max accuracy) over seeds, point i = each seed's i-th eval."""
    n = min(len(c) for c in curves)
    pts = [[c[i] for c in curves] for i in range(n)]
    x = [statistics.fmean(float(p["generated_tokens"]) for p in pt) for pt in pts]
    accs = [[float(p["accuracy"]) for p in pt] for pt in pts]
    return x, [statistics.fmean(a) for a in accs], [min(a) for a in accs], [max(a) for a in accs]


def plot(jobs: list[dict], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: only at the end of a sweep
    from matplotlib.figure import Figure

    groups = {c: [j["_curve"] for j in g if j["status"] == "ok" and j["_curve"]]
              for c, g in _group(jobs).items()}
    groups = {c: curves for c, curves in groups.items() if curves}
    if not groups:
        print("[sweep] no finished job has a val/curve: no plot")
        return
    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = _short_labels(list(groups))
    for config, curves in groups.items():
        x, mean, lo, hi = mean_curve(curves)
        (line,) = ax.plot(x, mean, marker="o", label=f"{labels[config]} (n={len(curves)})")
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set(xlabel="generated tokens", ylabel="held-out accuracy", title="accuracy vs rollout cost")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def _short_labels(configs: list[str]) -> dict[str, str]:
    """Legend labels: each config's overrides minus those every config shares."""
    common = set.intersection(*(set(c.split()) for c in configs))
    short = {c: " ".join(o for o in c.split() if o not in common) for c in configs}
    return {c: short[c] or ("(defaults)" if not c else "all jobs") for c in configs}
