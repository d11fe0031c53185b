"""The learning figures, measured through train.py multiruns: quickstart seeds, on-policy vs replay,
preference learning. Each reads the summary.json of its jobs (scripts/figures/registry.jobs)."""
from __future__ import annotations

import statistics
from pathlib import Path

import shutil

from callbacks.sweep import collect_jobs, mean_curve, plot
from scripts.figures.provenance import ROOT
from scripts.figures.registry import Figure, Job, Rendered, jobs, pts, register

QUIET = ["logger=csv", "callbacks.progress.refresh_rate=0"]  # no W&B files, no progress bars; same learning
# --smoke: every stage a few steps on a small held-out set (the plumbing, not the figures)
SMOKE = ["trainer.max_steps=4", "data.batch_size=32", "data.prompts_per_round=4", "task.num_heldout=20",
         "callbacks.evaluate.num_examples=20", "generator.max_new_tokens=6"]


def train(*args: str) -> list[str]:
    return ["python", "train.py", *args]


def mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def acc(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def mean_std(xs: list[float]) -> str:
    if not xs:
        return "–"
    std = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.3f} ± {std:.3f} ({', '.join(f'{x:.3f}' for x in xs)})"


def kilo(n: float) -> str:
    return f"{n / 1000:.0f}k" if n >= 1000 else f"{n:.0f}"


def table(head: list[str], align: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


# ------------------------------------------------------------------------------- quickstart


def quickstart_commands(out: Path, smoke: bool) -> list[list[str]]:
    seeds = "seed=1,2" if smoke else "seed=1,2,3,4,5"
    return [train("-m", seeds, *QUIET, *(SMOKE if smoke else []), f"hydra.sweep.dir={out}/quickstart")]


def reward_ends(stage: dict) -> tuple[float | None, float | None]:
    curve = stage.get("rollout/reward_curve") or []
    if curve:
        return curve[0], curve[-1]
    return stage.get("rollout/reward_mean_first"), stage.get("rollout/reward_mean")


def quickstart_row(job: Job) -> list:
    stages = list(job.stages.values())
    first, last = stages[0], stages[-1]
    r0, r1 = reward_ends(last)
    gain = None if last.get("val/accuracy_before") is None else last["val/accuracy_after"] - last["val/accuracy_before"]
    return [first.get("val/accuracy_before"), *[s.get("val/accuracy_after") for s in stages], gain, r0, r1,
            [s.get("wall_seconds") or 0.0 for s in stages]]


def quickstart_render(out: Path, smoke: bool) -> Rendered:
    found = sorted(jobs(out / "quickstart"), key=lambda j: j.seed)
    names = list(found[0].stages)
    steps = [found[0].stages[n].get("train/steps") for n in names]
    head = ["seed", f"before {names[0]}", *[f"after {n} ({s:,} steps)" for n, s in zip(names, steps)],
            f"{names[-1]} gain, pts", f"rollout reward, first → last round ({names[-1]})",
            f"stage wall s ({' + '.join(names)})"]
    rows, values = [], [quickstart_row(j) for j in found]
    for job, v in zip(found, values):
        accs, (gain, r0, r1, walls) = v[:-4], v[-4:]
        rows.append([str(job.seed), *map(acc, accs), pts(gain), f"{acc(r0)} → {acc(r1)}",
                     " + ".join(f"{w:.0f}" for w in walls)])
    means = [mean(v[i] for v in values) for i in range(len(values[0]) - 1)]
    rows.append(["mean", *map(acc, means[:-3]), pts(means[-3]), f"{acc(means[-2])} → {acc(means[-1])}", ""])
    tokens = [j.stages[names[-1]].get("cost/generated_tokens") for j in found]
    notes = (f"Held-out greedy accuracy of each stage's policy, {len(found)} seeds (`seed=`), the default "
             f"experiment (conf/experiment/quickstart.yaml). The {names[-1]} stage generated "
             f"{mean(tokens) or 0:,.0f} tokens per run on average.")
    return Rendered(table(head, ["---"] + ["---:"] * (len(head) - 1), rows), notes)


register(Figure("quickstart", "The default run (`python train.py`), per seed", "~5 min a seed on 2 cores, 5 seeds",
                quickstart_commands, quickstart_render))


# ------------------------------------------------------------------------- on-policy vs replay


def ovr_commands(out: Path, smoke: bool) -> list[list[str]]:
    seeds = "seed=1" if smoke else "seed=1,2,3"
    small = [*SMOKE, "callbacks.evaluate.every_n_steps=2"] if smoke else []
    ratios = "0,0.9" if smoke else "0,0.5,0.9"
    exp = ["-m", "experiment=onpolicy_vs_replay", *QUIET, *small]
    return [train(*exp, f"data.replay_ratio={ratios}", seeds, f"hydra.sweep.dir={out}/ovr"),
            train(*exp, "data.replay_ratio=0.9", "callbacks.drift.min_ess_frac=0.75", seeds,
                  f"hydra.sweep.dir={out}/ovr_drift")]


def ovr_label(job: Job) -> tuple[bool, float, str]:
    ratio, drift = job.overrides["data.replay_ratio"], job.overrides.get("callbacks.drift.min_ess_frac")
    if drift:
        return True, float(ratio), f"replay {ratio} + drift refresh (ESS < {drift})"
    return False, float(ratio), "replay 0 (on-policy)" if float(ratio) == 0 else f"replay {ratio}"


def at_tokens(onpolicy: list[Job], tokens: float) -> str:
    """On-policy's mean held-out accuracy at the evaluation nearest `tokens` generated tokens."""
    curves = [list(j.stages.values())[-1].get("val/curve") or [] for j in onpolicy]
    if not all(curves):
        return "–"
    x, accs, _, _ = mean_curve(curves)
    i = min(range(len(x)), key=lambda k: abs(x[k] - tokens))
    return f"{accs[i]:.3f} (step {curves[0][i]['step']}, {kilo(x[i])})"


def ovr_row(label: str, group: list[Job], onpolicy: list[Job]) -> list[str]:
    last = [list(j.stages.values())[-1] for j in sorted(group, key=lambda j: j.seed)]
    accs = [s["val/accuracy_after"] for s in last]
    tokens = mean(s.get("cost/generated_tokens") for s in last) or 0.0
    walls = [s.get("wall_seconds") or 0.0 for s in last]
    same = "–" if group is onpolicy else at_tokens(onpolicy, tokens)
    return [label, acc(mean(s.get("rollout/replay_frac_mean") for s in last)), kilo(tokens),
            f"**{mean(accs):.3f}** ({min(accs):.3f}–{max(accs):.3f})",
            ", ".join(pts(s["val/accuracy_after"] - s["val/accuracy_before"]) for s in last),
            same, f"{min(walls):.0f}–{max(walls):.0f}"]


PLOT = "docs/img/onpolicy_vs_replay.png"


def ovr_plot(out: Path, smoke: bool) -> str:
    """The sweep callback's accuracy-vs-tokens plot over both multiruns; the README's copy when not smoke."""
    path = out / "onpolicy_vs_replay.png"
    plot([j for d in ("ovr", "ovr_drift") if (out / d).is_dir() for j in collect_jobs(out / d)], path, quiet=True)
    if not smoke and path.is_file():
        shutil.copyfile(path, ROOT / PLOT)
    return str(path) if smoke else PLOT


def ovr_render(out: Path, smoke: bool) -> Rendered:
    groups: dict[tuple, list[Job]] = {}
    for job in jobs(out):
        groups.setdefault(ovr_label(job), []).append(job)
    onpolicy = next((g for (drift, r, _), g in groups.items() if not drift and r == 0), [])
    rows = [ovr_row(key[2], groups[key], onpolicy) for key in sorted(groups)]
    head = ["config", "replayed share of groups", "generated tokens", "final accuracy, mean (min–max)",
            "gain over SFT per seed, pts", "on-policy at the same tokens", "GRPO wall s"]
    sft = sorted(onpolicy, key=lambda j: j.seed)
    start = ", ".join(f"{list(j.stages.values())[0]['val/accuracy_after']:.3f}" for j in sft)
    notes = (f"Held-out greedy accuracy after the GRPO stage; after SFT the on-policy runs' seeds stand at "
             f"{start}. Every config takes the same optimizer steps, so they differ in what they generate. "
             f"Accuracy against generated tokens, all configs: {ovr_plot(out, smoke)}.")
    return Rendered(table(head, ["---", "---:", "---:", "---:", "---", "---:", "---:"], rows), notes)


register(Figure("onpolicy_vs_replay", "On-policy vs replay (`experiment=onpolicy_vs_replay`)",
                "~45 min on 2 cores: 12 runs of SFT 2,000 steps + GRPO 400 (estimate)", ovr_commands, ovr_render))


# ------------------------------------------------------------------------------- preferences

PREF_ALGORITHMS = "dpo,ipo,kto,online_dpo,rejection_sampling,reward_model"


def pref_commands(out: Path, smoke: bool) -> list[list[str]]:
    small = [*SMOKE[3:]] if smoke else []  # the held-out set and sampling length; steps set below
    sft_steps, steps = ("trainer.max_steps=4", "trainer.max_steps=2") if smoke else (
        "trainer.max_steps=2000", "trainer.max_steps=300")
    # smoke: online DPO and rejection sampling need a policy that solves some prompts (a 4-step SFT does not)
    algorithms = "dpo,reward_model" if smoke else PREF_ALGORITHMS
    return [train("algorithm=sft", "data.max_examples=1500", sft_steps, "seed=1", *QUIET, *small,
                  f"hydra.run.dir={out}/sft"),
            train("-m", "model=hf", "recipe=tiny", f"model.name_or_path={out}/sft/policy", f"algorithm={algorithms}", steps,
                  "seed=1" if smoke else "seed=1,2,3", *QUIET, *small, f"hydra.sweep.dir={out}/prefs")]


def pref_render(out: Path, smoke: bool) -> Rendered:
    sft = list(jobs(out / "sft")[0].stages.values())[-1]
    runs = [(j.overrides["algorithm"], list(j.stages.values())[-1]) for j in
            sorted(jobs(out / "prefs"), key=lambda j: j.seed)]
    algorithms = list(dict.fromkeys(a for a, _ in runs))
    pref_before = next((s["val/pref_accuracy_before"] for _, s in runs if "val/pref_accuracy_before" in s), None)
    rows = []
    for a in algorithms:
        stages = [s for name, s in runs if name == a]
        task = [s["val/accuracy_after"] for s in stages if s.get("val/accuracy_after") is not None]
        pref = [s["val/pref_accuracy_after"] for s in stages if s.get("val/pref_accuracy_after") is not None]
        own = mean(s.get("val/pref_accuracy_before") for s in stages)
        before = f"; {own:.3f} before" if pref and own is not None and abs(own - (pref_before or 0)) > 5e-4 else ""
        rows.append([a, "–" if a == "reward_model" else mean_std(task), mean_std(pref) + before])
    head = ["algorithm", f"held-out task accuracy ({acc(sft.get('val/accuracy_after'))} before)",
            f"held-out preference accuracy ({acc(pref_before)} before)"]
    notes = ("Every run starts from one SFT policy (the first command: 1,500 demonstrations, seed 1); "
             "mean ± sample std over the seeds, then each seed's value. The reward model trains a scoring "
             "head, not the policy: its task accuracy is the SFT policy's.")
    return Rendered(table(head, ["---", "---", "---"], rows), notes)


register(Figure("preferences", "Preference learning from one SFT policy", "~1-2 h on 2 cores: 1 SFT run + 18 runs of 300 steps (estimate)",
                pref_commands, pref_render))
