"""The overlap figure (issue 32): synchronous rounds against asynchronous rounds at staleness 1 and 2, held-out
accuracy against wall seconds and against generated tokens, from one SFT policy per seed.

    python -m scripts.readme_figures --only async                      # 3 seeds × (SFT + 4 GRPO runs)
    python -m scripts.figures.async_rounds --seeds 1,2 [--smoke] [--out DIR]

The task: the quickstart's flawed teacher (task=arithmetic_flawed), 1,000 held-out pairs. Per seed one SFT
policy (1,500 demonstrations, 2,000 steps as the quickstart: at 600 its accuracy was still
moving, and GRPO from it fell 10 points before it climbed), shared by the four GRPO runs, which differ only in
`callbacks.regenerate.max_staleness` (0: the synchronous loop; 1, 2: an engine in its own process generates the
next round while this one trains; docs/scaling.md). Same prompts (same seed), the same correction
(`correction=decoupled_ppo`: ppo_clip exactly on fresh data) but in the last config (`ppo_clip`: what the
decoupled correction's π_prox forward costs), STEPS optimizer steps each, STEPS_PER_ROUND a
round, evaluated every EVERY generated tokens (`callbacks.evaluate.every_n_tokens`: one grid for all). Every
command runs with OMP_NUM_THREADS=1 (the trainer: one core) and `callbacks.regenerate.engine_threads=1` (the
engine: the other core of a 2-core machine).

Each run's accuracy-vs-tokens curve gets the saturating fit of scripts/figures/curves.py from its seed's SFT
accuracy. The target: the synchronous run's fitted accuracy at its last evaluation ("its final accuracy").
Per asynchronous run, the generated tokens at which its fit reaches that target, mapped to wall seconds on
its own (tokens, seconds) curve: `wall_ratio_to_sync_final` is those seconds over the synchronous run's at its
last evaluation (wall seconds without evaluation: the evaluate callback's `seconds`). Also per config:
trained tokens per second, the trainer's and the engine's idle shares of the stage, and the staleness
histogram of what was trained (train/staleness_hist/*, averaged over steps). The numbers: async.json beside
the results file.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from scripts.figures import curves
from scripts.figures.curves import Fit, at_tokens, fit_saturating, paired_bootstrap  # noqa: F401 (tests fit through it)
from scripts.figures.provenance import ROOT
from scripts.figures.registry import Figure, Job, Rendered, register
from scripts.figures.training import QUIET, table, train

NAME, SYNC = "async", "sync"
CONFIGS = {SYNC: 0, "async k=1": 1, "async k=2": 2, "async k=1 ppo_clip": 1}  # label → max_staleness
# The correction: decoupled PPO (ppo_clip exactly on fresh data) clips against π_prox, the weights at the round's
# start, which for a stale round costs one more no-grad forward of every record; ppo_clip against the behaviour
# policy does not. The last config measures what that forward costs an asynchronous run.
CORRECTION = {label: "correction=ppo_clip" if label.endswith("ppo_clip") else "correction=decoupled_ppo"
              for label in CONFIGS}
SEEDS = [1, 2, 3]
THREADS = ["env", "OMP_NUM_THREADS=1"]  # the trainer on one core; the engine on the other (engine_threads=1)
TASK = ["task=arithmetic_flawed", "task.num_heldout=1000"]
SFT = ["algorithm=sft", "data=demonstrations", "data.max_examples=1500", "trainer.max_steps=2000"]
# 300 steps, 2 a round (256 of the round's 64 × 8 records each): 150 rounds, ≈ 7.5k generated tokens a round,
# ≈ 37 evaluations. Two steps a round make staleness 1 and 2 differ: k=1 (wait) starts the next round once the
# round's first step is pushed and overlaps it with the second; k=2 overlaps the whole round.
STEPS, STEPS_PER_ROUND, EVERY = 300, 2, 30_000  # optimizer steps a GRPO run; a round's; the evaluation grid
GRPO = ["algorithm=grpo", "data=fresh_rollouts", "data.prompts_per_round=64",
        f"data.batch_size={512 // STEPS_PER_ROUND}", "callbacks.regenerate.engine_threads=1"]
# --smoke: the plumbing only (a few rounds, a few grid points, 20 held-out pairs)
SMOKE_TASK = ["task=arithmetic_flawed", "task.num_heldout=20"]
SMOKE_RUN = ["data.prompts_per_round=4", "data.batch_size=16", "callbacks.evaluate.num_examples=20",
             "generator.max_new_tokens=6"]
SMOKE_STEPS, SMOKE_EVERY, SMOKE_SEEDS = 8, 100, [1]
HIST = ("0", "1", "2_3", "4_7", "8_up")  # train/staleness_hist/<bucket>


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_")


def commands(out: Path, smoke: bool, seeds: list[int] | None = None) -> list[list[str]]:
    task = SMOKE_TASK if smoke else TASK
    sft = [*SFT[:-1], "trainer.max_steps=4"] if smoke else SFT
    grpo = [*GRPO, f"trainer.max_steps={SMOKE_STEPS if smoke else STEPS}",
            f"callbacks.evaluate.every_n_tokens={SMOKE_EVERY if smoke else EVERY}", *(SMOKE_RUN if smoke else [])]
    runs = []
    for s in (SMOKE_SEEDS if smoke else seeds or SEEDS):  # seed by seed: a stopped measurement keeps its first
        runs.append([*THREADS, *train(*sft, *task, f"seed={s}", *QUIET, *(SMOKE_RUN[2:] if smoke else []),
                                      f"hydra.run.dir={out}/sft/seed{s}")])
        runs += [[*THREADS, *train(*grpo, CORRECTION[label], *task, "model=hf", "recipe=tiny", f"model.name_or_path={out}/sft/seed{s}/policy",
                                   f"callbacks.regenerate.max_staleness={k}", f"seed={s}", *QUIET,
                                   f"hydra.run.dir={out}/{slug(label)}/seed{s}")]
                 for label, k in CONFIGS.items()]
    return runs


# ------------------------------------------------------------------------------- reading the runs


@dataclass
class Run:
    """One GRPO run: its curve (evaluations: generated tokens, wall seconds without evaluation, accuracy), its
    totals and its mean staleness histogram."""
    tokens: list[float]
    seconds: list[float]
    accuracy: list[float]
    trained: float              # cost/trained_tokens
    trainer_idle: float         # cost/trainer_idle_seconds (0 in the synchronous loop)
    engine_idle: float          # cost/engine_idle_seconds
    wall: float                 # the stage's wall seconds, evaluations included (summary wall_seconds)
    staleness: dict[str, float] = field(default_factory=dict)
    fit: Fit | None = None

    @property
    def stage_seconds(self) -> float:
        return self.seconds[-1] if self.seconds else math.nan


def staleness_hist(job_dir: Path) -> dict[str, float]:
    """Mean over the optimizer steps of each train/staleness_hist/<bucket> (the share of the step's batch that
    many versions behind), from the CSV logger's metrics.csv files."""
    sums: dict[str, list[float]] = {}
    for path in sorted((job_dir / "csv").rglob("metrics.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                for bucket in HIST:
                    v = row.get(f"train/staleness_hist/{bucket}")
                    if v not in ("", None):
                        sums.setdefault(bucket, []).append(float(v))
    return {b: statistics.fmean(sums[b]) for b in HIST if sums.get(b)}


def read_run(job: Job) -> Run:
    s = list(job.stages.values())[-1]
    curve = s.get("val/curve") or []
    return Run([float(p["generated_tokens"]) for p in curve], [float(p.get("seconds", 0.0)) for p in curve],
               [float(p["accuracy"]) for p in curve], float(s.get("cost/trained_tokens") or 0.0),
               float(s.get("cost/trainer_idle_seconds") or 0.0), float(s.get("cost/engine_idle_seconds") or 0.0),
               float(s.get("wall_seconds") or math.nan), staleness_hist(job.path))


def seed_of(job: Job) -> int:
    name = job.path.name
    return int(name[4:]) if name.startswith("seed") and name[4:].isdigit() else job.seed


def read(out: Path) -> tuple[dict[int, float], dict[str, dict[int, Run]]]:
    """Each seed's SFT accuracy (a0) and each config's runs by seed, fitted from that a0."""
    return curves.fitted_runs(out, CONFIGS, slug, read_run, seed_of)


# ------------------------------------------------------------------------------- the numbers


def sync_final(sync: Run) -> float:
    """The synchronous run's final accuracy, from its fit: at its last evaluation's tokens; NaN when it
    gained nothing over its start (no target to reach: the seed's ratio is left out)."""
    if not (sync.fit and sync.tokens) or sync.fit.gain <= 0:
        return math.nan
    return sync.fit.at(sync.tokens[-1])


def seconds_to(run: Run, target: float) -> float:
    """Wall seconds (evaluations left out) at which `run`'s fitted curve reaches `target` accuracy: the tokens
    from the fit, mapped through the run's own (tokens, seconds) curve (∞: its asymptote stays below)."""
    if not run.fit or target != target:
        return math.nan
    if target <= run.fit.a0:
        return 0.0
    return at_tokens(run.tokens, run.seconds, curves.tokens_to(run.fit, target - run.fit.a0))


def per_seed(runs: dict[int, Run], value) -> dict[str, object]:
    return {str(s): curves._num(value(r)) for s, r in sorted(runs.items())}


def mean_of(values) -> float | None:
    xs = [v for v in values if v is not None and v == v and v != math.inf]
    return statistics.fmean(xs) if xs else None


def numbers(sft: dict[int, float], found: dict[str, dict[int, Run]]) -> dict:
    """The results JSON: {"sync", "sft_accuracy", "configs": {label: {...}}}; per config its final accuracy
    and throughput, per asynchronous config `wall_ratio_to_sync_final` (median [bootstrap interval] and per seed)."""
    sync = found.get(SYNC, {})
    noise = [r.accuracy[-1] for r in sync.values() if r.accuracy]
    out = {"sync": SYNC, "sft_accuracy": {str(k): v for k, v in sorted(sft.items())}, "steps": STEPS,
           "steps_per_round": STEPS_PER_ROUND, "every_n_tokens": EVERY,
           "sync_final_accuracy_std": statistics.stdev(noise) if len(noise) > 1 else None, "configs": {}}
    for label, runs in found.items():
        last = {s: r.accuracy[-1] for s, r in runs.items() if r.accuracy}
        entry: dict = {"max_staleness": CONFIGS.get(label), "correction": CORRECTION.get(label),
                       "final_accuracy": {"mean": mean_of(last.values()), "per_seed": {str(s): a for s, a in sorted(last.items())}},
                       "fitted_final_accuracy": per_seed(runs, lambda r: r.fit.at(r.tokens[-1]) if r.fit else math.nan),
                       "asymptote": per_seed(runs, lambda r: r.fit.asymptote if r.fit else math.nan),
                       "stage_seconds": per_seed(runs, lambda r: r.stage_seconds),
                       "trained_tokens_per_s": per_seed(runs, lambda r: r.trained / r.stage_seconds if r.stage_seconds else math.nan),
                       "trainer_idle_share": per_seed(runs, lambda r: r.trainer_idle / r.stage_seconds if r.stage_seconds else math.nan),
                       "engine_idle_share": per_seed(runs, lambda r: r.engine_idle / r.stage_seconds if r.stage_seconds else math.nan),
                       "staleness_hist": {b: mean_of(r.staleness.get(b) for r in runs.values()) or 0.0 for b in HIST},
                       "eval_points_min": min(len(r.tokens) for r in runs.values())}
        if label != SYNC:
            ratios, wall, delta = {}, {}, {}
            for s, r in sorted(runs.items()):
                base = sync.get(s)
                if base is None or not base.seconds:
                    continue
                target = sync_final(base)
                ratios[s] = seconds_to(r, target) / base.seconds[-1] if base.seconds[-1] else math.nan
                wall[s] = r.wall / base.wall if base.wall else math.nan
                delta[s] = r.accuracy[-1] - base.accuracy[-1] if r.accuracy and base.accuracy else math.nan
            entry["wall_ratio_to_sync_final"] = paired_bootstrap(list(ratios.values())).as_dict() | {
                "per_seed": {str(s): curves._num(v) for s, v in ratios.items()}}
            entry["stage_wall_ratio_to_sync"] = {str(s): curves._num(v) for s, v in wall.items()}
            entry["final_accuracy_minus_sync"] = {str(s): curves._num(v) for s, v in delta.items()}
        out["configs"][label] = entry
    return out


# ------------------------------------------------------------------------------- the table, plot, JSON


def _mean_text(per: dict, fmt: str) -> str:
    xs = [v for v in per.values() if isinstance(v, (int, float))]
    return "–" if not xs else f"{format(statistics.fmean(xs), fmt)} ({', '.join(format(x, fmt) for x in xs)})"


def rows(result: dict) -> list[list[str]]:
    out = []
    for label, e in result["configs"].items():
        w = e.get("wall_ratio_to_sync_final")
        ratio = "1 (the target's run)" if w is None else (
            f"{curves._fmt(_val(w['median']))} [{curves._fmt(_val(w['lo']))}, {curves._fmt(_val(w['hi']))}] ("
            + ", ".join(curves._fmt(_val(v)) for v in w["per_seed"].values()) + ")")
        fa = e["final_accuracy"]
        hist = " / ".join(f"{e['staleness_hist'][b]:.2f}" for b in HIST[:3])
        out.append([label, ratio, _mean_text(fa["per_seed"], ".3f"), _mean_text(e["stage_seconds"], ".0f"),
                    _mean_text(e["trained_tokens_per_s"], ",.0f"), _mean_text(e["trainer_idle_share"], ".2f"),
                    "–" if label == SYNC else _mean_text(e["engine_idle_share"], ".2f"), hist])
    return out


def _val(x):
    return math.inf if x == "inf" else math.nan if x is None else x


HEAD = ["config", "wall s to sync's final accuracy ÷ sync's, median [95 % CI] (per seed)",
        "final held-out accuracy, mean (per seed)", "stage wall s without evaluation", "trained tokens/s",
        "trainer idle share", "engine idle share", "staleness 0 / 1 / 2-3 (share of trained records)"]


def plot(found: dict[str, dict[int, Run]], path: Path) -> None:
    """Accuracy against wall seconds (evaluations left out) and against generated tokens: colour a config,
    line style a seed, points the evaluations, thin lines the fitted curves."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: only when a figure is rendered
    from matplotlib.figure import Figure as MplFigure
    import numpy as np

    fig = MplFigure(figsize=(13, 5), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    styles = ["-", "--", ":", "-.", (0, (5, 1))]
    for c, (label, runs) in enumerate(found.items()):
        for i, (seed, run) in enumerate(sorted(runs.items())):
            style = dict(color=f"C{c}", linestyle=styles[i % len(styles)])
            axes[0].plot(run.seconds, run.accuracy, marker=".", markersize=3, linewidth=0, color=f"C{c}",
                         label=f"{label}, seed {seed}")
            axes[1].plot(run.tokens, run.accuracy, marker=".", markersize=3, linewidth=0, color=f"C{c}")
            if run.fit and run.tokens:
                axes[0].plot(run.seconds, [run.fit.at(x) for x in run.tokens], linewidth=0.8, **style)
                t = np.linspace(0, max(run.tokens), 200)
                axes[1].plot(t, [run.fit.at(x) for x in t], linewidth=0.8, **style)
    axes[0].set(xlabel="wall seconds (without evaluations)", ylabel="held-out accuracy",
                title="accuracy vs wall seconds (fits: lines)")
    axes[1].set(xlabel="generated tokens", title="accuracy vs generated tokens")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.legend(fontsize=6, loc="center right", ncol=1)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp)
    tmp.replace(path)


def render(out: Path, smoke: bool) -> Rendered:
    sft, found = read(out)
    result = numbers(sft, found)
    results = out.parent / "results" if smoke else ROOT / "docs/results"
    for folder in (out, results):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{NAME}.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    image = out / "curves.png"
    if found:
        plot(found, image)
        if not smoke:
            shutil.copyfile(image, ROOT / f"docs/img/{NAME}.png")
    std = result["sync_final_accuracy_std"]
    notes = (f"Task: the flawed teacher (`task=arithmetic_flawed`), {len(sft)} seed(s), SFT accuracy "
             f"{', '.join(f'{a:.3f}' for _, a in sorted(sft.items()) if a is not None)} (each seed's SFT policy "
             f"shared by every config). Every GRPO run: {SMOKE_STEPS if smoke else STEPS} optimizer steps, "
             f"{STEPS_PER_ROUND} a round, `correction=decoupled_ppo` (the `ppo_clip` config: `correction=ppo_clip`, "
             f"no π_prox forward), evaluated every "
             f"{SMOKE_EVERY if smoke else EVERY:,} generated tokens; trainer OMP_NUM_THREADS=1, engine "
             f"`engine_threads=1`. Target: the synchronous run's fitted accuracy at its last evaluation (same seed); "
             f"ratio = the asynchronous run's wall seconds to it (from its fit, through its own tokens→seconds "
             f"curve) over the synchronous run's; median over seeds, [2.5 %, 97.5 %] of the median over 10,000 "
             f"bootstrap resamples of the seeds; ∞: the run's fitted asymptote stays below. Seed noise: the "
             f"synchronous final accuracies' standard deviation, {'–' if std is None else f'{std:.3f}'}. Wall seconds "
             f"leave evaluations out (the engine keeps generating while the trainer evaluates, so an asynchronous "
             f"run gains up to its evaluation seconds; `stage_wall_ratio_to_sync` in the JSON has the stage's wall "
             f"with evaluations). Idle shares: cost/trainer_idle_seconds, cost/engine_idle_seconds over the stage "
             f"seconds. Per-seed values: {NAME}.json beside this file. Curves: "
             + (str(image) if smoke else f"docs/img/{NAME}.png") + ".")
    return Rendered(table(HEAD, ["---", *["---:"] * (len(HEAD) - 1)], rows(result)), notes)


def figure(seeds: list[int]) -> Figure:
    return Figure(NAME, "Asynchronous rounds (issue 32): wall seconds to the synchronous run's final accuracy",
                  f"≈ {len(seeds) * 6} min on an idle 2-core machine (3 seeds measured 17.9 min): {len(seeds)} SFT "
                  f"runs of {SFT[-1].split('=')[1]} steps + {len(CONFIGS) * len(seeds)} GRPO runs of {STEPS} steps",
                  lambda out, smoke: commands(out, smoke, seeds), render)


register(figure(SEEDS))


def main(argv: list[str] | None = None) -> None:
    """`--seeds` for a rerun on other seeds, through scripts.readme_figures."""
    from scripts import readme_figures  # lazy: it imports this module to register it
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated SFT/RL seeds")
    p.add_argument("--smoke", action="store_true", help="a few steps, one seed, into --out or a temp dir")
    p.add_argument("--out", type=Path, help=f"where the runs go (default multirun/figures/{NAME}-<UTC time>)")
    args = p.parse_args(argv)
    fig = figure([int(s) for s in args.seeds.split(",")])
    invocation = readme_figures.shown(["python", "-m", "scripts.figures.async_rounds", *(argv or [])])
    if args.smoke:
        import tempfile
        out = (args.out or Path(tempfile.mkdtemp(prefix="async-figure-"))).resolve() / NAME
        out.parent.mkdir(parents=True, exist_ok=True)
        return readme_figures.write(NAME, readme_figures.make(fig, out, True, invocation), out.parent / "results")
    import time
    out = args.out or Path("multirun/figures") / f"{NAME}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    readme_figures.write(NAME, readme_figures.make(fig, out, False, invocation), readme_figures.RESULTS)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
