"""The overlap figure (issue 32; scripts/figures/async_rounds.py): its commands, and its numbers from fake job
dirs whose curves are known saturating curves, worked by hand."""
from __future__ import annotations

import json
import math

import pytest

from scripts.figures import async_rounds as fig
from scripts.figures.registry import FIGURES
from tests.test_readme_figures import fake_job

A0, GRID = 0.80, [10_000 * k for k in range(21)]  # 0 … 200k generated tokens, 21 evaluations


def run(path, seed, asymptote, tau, tokens_a_second, idle=(0.0, 0.0), hist=None, wall=None):
    curve = [{"step": i, "generated_tokens": t, "seconds": t / tokens_a_second,
              "accuracy": A0 + (asymptote - A0) * (1 - math.exp(-t / tau))} for i, t in enumerate(GRID)]
    stage = {"val/curve": curve, "val/accuracy_after": curve[-1]["accuracy"], "cost/generated_tokens": GRID[-1],
             "cost/trained_tokens": 3 * GRID[-1], "cost/trainer_idle_seconds": idle[0],
             "cost/engine_idle_seconds": idle[1], "wall_seconds": wall or GRID[-1] / tokens_a_second + 10}
    fake_job(path / f"seed{seed}", [f"seed={seed}"], {"grpo": stage})
    if hist is not None:  # two steps' histograms
        (path / f"seed{seed}" / "csv" / "grpo").mkdir(parents=True)
        (path / f"seed{seed}" / "csv" / "grpo" / "metrics.csv").write_text(
            "step,train/staleness_hist/0,train/staleness_hist/1,train/loss\n"
            + "".join(f"{i},{h0},{h1},\n" for i, (h0, h1) in enumerate(hist)) + "9,,,0.5\n")


@pytest.fixture
def measured(tmp_path):
    """2 seeds: sync A = 0.95 at 1,000 tokens/s (200 s a run); k=1 the same curve in tokens at 2,000 tokens/s
    (half the seconds at every token), staleness 1 but for its first step; k=2 at A = 0.85, below sync's final
    accuracy (never reaches it)."""
    for s in (1, 2):
        fake_job(tmp_path / "sft" / f"seed{s}", [f"seed={s}"], {"sft": {"val/accuracy_after": A0}})
        tau = 40_000 * s
        run(tmp_path / "sync", s, 0.95, tau, 1000.0, hist=[(1, 0), (1, 0)])
        run(tmp_path / "async_k_1", s, 0.95, tau, 2000.0, idle=(10.0, 25.0), hist=[(1, 0), (0, 1)])
        run(tmp_path / "async_k_2", s, 0.85, tau, 2000.0)
    return tmp_path


def test_numbers_hand_worked(measured):
    sft, found = fig.read(measured)
    assert sft == {1: A0, 2: A0} and set(found) == {"sync", "async k=1", "async k=2"}
    result = fig.numbers(sft, found)
    c = result["configs"]
    k1 = c["async k=1"]["wall_ratio_to_sync_final"]
    assert k1["median"] == pytest.approx(0.5, rel=1e-3)  # the same tokens, at twice the tokens per second
    assert k1["per_seed"] == pytest.approx({"1": 0.5, "2": 0.5}, rel=1e-3)
    assert c["async k=2"]["wall_ratio_to_sync_final"]["median"] == "inf"
    final = A0 + 0.15 * (1 - math.exp(-200_000 / 40_000))  # seed 1's last evaluation
    assert c["sync"]["final_accuracy"]["per_seed"]["1"] == pytest.approx(final)
    assert c["async k=1"]["final_accuracy_minus_sync"] == pytest.approx({"1": 0.0, "2": 0.0}, abs=1e-12)
    assert c["async k=1"]["trained_tokens_per_s"]["1"] == pytest.approx(3 * 200_000 / 100)  # 6,000
    assert c["sync"]["trained_tokens_per_s"]["1"] == pytest.approx(3 * 200_000 / 200)
    assert c["async k=1"]["trainer_idle_share"]["1"] == pytest.approx(10 / 100)
    assert c["async k=1"]["engine_idle_share"]["1"] == pytest.approx(25 / 100)
    assert c["async k=1"]["staleness_hist"] == {"0": 0.5, "1": 0.5, "2_3": 0.0, "4_7": 0.0, "8_up": 0.0}
    assert c["sync"]["staleness_hist"]["0"] == 1.0
    assert c["async k=1"]["stage_wall_ratio_to_sync"] == pytest.approx({"1": 110 / 210, "2": 110 / 210})
    assert "wall_ratio_to_sync_final" not in c["sync"] and c["sync"]["eval_points_min"] == 21
    json.dumps(result, allow_nan=False)  # ∞ as "inf", NaN as null: valid JSON


def test_seconds_to_maps_the_fitted_tokens_through_the_runs_own_seconds():
    """A run at 2,000 tokens/s whose fit reaches the target at t = τ ln 2 (half its gain): seconds = t / 2,000."""
    tau = 50_000.0
    run = fig.Run(GRID, [t / 2000 for t in GRID], [A0 + 0.1 * (1 - math.exp(-t / tau)) for t in GRID], 0, 0, 0, 0)
    run.fit = fig.fit_saturating(run.tokens, run.accuracy, A0)
    assert fig.seconds_to(run, A0 + 0.05) == pytest.approx(tau * math.log(2) / 2000, rel=1e-3)
    assert fig.seconds_to(run, A0 + 0.2) == math.inf and fig.seconds_to(run, A0 - 0.01) == 0.0
    flat = fig.Run(GRID, GRID, [A0] * len(GRID), 0, 0, 0, 0)  # a synchronous run that gained nothing: no target
    flat.fit = fig.fit_saturating(flat.tokens, flat.accuracy, A0)
    assert math.isnan(fig.sync_final(flat)) and math.isnan(fig.seconds_to(run, fig.sync_final(flat)))


def test_render_writes_table_plot_and_json(measured):
    rendered = fig.render(measured, True)
    lines = rendered.table.splitlines()
    assert lines[0].startswith("| config | wall s to sync's final accuracy")
    k1 = next(line for line in lines if line.startswith("| async k=1 |"))
    assert "0.50 [0.50, 0.50] (0.50, 0.50)" in k1 and "| 0.10 (0.10, 0.10) | 0.25 (0.25, 0.25) |" in k1
    saved = json.loads((measured / "async.json").read_text())
    assert saved == json.loads((measured.parent / "results" / "async.json").read_text())
    assert set(saved["configs"]["async k=1"]) >= {"wall_ratio_to_sync_final", "final_accuracy"}
    assert (measured / "curves.png").stat().st_size > 0 and "async.json" in rendered.notes


def test_commands_share_one_sft_per_seed_and_differ_only_in_staleness(tmp_path):
    """Per seed one SFT and four GRPO runs from it; sync and async k=1 differ in the staleness bound only,
    async k=1 and its ppo_clip twin in the correction only."""
    runs = fig.figure([4, 7]).commands(tmp_path, False)
    assert len(runs) == 2 * 5 and all(r[:3] == ["env", "OMP_NUM_THREADS=1", "python"] for r in runs)
    grpo = [r for r in runs if "algorithm=grpo" in r and r[-1].endswith("seed7")]
    assert len(grpo) == 4
    for r in grpo:
        assert {f"model.name_or_path={tmp_path}/sft/seed7/policy", "seed=7",
                "callbacks.regenerate.engine_threads=1", f"callbacks.evaluate.every_n_tokens={fig.EVERY}"} <= set(r)
    assert sum("correction=decoupled_ppo" in r for r in grpo) == 3
    differ = set(grpo[0]) ^ set(grpo[1])
    assert differ == {grpo[0][-1], grpo[1][-1], "callbacks.regenerate.max_staleness=0",
                      "callbacks.regenerate.max_staleness=1"}
    assert set(grpo[1]) ^ set(grpo[3]) == {grpo[1][-1], grpo[3][-1], "correction=decoupled_ppo", "correction=ppo_clip"}
    assert "async" in FIGURES and len(FIGURES["async"].commands(tmp_path, False)) == 3 * 5
