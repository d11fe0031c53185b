"""Per-run plots: loss, margin, reward, held-out accuracy, KL, ESS and replay share of every stage, as PNGs.

    <run dir>/plots/<stage>.json   the stage's series (written at the stage's train end)
    <run dir>/plots/<metric>.png   loss, margin, reward, accuracy, kl, ess, replay: two panels, against the
                                   stage's optimizer steps and its generated tokens, one line per stage

Per optimizer step it keeps what the module already logged (`train/loss`, the preference algorithms'
`train/reward_margin`, `rollout/reward_mean`, `train/kl`, `train/ess_frac`: `trainer.callback_metrics`)
and the stage's generated tokens so far (callbacks/evaluate.generated_tokens); per round the replayed share of its groups
(RegenerateExperience.replay_fracs, only where the data module reports `rollout/replay_frac`), placed at
the first step that trains on the round and the tokens generated up to it, as that step's points; at the end
the held-out curve (HeldOutEvaluation.curve). Values are kept as they are (a CUDA tensor stays on its
device until the stage ends or a checkpoint is written: no host sync per step). The series are
checkpointed, so a resumed stage still plots from its first step. At each stage's train end the PNGs are
redrawn from every stage's json so far (a resumed run's finished stages keep theirs). A stage without a
metric is left out of that plot; a stage that generated no tokens (SFT) is left out of the token panel.
Rank 0 only. A plotting error is printed as a warning and never stops the run.
"""
from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import lightning as L
import torch
import yaml

from callbacks.evaluate import generated_tokens
from callbacks.logging import find_callback
from hardware.console import say

# per-step series: plot name → the callback_metrics key it reads
STEP_KEYS = {"reward": "rollout/reward_mean", "kl": "train/kl", "ess": "train/ess_frac", "loss": "train/loss",
             "margin": "train/reward_margin"}
# plot name → (title, y label)
PLOTS = {
    "loss": ("training loss (train/loss)", "loss"),
    "margin": ("implicit reward margin, chosen − rejected (train/reward_margin: DPO, IPO, KTO, RM)", "margin"),
    "reward": ("rollout reward: mean over every sampled, scored completion of a round (rollout/reward_mean; "
               "dynamic sampling's tied groups included; held-out greedy accuracy: accuracy.png)", "mean reward"),
    "accuracy": ("held-out greedy accuracy (val/accuracy)", "accuracy"),
    "kl": ("KL(π ‖ π_ref) per token (train/kl)", "KL"),
    "ess": ("effective sample size / batch (train/ess_frac)", "ESS fraction"),
    "replay": ("replayed share of each round's groups (rollout/replay_frac)", "replay share"),
}


class RunPlots(L.Callback):
    def __init__(self, output_dir: str, stage: str):
        self.output_dir, self.stage = Path(output_dir), stage
        self.steps: list[int] = []
        self.tokens: list[int] = []
        self.values: dict[str, list] = {name: [] for name in STEP_KEYS}  # None where not logged
        self.rounds_seen = 0
        self.replay: list[dict] = []  # {step, generated_tokens, replay_frac} per round that reports it

    # ---- recording ---------------------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module):
        self._new_rounds(trainer)  # after RegenerateExperience's on_fit_start (later in the list)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if not trainer.is_global_zero or (self.steps and step <= self.steps[-1]):
            return  # a skipped (non-finite) step did not advance the optimizer: nothing new to keep
        metrics = trainer.callback_metrics
        self.steps.append(step)
        self.tokens.append(generated_tokens(trainer))
        for name, key in STEP_KEYS.items():
            self.values[name].append(_keep(metrics.get(key)))

    def on_train_epoch_end(self, trainer, pl_module):
        self._new_rounds(trainer)  # RegenerateExperience made the next round in its epoch end, before this

    def _new_rounds(self, trainer) -> None:
        regen = find_callback(trainer, "RegenerateExperience")
        if not trainer.is_global_zero or regen is None:
            return
        fracs = regen.replay_fracs
        reports = "rollout/replay_frac" in regen.last_round  # fresh-only data modules report no share
        for frac in fracs[self.rounds_seen:]:  # a round's point: the first optimizer step that trains on it
            if reports:
                self.replay.append({"step": trainer.global_step + 1, "generated_tokens": generated_tokens(trainer),
                                    "replay_frac": float(frac)})
        self.rounds_seen = len(fracs)

    # ---- checkpointed state ----------------------------------------------------------------------
    STATE = ("steps", "tokens", "values", "rounds_seen", "replay")

    def state_dict(self) -> dict:
        self._to_floats()  # a checkpoint holds plain numbers (one host sync per checkpoint on a GPU)
        return copy.deepcopy({k: getattr(self, k) for k in self.STATE})

    def load_state_dict(self, state: dict) -> None:
        for k in self.STATE:
            setattr(self, k, copy.deepcopy(state.get(k, getattr(self, k))))
        for name in STEP_KEYS:  # an older state without a series: None for its steps
            self.values.setdefault(name, [None] * len(self.steps))

    def _to_floats(self) -> None:
        """Every kept tensor as a float (NaN → None), in one transfer per device."""
        kept = [(name, i, v) for name, vs in self.values.items() for i, v in enumerate(vs)
                if isinstance(v, torch.Tensor)]
        by_device: dict = {}
        for item in kept:
            by_device.setdefault(item[2].device, []).append(item)
        for items in by_device.values():
            floats = torch.stack([v.detach().float().reshape(()) for _, _, v in items]).tolist()
            for (name, i, _), x in zip(items, floats):
                self.values[name][i] = x
        for vs in self.values.values():
            vs[:] = [_finite(v) for v in vs]

    # ---- the stage's end -------------------------------------------------------------------------
    def series(self, trainer) -> dict:
        """The stage's series, as written to plots/<stage>.json."""
        self._new_rounds(trainer)
        self._to_floats()
        evaluation = find_callback(trainer, "HeldOutEvaluation")
        curve = [{"step": int(p["step"]), "generated_tokens": int(p["generated_tokens"]),
                  "accuracy": _finite(p["accuracy"])} for p in (evaluation.curve if evaluation else [])]
        return {"stage": self.stage, "steps": self.steps, "generated_tokens": self.tokens,
                **{name: vs for name, vs in self.values.items()}, "accuracy": curve, "replay": self.replay}

    def on_train_end(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        try:
            folder = self.output_dir / "plots"
            folder.mkdir(parents=True, exist_ok=True)
            _write_atomic(folder / f"{self.stage}.json", json.dumps(self.series(trainer)))
            written = draw(folder, stage_order(self.output_dir))
            if written:
                say(trainer, f"[plots] {folder}/: {', '.join(p.name for p in written)}")
        except Exception as e:  # noqa: BLE001 - a plot must never take a trained stage down with it
            say(trainer, f"WARNING [plots] could not write the run's plots: {type(e).__name__}: {e}")


def _keep(v):
    """A logged value as cheaply as it can be kept: a float from the CPU, a CUDA tensor as it is."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return v.detach().clone() if v.device.type != "cpu" else _finite(float(v))
    return _finite(float(v))


def _finite(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def stage_order(run_dir: Path) -> list[str]:
    """The run's stage names in order: config.yaml's keys (train.py writes it), then any other json."""
    config = run_dir / "config.yaml"
    planned = list(yaml.safe_load(config.read_text()) or {}) if config.is_file() else []
    others = sorted((p for p in (run_dir / "plots").glob("*.json") if p.stem not in planned),
                    key=lambda p: p.stat().st_mtime)
    return [name for name in planned if (run_dir / "plots" / f"{name}.json").is_file()] + [p.stem for p in others]


def lines(stage: dict, metric: str) -> tuple[list, list, list]:
    """(steps, generated tokens, values) of one stage's metric, points without a value left out."""
    if metric == "accuracy":
        pts = [(p["step"], p["generated_tokens"], p["accuracy"]) for p in stage.get("accuracy", [])]
    elif metric == "replay":
        pts = [(p["step"], p["generated_tokens"], p["replay_frac"]) for p in stage.get("replay", [])]
    else:
        pts = list(zip(stage.get("steps", []), stage.get("generated_tokens", []), stage.get(metric, [])))
    pts = [p for p in pts if p[2] is not None]
    return [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]


def draw(folder: Path, stages: list[str]) -> list[Path]:
    """(Re)draw plots/<metric>.png from the stages' json files; returns the PNGs written."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg: no display needed
    from matplotlib.figure import Figure

    data = [json.loads((folder / f"{name}.json").read_text()) for name in stages]
    colors = {d["stage"]: f"C{i % 10}" for i, d in enumerate(data)}  # a stage keeps its colour everywhere
    written = []
    for metric, (title, ylabel) in PLOTS.items():
        series = [(d["stage"], *lines(d, metric)) for d in data]
        series = [s for s in series if s[3]]
        if not series:
            continue  # no stage has this metric: no plot
        fig = Figure(figsize=(11, 4), dpi=110)
        FigureCanvasAgg(fig)
        by_steps, by_tokens = fig.subplots(1, 2, sharey=True)
        for name, steps, tokens, values in series:
            marker = "o" if len(values) <= 40 else None
            style = {"marker": marker, "markersize": 3, "label": name, "color": colors[name]}
            by_steps.plot(steps, values, **style)
            if any(tokens):  # a stage that generated nothing (SFT) has no token axis
                by_tokens.plot(tokens, values, **style)
        if not by_tokens.lines:
            by_tokens.text(0.5, 0.5, "no stage generated tokens", ha="center", va="center",
                           transform=by_tokens.transAxes, color="gray")
        by_steps.set(xlabel="optimizer steps of the stage", ylabel=ylabel)
        scale_y(by_steps, [v for *_, values in series for v in values])  # shared by both panels
        by_tokens.set(xlabel="generated tokens of the stage")
        for ax in (by_steps, by_tokens):
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
        fig.suptitle(title)
        fig.tight_layout()
        path = folder / f"{metric}.png"
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
        fig.savefig(tmp)
        os.replace(tmp, path)
        written.append(path)
    return written


def scale_y(ax, values: list[float]) -> None:
    """Plain tick labels (never matplotlib's offset, which shows float noise as "1e-7+1"); a flat series
    gets a readable range around it instead of a zig-zag at the 7th decimal; a series that never goes
    below 0 gets an axis that does not either (an all-zero series is not drawn around -0.05)."""
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    lo, hi = min(values), max(values)
    if hi - lo < 1e-6 * max(1.0, abs(hi)):
        pad = max(0.05 * abs(hi), 0.05)
        lo, hi = lo - pad, hi + pad
        ax.set_ylim(lo, hi)
    if min(values) >= 0 and ax.get_ylim()[0] < 0:
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1e-9))
