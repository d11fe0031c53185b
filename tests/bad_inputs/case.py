"""A bad-input case (a command line, the files it names, when it is caught, the line the user sees) and
how a test runs one: `observe` runs what train.py runs, in-process; `matches` compares the line."""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent.parent
WHEN = {"command line": "before Hydra", "plan": "plan", "plan (warning)": "plan, a warning (the run goes on)",
        "load": "model load"}


@dataclass(frozen=True)
class Case:
    id: str
    what: str                      # the bad input in words
    argv: tuple[str, ...]          # the command line after `python train.py` (DIR: the case's folder)
    message: str                   # what the user sees on stderr (DIR for the folder)
    setup: Callable[[Path], None] | None = None   # writes the files the command line names
    when: str = "plan"             # a key of WHEN (see docs/bad_inputs.md)
    patches: tuple = ()            # (target, value) for unittest.mock.patch, e.g. no GPU
    needs: Callable[[], str | None] = field(default=lambda: None)  # a reason to skip, or None

    def __post_init__(self):
        assert self.when in WHEN, f"{self.id}: when={self.when!r}"


def observe(case: Case, folder: Path) -> str | None:
    """What `python train.py <case.argv>` prints for this case (DIR for `folder`): its error, or for a
    warning case the warning planning printed; None if it plans without either. Before a load-time case's
    model node, building a model fails the case (AssertionError)."""
    from unittest import mock

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    from run.command_line import command_line_problem
    from run.errors import format_error, user_error
    from run.stages import plan_stages

    if case.setup:
        case.setup(folder)
    argv = [a.replace("DIR", str(folder)) for a in case.argv]
    patches = [mock.patch(target, value) for target, value in case.patches]
    if case.when != "load":
        patches += [mock.patch("models.tiny.build_tiny", _no_model), mock.patch("models.hf._load_weights", _no_model)]
    for p in patches:
        p.start()
    try:
        GlobalHydra.instance().clear()
        problem = command_line_problem(argv)
        if problem:
            return f"error: {problem}".replace(str(folder), "DIR")
        overrides = [a for a in argv if not a.startswith(("-", "hydra.", "hydra/"))]  # as hc.overrides.task
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            printed = io.StringIO()
            try:
                with contextlib.redirect_stderr(printed):
                    stages = plan_stages(compose("train", overrides=overrides), overrides)
                if case.when == "load":
                    instantiate(stages[0].cfg.model)
            except Exception as e:  # noqa: BLE001 - the test asserts it is a project error
                err = user_error(e)
                if err is None:
                    raise
                return format_error(err).replace(str(folder), "DIR")
        warnings = [line for line in printed.getvalue().splitlines() if line.startswith("warning: ")]
        shown = "\n".join(warnings).replace(str(folder), "DIR")
        return shown if case.when == "plan (warning)" and warnings else None
    finally:
        GlobalHydra.instance().clear()
        for p in reversed(patches):
            p.stop()


def _no_model(*_, **__):
    raise AssertionError("a model was built before the input was refused")


def matches(expected: str, shown: str | None) -> bool:
    if shown is None:
        return False
    return shown.startswith(expected[:-1]) if expected.endswith("…") else shown == expected
