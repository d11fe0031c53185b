"""pyproject.toml makes the checkout installable (`pip install -e .`, `pip install -e .[dev]`): the same
dependencies as requirements.txt (pins included), a dev extra, and every top-level package + train.py."""
from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

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
    found = set(find_packages(where=str(ROOT), include=setuptools["packages"]["find"]["include"]))
    top_level = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert top_level == {"policyshift", "run", "trainers", "callbacks", "data_modules", "rewards", "envs", "tasks", "generators", "models",
                         "hardware", "losses"}
    assert top_level | {"run.validation"} <= found and not any(p.startswith("tests") for p in found)
