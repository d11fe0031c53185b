"""`python train.py print_config=true`: every stage's resolved config, planned and validated as a run
would be, printed without training or writing anything; `--help` points to it."""
from __future__ import annotations

import yaml

from tests.test_bad_inputs import train


def test_print_config_prints_each_stage_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    proc = train("scheduler=linear", "print_config=true", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    assert not out.exists()  # Hydra's log file and the run dir it made are gone again
    assert "# ===== stage 1/2: sft" in proc.stdout and "# ===== stage 2/2: grpo" in proc.stdout
    stages = yaml.safe_load(proc.stdout)  # the shape of the run's config.yaml: {stage: resolved config}
    assert list(stages) == ["sft", "grpo"]
    sft, grpo = stages["sft"], stages["grpo"]
    assert (sft["algorithm"]["name"], grpo["algorithm"]["name"]) == ("sft", "grpo")
    assert [s["algorithm"]["scheduler"]["num_training_steps"] for s in (sft, grpo)] == [2000, 600]
    assert sft["algorithm"]["scheduler"]["_target_"] == "transformers.get_linear_schedule_with_warmup"
    assert sft["run"]["output_dir"] == str(out) and sft["print_config"] is False
    assert "[batch] 64 prompts per round × 8 samples" in proc.stdout


def test_print_config_keeps_a_folders_files_and_refuses_bad_values_in_one_line(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = train("algorithm=grpo", "trainer.max_steps=5", "print_config=true", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    assert list(yaml.safe_load(proc.stdout)) == ["grpo"]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    proc = train("trainer.max_steps=2.5", "print_config=true", f"hydra.run.dir={tmp_path / 'bad'}")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["error: stage sft: trainer.max_steps=2.5 must be a positive integer"], proc.stderr
    assert not (tmp_path / "bad").exists()


def test_help_points_to_print_config_and_lists_the_groups():
    proc = train("--help")
    assert proc.returncode == 0, proc.stderr
    assert "python train.py print_config=true" in proc.stdout
    assert "scheduler: constant, cosine, linear" in proc.stdout  # Hydra's generated group list
    assert "algorithm: dpo, dr_grpo, grpo" in proc.stdout and "docs/config/<group>.md" in proc.stdout
