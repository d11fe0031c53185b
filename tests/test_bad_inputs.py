"""Bad input: one clear line, before any model loads (docs/bad_inputs.md).

Every case of tests/bad_inputs/ is run in-process through what train.py runs (the command-line
check, then plan_stages, then for load-time cases the model node) and must show exactly its message,
formatted as the console shows it; plan-time cases must build no model. A few real `python train.py`
runs prove the console output is that one line, that HYDRA_FULL_ERROR=1 brings the traceback back,
and that a refused run writes nothing into its folder.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import InstantiationException

from tests.bad_inputs import CASES, ROOT, matches, observe
from tests.bad_inputs_doc import DOC, render
from tests.helpers import TINY


def test_there_are_at_least_40_cases_with_unique_ids():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


def test_the_doc_table_is_generated_from_the_cases():
    doc = DOC.read_text()
    assert render(doc, CASES) == doc, "run: python -m tests.bad_inputs_doc"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_shows_its_one_line(case, tmp_path):
    """observe() makes building a model fail for every case not caught at model load."""
    reason = case.needs()
    if reason:
        pytest.skip(reason)
    shown = observe(case, tmp_path)
    assert shown is not None, f"{case.id}: accepted"
    assert matches(case.message, shown), f"{case.id}:\n  shown:    {shown}\n  expected: {case.message}"
    assert "Traceback" not in shown


# ---------------------------------------------------------------- the pieces
def test_error_lines_one_per_problem_and_unwrapped_from_hydra():
    from run.errors import format_error, user_error
    from run.errors import ConfigError
    err = ConfigError("invalid\n  - a\n  - b", problems=["a=1 is bad", "b=2\n is bad"], where="stage sft")
    assert format_error(err) == "error: stage sft: a=1 is bad\nerror: stage sft: b=2 is bad"
    try:
        try:
            raise err
        except ConfigError as e:
            raise InstantiationException("Error in call to target") from e
    except InstantiationException as wrapped:
        assert user_error(wrapped) is err
    assert user_error(RuntimeError("a bug")) is None


def test_accepted_params_walk_the_kwargs_chain():
    from run.overrides import accepted_params
    grpo = accepted_params("trainers.grpo.GRPOModule")
    assert {"advantage", "beta", "group_size", "optimizer", "max_grad_norm", "name"} <= grpo
    assert "beta" not in accepted_params("trainers.sft.SFTModule")
    assert "max_steps" in accepted_params("lightning.Trainer")
    assert "betas" in accepted_params("torch.optim.AdamW")
    assert accepted_params("tests.helpers.LengthReward") is None  # takes **kwargs to the end
    assert accepted_params("no.such.module.Thing") is None


def plan(hydra_conf, overrides):
    from run.stages import plan_stages
    return plan_stages(hydra_conf(overrides), overrides)


def test_added_keys_go_to_the_stages_whose_code_takes_them(hydra_conf):
    sft, grpo = plan(hydra_conf, ["+algorithm.optimizer.betas=[0.9,0.95]"])
    assert list(sft.cfg.algorithm.optimizer.betas) == list(grpo.cfg.algorithm.optimizer.betas) == [0.9, 0.95]
    # a node with no target takes only its schema's keys (+cost.note=1: tests/bad_inputs/command_line.py)
    sft, grpo = plan(hydra_conf, ["++algorithm.optimizer.amsgrad=true"])  # ++ adds where the code takes it
    assert sft.cfg.algorithm.optimizer.amsgrad is True and grpo.cfg.algorithm.optimizer.amsgrad is True


def test_an_interpolation_on_the_command_line_is_parsed_once(hydra_conf):
    sft, grpo = plan(hydra_conf, ["callbacks.evaluate.verifier=${reward}"])
    for stage in (sft, grpo):
        assert stage.cfg.callbacks.evaluate.verifier._target_ == stage.cfg.reward._target_


def test_good_inputs_still_plan_without_building_a_model(hydra_conf, tmp_path, monkeypatch):
    import models.hf
    import models.tiny
    from tests.helpers import tiny_model
    model, tok = tiny_model()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    (tmp_path / "bom.jsonl").write_bytes("\ufeff".encode() + b'{"prompt": "1+1=", "answer": "2"}\n' * 30)
    monkeypatch.setattr(models.tiny, "build_tiny", lambda **_: pytest.fail("a model was built"))
    monkeypatch.setattr(models.hf, "_load_weights", lambda *_: pytest.fail("a model was built"))
    assert [s.name for s in plan(hydra_conf, TINY)] == ["sft", "grpo"]
    plan(hydra_conf, ["model=hf", f"model.name_or_path={tmp_path / 'm'}", "logger=none",
                      "generator.max_new_tokens=8"])  # a 64-token context: not recipe=pretrained's 256 new tokens
    [stage] = plan(hydra_conf, ["algorithm=grpo", "task=jsonl", f"task.train_path={tmp_path / 'bom.jsonl'}",
                                "task.num_heldout=5"])  # a UTF-8 byte-order mark is fine
    assert stage.task.train[0].prompt == "1+1="


def test_experiment_grpo_code_fits_its_model(hydra_conf):
    """The experiment sets a context that holds its prompts and 256 new tokens (the check refused it)."""
    assert [s.name for s in plan(hydra_conf, ["experiment=grpo_code"] + TINY)] == ["sft", "grpo"]


def test_load_hf_keeps_file_not_found_for_a_missing_folder(tmp_path):
    from models.hf import load_hf
    from models.hf_checks import ModelFolderError
    with pytest.raises(FileNotFoundError, match="no_such_model") as e:
        load_hf(str(tmp_path / "no_such_model"), "float32", False, False)
    assert isinstance(e.value, ModelFolderError)


# ---------------------------------------------------------------- as a user runs it (≈7 s each)
def train(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WANDB_API_KEY")}
    clean |= {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=clean, capture_output=True,
                          text=True, timeout=120)


def case(case_id: str):
    return next(c for c in CASES if c.id == case_id)


def test_console_shows_one_line_and_the_run_dir_keeps_its_files(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = train("trainer.max_steps=2.5", f"hydra.run.dir={out}")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [case("max-steps-float").message], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (out / "notes.txt").read_text() == "mine" and not (out / "config.yaml").exists()


def test_a_refused_command_line_imports_no_heavy_stack():
    """train.py checks the command line before importing torch, Lightning and transformers (issue 34: a typo
    took 15-36 s to refuse); bench/refusal_seconds.py measures the seconds."""
    probe = ("import runpy, sys\nsys.argv = ['train.py', '+learning_rate=1e-5']\ntry:\n"
             "    runpy.run_path('train.py', run_name='__main__')\nexcept SystemExit as e:\n    print('exit', e.code)\n"
             "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    clean = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == ["exit 1", "[]"], proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [case("plus-trl-learning-rate").message]


def test_the_policyshift_command_refuses_before_importing_the_heavy_stack_too(tmp_path):
    """The console script (`policyshift ARGS`, policyshift.main) checks the command line as train.py does,
    before torch, Lightning and transformers; `import policyshift` alone imports none of them either."""
    probe = ("import sys\nsys.argv = ['policyshift', '+learning_rate=1e-5']\nimport policyshift\n"
             "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))\ntry:\n"
             "    policyshift.main()\nexcept SystemExit as e:\n    print('exit', e.code)\n"
             "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    clean = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=clean | {"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == ["[]", "exit 1", "[]"], proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [case("plus-trl-learning-rate").message]


def test_console_shows_the_command_line_typo_in_one_line_before_hydra(tmp_path):
    proc = train("algorithm.betta=0.1", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [case("key-typo").message], proc.stderr
    assert not (tmp_path / "run").exists()  # refused before Hydra made the run dir


def test_full_error_brings_the_traceback_back_and_interpolations_pass_through(tmp_path):
    """'${reward}' on the command line used to fail Hydra's grammar when re-parsed; now the run gets as
    far as the next check (trainer.max_epochs=0), and HYDRA_FULL_ERROR=1 shows its traceback."""
    proc = train("callbacks.evaluate.verifier=${reward}", "trainer.max_epochs=0",
                 f"hydra.run.dir={tmp_path / 'run'}", HYDRA_FULL_ERROR="1")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ConfigError" in proc.stderr
    assert "trainer.max_epochs=0 must be" in proc.stderr and "no viable alternative" not in proc.stderr

