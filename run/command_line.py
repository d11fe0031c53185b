"""The command line checked before Hydra composes it (train.py's `__main__`), for what Hydra itself would
refuse in several lines: a group choice that does not exist, a key that is not in the config (where Hydra
suggests `+key=...`, which only adds the typo), `+` on a key that exists, an override that does not
parse. Each is one line naming the override and the nearest valid choice or key.

Only what Hydra would refuse anyway is reported: the full command line is composed first and nothing is
said when that works. Sweeps (`-m a=1,2`) get the choice check only; `--config-*` flags skip it all.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from run.errors import did_you_mean, full_traceback, nearest
from run.overrides import dotted_keys, foreign_hint, has_key

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
OWN_CONFIG_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--help", "-h",
                    "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version"}
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--experimental-rerun"}


def exit_on_bad_command_line(args: list[str] | None = None) -> None:
    """Print the command line's first problem as one line and exit 1 (nothing with HYDRA_FULL_ERROR=1)."""
    problem = None if full_traceback() else command_line_problem(sys.argv[1:] if args is None else args)
    if problem:
        sys.stderr.write(f"error: {problem}\n")
        raise SystemExit(1)


def with_default_data(args: list[str], conf_dir: Path = CONF_DIR) -> list[str]:
    """`algorithm=dpo data.path=x`: the args with `data=<the algorithm's default_data>` added when they pick
    one algorithm and neither a data source nor an experiment. That run is one stage on the algorithm's own
    data (run/stages.plan_stages); saying so before Hydra composes lets the data's keys apply without `++`."""
    overrides = _overrides(args) or []
    heads = {o.lstrip("+~").split("=")[0] for o in overrides if "=" in o}
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("algorithm=")]
    if "data" in heads or "experiment" in heads or len(chosen) != 1 or "," in chosen[0]:
        return args
    default = _default_data(conf_dir / "algorithm", chosen[0])
    return [*args, f"data={default}"] if default else args


def _default_data(folder: Path, choice: str) -> str | None:
    """`default_data` of conf/algorithm/<choice>.yaml, or of the algorithm its defaults list extends."""
    path = folder / f"{choice}.yaml"
    if not path.is_file():
        return None  # an unknown choice: _choice_problem names it
    node = OmegaConf.load(path)
    if "default_data" in node:
        return str(node.default_data)
    parents = [d for d in node.get("defaults", []) if isinstance(d, str) and d != "_self_"]
    return _default_data(folder, parents[0]) if parents else None


def command_line_problem(args: list[str], conf_dir: Path = CONF_DIR, config_name: str = "train") -> str | None:
    """The first override Hydra would refuse, explained in one line; None when there is none."""
    overrides = _overrides(args)
    if overrides is None:
        return None
    parser, parsed = OverridesParser.create(), []
    for text in overrides:
        try:
            parsed.append((text, parser.parse_override(text)))
        except Exception as e:  # noqa: BLE001 - OverrideParseException, with the grammar's message
            return (f"{text!r} is not a valid override ({str(e).strip().splitlines()[0]}); quote a value "
                    f"holding spaces or brackets: 'key=\"a b\"'")
    parsed = [(t, ov) for t, ov in parsed if ov.key_or_group.split(".")[0].split("/")[0] != "hydra"]
    problem = _choice_problem(parsed, conf_dir) or _added_typo_problem(parsed, conf_dir, config_name)
    if problem or any(ov.is_sweep_override() for _, ov in parsed):
        return problem
    with _hydra(conf_dir):
        try:
            return _empty_mapping_problem(parsed, compose(config_name, overrides=[t for t, _ in parsed]))
        except Exception:  # noqa: BLE001 - find which override Hydra refused
            pass
        groups = [t for t, ov in parsed if _is_group(ov, conf_dir)]
        try:
            base = compose(config_name, overrides=groups, return_hydra_config=True)
        except Exception:  # noqa: BLE001 - Hydra's own message covers it
            return None
    return _key_problem(parsed, base, conf_dir)


def _empty_mapping_problem(parsed, cfg: DictConfig) -> str | None:
    """`env.tools={}`: Hydra merges a mapping into the node, so {} changes nothing and the run keeps every
    entry it had, silently."""
    for text, ov in parsed:
        if ov.is_delete() or _is_group_key(ov.key_or_group) or ov.value() != {}:
            continue
        node = OmegaConf.select(cfg, ov.key_or_group, default=None, throw_on_resolution_failure=False)
        if isinstance(node, DictConfig) and len(node):
            keys = [str(k) for k in node.keys()]
            return (f"{text}: {{}} is merged into `{ov.key_or_group}`, which keeps {', '.join(keys)}: nothing changes; "
                    f"remove an entry with ~{ov.key_or_group}.{keys[0]}")
    return None


def _is_group_key(key: str) -> bool:
    return "." not in key and (CONF_DIR / key).is_dir()


def _overrides(args: list[str]) -> list[str] | None:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.split("=")[0] in OWN_CONFIG_FLAGS:
            return None
        elif a in FLAGS_WITH_VALUE:
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


@contextmanager
def _hydra(conf_dir: Path):
    if GlobalHydra.instance().is_initialized():  # inside a test's Hydra: use it
        yield
        return
    with initialize_config_dir(str(conf_dir), version_base="1.3"):
        yield


def _is_group(ov, conf_dir: Path) -> bool:
    return "." not in ov.key_or_group and (conf_dir / ov.key_or_group).is_dir()


def _added_typo_problem(parsed, conf_dir: Path, config_name: str) -> str | None:
    """`+typo=1`, `+learning_rate=1e-5`: '+' (or '++') adds any new top-level key, and no run reads a key the
    config does not have (exit 0, the setting silently ignored). Refused, naming the nearest group or key,
    or the key that means it here for a name from TRL."""
    known = {p.name for p in conf_dir.iterdir() if p.is_dir()}
    known |= {str(k) for k in OmegaConf.load(conf_dir / f"{config_name}.yaml").keys()} - {"defaults", "hydra"}
    for text, ov in parsed:
        head = ov.key_or_group.split(".")[0].split("/")[0]
        if (ov.is_add() or ov.is_force_add()) and head not in known:
            near = nearest(head, known, cutoff=0.8)
            hint = f"; did you mean `{near}`?" if near else foreign_hint(ov.key_or_group)
            return f"{text}: the config has no `{head}`, so '+' would add it and nothing would read it{hint}"
    return None


def _choice_problem(parsed, conf_dir: Path) -> str | None:
    for text, ov in parsed:
        if not _is_group(ov, conf_dir) or ov.is_delete():
            continue
        group = ov.key_or_group
        options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        for choice in _choices(ov):
            if choice not in options:
                near = nearest(choice, options)
                return (f"{text}: there is no {group}={choice} (choices: {', '.join(options)})"
                        + (f"; did you mean {group}={near}?" if near else ""))
    return None


def _choices(ov) -> list[str]:
    try:
        values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.value()]
    except Exception:  # noqa: BLE001 - glob/range sweeps of a group: left to Hydra
        return []
    out = []
    for v in values:
        out += [str(x) for x in v] if isinstance(v, (list, tuple)) else [] if v is None else [str(v)]
    return out


def _key_problem(parsed, base: DictConfig, conf_dir: Path) -> str | None:
    """Why a key override cannot apply to the composed base config, or None."""
    for text, ov in parsed:
        key = ov.key_or_group
        if _is_group(ov, conf_dir) or ov.is_force_add():
            continue
        exists = has_key(base, key)
        if ov.is_add() and exists:
            return (f"{text}: `{key}` already exists; '+' only adds a new key: write "
                    f"{key}={ov.get_value_element_as_str()} to change it")
        if ov.is_add() or exists:
            continue
        group, _, rest = key.partition(".")
        chosen = base.hydra.runtime.choices.get(group)
        others = _choices_with_key(conf_dir, group, rest, chosen)
        if others and not ov.is_delete():
            return (f"{text}: {group}={chosen} has no `{rest}`, {group}={', '.join(others)} has: for the stages "
                    f"whose {group} has it, write ++{text}")
        parent = key.rpartition(".")[0]
        node = OmegaConf.select(base, parent, default=None, throw_on_resolution_failure=False) if parent else base
        leaves = [str(k) for k in node.keys() if not str(k).startswith("_")] if isinstance(node, DictConfig) else []
        leaves += _keys_in_choices(conf_dir, group, rest.rpartition(".")[0]) if leaves else []
        full = [k for k in dotted_keys(base) if not k.startswith("hydra")]
        what = "to delete" if ov.is_delete() else ""
        hint = foreign_hint(key) or _group_hint(key, ov, conf_dir) or did_you_mean(key, leaves, full)
        return f"{text}: no `{key}` in the config{' ' + what if what else ''}{hint}"
    return None


def _group_hint(key: str, ov, conf_dir: Path) -> str:
    """'; did you mean experiment=quickstart?' for a misspelled group name (`experimnt=quickstart`)."""
    if "." in key:
        return ""
    near = nearest(key, [p.name for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra"], cutoff=0.75)
    return f"; did you mean {near}={ov.get_value_element_as_str()}?" if near else ""


def _keys_in_choices(conf_dir: Path, group: str, parent: str) -> list[str]:
    """The keys of node `parent` (top level: '') in every choice of config group `group`."""
    if not (conf_dir / group).is_dir():
        return []
    keys = []
    for path in sorted((conf_dir / group).glob("*.yaml")):
        node = OmegaConf.load(path)
        node = OmegaConf.select(node, parent, default=None) if parent else node
        keys += [str(k) for k in node.keys() if not str(k).startswith("_")] if isinstance(node, DictConfig) else []
    return keys


def _choices_with_key(conf_dir: Path, group: str, rest: str, chosen) -> list[str]:
    """The other choices of config group `group` whose file has key `rest`."""
    if not rest or not (conf_dir / group).is_dir():
        return []
    found = []
    for path in sorted((conf_dir / group).glob("*.yaml")):
        if path.stem != chosen:
            node = OmegaConf.load(path)
            if isinstance(node, DictConfig) and has_key(node, rest):
                found.append(path.stem)
    return found


CHECKED: list[bool] = []  # the command line was checked (once per process)


def check_command_line() -> None:
    """A wrong command line is one line and exit 1, before torch, Lightning and transformers are imported
    (this module imports Hydra alone): a typo is answered in about two seconds, not thirty. `python
    train.py` and the `policyshift` console script both call it first."""
    if CHECKED:
        return
    sys.argv[1:] = with_default_data(sys.argv[1:])  # algorithm=dpo alone: its own data's keys apply
    exit_on_bad_command_line()  # a typo'd key or choice: one line, before Hydra's own report
    CHECKED.append(True)
