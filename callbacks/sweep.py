"""End-of-sweep summary: a Hydra callback comparing the jobs of a multirun on accuracy vs rollout cost.

Registered in conf/train.yaml under `hydra.callbacks`. Reads every job dir `<sweep dir>/<n>/` (its
`summary.json` and `.hydra/overrides.yaml`) and writes into the sweep dir:

- `sweep_summary.csv`: one row per job (JOB_COLUMNS); a job without a complete summary.json is `failed`,
  and so is a job started in this sweep whose folder is gone (it failed before its first optimizer step).
- `sweep_summary_by_config.csv`: one row per config (= the job's overrides minus `seed`) over its seeds
  (CONFIG_COLUMNS; `acc_std` is the sample std, empty for a single seed).
- `sweep_accuracy_vs_tokens.png`: held-out accuracy against generated tokens (last stage's `val/curve`),
  one line per config: mean over seeds, band = min..max; seeds aligned by eval index.

All three are rewritten after every job (`on_job_end`), so a sweep that aborts still leaves them:
Hydra's basic sweeper raises before `on_multirun_end` when a job raised. A job that ends the process
instead (train.py turns the project's own errors into `SystemExit(1)`, a signal into 128 + its number)
gets no `on_job_end` from Hydra and ends the sweep: an exit handler registered at `on_multirun_start`
then writes the summary once more, with that job's dir listed as `failed`. Nothing here ever raises
into Hydra.
"""
from __future__ import annotations

import atexit
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


PLOT = "sweep_accuracy_vs_tokens.png"


class SweepSummary(Callback):
    def __init__(self) -> None:
        self._pending: Path | None = None  # a sweep dir whose summary the exit handler still owes
        self._started: dict[str, list[str]] = {}  # job dir name → its overrides, for every job started

    def on_multirun_start(self, config, **kwargs) -> None:
        self._pending = Path(config.hydra.sweep.dir)
        atexit.register(self._at_exit)  # a job's SystemExit skips on_job_end and on_multirun_end

    def on_job_start(self, config, **kwargs) -> None:
        """Remember the job: one that fails before its first step leaves no folder (run/run_folder.py)
        and is still listed, as `failed`."""
        out = OmegaConf.select(config, "hydra.runtime.output_dir", default=None)
        if out is not None:
            self._started[Path(str(out)).name] = [str(o) for o in config.hydra.overrides.task]

    def on_job_end(self, config, job_return=None, **kwargs) -> None:
        if str(OmegaConf.select(config, "hydra.mode", default="MULTIRUN")).endswith("MULTIRUN"):
            write_summary(Path(config.hydra.sweep.dir), started=self._started)

    def on_multirun_end(self, config, **kwargs) -> None:
        self._done()
        sweep = Path(config.hydra.sweep.dir)
        jobs = write_summary(sweep, final=True, started=self._started)
        if jobs:
            print(f"[sweep] {len(jobs)} jobs summarised in {sweep}/sweep_summary*.csv")

    def _at_exit(self) -> None:
        """The process ends before on_multirun_end (a job exited, Ctrl+C): the summary as it stands."""
        sweep, self._pending = self._pending, None
        if sweep is not None and sweep.is_dir():
            jobs = write_summary(sweep, final=True, started=self._started)
            if jobs:
                print(f"[sweep] stopped early: {len(jobs)} jobs summarised in {sweep}/sweep_summary*.csv")

    def _done(self) -> None:
        self._pending = None
        atexit.unregister(self._at_exit)


def write_summary(sweep: Path, final: bool = False, started: dict | None = None) -> list[dict] | None:
    """The tables, then the plot (each guarded): after every job, at the sweep's end, at exit."""
    jobs = _guarded("tables", lambda: write_tables(sweep, started))
    if jobs:
        _guarded("plot", lambda: plot(jobs, sweep / PLOT, quiet=not final))
    return jobs


def _guarded(what: str, fn):
    """fn() or None: a summary must never take the sweep's results down with it."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        print(f"[sweep] WARNING: could not write the sweep {what}: {type(e).__name__}: {e}")
        return None


def write_tables(sweep: Path, started: dict | None = None) -> list[dict]:
    jobs = collect_jobs(sweep, started)
    _write_csv(sweep / "sweep_summary.csv", JOB_COLUMNS, jobs)
    _write_csv(sweep / "sweep_summary_by_config.csv", CONFIG_COLUMNS, by_config(jobs))
    return jobs


def collect_jobs(sweep: Path, started: dict | None = None) -> list[dict]:
    """Every job dir of the sweep: `<n>` for this multirun's jobs, and any other subdir holding a Hydra job
    (a second multirun into the same dir with hydra.sweep.subdir=drift_${hydra.job.num}, say); and each
    job `started` ({dir name: overrides}) whose folder is gone (it failed before its first step)."""
    dirs = [d for d in sweep.iterdir() if d.is_dir() and (d.name.isdigit() or (d / ".hydra").is_dir())]
    dirs += [sweep / name for name in (started or {}) if not (sweep / name).is_dir()]
    return [read_job(d, (started or {}).get(d.name))
            for d in sorted(dirs, key=lambda d: (not d.name.isdigit(), d.name.zfill(8)))]


def read_job(job_dir: Path, overrides: list[str] | None = None) -> dict:
    """One CSV row (plus the private `_curve`) for the job in `job_dir` (`overrides`: the job's, when its
    folder holds none)."""
    overrides = _read_yaml(job_dir / ".hydra" / "overrides.yaml") or overrides or []
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


def plot(jobs: list[dict], path: Path, quiet: bool = False) -> None:
    """The accuracy-vs-tokens plot, written atomically (jobs of a parallel launcher may end together);
    `quiet`: no line when there is nothing to plot yet (after a job)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: only once a job has ended
    from matplotlib.figure import Figure

    groups = {c: [j["_curve"] for j in g if j["status"] == "ok" and j["_curve"]]
              for c, g in _group(jobs).items()}
    groups = {c: curves for c, curves in groups.items() if curves}
    if not groups:
        if not quiet:
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
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    fig.savefig(tmp)
    os.replace(tmp, path)


def _short_labels(configs: list[str]) -> dict[str, str]:
    """Legend labels: each config's overrides minus those every config shares."""
    common = set.intersection(*(set(c.split()) for c in configs))
    short = {c: " ".join(o for o in c.split() if o not in common) for c in configs}
    return {c: short[c] or ("(defaults)" if not c else "all jobs") for c in configs}
