"""Per-run plots (callbacks/run_plots.py): the hooks driven by hand on a fake trainer, and one real stage."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from callbacks import run_plots
from callbacks.run_plots import RunPlots, draw, lines, stage_order

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class RegenerateExperience:  # found by class name (callbacks/logging.find_callback), like the real one
    def __init__(self, replay: bool):
        self.totals = {"generated_tokens": 0}
        self.replay_fracs: list[float] = []
        self.last_round: dict = {}
        self.replay = replay

    def make_round(self, tokens: int, frac: float) -> None:
        self.totals["generated_tokens"] += tokens
        self.replay_fracs.append(frac if self.replay else 0.0)
        self.last_round = {"rollout/reward_mean": 0.5} | ({"rollout/replay_frac": frac} if self.replay else {})


class HeldOutEvaluation:
    def __init__(self):
        self.curve: list[dict] = []


def fake_trainer(regen=None, zero=True):
    evaluation = HeldOutEvaluation()
    cbs = [c for c in (regen, evaluation) if c is not None]
    return SimpleNamespace(global_step=0, callback_metrics={}, is_global_zero=zero, callbacks=cbs,
                           progress_bar_callback=None, evaluation=evaluation)


def grpo_stage(trainer, regen, cb, steps, first_step=1, stop=None):
    """Rounds of 2 optimizer steps: a round at fit start and at each epoch end before max_steps (`steps`),
    as RegenerateExperience makes them; `stop`: the process ends after that step (a kill)."""
    if first_step == 1:
        regen.make_round(100, 0.0)
        cb.on_fit_start(trainer, None)
        trainer.evaluation.curve.append({"step": 0, "generated_tokens": 100, "accuracy": 0.1})
    for step in range(first_step, (stop or steps) + 1):
        trainer.global_step = step
        trainer.callback_metrics = {"rollout/reward_mean": torch.tensor(step / 10),
                                    "train/kl": torch.tensor(0.01 * step), "train/ess_frac": 1.0 - step / 100,
                                    "train/loss": torch.tensor(9.0)}
        cb.on_train_batch_end(trainer, None, None, None, step)
        if step % 2 == 0:
            if step < steps:
                regen.make_round(100, 0.5)
            cb.on_train_epoch_end(trainer, None)


def test_a_stage_writes_its_series_and_the_pngs(tmp_path):
    regen = RegenerateExperience(replay=True)
    trainer, cb = fake_trainer(regen), RunPlots(str(tmp_path), "grpo")
    grpo_stage(trainer, regen, cb, steps=6)
    trainer.evaluation.curve.append({"step": 6, "generated_tokens": 300, "accuracy": 0.4})
    cb.on_train_end(trainer, None)

    series = json.loads((tmp_path / "plots" / "grpo.json").read_text())
    assert series["stage"] == "grpo"
    assert series["steps"] == [1, 2, 3, 4, 5, 6]
    assert series["generated_tokens"] == [100, 100, 200, 200, 300, 300]
    assert series["reward"] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert series["kl"] == pytest.approx([0.01 * s for s in range(1, 7)])
    assert series["ess"] == pytest.approx([1 - s / 100 for s in range(1, 7)])
    assert series["accuracy"] == [{"step": 0, "generated_tokens": 100, "accuracy": 0.1},
                                  {"step": 6, "generated_tokens": 300, "accuracy": 0.4}]
    # one point per round, at the first step that trains on it (and that step's generated tokens)
    assert series["replay"] == [{"step": 1, "generated_tokens": 100, "replay_frac": 0.0},
                                {"step": 3, "generated_tokens": 200, "replay_frac": 0.5},
                                {"step": 5, "generated_tokens": 300, "replay_frac": 0.5}]
    for metric in ("reward", "accuracy", "kl", "ess", "replay"):
        png = (tmp_path / "plots" / f"{metric}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 1024, metric


def test_a_skipped_step_is_not_a_point_and_missing_keys_are_none(tmp_path):
    trainer, cb = fake_trainer(), RunPlots(str(tmp_path), "sft")
    for step in (1, 1, 2):  # the second batch's optimizer step was skipped (non-finite): same global step
        trainer.global_step = step
        trainer.callback_metrics = {"train/loss": torch.tensor(1.0)}
        cb.on_train_batch_end(trainer, None, None, None, 0)
    assert cb.steps == [1, 2] and cb.tokens == [0, 0]
    assert cb.values == {"reward": [None, None], "kl": [None, None], "ess": [None, None], "loss": [1.0, 1.0],
                         "margin": [None, None]}


def test_stages_lacking_a_metric_are_left_out_of_its_plot(tmp_path, monkeypatch):
    """SFT (no reward/KL/ESS/replay, no generated tokens) then GRPO on fresh rollouts (no replay share)."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"sft": {}, "grpo": {}}, sort_keys=False))
    sft_trainer, sft = fake_trainer(), RunPlots(str(tmp_path), "sft")
    for step in (1, 2):
        sft_trainer.global_step = step
        sft.on_train_batch_end(sft_trainer, None, None, None, 0)
    sft_trainer.evaluation.curve += [{"step": 0, "generated_tokens": 0, "accuracy": 0.0},
                                     {"step": 2, "generated_tokens": 0, "accuracy": 0.5}]
    sft.on_train_end(sft_trainer, None)
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == ["accuracy.png"]

    regen = RegenerateExperience(replay=False)
    trainer, cb = fake_trainer(regen), RunPlots(str(tmp_path), "grpo")
    grpo_stage(trainer, regen, cb, steps=4)
    drawn = {}
    real = run_plots.lines
    monkeypatch.setattr(run_plots, "lines", lambda stage, metric: drawn.setdefault(
        (stage["stage"], metric), real(stage, metric)))
    cb.on_train_end(trainer, None)
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == [
        "accuracy.png", "ess.png", "kl.png", "loss.png", "reward.png"]  # no stage reports a replay share
    assert json.loads((tmp_path / "plots" / "grpo.json").read_text())["replay"] == []
    assert drawn[("sft", "reward")] == ([], [], [])  # nothing to draw: SFT is left out of reward.png
    assert drawn[("sft", "accuracy")] == ([0, 2], [0, 0], [0.0, 0.5])
    assert stage_order(tmp_path) == ["sft", "grpo"]  # config.yaml's order (not alphabetical)
    (tmp_path / "plots" / "extra.json").write_text("{}")
    assert stage_order(tmp_path) == ["sft", "grpo", "extra"]  # a stage config.yaml does not name: last


def test_the_token_panel_leaves_out_a_stage_that_generated_nothing(tmp_path):
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "sft.json").write_text(json.dumps({"stage": "sft", "steps": [1], "generated_tokens": [0],
                                                 "accuracy": [{"step": 0, "generated_tokens": 0, "accuracy": 0.2}]}))
    (folder / "grpo.json").write_text(json.dumps({"stage": "grpo", "steps": [1], "generated_tokens": [50],
                                                  "accuracy": [{"step": 0, "generated_tokens": 50, "accuracy": 0.3}]}))
    from matplotlib.figure import Figure
    labels = {}
    real_savefig = Figure.savefig

    def savefig(fig, path, *a, **k):
        steps_ax, tokens_ax = fig.axes
        labels[Path(path).name] = ([ln.get_label() for ln in steps_ax.lines],
                                   [ln.get_label() for ln in tokens_ax.lines])
        return real_savefig(fig, path, *a, **k)

    Figure.savefig = savefig
    try:
        written = draw(folder, ["sft", "grpo"])
    finally:
        Figure.savefig = real_savefig
    assert [p.name for p in written] == ["accuracy.png"]
    assert list(labels.values()) == [(["sft", "grpo"], ["grpo"])]


def test_state_round_trip_a_resumed_stage_plots_from_step_one(tmp_path):
    regen = RegenerateExperience(replay=True)
    trainer, cb = fake_trainer(regen), RunPlots(str(tmp_path), "grpo")
    grpo_stage(trainer, regen, cb, steps=6, stop=4)
    state = cb.state_dict()
    json.dumps(state)  # plain numbers: a checkpoint holds no tensors of this callback
    assert state["steps"] == [1, 2, 3, 4] and state["rounds_seen"] == 3

    resumed = RunPlots(str(tmp_path), "grpo")  # a new process: state from the checkpoint, then the rest
    resumed.load_state_dict(state)
    grpo_stage(trainer, regen, resumed, steps=6, first_step=5)
    resumed.on_train_end(trainer, None)
    series = json.loads((tmp_path / "plots" / "grpo.json").read_text())
    assert series["steps"] == [1, 2, 3, 4, 5, 6]
    assert series["reward"] == pytest.approx([s / 10 for s in range(1, 7)])
    assert [p["step"] for p in series["replay"]] == [1, 3, 5]


def test_tensors_are_kept_until_the_end_and_nan_is_none(tmp_path):
    cb = RunPlots(str(tmp_path), "grpo")
    cb.steps, cb.tokens = [1, 2], [10, 20]
    cb.values = {"reward": [torch.tensor(0.5), torch.tensor(float("nan"))], "kl": [None, torch.tensor(2.0)],
                 "ess": [1.0, float("inf")]}
    cb._to_floats()
    assert cb.values == {"reward": [0.5, None], "kl": [None, 2.0], "ess": [1.0, None]}


def test_only_rank_zero_records_and_writes(tmp_path):
    regen = RegenerateExperience(replay=True)
    trainer, cb = fake_trainer(regen, zero=False), RunPlots(str(tmp_path), "grpo")
    grpo_stage(trainer, regen, cb, steps=2)
    cb.on_train_end(trainer, None)
    assert cb.steps == [] and cb.replay == [] and not (tmp_path / "plots").exists()


def test_a_plotting_error_warns_and_never_raises(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_plots, "draw", lambda *a: (_ for _ in ()).throw(RuntimeError("no fonts")))
    trainer, cb = fake_trainer(), RunPlots(str(tmp_path), "sft")
    cb.on_train_end(trainer, None)
    out = capsys.readouterr().out
    assert "WARNING [plots]" in out and "no fonts" in out
    assert (tmp_path / "plots" / "sft.json").is_file()


def test_lines_leave_out_points_without_a_value():
    stage = {"steps": [1, 2, 3], "generated_tokens": [5, 5, 9], "kl": [0.1, None, 0.3]}
    assert lines(stage, "kl") == ([1, 3], [5, 9], [0.1, 0.3])
    assert lines(stage, "replay") == ([], [], [])


def test_a_real_grpo_stage_with_replay_writes_its_plots(hydra_conf, tmp_path):
    """One real stage through run_stage (the callback built from conf/callbacks/default.yaml)."""
    from run.stages import plan_stages, run_stage, set_run_fields
    from tests.helpers import TINY

    overrides = ["algorithm=grpo", "data=replay_mix", "trainer.max_steps=4", "data.prompts_per_round=4",
                 "data.batch_size=16", "generator.max_new_tokens=4", "callbacks.evaluate.every_n_steps=2",
                 "reward._target_=tests.helpers.LengthReward", *TINY]
    (stage,) = plan_stages(hydra_conf(overrides), overrides)
    set_run_fields(stage.cfg, tmp_path, stage.name, "test", "test")
    _, _, metrics = run_stage(stage)
    series = json.loads((tmp_path / "plots" / "grpo.json").read_text())
    assert series["steps"] == [1, 2, 3, 4]
    assert series["generated_tokens"][-1] == metrics["cost/generated_tokens"]
    assert series["ess"][-1] == pytest.approx(metrics["train/ess_frac"])
    assert series["kl"][-1] == pytest.approx(metrics["train/kl"])
    assert all(r is not None for r in series["reward"])
    assert [p["step"] for p in series["accuracy"]] == [0, 2, 4]
    assert len(series["replay"]) == metrics["rollout/rounds"]
    for metric in ("reward", "accuracy", "kl", "ess", "replay"):
        assert (tmp_path / "plots" / f"{metric}.png").read_bytes().startswith(PNG_MAGIC), metric


def test_a_device_tensor_is_kept_as_a_tensor_a_cpu_one_as_a_float():
    """No host sync per step: a tensor off the CPU (meta here: no GPU needed) is kept, not read."""
    kept = run_plots._keep(torch.tensor(0.25, device="meta"))
    assert isinstance(kept, torch.Tensor) and kept.device.type == "meta"
    assert run_plots._keep(torch.tensor(0.25)) == 0.25 and run_plots._keep(None) is None


def drawn_figures(folder, stages):
    """draw(folder, stages) → {png name: its figure, drawn}."""
    from matplotlib.figure import Figure
    figures, real_savefig = {}, Figure.savefig

    def savefig(fig, path, *a, **k):
        fig.canvas.draw()
        figures[Path(path).name.split(".")[1] + ".png"] = fig
        return real_savefig(fig, path, *a, **k)

    Figure.savefig = savefig
    try:
        draw(folder, stages)
    finally:
        Figure.savefig = real_savefig
    return figures


def write_stage(folder, name, **series):
    steps = list(range(1, len(next(iter(series.values()))) + 1))
    (folder / f"{name}.json").write_text(json.dumps({"stage": name, "steps": steps, "generated_tokens": [0] * len(steps),
                                                     **series}))


def test_float_noise_is_not_a_zigzag_and_an_all_zero_series_has_no_negative_axis(tmp_path):
    write_stage(tmp_path, "grpo", ess=[1.0, 1 - 1e-7, 1.0, 1 - 1e-7], reward=[0.0, 0.0, 0.0, 0.0],
                kl=[0.0, 0.01, 0.02, 0.03])
    figures = drawn_figures(tmp_path, ["grpo"])
    ess = figures["ess.png"].axes[0]
    assert ess.yaxis.get_major_formatter().get_offset() == ""  # no "1e-7+1" above the axis
    lo, hi = ess.get_ylim()
    assert lo <= 0.95 and hi >= 1.0  # a readable range around 1, not the 7th decimal
    assert all(float(t.get_text().replace("\u2212", "-") or 0) <= 1.1 for t in ess.get_yticklabels())
    assert figures["reward.png"].axes[0].get_ylim()[0] == 0.0  # all zero: no axis below 0
    assert figures["reward.png"].axes[0].get_ylim()[1] > 0.0
    assert figures["kl.png"].axes[0].get_ylim()[0] == 0.0  # never below 0: the axis starts at 0


def test_sft_gets_a_loss_plot_and_dpo_a_loss_and_margin_plot(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"sft": {}, "dpo": {}}, sort_keys=False))
    for name, metrics in (("sft", {"train/loss": 2.0}), ("dpo", {"train/loss": 0.69, "train/reward_margin": 0.1})):
        trainer, cb = fake_trainer(), RunPlots(str(tmp_path), name)
        for step in (1, 2, 3):
            trainer.global_step = step
            trainer.callback_metrics = {k: torch.tensor(v / step) for k, v in metrics.items()}
            cb.on_train_batch_end(trainer, None, None, None, step)
        cb.on_train_end(trainer, None)
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == ["loss.png", "margin.png"]
    series = json.loads((tmp_path / "plots" / "dpo.json").read_text())
    assert series["loss"] == pytest.approx([0.69, 0.345, 0.23]) and series["margin"] == pytest.approx([0.1, 0.05, 0.1 / 3])
    figures = drawn_figures(tmp_path / "plots", ["sft", "dpo"])
    assert [ln.get_label() for ln in figures["loss.png"].axes[0].lines] == ["sft", "dpo"]
    assert [ln.get_label() for ln in figures["margin.png"].axes[0].lines] == ["dpo"]
