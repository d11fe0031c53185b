"""The measurement v2 figure (issue 33; scripts/figures/economics_v2.py): its commands, and its numbers from
fake job dirs whose curves are known saturating curves, worked by hand."""
from __future__ import annotations

import json
import math

import pytest

from scripts.figures import economics_v2 as v2
from scripts.figures.registry import FIGURES
from tests.test_readme_figures import fake_job

A0, GRID = 0.86, [20_000 * k for k in range(31)]  # 0 … 600k generated tokens, 31 evaluations


def curve(asymptote: float, tau: float, tokens_a_second: float) -> list[dict]:
    return [{"step": i, "generated_tokens": t, "seconds": t / tokens_a_second,
             "accuracy": A0 + (asymptote - A0) * (1 - math.exp(-t / tau))} for i, t in enumerate(GRID)]


def run(path, seed, asymptote, tau, trained_per_generated=2.0, tokens_a_second=1000.0, z=None):
    stage = {"val/curve": curve(asymptote, tau, tokens_a_second), "val/accuracy_after": asymptote,
             "cost/generated_tokens": GRID[-1], "cost/trained_tokens": GRID[-1] * trained_per_generated}
    fake_job(path / f"seed{seed}", [f"seed={seed}"], {"grpo": stage})
    if z is not None:
        (path / f"seed{seed}" / "csv" / "grpo").mkdir(parents=True)
        (path / f"seed{seed}" / "csv" / "grpo" / "metrics.csv").write_text(
            "step,rollout/z,train/loss\n" + "".join(f"{i},{v},\n" for i, v in enumerate(z)) + "9,,0.5\n")


@pytest.fixture
def measured(tmp_path):
    """3 seeds: on-policy A = 0.98, τ = 110k/120k/130k; A/A its exact copy; DAPO twice as fast (τ/2) training
    on 0.5 tokens a generated token (on-policy: 2) at 500 tokens a second (on-policy: 1,000); `low` on-policy's
    τ but A = 0.95 (0.09 of gain, below 90 % of on-policy's 0.12)."""
    for s in (1, 2, 3):
        fake_job(tmp_path / "sft" / f"seed{s}", [f"seed={s}"], {"sft": {"val/accuracy_after": A0}})
        tau = 100_000 * (1 + 0.1 * s)
        run(tmp_path / "on_policy", s, 0.98, tau, z=[0.5, 0.7])
        run(tmp_path / "A_A", s + v2.AA_OFFSET, 0.98, tau)
        (tmp_path / "A_A" / f"seed{s + v2.AA_OFFSET}").rename(tmp_path / "A_A" / f"seed{s}")  # dirs name the SFT seed
        run(tmp_path / "DAPO", s, 0.98, tau / 2, trained_per_generated=0.5, tokens_a_second=500.0, z=[0.2, 0.4])
        run(tmp_path / "low", s, 0.95, tau)
    return tmp_path


def test_numbers_hand_worked(measured, monkeypatch):
    monkeypatch.setitem(v2.CONFIGS, "low", ["data=fresh_rollouts"])
    sft, found = v2.read(measured, [v2.BASELINE, v2.AA, v2.DAPO, "low"])
    assert sft == {1: A0, 2: A0, 3: A0}
    result = v2.numbers(sft, found)
    assert result["baseline"] == "on-policy"
    assert result["aa"] == pytest.approx({"median": 1.0, "lo": 1.0, "hi": 1.0}, rel=1e-3)  # A/A: exactly 1
    c = result["configs"]
    dapo = c["DAPO"]
    assert dapo["tokens_ratio_90"]["median"] == pytest.approx(0.5, rel=1e-3)
    assert dapo["tokens_ratio_90"]["lo"] == pytest.approx(0.5, rel=1e-3) and dapo["tokens_ratio_90"]["hi"] == pytest.approx(0.5, rel=1e-3)
    assert dapo["tokens_ratio_50"]["median"] == pytest.approx(0.5, rel=1e-3)
    assert dapo["tokens_ratio_90_trained"]["median"] == pytest.approx(0.5 * 0.5 / 2, rel=1e-3)   # 0.125
    assert dapo["tokens_ratio_90_seconds"]["median"] == pytest.approx(0.5 * 2, rel=1e-3)         # 1.0
    for share, want in ((0.3, 0.2375), (0.7, 0.3875), (0.85, 0.44375)):  # share × 0.5 + (1 − share) × 0.125
        assert dapo[f"tokens_ratio_90_priced_{share}"]["median"] == pytest.approx(want, rel=1e-3)
    assert dapo["asymptote"] == pytest.approx(0.98, abs=1e-4) and dapo["asymptote_baseline"] == pytest.approx(0.98, abs=1e-4)
    assert dapo["tokens_ratio_90_vs_dapo"]["median"] == pytest.approx(1.0, rel=1e-3)
    assert c["on-policy"]["tokens_ratio_90_vs_dapo"]["median"] == pytest.approx(2.0, rel=1e-3)
    assert dapo["z_mean"] == pytest.approx(0.3) and c["on-policy"]["z_mean"] == pytest.approx(0.6)
    assert dapo["eval_points_min"] == 31
    low = c["low"]  # its asymptote 0.95 never reaches 0.86 + 0.9 × 0.12; 50 %: −τ ln(1 − 0.06/0.09) = τ ln 3
    assert low["tokens_ratio_90"]["median"] == "inf" and low["asymptote"] == pytest.approx(0.95, abs=1e-4)
    assert low["tokens_ratio_50"]["median"] == pytest.approx(math.log(3) / math.log(2), rel=1e-3)
    json.dumps(result, allow_nan=False)  # no NaN or ∞ as numbers: valid JSON


def test_render_writes_table_plot_and_json(measured):
    rendered = v2.render_for([v2.BASELINE, v2.AA, v2.DAPO])(measured, True)
    lines = rendered.table.splitlines()
    assert lines[0].startswith("| config | tokens to 90 % of on-policy's gain")
    dapo = next(line for line in lines if line.startswith("| DAPO |"))
    assert "0.50 [0.50, 0.50] (A/A 1.00 [1.00, 1.00])" in dapo and "| 31 |" in dapo
    saved = json.loads((measured / "economics_v2.json").read_text())
    assert saved == json.loads((measured.parent / "results" / "economics_v2.json").read_text())
    assert set(saved["configs"]["DAPO"]) >= {"tokens_ratio_90", "tokens_ratio_90_vs_dapo", "asymptote",
                                             "asymptote_baseline", "z_mean"}
    assert (measured / "curves.png").stat().st_size > 0 and "economics_v2.json" in rendered.notes


def test_commands_share_one_sft_and_one_token_grid(tmp_path):
    """Per seed one SFT run; every config's GRPO from its policy, to the same token budget, evaluated on the
    same grid (≥ 30 points) over ≥ 1,000 held-out pairs; the A/A run differs only in its RL seed."""
    runs = v2.figure([4, 7], [v2.DAPO, v2.AA]).commands(tmp_path, False)
    assert len(runs) == 2 * (1 + 3)  # the baseline is always measured
    grpo = [r for r in runs if "algorithm=grpo" in r]
    assert v2.BUDGET // v2.EVERY >= 30
    for r in grpo:
        assert {f"budget.generated_tokens={v2.BUDGET}", f"callbacks.evaluate.every_n_tokens={v2.EVERY}",
                "task=arithmetic_flawed", "task.num_heldout=1000"} <= set(r)
    aa = [r for r in grpo if r[-1].endswith("A_A/seed7")][0]
    base = [r for r in grpo if r[-1].endswith("on_policy/seed7")][0]
    assert "seed=1007" in aa and "seed=7" in base
    assert [a for a in aa if a.startswith("model.name_or_path")] == [f"model.name_or_path={tmp_path}/sft/seed7/policy"]
    assert sorted(set(aa) ^ set(base)) == sorted([aa[-1], base[-1], "seed=1007", "seed=7"])
    with pytest.raises(SystemExit, match="no config named nope"):
        v2.figure([1], ["nope"])
    assert "economics_v2" in FIGURES and len(FIGURES["economics_v2"].commands(tmp_path, False)) == 5 * (1 + len(v2.CONFIGS))


def test_every_config_has_a_folder_name_hydra_takes():
    """`hydra.run.dir=<out>/<slug>/seedN`: Hydra's override grammar refuses non-ASCII (it refused "on_policy_β_0"
    and stopped the measurement at its second run); each slug ASCII, and no two configs share a folder."""
    import re
    slugs = [v2.slug(label) for label in v2.CONFIGS]
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", s) for s in slugs) and len(set(slugs)) == len(slugs)
    assert v2.slug("on-policy β=0") == "on_policy_beta_0"
