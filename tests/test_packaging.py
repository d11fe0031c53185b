"""pyproject.toml makes the checkout installable (`pip install -e .`, `pip install -e .[dev]`): the same
dependencies as requirements.txt (pins included), a dev extra, and every top-level package + train.py."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path

from setuptools import find_namespace_packages

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements(name: str) -> list[str]:
    """A requirements file's requirements, comments and `-r` includes left out."""
    lines = (line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def test_dependencies_are_requirements_txt():
    project = PYPROJECT["project"]
    assert project["dependencies"] == requirements("requirements.txt")
    assert "torch==2.13.0" in project["dependencies"]
    assert project["optional-dependencies"]["dev"] == requirements("requirements-dev.txt")
    assert PYPROJECT["build-system"]["build-backend"] == "setuptools.build_meta"


def test_every_top_level_package_and_train_py_are_installed():
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["py-modules"] == ["train"]
    found = set(find_namespace_packages(where=str(ROOT), include=setuptools["packages"]["find"]["include"]))
    top_level = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert top_level == {"policyshift", "run", "trainers", "callbacks", "data_modules", "rewards", "envs", "tasks", "generators", "models",
                         "hardware", "losses"}
    assert top_level | {"run.validation", "conf", "conf.algorithm"} <= found
    assert not any(p.startswith("tests") for p in found)


def test_the_wheel_carries_its_configs_and_runs_a_stage_from_any_directory(tmp_path):
    """`pip install .` (not editable) used to copy the code without conf/, so the installed `policyshift`
    could not compose a run. Build the wheel, install it (no dependencies: the test's own environment's,
    through --system-site-packages) into a fresh venv, and run a 2-step SFT stage from a folder that is
    not the checkout."""
    import subprocess
    import sys
    import zipfile
    import shutil
    source, wheels = tmp_path / "source", tmp_path / "wheels"  # a copy: the build writes build/ and egg-info
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "tests", "outputs", "multirun", "wandb",
                                                                "build", "*.egg-info", "__pycache__", "docs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, capture_output=True, timeout=300)
    wheel = next(wheels.glob("policyshift-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.yaml"))
    assert [n for n in shipped if n not in names] == [] and "tasks/code_tasks.jsonl" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASTER_PORT", "LOCAL_RANK")}
    env |= {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([venv / "bin" / "policyshift", "algorithm=sft", "trainer.max_steps=2",
                           "task.num_heldout=20", "callbacks.evaluate.num_examples=20", "hydra.run.dir=run"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (elsewhere / "run" / "summary.json").is_file() and (elsewhere / "run" / "policy").is_dir()
    assert str(ROOT) not in (elsewhere / "run" / "config.yaml").read_text()  # nothing read from the checkout
