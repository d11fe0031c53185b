"""W&B sweep entry point: the agent's `--key=value` arguments as Hydra overrides, then train.py.

    wandb sweep scripts/wandb_sweep.yaml        # from the repo root; prints the agent command
    wandb agent <entity>/policyshift/<id>       # runs this script once per trial (docs/sweeps.md)

A W&B agent runs `python scripts/wandb_sweep.py --algorithm.optimizer.lr=0.00031 --seed=2` (its default
`${args}`). This script turns each argument into the override train.py takes on its command line
(`algorithm.optimizer.lr=0.00031 seed=2`) and replaces itself with `python train.py <overrides>`, so
the trial is an ordinary train.py job (signals, exit status and all). Values:

- as W&B prints them (Python's `str`): `True`/`False` → `true`/`false`, `None` → `null`, numbers as
  they are, lists and dicts (`[4, 8]`, `{'r': 8}`) → Hydra's `[4,8]`, `{r:8}`;
- any other text is kept when Hydra reads it as one value (`1e-3`, `adamw`, `${seed}`, `[a,b]`) and
  quoted as a string otherwise (spaces, commas, quotes, `choice(...)`: `'my prompts.jsonl'`): a trial
  is one value, never a Hydra sweep;
- a dict given to a config group (W&B's nested parameters: `--algorithm={'beta': 0.1}`) becomes one
  dotted key per entry (`algorithm.beta=0.1`); a dict given to a key merges into that node;
- parameter names may carry Hydra's `+`/`++` (`--++data.max_examples=200`); an argument already in
  Hydra's form (`experiment=quickstart`, e.g. fixed in the sweep's `command`) is passed as it is.

Anything else (`--flag` without a value, `-k=v`, `--key value`, a key twice) stops with one line on
stderr and exit status 2. Unless the command line names `hydra.run.dir`, each trial writes to
`outputs/wandb/<sweep id>/<run id>` (the agent's WANDB_SWEEP_ID and WANDB_RUN_ID), so parallel agents
never share a folder. train.py keeps W&B offline unless WANDB_MODE says otherwise, and an offline run
never reports to its sweep: this script sets WANDB_MODE=online when it is unset.
"""
from __future__ import annotations

import ast
import math
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "train.py"
CONF = ROOT / "conf"
KEY = re.compile(r"^(\+\+|\+)?[A-Za-z_][\w-]*(?:[./][\w-]+)*(?:@[\w.-]+)?$")
DICT_KEY = re.compile(r"^[A-Za-z_][\w-]*$")


class SweepArgumentError(ValueError):
    """An argument this script cannot turn into a Hydra override."""


def translate(args: list[str]) -> list[str]:
    """Hydra overrides for the W&B agent's arguments (see the module docstring); raises SweepArgumentError."""
    overrides, seen = [], {}
    for arg in args:
        for override in to_overrides(arg):
            key = override.split("=", 1)[0].lstrip("+")
            if key in seen:
                raise SweepArgumentError(f"{key!r} is given twice ({seen[key]!r} and {arg!r}): one value per key")
            seen[key] = arg
            overrides.append(override)
    return overrides


def to_overrides(arg: str) -> list[str]:
    """The override(s) of one argument: `--key=value` translated, `key=value` as it is."""
    if not arg.startswith("--"):
        if arg.startswith("-"):
            raise SweepArgumentError(f"{arg!r}: arguments are --key=value (two dashes), e.g. --seed=2")
        key = arg.split("=", 1)[0]
        if "=" not in arg or not KEY.match(key):
            raise SweepArgumentError(f"{arg!r} is neither --key=value nor a Hydra override key=value "
                                     f"(a value of its own? write --key=value, not --key value)")
        return [arg]
    body = arg[2:]
    if "=" not in body:
        raise SweepArgumentError(f"{arg!r} has no value: write {arg}=VALUE (a W&B agent passes --key=value "
                                 f"with the sweep's default ${{args}}); flags and '--key value' are not taken")
    key, raw = body.split("=", 1)
    if not key:
        raise SweepArgumentError(f"{arg!r} has no key before '='")
    if not KEY.match(key):
        raise SweepArgumentError(f"{arg!r}: {key!r} is not a config key (letters, digits, _ and -, "
                                 f"separated by . or /; optionally + or ++ in front)")
    value = _python_value(raw)
    if isinstance(value, dict) and value and _is_group(key):
        return [f"{key}.{k}={hydra_value(v)}" for k, v in _flat(value)]
    if value is not _TEXT:
        return [f"{key}={hydra_value(value)}"]
    return [f"{key}={text(key, raw)}"]


_TEXT = object()  # a value that is no Python literal: text


def _python_value(raw: str):
    """The value W&B printed (Python's str of a bool, None, number, list or dict), or _TEXT."""
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _TEXT
    if isinstance(value, (bool, int, float, list, dict)) or value is None:
        return value
    return _TEXT  # a string literal, a tuple (`1,2`), a set, bytes, complex: taken as text


def _is_group(key: str) -> bool:
    """Whether `key` names a config group (a folder of conf/): its dict spreads into dotted keys."""
    name = key.lstrip("+")
    return "." not in name and (CONF / name).is_dir()


def _flat(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def hydra_value(v) -> str:
    """A Python value in Hydra's override grammar (strings quoted)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else "inf" if v > 0 else "-inf") if not math.isfinite(v) else repr(v)
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str) or not DICT_KEY.match(k):
                raise SweepArgumentError(f"dict key {k!r} cannot be written as a Hydra dict key")
        return "{" + ",".join(f"{k}:{hydra_value(x)}" for k, x in v.items()) + "}"
    raise SweepArgumentError(f"cannot write {v!r} ({type(v).__name__}) as a Hydra value")


def quote(s: str) -> str:
    """`s` as a quoted Hydra string: the quote it does not contain, else ' with escapes (a quote, and the
    backslashes before a quote or the closing quote, take a backslash each: Hydra's escaping rules)."""
    q = "'" if "'" not in s else '"' if '"' not in s else "'"
    escaped = re.sub(r"(\\*)(" + re.escape(q) + r"|$)",
                     lambda m: m.group(1) * 2 + ("\\" + q if m.group(2) else ""), s)
    return f"{q}{escaped}{q}"


def text(key: str, raw: str) -> str:
    """`raw` as the value of `key`: as it is when Hydra reads it as one value, else quoted."""
    return raw if _one_hydra_value(key, raw) else quote(raw)


def _one_hydra_value(key: str, raw: str) -> bool:
    """Whether `key=raw` may go to Hydra unquoted: it reads as one value (not a sweep such as `a,b` or
    `choice(1,2)`, not an error), and a string of it has no whitespace (Hydra would keep inner spaces
    but trim outer ones; quoted, a path with spaces reads the same everywhere)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        override = OverridesParser.create().parse_override(f"{key}={raw}")
    except HydraException:
        return False
    if override.is_sweep_override():
        return False
    return not (isinstance(override.value(), str) and (not raw or re.search(r"\s", raw)))


def build_command(args: list[str], environ: dict | None = None) -> tuple[list[str], dict]:
    """(argv, environment) of the train.py job for the agent's arguments."""
    env = dict(os.environ if environ is None else environ)
    overrides = translate(args)
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    sweep, run = env.get("WANDB_SWEEP_ID"), env.get("WANDB_RUN_ID")
    if "hydra.run.dir" not in keys and sweep and run:
        overrides.append(f"hydra.run.dir={text('hydra.run.dir', str(Path('outputs') / 'wandb' / sweep / run))}")
    if not env.get("WANDB_MODE"):
        env["WANDB_MODE"] = "online"  # train.py's default is offline: the sweep would never see the run
    elif env["WANDB_MODE"] in ("offline", "disabled", "dryrun"):
        print(f"wandb_sweep.py: WARNING: WANDB_MODE={env['WANDB_MODE']}: this run will not report to its sweep",
              file=sys.stderr)
    return [sys.executable, str(TRAIN), *overrides], env


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        command, env = build_command(args)
    except SweepArgumentError as e:
        print(f"wandb_sweep.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print("wandb_sweep.py: " + " ".join(command[1:]), file=sys.stderr, flush=True)
    os.execve(command[0], command, env)  # the trial is train.py itself: signals and exit status are its own


if __name__ == "__main__":
    main()
