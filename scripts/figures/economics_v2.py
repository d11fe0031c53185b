"""Measurement v2 (issue 33): which source of experience buys held-out accuracy with fewer tokens, judged by
fitted curves on a task with large, consistent headroom, against an A/A null.

    python -m scripts.readme_figures --only economics_v2           # 5 seeds, every config (hours)
    python -m scripts.figures.economics_v2 --seeds 6,7 --configs on-policy,A/A,DAPO [--smoke] [--out DIR]

The task: the quickstart's flawed teacher (task=arithmetic_flawed: SFT copies its missing carry, 0.83-0.89;
GRPO gains 11-16 points on every seed), 1,000 held-out pairs. Per seed one SFT policy (the quickstart's
1,500 demonstrations, 2,000 steps), shared by every config; each config's GRPO runs until it has generated
BUDGET tokens (≈ 3.3 passes of the 9,000 training prompts on-policy), evaluated each EVERY generated
tokens (`callbacks.evaluate.every_n_tokens`: one grid for all, ≥ 40 points a run). The A/A config is the
baseline again from the same SFT policy with another RL seed (seed + AA_OFFSET): its ratio's interval is
the null every claim is printed beside.

Each run's accuracy-vs-tokens curve gets a saturating fit from the seed's SFT accuracy
(scripts/figures/curves.py); per seed, tokens to 50/80/90 % of the baseline's fitted gain, as a ratio to
the baseline's, in four currencies (generated tokens, trained tokens, wall seconds without evaluation, and a
price with generation at 0.3/0.7/0.85 of the baseline's step); median over seeds with a paired bootstrap
interval. The fitted asymptote is reported apart: a ratio says how fast, the asymptote how far.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from scripts.figures import curves
from scripts.figures.curves import FRACTIONS, SHARES, Fit, Interval, at_tokens, paired_bootstrap
from scripts.figures.provenance import ROOT
from scripts.figures.registry import Figure, Job, Rendered, register
from scripts.figures.training import QUIET, table, train

NAME, BASELINE, AA, DAPO = "economics_v2", "on-policy", "A/A", "DAPO"
AA_OFFSET = 1000  # the A/A run's RL seed: the SFT seed + this
GRESO = ["data=adaptive", "data.policy.selection=greso", "data.policy.min_fresh_frac=1", "data.policy.max_fresh_frac=1"]
CONFIGS = {  # label → the GRPO stage's keys; the baseline first
    BASELINE: ["data=fresh_rollouts"],
    "on-policy β=0": ["data=fresh_rollouts", "algorithm.beta=0"],
    AA: ["data=fresh_rollouts"],
    DAPO: ["data=fresh_rollouts", "algorithm.dynamic_sampling=true"],
    "2 passes": ["data=fresh_rollouts", "algorithm.epochs_per_round=2"],  # the update-limitation test: is
    # learning limited by updates (2 passes beat 1 at equal generated tokens) or by fresh informative groups?
    "replay 0.5": ["data=replay_mix", "data.replay_ratio=0.5"],
    "adaptive": ["data=adaptive"],
    # issue 33 §2, each on DAPO's refill loop (the baseline it must beat by 2×): GRESO's calibrated skipping before
    # rollout (fresh data only, so only the selection acts) with measured refills and the surplus carried; screen,
    # then expand; a stored verified success for an all-fail group of a revisited prompt; all of them together
    "GRESO": [*GRESO, "algorithm.dynamic_sampling=true", "algorithm.refill=measured", "algorithm.carry_surplus=true"],
    "screen": ["data=fresh_rollouts", "algorithm.dynamic_sampling=true", "algorithm.screen.size=2"],
    "stored success": ["data=fresh_rollouts", "algorithm.dynamic_sampling=true", "algorithm.stored_success.enabled=true"],
    "economy": [*GRESO, "algorithm.dynamic_sampling=true", "algorithm.refill=measured", "algorithm.carry_surplus=true",
                "algorithm.screen.size=2", "algorithm.stored_success.enabled=true"],
}
SEEDS = [1, 2, 3, 4, 5]
TASK = ["task=arithmetic_flawed", "task.num_heldout=1000"]
SFT = ["algorithm=sft", "data=demonstrations", "data.max_examples=1500", "trainer.max_steps=2000"]
BUDGET, EVERY, MAX_STEPS = 800_000, 20_000, 2000  # generated tokens; the evaluation grid; a cap on steps
# --smoke: the plumbing only (a few rounds, a few grid points, 20 held-out pairs)
SMOKE_TASK = ["task=arithmetic_flawed", "task.num_heldout=20"]
SMOKE_RUN = ["data.batch_size=32", "data.prompts_per_round=4", "callbacks.evaluate.num_examples=20",
             "generator.max_new_tokens=6"]
SMOKE_BUDGET, SMOKE_EVERY, SMOKE_STEPS, SMOKE_SEEDS = 1200, 200, 12, [1]
PER_ROUND = ("rollout/z", "rollout/tokens_per_informative_group", "rollout/pg_kl_weight", "rollout/kl_after_update")


def slug(label: str) -> str:
    """A label as a folder name Hydra's override grammar takes: ASCII letters, digits and _ (β → beta)."""
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in label.replace("β", "beta")).strip("_")


def known(configs: list[str]) -> list[str]:
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"--configs: no config named {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    return [BASELINE, *[c for c in configs if c != BASELINE]]  # the baseline is always measured


def commands_for(seeds: list[int], configs: list[str]):
    def commands(out: Path, smoke: bool) -> list[list[str]]:
        task = SMOKE_TASK if smoke else TASK
        sft = [*SFT[:-1], "trainer.max_steps=4"] if smoke else SFT
        grpo = [f"trainer.max_steps={SMOKE_STEPS if smoke else MAX_STEPS}",
                f"budget.generated_tokens={SMOKE_BUDGET if smoke else BUDGET}",
                f"callbacks.evaluate.every_n_tokens={SMOKE_EVERY if smoke else EVERY}",
                *(SMOKE_RUN if smoke else [])]
        runs = []
        for s in (SMOKE_SEEDS if smoke else seeds):  # seed by seed: a stopped measurement keeps its first seeds
            runs.append(train(*sft, *task, f"seed={s}", *QUIET, *(SMOKE_RUN[2:] if smoke else []),
                              f"hydra.run.dir={out}/sft/seed{s}"))
            runs += [train("algorithm=grpo", *CONFIGS[label], *task, "model=hf", "recipe=tiny",
                           f"model.name_or_path={out}/sft/seed{s}/policy", *grpo,
                           f"seed={s + AA_OFFSET if label == AA else s}", *QUIET, f"hydra.run.dir={out}/{slug(label)}/seed{s}")
                     for label in configs]
        return runs
    return commands


# ------------------------------------------------------------------------------- reading the runs


@dataclass
class Run:
    """One GRPO run, read from its job dir: its curve, its totals and its per-round means."""
    tokens: list[float]
    seconds: list[float]
    accuracy: list[float]
    generated: float   # cost/generated_tokens at the end
    trained: float     # cost/trained_tokens at the end
    per_round: dict[str, float]
    fit: Fit | None = None


def pair_seed(job: Job) -> int:
    """The SFT seed a run started from: its dir is <config>/seed<N> (the A/A run's own seed differs)."""
    name = job.path.name
    return int(name[4:]) if name.startswith("seed") and name[4:].isdigit() else job.seed


def round_means(job_dir: Path) -> dict[str, float]:
    """Means over the stage's rounds of the per-round metrics (PER_ROUND) and of every train/ clip_frac and
    kl_behaviour column (per source and staleness bucket), from the CSV logger's metrics.csv files."""
    sums: dict[str, list[float]] = {}
    for path in sorted((job_dir / "csv").rglob("metrics.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                for k, v in row.items():
                    wanted = k in PER_ROUND or (k.startswith("train/") and ("clip_frac" in k or "kl_behaviour" in k))
                    if wanted and v not in ("", None):
                        try:
                            sums.setdefault(k, []).append(float(v))
                        except ValueError:
                            continue
    return {k: statistics.fmean(v) for k, v in sorted(sums.items()) if v}


def read_run(job: Job) -> Run:
    s = list(job.stages.values())[-1]
    curve = s.get("val/curve") or []
    return Run([float(p["generated_tokens"]) for p in curve], [float(p.get("seconds", 0.0)) for p in curve],
               [float(p["accuracy"]) for p in curve], float(s.get("cost/generated_tokens") or 0.0),
               float(s.get("cost/trained_tokens") or 0.0), round_means(job.path))


def read(out: Path, configs: list[str]) -> tuple[dict[int, float], dict[str, dict[int, Run]]]:
    """Each seed's SFT accuracy (a0) and each config's runs by SFT seed, fitted from that a0."""
    return curves.fitted_runs(out, configs, slug, read_run, pair_seed)


# ------------------------------------------------------------------------------- the numbers


def to_target(run: Run, target_gain: float) -> float:
    return curves.tokens_to(run.fit, target_gain) if run.fit else math.nan


def ratios(runs: dict[int, Run], base: dict[int, Run], p: float) -> dict[str, list[float]]:
    """Per seed (paired with the baseline's), at p of the baseline's fitted gain: the ratios to the baseline
    in generated tokens, trained tokens, wall seconds, and priced at each generation share."""
    out: dict[str, list[float]] = {"tokens": [], "trained": [], "seconds": [], **{f"priced_{s}": [] for s in SHARES}}
    for seed in sorted(set(runs) & set(base)):
        run, b = runs[seed], base[seed]
        if not (run.fit and b.fit) or b.fit.gain <= 0:
            continue
        t, tb = to_target(run, p * b.fit.gain), to_target(b, p * b.fit.gain)
        r_gen = t / tb
        r_trained = (t * run.trained / run.generated) / (tb * b.trained / b.generated) if run.generated and b.generated and b.trained else math.nan
        sec, sec_b = at_tokens(run.tokens, run.seconds, t), at_tokens(b.tokens, b.seconds, tb)
        out["tokens"].append(r_gen)
        out["trained"].append(r_trained)
        out["seconds"].append(sec / sec_b if sec_b else math.nan)
        for share in SHARES:
            out[f"priced_{share}"].append(curves.priced_ratio(r_gen, r_trained, share))
    return out


def vs_dapo(runs: dict[int, Run], base: dict[int, Run], dapo: dict[int, Run]) -> list[float]:
    """Per seed: tokens to 90 % of the baseline's gain, this config's over DAPO's."""
    out = []
    for seed in sorted(set(runs) & set(base) & set(dapo)):
        b = base[seed]
        if runs[seed].fit and dapo[seed].fit and b.fit and b.fit.gain > 0:
            out.append(to_target(runs[seed], 0.9 * b.fit.gain) / to_target(dapo[seed], 0.9 * b.fit.gain))
    return out


def mean_of(values) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return statistics.fmean(values) if values else None


def numbers(sft: dict[int, float], found: dict[str, dict[int, Run]]) -> dict:
    """The results JSON: {"baseline", "aa": interval, "configs": {label: {...}}} (issue 33's shape, plus the
    other fractions and currencies, the per-seed values and the per-round means)."""
    base, dapo = found.get(BASELINE, {}), found.get(DAPO, {})
    aa = paired_bootstrap(ratios(found.get(AA, {}), base, 0.9)["tokens"])
    out = {"baseline": BASELINE, "aa": aa.as_dict(), "sft_accuracy": {str(k): v for k, v in sorted(sft.items())},
           "budget_tokens": BUDGET, "every_n_tokens": EVERY, "configs": {}}
    for label, runs in found.items():
        entry: dict = {}
        for p in FRACTIONS:
            for currency, values in ratios(runs, base, p).items():
                key = f"tokens_ratio_{round(p * 100)}" + ("" if currency == "tokens" else f"_{currency}")
                entry[key] = paired_bootstrap(values).as_dict()
                if p == 0.9 and currency == "tokens":
                    entry["tokens_ratio_90_per_seed"] = [curves._num(v) for v in values]
        entry["tokens_ratio_90_vs_dapo"] = paired_bootstrap(vs_dapo(runs, base, dapo)).as_dict()
        entry["asymptote"] = mean_of(r.fit.asymptote if r.fit else None for r in runs.values())
        entry["asymptote_baseline"] = mean_of(base[s].fit.asymptote if base[s].fit else None for s in runs if s in base)
        entry["asymptote_per_seed"] = {str(s): r.fit.asymptote if r.fit else None for s, r in sorted(runs.items())}
        entry["tau_per_seed"] = {str(s): r.fit.tau if r.fit else None for s, r in sorted(runs.items())}
        entry["fit_rmse_max"] = max((r.fit.rmse for r in runs.values() if r.fit), default=None)
        entry["eval_points_min"] = min(len(r.tokens) for r in runs.values())
        entry["z_mean"] = mean_of(r.per_round.get("rollout/z") for r in runs.values())
        keys = sorted({k for r in runs.values() for k in r.per_round})
        entry["per_round_means"] = {k: mean_of(r.per_round.get(k) for r in runs.values()) for k in keys}
        out["configs"][label] = entry
    return out


# ------------------------------------------------------------------------------- the table, plot, JSON


def cell(d: dict) -> str:
    iv = Interval(*(math.inf if d[k] == "inf" else math.nan if d[k] is None else d[k] for k in ("median", "lo", "hi")))
    return iv.text()


def rows(result: dict) -> list[list[str]]:
    aa = cell(result["aa"])
    out = []
    for label, e in result["configs"].items():
        a, ab = e["asymptote"], e["asymptote_baseline"]
        priced = " / ".join(cell(e[f"tokens_ratio_90_priced_{s}"]) for s in SHARES)
        out.append([label, f"{cell(e['tokens_ratio_90'])} (A/A {aa})", cell(e["tokens_ratio_50"]),
                    cell(e["tokens_ratio_80"]), "–" if a is None else f"{a:.3f} (baseline {ab:.3f})" if ab else f"{a:.3f}",
                    cell(e["tokens_ratio_90_trained"]), cell(e["tokens_ratio_90_seconds"]), priced,
                    cell(e["tokens_ratio_90_vs_dapo"]), "–" if e["z_mean"] is None else f"{e['z_mean']:.2f}",
                    str(e["eval_points_min"])])
    return out


def plot(sft: dict[int, float], found: dict[str, dict[int, Run]], path: Path) -> None:
    """Accuracy against generated tokens and against wall seconds (evaluations left out): colour a config,
    line style a seed, points the evaluations, thin lines the fitted curves (on the seconds panel, the fit
    at each evaluation's tokens)."""
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
            axes[0].plot(run.tokens, run.accuracy, marker=".", markersize=3, linewidth=0, color=f"C{c}",
                         label=f"{label}, seed {seed}")
            axes[1].plot(run.seconds, run.accuracy, marker=".", markersize=3, linewidth=0, color=f"C{c}")
            if run.fit and run.tokens:
                t = np.linspace(0, max(run.tokens), 200)
                axes[0].plot(t, [run.fit.at(x) for x in t], linewidth=0.8, **style)
                axes[1].plot(run.seconds, [run.fit.at(x) for x in run.tokens], linewidth=0.8, **style)
    axes[0].set(xlabel="generated tokens", ylabel="held-out accuracy", title="accuracy vs generated tokens (fits: lines)")
    axes[1].set(xlabel="wall seconds (without evaluations)", title="accuracy vs wall seconds")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.legend(fontsize=5, loc="center right", ncol=1)
    fig.tight_layout(rect=(0, 0, 0.82, 1))
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp)
    tmp.replace(path)


HEAD = ["config", "tokens to 90 % of on-policy's gain ÷ on-policy's, median [95 % CI] (A/A null)", "… to 50 %",
        "… to 80 %", "fitted asymptote, mean (on-policy's)", "trained tokens to 90 % ÷", "wall s to 90 % ÷",
        "priced to 90 % ÷, generation 0.3 / 0.7 / 0.85 of a step", "tokens to 90 % ÷ DAPO's", "z (tied groups), mean",
        "evaluations a run, min"]


def render_for(configs: list[str]):
    def render(out: Path, smoke: bool) -> Rendered:
        sft, found = read(out, configs)
        result = numbers(sft, found)
        results = out.parent / "results" if smoke else ROOT / "docs/results"
        for folder in (out, results):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{NAME}.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
        image = out / "curves.png"
        plot(sft, found, image)
        if not smoke:
            shutil.copyfile(image, ROOT / f"docs/img/{NAME}.png")
        notes = (f"Task: the quickstart's flawed teacher (`task=arithmetic_flawed`), {len(sft)} seed(s), SFT accuracy "
                 f"{', '.join(f'{a:.3f}' for _, a in sorted(sft.items()) if a is not None)} on the held-out pairs "
                 f"(each seed's SFT policy shared by every config). Every GRPO run: until "
                 f"{SMOKE_BUDGET if smoke else BUDGET:,} generated tokens, evaluated every "
                 f"{SMOKE_EVERY if smoke else EVERY:,} (`callbacks.evaluate.every_n_tokens`). Fit per run: "
                 f"acc(t) = a0 + (A − a0)(1 − exp(−t/τ)), a0 the seed's SFT accuracy; t_p = −τ ln(1 − p·g/(A − a0)), "
                 f"g the baseline's fitted gain of the same seed (∞: the run's asymptote stays below). Ratios: median "
                 f"over seeds, [2.5 %, 97.5 %] of the median over 10,000 paired bootstrap resamples of the seeds. "
                 f"A/A: on-policy from the same SFT policy with RL seed + {AA_OFFSET}; a claim whose interval overlaps "
                 f"the A/A interval is not one. Priced: generation at the given share of on-policy's price a step "
                 f"(the ledger's two prices set so; here it is ≈ 0.28 of the time). Per-round means (z, tokens per "
                 f"informative group, PG:KL weight, KL after one update, clip_frac and KL per source/staleness) and "
                 f"per-seed values: {NAME}.json beside this file. Curves: "
                 + (str(image) if smoke else f"docs/img/{NAME}.png") + ".")
        return Rendered(table(HEAD, ["---", *["---:"] * (len(HEAD) - 1)], rows(result)), notes)
    return render


def figure(seeds: list[int], configs: list[str]) -> Figure:
    configs = known(configs)
    runs = len(seeds) * (1 + len(configs))
    return Figure(NAME, "Measurement v2 (issue 33): tokens to a share of on-policy's fitted gain, against an A/A null",
                  f"≈ {runs * 2.2 / 60:.1f} h on an idle 2-core machine (3 seeds × 9 configs measured 54 min: ≈ 2.6 min a "
                  f"GRPO run, ≈ 1.2 on DAPO's loop): "
                  f"{len(seeds)} SFT + {runs - len(seeds)} GRPO runs to {BUDGET:,} generated tokens, "
                  f"{BUDGET // EVERY} evaluations of 1,000 pairs each",
                  commands_for(seeds, configs), render_for(configs))


register(figure(SEEDS, list(CONFIGS)))


def main(argv: list[str] | None = None) -> None:
    """`--seeds` and `--configs` for a rerun on other seeds or configs, through scripts.readme_figures."""
    from scripts import readme_figures  # lazy: it imports this module (through economics) to register it
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated SFT/RL seeds")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of: {', '.join(CONFIGS)}")
    p.add_argument("--smoke", action="store_true", help="a few steps, one seed, into --out or a temp dir")
    p.add_argument("--out", type=Path, help="where the runs go (default multirun/figures/economics_v2-<UTC time>)")
    args = p.parse_args(argv)
    fig = figure([int(s) for s in args.seeds.split(",")], [c.strip() for c in args.configs.split(",")])
    invocation = readme_figures.shown(["python", "-m", "scripts.figures.economics_v2", *(argv or [])])
    if args.smoke:
        import tempfile
        out = (args.out or Path(tempfile.mkdtemp(prefix="economics-v2-"))).resolve() / NAME
        out.parent.mkdir(parents=True, exist_ok=True)
        return readme_figures.write(NAME, readme_figures.make(fig, out, True, invocation), out.parent / "results")
    import time
    out = args.out or Path("multirun/figures") / f"{NAME}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    readme_figures.write(NAME, readme_figures.make(fig, out, False, invocation), readme_figures.RESULTS)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
