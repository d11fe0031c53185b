"""The results tables of README.md and the docs pages are figures of `python -m scripts.readme_figures`: in
README.md and in every docs page that holds a figure block, every table sits in a registered figure block
whose caption names a commit and a command, or is marked as a reference table; every registered figure has
one block, in one page; every figure's docs/results file has its header; one figure runs end to end."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.tables import readme_table
from scripts.figures.provenance import FIELDS, read_header, short_commit
from scripts.figures.readme import (README, RESULTS, block_body, blocks, loose_tables, page_of, pages,
                                    pages_with_blocks, results_link, splice)
from scripts import readme_figures
from scripts.figures import registry
from scripts.figures.registry import FIGURES, PENDING, Figure
from scripts.readme_figures import selected

ROOT = Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"`(?:[A-Z_]+=\S+ )*(?:python|bash|env) [^`]+`")  # a command, maybe after VAR=value


RULED = sorted({README, *pages_with_blocks()})  # README.md and each docs page that holds a figure block


@pytest.mark.parametrize("page", RULED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_table_is_a_figure_or_a_marked_reference_table(page):
    loose = loose_tables(page.read_text())
    assert not loose, (f"{page.relative_to(ROOT)} lines {loose}: a table outside any <!-- figure:NAME --> block and "
                       "without <!-- not-a-figure: why --> right above it (scripts/readme_figures.py's docstring)")


def test_every_figure_block_is_registered_and_its_caption_names_a_commit_and_a_command():
    found = pages_with_blocks()
    assert README in found and "quickstart" in found[README], "README.md lost the default run's figure block"
    for page, named in found.items():
        for name, body in named.items():
            assert name in FIGURES, f"{page.name} block {name!r} names no registered figure ({', '.join(FIGURES)})"
            first = body.splitlines()[0]
            assert re.search(r"\b[0-9a-f]{7,40}\b", first), f"{name}: the caption names no commit: {first}"
            assert COMMAND.search(first), f"{name}: the caption names no command: {first}"


def test_every_figure_has_one_block_in_one_page():
    """A registered figure is shown once: in README.md or one docs page, never in two, never nowhere."""
    where = {}
    for page, named in pages_with_blocks().items():
        for name in named:
            where.setdefault(name, []).append(page.relative_to(ROOT).as_posix())
    assert {n: w for n, w in where.items() if len(w) > 1} == {}
    assert [n for n in FIGURES if n not in where] == [], "figures with no block in README.md or docs/*.md"


@pytest.mark.parametrize("name", list(FIGURES))
def test_each_figure_has_its_results_file_with_every_header_field(name):
    path = RESULTS / f"{name}.md"
    assert path.is_file(), f"{path} is missing: python -m scripts.readme_figures --only {name}"
    fields = read_header(path.read_text())
    assert [k for k in FIELDS if not fields.get(k)] == [], f"{path}: header fields missing"
    assert short_commit(fields), f"{path}: the commit field names no commit"
    assert COMMAND.search(fields["command"]), f"{path}: the command field names no command"
    assert "|---" in path.read_text(), f"{path}: no table"


def test_blocks_show_their_results_files():
    """What each page shows is exactly what docs/results holds, its caption linking the results file from
    that page (`python -m scripts.readme_figures --readme`)."""
    for page, named in pages_with_blocks().items():
        for name, body in named.items():
            assert body == block_body(name, (RESULTS / f"{name}.md").read_text(), page), (
                f"{page.name} block {name} differs from docs/results/{name}.md: python -m scripts.readme_figures --readme")
            assert (page.parent / results_link(name, page)).is_file()


def test_a_block_is_found_and_spliced_in_the_docs_page_that_holds_it(tmp_path):
    """A block moved to docs/: page_of finds it there, and splice_file rewrites it there with the caption's link
    relative to docs/ (results/NAME.md), README.md untouched."""
    from scripts.figures.readme import splice_file
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# r\n")
    page = tmp_path / "docs" / "bench.md"
    page.write_text("# b\n<!-- figure:speed_tiny -->\nold\n<!-- /figure:speed_tiny -->\n")
    assert page_of("speed_tiny", tmp_path) == page and pages(tmp_path)[0] == tmp_path / "README.md"
    results = RESULTS / "speed_tiny.md"
    assert splice_file("speed_tiny", page_of("speed_tiny", tmp_path), RESULTS) == page
    body = blocks(page.read_text())["speed_tiny"]
    assert "([docs/results/speed_tiny.md](results/speed_tiny.md))" in body.splitlines()[0]
    assert body == block_body("speed_tiny", results.read_text(), page) and (tmp_path / "README.md").read_text() == "# r\n"


def test_loose_tables_rule():
    text = "\n".join([
        "# t", "", "| a |", "|---|", "", "<!-- not-a-figure: reference -->", "| b |", "|---|", "",
        "<!-- figure:x -->", "cap", "", "| c |", "|---|", "<!-- /figure:x -->", "", "```", "| d |", "```", "",
        "| e |", "|---|", ""])
    assert loose_tables(text) == [3, 21]


def test_splice_replaces_one_block_and_refuses_a_missing_one():
    text = "a\n<!-- figure:x -->\nold\n<!-- /figure:x -->\nb\n"
    assert splice(text, "x", "new\n") == "a\n<!-- figure:x -->\nnew\n<!-- /figure:x -->\nb\n"
    with pytest.raises(SystemExit, match="figure:y"):
        splice(text, "y", "new\n")


def test_only_refuses_an_unknown_figure():
    with pytest.raises(SystemExit, match="no figure named nope"):
        selected("quickstart,nope")


def test_speed_table_from_a_bench_summary():
    run = {"s_per_step": 0.08, "throughput": 100.0, "peak_rss_mb": 587.0}
    summary = {"tiny_grpo_b0.04": {"policyshift": run, "trl": run | {"s_per_step": 0.12, "peak_rss_mb": 514.0}},
               "gen_tiny": {"seam": run | {"throughput": 62039.0}, "generate": run | {"throughput": 32763.0},
                            "vllm_note": "no kernel"}}
    lines = readme_table(summary).splitlines()
    assert lines[2] == "| tiny_grpo_b0.04 | 0.0800 | 0.1200 | **1.50×** | – | – | 587 / 514 / – MB |"
    assert "| 62,039 | 32,763 | 1.89× |" in lines[3] and "no kernel" in lines[3]


def fake_job(path: Path, overrides: list[str], stages: dict) -> None:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (path / "summary.json").write_text(json.dumps(stages))


def test_onpolicy_vs_replay_table_from_job_dirs(tmp_path):
    """Two configs × 2 seeds: means, ranges, gains per seed and on-policy's accuracy at the nearest tokens."""
    curve = [{"step": 0, "generated_tokens": 0, "accuracy": 0.5}, {"step": 2, "generated_tokens": 1000, "accuracy": 0.6},
             {"step": 4, "generated_tokens": 2000, "accuracy": 0.7}]
    for i, (ratio, seed, after, tokens) in enumerate([("0", 1, 0.7, 2000), ("0", 2, 0.8, 2000),
                                                       ("0.9", 1, 0.55, 900), ("0.9", 2, 0.65, 1100)]):
        grpo = {"val/accuracy_before": 0.5, "val/accuracy_after": after, "cost/generated_tokens": tokens,
                "rollout/replay_frac_mean": float(ratio), "wall_seconds": 10.0 + i, "val/curve": curve}
        fake_job(tmp_path / "ovr" / str(i), [f"data.replay_ratio={ratio}", f"seed={seed}"],
                 {"sft": {"val/accuracy_after": 0.5}, "grpo": grpo})
    rendered = FIGURES["onpolicy_vs_replay"].render(tmp_path, True)  # smoke: the plot stays in tmp_path
    rows = rendered.table.splitlines()[2:]
    assert rows[0] == "| replay 0 (on-policy) | 0.000 | 2k | **0.750** (0.700–0.800) | +20.0, +30.0 | – | 10–11 |"
    assert rows[1] == "| replay 0.9 | 0.900 | 1k | **0.600** (0.550–0.650) | +5.0, +15.0 | 0.600 (step 2, 1k) | 12–13 |"
    assert "0.500, 0.500" in rendered.notes and (tmp_path / "onpolicy_vs_replay.png").is_file()


def test_quickstart_figure_smoke_end_to_end(tmp_path):
    """`--only quickstart --smoke`: the real train.py multirun (2 seeds, 4 steps a stage), its job dirs read
    back, the results file and a README copy written under --out; docs/results and README.md untouched."""
    before = README.read_text(), (RESULTS / "quickstart.md").read_text()
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "scripts.readme_figures", "--only", "quickstart", "--smoke",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = (tmp_path / "results" / "quickstart.md").read_text()
    fields = read_header(text)
    assert fields["command"].startswith("`python -m scripts.readme_figures --only quickstart --smoke")
    assert "seed=1,2" in fields["ran"] and "SMOKE" in fields["status"] and short_commit(fields)
    assert re.search(r"load average \d+\.\d\d at the start, \d+\.\d\d at the end", fields["load"])
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 2", "| mean"]
    assert "after sft (4 steps)" in text and "after grpo (4 steps)" in text
    assert blocks((tmp_path / "README.md").read_text())["quickstart"] == block_body("quickstart", text)
    assert (README.read_text(), (RESULTS / "quickstart.md").read_text()) == before


def test_preferences_table_from_job_dirs(tmp_path):
    """mean ± sample std then each seed; the reward model's task column is '–'; its own 'before' shown."""
    fake_job(tmp_path / "sft", ["algorithm=sft"], {"sft": {"val/accuracy_after": 0.7}})
    runs = [("dpo", 1, 0.70, 0.78, 0.5), ("dpo", 2, 0.72, 0.76, 0.5), ("reward_model", 1, None, 0.53, 0.51)]
    for i, (algorithm, seed, task, pref, before) in enumerate(runs):
        stage = {"val/accuracy_after": task, "val/pref_accuracy_after": pref, "val/pref_accuracy_before": before}
        fake_job(tmp_path / "prefs" / str(i), [f"algorithm={algorithm}", f"seed={seed}"], {algorithm: stage})
    lines = FIGURES["preferences"].render(tmp_path, True).table.splitlines()
    assert lines[0] == "| algorithm | held-out task accuracy (0.700 before) | held-out preference accuracy (0.500 before) |"
    assert lines[2] == "| dpo | 0.710 ± 0.014 (0.700, 0.720) | 0.770 ± 0.014 (0.780, 0.760) |"
    assert lines[3] == "| reward_model | – | 0.530 ± 0.000 (0.530); 0.510 before |"


def test_economics_table_from_job_dirs(tmp_path):
    """Tokens to reach on-policy's final accuracy and accuracy at a third of its tokens, per seed, by hand:
    on-policy ends at 0.8 after 300 tokens; adaptive reaches 0.8 at 50 tokens (50 / 300 = 0.17) and, within
    100 tokens (⅓ of 300), its last evaluation reads 0.85; its bookkeeping 0.5 s of 20 s is 2.50%."""
    def point(t, a):
        return {"step": t, "generated_tokens": t, "seconds": t / 10, "accuracy": a}
    onpolicy = {"val/accuracy_after": 0.8, "cost/generated_tokens": 300, "wall_seconds": 30.0, "train/steps": 3,
                "val/curve": [point(0, 0.5), point(100, 0.6), point(200, 0.7), point(300, 0.8)]}
    adaptive = {"val/accuracy_after": 0.85, "cost/generated_tokens": 150, "wall_seconds": 20.0, "train/steps": 3,
                "mix/decision_seconds": 0.5, "val/curve": [point(0, 0.5), point(50, 0.8), point(100, 0.85), point(150, 0.85)]}
    fake_job(tmp_path / "sft" / "seed1", ["seed=1"], {"sft": {"val/accuracy_after": 0.5}})
    fake_job(tmp_path / "on_policy" / "seed1", ["seed=1"], {"grpo": onpolicy})
    fake_job(tmp_path / "adaptive" / "seed1", ["seed=1"], {"grpo": adaptive})
    rendered = FIGURES["economics"].render(tmp_path, True)
    rows = rendered.table.splitlines()[2:]
    assert rows == ["| on-policy | 300 | 0.800 (0.800) | 1.00 | 0.600 | 30–30 | – |",
                    "| adaptive | 150 | 0.850 (0.850) | 0.17 | 0.850 | 20–20 | 2.50% |"]
    assert (tmp_path / "curves.png").stat().st_size > 0 and str(tmp_path / "curves.png") in rendered.notes


def test_a_pending_figure_runs_only_when_named(monkeypatch):
    """A figure built but not yet measured (registered with pending=True): `--only NAME` selects it, a run of
    every figure does not, and it needs no results file until it is measured (then it moves to FIGURES)."""
    figure = Figure("probe_pending", "a pending probe", "0 min", lambda out, smoke: [], lambda out, smoke: None)
    monkeypatch.setattr(registry, "PENDING", dict(PENDING))
    registry.register(figure, pending=True)
    monkeypatch.setattr(readme_figures, "PENDING", registry.PENDING)
    assert "probe_pending" in registry.PENDING and "probe_pending" not in FIGURES
    assert [f.name for f in selected("probe_pending")] == ["probe_pending"]
    assert "probe_pending" not in [f.name for f in selected(None)]


def test_economics_at_equal_tokens_gives_every_config_the_same_token_budget(tmp_path):
    """economics_tokens: each seed's SFT, then every config's GRPO from that SFT's policy, each stopped by the
    same `budget.generated_tokens` (at most MAX_STEPS steps), so a config that generates less a step trains
    longer; the 100-step figures keep their fixed step count and no budget."""
    from scripts.figures import economics
    figure = registry.PENDING.get("economics_tokens") or FIGURES["economics_tokens"]
    runs = figure.commands(tmp_path, False)
    assert len(runs) == 3 * (1 + len(economics.TOKENS))
    grpo = [r for r in runs if "algorithm=grpo" in r]
    assert len(grpo) == 3 * len(economics.TOKENS)
    for r in grpo:
        assert "budget.generated_tokens=180000" in r and "trainer.max_steps=400" in r
        seed = next(a for a in r if a.startswith("seed="))[5:]
        assert f"model.name_or_path={tmp_path}/sft/seed{seed}/policy" in r
    assert sum("data.policy.select_prompts=false" in r for r in grpo) == 3
    fixed = FIGURES["economics"].commands(tmp_path, False)
    assert not any(a.startswith("budget.") for r in fixed for a in r)
    assert sum("trainer.max_steps=100" in r for r in fixed) == 3 * len(economics.EVERY_CONFIG)


def test_a_rerun_into_the_same_out_keeps_finished_runs_and_clears_stopped_ones(tmp_path):
    """A figure rerun with the same --out resumes: a run dir with its summary.json is kept (not rerun), one a
    stopped run left without it is removed before the command runs again."""
    from scripts import readme_figures as rf
    done, stopped = tmp_path / "done", tmp_path / "stopped"
    done.mkdir()
    (done / "summary.json").write_text("{}")
    stopped.mkdir()
    (stopped / "half.csv").write_text("step\n1\n")
    assert rf.finished_dir(["python", "train.py", f"hydra.run.dir={done}"]) == done
    assert rf.finished_dir(["python", "train.py", f"hydra.run.dir={stopped}"]) is None
    assert not stopped.exists()
    assert rf.finished_dir(["python", "train.py", "-m", f"hydra.sweep.dir={done}"]) is None
    log = tmp_path / "fig.log"
    rf.run_commands([["python", "-c", "raise SystemExit(3)", f"hydra.run.dir={done}"]], log)  # kept: never run
    assert "kept (finished earlier)" in log.read_text()
