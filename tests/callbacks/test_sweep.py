"""The end-of-multirun summary (callbacks/sweep.py): on a hand-built sweep dir, and on a real 2-job sweep."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from callbacks import sweep as sweep_mod
from callbacks.sweep import CONFIG_COLUMNS, JOB_COLUMNS, SweepSummary, mean_curve

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def curve(tokens: list[int], accs: list[float]) -> list[dict]:
    return [{"step": i, "generated_tokens": t, "accuracy": a} for i, (t, a) in enumerate(zip(tokens, accs))]


def make_job(sweep: Path, num: int, overrides: list[str], summary: dict | None, planned=None) -> None:
    d = sweep / str(num)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if planned is not None:  # train.py's config.yaml: {stage name: resolved config}
        (d / "config.yaml").write_text(yaml.safe_dump({name: {"seed": 1} for name in planned}))


def grpo(before, after, tokens, wall, points, **extra) -> dict:
    return {"val/accuracy_before": before, "val/accuracy_after": after, "cost/generated_tokens": tokens,
            "wall_seconds": wall, "val/curve": points, **extra}


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with path.open() as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def run_callback(sweep: Path) -> None:
    SweepSummary().on_multirun_end(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}),
                                   config_name="train")


@pytest.fixture
def fake_sweep(tmp_path) -> Path:
    """2 configs × 2 seeds (job 0 has two stages; seeds have curves of different lengths) + 1 failed job."""
    sweep = tmp_path / "sweep"
    sft = {"val/accuracy_before": 0.0, "val/accuracy_after": 0.1, "wall_seconds": 1.5}
    make_job(sweep, 0, ["data.replay_ratio=0", "seed=1"],
             {"sft": sft, "grpo": grpo(0.1, 0.3, 1000, 2.0, curve([0, 500, 1000], [0.1, 0.2, 0.3]),
                                      **{"cost/usd": 0.002, "cost/reward_gain_per_mtok": 40.0})},
             planned=["sft", "grpo"])
    make_job(sweep, 1, ["data.replay_ratio=0", "seed=2"],
             {"grpo": grpo(0.0, 0.5, 1200, 3.0, curve([0, 600, 1200, 1800], [0.0, 0.4, 0.5, 0.5]))})
    make_job(sweep, 2, ["data.replay_ratio=0.5", "seed=1"],
             {"grpo": grpo(0.0, 0.2, 400, 1.0, curve([0, 200, 400], [0.0, 0.1, 0.2]))})
    make_job(sweep, 3, ["data.replay_ratio=0.5", "seed=2"],
             {"grpo": grpo(0.0, 0.4, 600, 1.0, curve([0, 300, 600], [0.0, 0.3, 0.4]))})
    make_job(sweep, 4, ["data.replay_ratio=0.9", "seed=1"], None)  # crashed: no summary.json
    return sweep


def test_multirun_end_writes_per_job_and_per_config_tables_and_plot(fake_sweep):
    run_callback(fake_sweep)

    columns, jobs = read_csv(fake_sweep / "sweep_summary.csv")
    assert columns == JOB_COLUMNS
    assert [(r["job"], r["status"], r["config"], r["seed"]) for r in jobs] == [
        ("0", "ok", "data.replay_ratio=0", "1"), ("1", "ok", "data.replay_ratio=0", "2"),
        ("2", "ok", "data.replay_ratio=0.5", "1"), ("3", "ok", "data.replay_ratio=0.5", "2"),
        ("4", "failed", "data.replay_ratio=0.9", "1")]
    j0, j1, failed = jobs[0], jobs[1], jobs[4]
    assert j0["overrides"] == "data.replay_ratio=0 seed=1"
    # the LAST stage's metrics; wall seconds summed over stages
    assert float(j0["accuracy_after"]) == 0.3 and float(j0["accuracy_before"]) == 0.1
    assert float(j0["generated_tokens"]) == 1000 and float(j0["wall_seconds"]) == 3.5
    assert float(j0["cost_usd"]) == 0.002 and float(j0["reward_gain_per_mtok"]) == 40.0
    assert j1["cost_usd"] == "" and j1["reward_gain_per_mtok"] == ""  # absent metrics stay empty
    assert failed["accuracy_after"] == "" and failed["wall_seconds"] == ""

    columns, configs = read_csv(fake_sweep / "sweep_summary_by_config.csv")
    assert columns == CONFIG_COLUMNS
    by = {r["config"]: r for r in configs}
    assert list(by) == ["data.replay_ratio=0", "data.replay_ratio=0.5", "data.replay_ratio=0.9"]
    r0, r5, r9 = by.values()
    assert (r0["n_seeds"], r0["n_failed"]) == ("2", "0")
    assert float(r0["acc_mean"]) == pytest.approx((0.3 + 0.5) / 2)
    assert float(r0["acc_std"]) == pytest.approx(math.sqrt(((0.3 - 0.4) ** 2 + (0.5 - 0.4) ** 2) / 1))
    assert (float(r0["acc_min"]), float(r0["acc_max"])) == (0.3, 0.5)
    assert float(r0["generated_tokens_mean"]) == 1100
    assert float(r5["acc_mean"]) == pytest.approx((0.2 + 0.4) / 2)
    assert (r9["n_seeds"], r9["n_failed"], r9["acc_mean"]) == ("0", "1", "")

    png = (fake_sweep / "sweep_accuracy_vs_tokens.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1024


def test_seeds_align_by_eval_index_truncated_to_the_shortest():
    a = curve([0, 500, 1000], [0.1, 0.2, 0.3])
    b = curve([0, 600, 1200, 1800], [0.0, 0.4, 0.5, 0.5])
    x, mean, lo, hi = mean_curve([a, b])
    assert x == [0, 550, 1100]
    assert mean == pytest.approx([0.05, 0.3, 0.4])
    assert lo == [0.0, 0.2, 0.3] and hi == [0.1, 0.4, 0.5]


def test_a_job_that_stopped_before_its_last_stage_is_failed(tmp_path):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, ["seed=1"], {"sft": {"val/accuracy_after": 0.1, "wall_seconds": 1.0}},
             planned=["sft", "grpo"])
    run_callback(sweep)
    _, (job,) = read_csv(sweep / "sweep_summary.csv")
    assert job["status"] == "failed" and job["accuracy_after"] == ""


def test_a_plotting_error_keeps_the_tables_and_never_raises(fake_sweep, monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("no display")
    monkeypatch.setattr(sweep_mod, "plot", broken)
    run_callback(fake_sweep)
    assert "WARNING" in capsys.readouterr().out
    assert len(read_csv(fake_sweep / "sweep_summary.csv")[1]) == 5
    SweepSummary().on_multirun_end(config=OmegaConf.create({"hydra": {"sweep": {"dir": "/nonexistent"}}}))


def job_config(sweep: Path):
    return OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})


def test_tables_and_plot_are_rewritten_after_each_job(fake_sweep):
    """Hydra's basic sweeper raises before on_multirun_end when any job failed: everything still exists."""
    SweepSummary().on_job_end(config=job_config(fake_sweep), job_return=None)
    assert len(read_csv(fake_sweep / "sweep_summary.csv")[1]) == 5
    assert (fake_sweep / "sweep_summary_by_config.csv").is_file()
    png = (fake_sweep / "sweep_accuracy_vs_tokens.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1024
    assert not list(fake_sweep.glob(".*tmp*"))  # written through a temporary file, renamed into place


def test_a_failing_job_leaves_the_tables_and_the_plot_without_multirun_end(fake_sweep, monkeypatch, capsys):
    """The hooks as Hydra's basic sweeper calls them when the last job raises: on_multirun_start, each
    job's on_job_end (the failed one's too, with a FAILED JobReturn), then the sweep raises: no
    on_multirun_end."""
    from hydra.core.utils import JobReturn, JobStatus

    exits = []
    monkeypatch.setattr(sweep_mod.atexit, "register", exits.append)
    monkeypatch.setattr(sweep_mod.atexit, "unregister", exits.remove)
    cb, config = SweepSummary(), job_config(fake_sweep)
    cb.on_multirun_start(config=config)
    failed = JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("every sample dropped"))
    for num in range(5):  # job 4 is the crashed one (no summary.json)
        cb.on_job_end(config=config, job_return=failed if num == 4 else JobReturn(status=JobStatus.COMPLETED))
        assert (fake_sweep / "sweep_accuracy_vs_tokens.png").is_file()
    _, jobs = read_csv(fake_sweep / "sweep_summary.csv")
    assert [(r["job"], r["status"]) for r in jobs][-1] == ("4", "failed")
    assert "no plot" not in capsys.readouterr().out  # after a job: quiet
    assert exits == [cb._at_exit]  # the exit handler is still owed: the process exits with the error


def test_a_job_that_exits_the_process_is_summarised_at_exit(tmp_path, monkeypatch, capsys):
    """train.py turns the project's errors into SystemExit, which Hydra's run_job does not catch: the
    failing job gets no on_job_end and the sweep no on_multirun_end. The exit handler writes the summary."""
    exits = []
    monkeypatch.setattr(sweep_mod.atexit, "register", exits.append)
    monkeypatch.setattr(sweep_mod.atexit, "unregister", exits.remove)
    sweep = tmp_path / "sweep"
    cb, config = SweepSummary(), job_config(sweep)
    cb.on_multirun_start(config=config)
    make_job(sweep, 0, ["seed=1"], {"grpo": grpo(0.0, 0.5, 100, 1.0, curve([0, 100], [0.0, 0.5]))})
    cb.on_job_end(config=config, job_return=None)
    (sweep / "1").mkdir()  # job 1 stopped on a config error before train.py wrote anything into its dir
    (handler,) = exits
    handler()  # what the interpreter runs on its way out
    _, jobs = read_csv(sweep / "sweep_summary.csv")
    assert [(r["job"], r["status"]) for r in jobs] == [("0", "ok"), ("1", "failed")]
    assert (sweep / "sweep_accuracy_vs_tokens.png").read_bytes().startswith(PNG_MAGIC)
    assert "stopped early: 2 jobs" in capsys.readouterr().out
    handler()  # once only
    assert "stopped early" not in capsys.readouterr().out


def test_a_finished_sweep_owes_nothing_at_exit(fake_sweep, monkeypatch):
    exits = []
    monkeypatch.setattr(sweep_mod.atexit, "register", exits.append)
    monkeypatch.setattr(sweep_mod.atexit, "unregister", exits.remove)
    cb, config = SweepSummary(), job_config(fake_sweep)
    cb.on_multirun_start(config=config)
    cb.on_multirun_end(config=config)
    assert exits == []


def test_a_single_run_writes_no_sweep_tables(tmp_path):
    config = OmegaConf.create({"hydra": {"mode": "RUN", "sweep": {"dir": str(tmp_path / "sweep")}}})
    SweepSummary().on_job_end(config=config, job_return=None)
    assert not (tmp_path / "sweep").exists()


def test_real_two_job_multirun_writes_the_summary(tmp_path):
    """train.py -m seed=1,2 in a subprocess: the callback registered in conf/train.yaml runs at the end."""
    from tests.helpers import TINY
    from tests.test_train_e2e import train

    sweep = tmp_path / "sweep"
    proc = train("-m", "experiment=single", "algorithm=grpo", "seed=1,2", "trainer.max_steps=2",
                 "data.prompts_per_round=4", "data.batch_size=32", "algorithm.group_size=8",
                 "generator.max_new_tokens=8", "callbacks.evaluate.every_n_steps=1", *TINY,
                 f"hydra.sweep.dir={sweep}", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, jobs = read_csv(sweep / "sweep_summary.csv")
    assert [(r["job"], r["status"], r["seed"]) for r in jobs] == [("0", "ok", "1"), ("1", "ok", "2")]
    assert jobs[0]["config"] == jobs[1]["config"] and "seed=" not in jobs[0]["config"]
    for r in jobs:
        assert 0.0 <= float(r["accuracy_after"]) <= 1.0 and float(r["generated_tokens"]) > 0
    _, (config,) = read_csv(sweep / "sweep_summary_by_config.csv")
    assert config["n_seeds"] == "2"
    png = (sweep / "sweep_accuracy_vs_tokens.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1024


def test_real_multirun_with_a_failing_job_still_writes_the_summary(tmp_path):
    """train.py -m trainer.max_steps=2,-1: job 1 stops on a config error (SystemExit) and ends the sweep;
    the summary lists job 0 and job 1 (failed, with its overrides, though it failed before its first
    step and so left no folder: run/run_folder.py), and the plot exists."""
    from tests.helpers import TINY
    from tests.test_train_e2e import train

    sweep = tmp_path / "sweep"
    proc = train("-m", "experiment=single", "algorithm=grpo", "seed=1", "trainer.max_steps=2,-1",
                 "data.prompts_per_round=4", "data.batch_size=32", "generator.max_new_tokens=6",
                 "callbacks.evaluate.every_n_steps=1", *TINY, f"hydra.sweep.dir={sweep}", timeout=120)
    assert proc.returncode == 1 and "trainer.max_steps=-1" in proc.stderr, proc.stderr[-3000:]
    _, jobs = read_csv(sweep / "sweep_summary.csv")
    assert [(r["job"], r["status"]) for r in jobs] == [("0", "ok"), ("1", "failed")]
    assert "trainer.max_steps=-1" in jobs[1]["overrides"] and not (sweep / "1").exists()
    png = (sweep / "sweep_accuracy_vs_tokens.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1024
