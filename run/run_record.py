"""A run folder's record, and the rules for starting or resuming a run in it.

    <run>/.hydra/config.yaml, hydra.yaml, overrides.yaml   the job as it was started (Hydra's files)
    <run>/run.json   {"wandb_id", "started", "resumes": [{"started", "overrides", "changes"}]}

`hydra.output_subdir` is null (conf/train.yaml), so Hydra writes nothing into the folder before the task
runs: train.py writes the record itself, at the run's first optimizer step, once every stage's config is
valid, the folder is owned by this process alone and known to be free (or really resumed). A refused or
invalid run, or one that fails before that step, leaves every file of the folder as it was
(run/run_folder.py removes what it wrote before then).

Resuming (`resume=true`) composes from the overrides the run was started with (plus the changes that
earlier resumes were allowed to make); a command-line value that differs is refused, naming the key and
both values, unless `resume_allow_changes=true`, and then the change is appended to run.json's
`resumes`, never written over `.hydra/overrides.yaml`.
"""
from __future__ import annotations

import datetime
import json
import atexit
import os
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from run.errors import ConfigError, format_error
from run.run_folder import FolderLock

CONTROL_KEYS = ("resume", "resume_allow_changes")  # about this invocation, never part of the run's settings
MARKERS = ("summary.json", "run.json", ".hydra", "config.yaml", "checkpoints")  # what a run that took a step leaves


@dataclass
class RunPlan:
    overrides: list[str]  # the command line the run composes from (resume: the recorded one)
    resume: int = 0  # 0: a new run; N: the Nth resume
    changes: list[dict] = field(default_factory=list)  # resume: allowed {key, was, now}
    wandb_id: str = ""
    finished: dict = field(default_factory=dict)  # stage → its metrics in summary.json


def holds_run(out: Path) -> str | None:
    """The first file or folder that shows `out` holds a run (started, killed or finished), or None."""
    return next((m for m in MARKERS if (out / m).exists()), None)


def plan_run(out: Path, user_overrides: list[str], resume: bool, allow_changes: bool) -> RunPlan:
    """What to run in `out`; raises ConfigError (writing nothing) when the folder cannot take it."""
    marker = holds_run(out)
    if not resume:
        if marker:
            raise ConfigError(f"{out} already holds a run ({marker}); choose another hydra.run.dir, or "
                              f"resume=true hydra.run.dir={out} to continue it")
        return RunPlan(list(user_overrides), wandb_id=secrets.token_hex(4))
    recorded = out / ".hydra" / "overrides.yaml"
    if not recorded.is_file():
        what = ("does not exist" if not out.exists() else "holds no run" if marker is None
                else f"holds a run ({marker}) but no record of its command line")
        raise ConfigError(f"resume=true but {out} {what}: no .hydra/overrides.yaml to take the run's "
                          f"settings from; check hydra.run.dir (nothing was trained)")
    record = read_record(out)
    merged, changes = merge_overrides(effective_overrides(out, record), user_overrides)
    if changes and not allow_changes:
        raise ConfigError(f"resume=true: this command line changes the run's settings in {out}: "
                          + "; ".join(describe(out, c) for c in changes)
                          + ". Drop them to continue the run as it was started, or add "
                            "resume_allow_changes=true to apply them (recorded in run.json)")
    return RunPlan(merged, len(record.get("resumes", [])) + 1, changes,
                   record.get("wandb_id") or _wandb_id_in(out) or secrets.token_hex(4), finished(out))


def finished(out: Path) -> dict:
    path = out / "summary.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"resume: {path} is not valid JSON ({e}); restore it or start a new run") from e


def read_record(out: Path) -> dict:
    path = out / "run.json"
    if not path.is_file():  # a run from before run.json existed: its command line alone
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"resume: {path} is not valid JSON ({e}); restore it or start a new run") from e


def effective_overrides(out: Path, record: dict) -> list[str]:
    """The run's command line as it stands: .hydra/overrides.yaml + each earlier resume's changes."""
    path = out / ".hydra" / "overrides.yaml"
    overrides = [str(o) for o in yaml.safe_load(path.read_text()) or []]  # as typed: `x=${y}` unresolved
    for resume in record.get("resumes", []):
        overrides, _ = merge_overrides(overrides, [c["now"] for c in resume.get("changes", [])])
    return overrides


def _parse(overrides: list[str]) -> list[tuple[str, str, object]]:
    """(key, text, value) per override; key includes the package (`group@pkg`)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [(ov.key_or_group + (f"@{ov.package}" if ov.package else ""), text, ov.value())
            for text, ov in zip(overrides, parsed)]


def merge_overrides(recorded: list[str], current: list[str]) -> tuple[list[str], list[dict]]:
    """(the recorded command line with `current`'s values applied, the values `current` changes)."""
    merged = [(k, t) for k, t, _ in _parse(recorded) if k not in CONTROL_KEYS]
    values = {k: v for k, _, v in _parse(recorded)}
    texts = dict(merged)
    changes, control = [], []
    for key, text, value in _parse(current):
        if key in CONTROL_KEYS:
            control.append(text)
        elif key not in values or values[key] != value:
            changes.append({"key": key, "was": texts.get(key), "now": text})
            merged = [(k, text if k == key else t) for k, t in merged]
            if key not in texts:
                merged.append((key, text))
                texts[key] = text
    return [t for _, t in merged] + control, changes


def describe(out: Path, change: dict) -> str:
    was = change["was"] or f"its default ({_recorded_values(out, change['key'])})"
    return f"{change['key']}: the run has {was}, this command line says {change['now']}"


def _recorded_values(out: Path, key: str) -> str:
    """What the run's stages used for `key`, from its config.yaml (`sft=3000, grpo=600`)."""
    path = out / "config.yaml"
    if not path.is_file():
        return "its default"
    stages = OmegaConf.load(path)
    key = key.lstrip("+~").split("@")[0]
    used = []
    for name, cfg in stages.items():
        value = OmegaConf.select(cfg, key, default="<absent>")
        if isinstance(value, DictConfig):
            value = value.get("name", "<group>")
        used.append(f"{name}={value}")
    return ", ".join(used)


def _wandb_id_in(out: Path) -> str | None:
    """The W&B run id of a run recorded before run.json kept it: its newest wandb/*run-<time>-<id>."""
    runs = sorted((out / "wandb").glob("*run-*-*"), key=lambda p: p.name)
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


def write_record(out: Path, plan: RunPlan, task_cfg: DictConfig | None, hydra_cfg: DictConfig | None,
                 command_line: list[str]) -> None:
    """A new run: .hydra/ + run.json. A resume: one more entry in run.json's `resumes` (nothing else)."""
    now = datetime.datetime.now().isoformat(timespec="seconds")
    if plan.resume:
        record = read_record(out) or {"wandb_id": plan.wandb_id}
        record.setdefault("resumes", []).append({"started": now, "overrides": list(command_line),
                                                 "changes": plan.changes})
        _write(out / "run.json", json.dumps(record, indent=2))
        return
    hydra_dir = out / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    if task_cfg is not None:
        _write(hydra_dir / "config.yaml", OmegaConf.to_yaml(task_cfg))
    if hydra_cfg is not None:
        _write(hydra_dir / "hydra.yaml", OmegaConf.to_yaml(hydra_cfg))
    _write(hydra_dir / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(plan.overrides))))
    _write(out / "run.json", json.dumps({"wandb_id": plan.wandb_id, "started": now, "resumes": []}, indent=2))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per process: two writers never share one
    tmp.write_text(text)
    os.replace(tmp, path)


class RefuseUsedSweepDir(Callback):
    """A Hydra callback (conf/train.yaml): a `-m` sweep owns its sweep dir (run/run_folder.py's lock, for
    the sweep's life), and a sweep into a dir that already holds one is refused; resume=true continues
    that sweep's jobs. Both refusals come before Hydra writes anything (multirun.yaml, the jobs' folders)
    and end the process: Hydra 1.3 turns a callback's exception into a warning and carries on."""

    def __init__(self):
        self.lock: FolderLock | None = None
        self.new = False  # the sweep dir was absent or empty

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        try:
            self.claim(config)
        except ConfigError as e:
            sys.stderr.write(format_error(e) + "\n")
            sys.stderr.flush()
            raise SystemExit(1) from None

    def claim(self, config: DictConfig) -> None:
        """Lock the sweep dir (creating it), or raise ConfigError saying what to do instead."""
        sweep = Path(str(config.hydra.sweep.dir))
        self.new = not sweep.exists() or not any(sweep.iterdir())
        hint = "choose another hydra.sweep.dir, or wait for that sweep to end (or stop it: kill {pid})"
        self.lock = FolderLock(sweep, "sweep").acquire(hint)
        atexit.register(self.release)  # a sweep that dies of a job's error: the same end
        if (sweep / "multirun.yaml").exists() and not config.get("resume", False):
            self.release()
            raise ConfigError(f"{sweep} already holds a sweep (multirun.yaml), which this sweep would overwrite; "
                              f"choose another hydra.sweep.dir, or resume=true hydra.sweep.dir={sweep} to "
                              f"continue its jobs")

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self.release()

    def release(self) -> None:
        """The sweep's end: a new sweep dir none of whose jobs took an optimizer step (each job's folder
        was put back by run/run_folder.py) is removed with what the sweep wrote there (multirun.yaml,
        its summary), so the corrected sweep runs there too; then the lock goes."""
        if self.lock is None:
            return
        sweep = self.lock.folder
        if self.new and not any(holds_run(p) for p in sweep.iterdir() if p.is_dir()):
            for path in sweep.iterdir():
                if path.name != self.lock.path.name:
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        self.lock.release()
        self.lock = None
        if self.new and sweep.is_dir() and not any(sweep.iterdir()):
            sweep.rmdir()
