"""Typed schemas of every config group, checked against each stage's composed config at plan time
(`check_schemas`, the first of run/validation/config.py's checks): types, ranges and choices of single
values, and unknown keys where a node is closed. pydantic (docs/config_schemas.md says why).

A group's schema is chosen by its node's `_target_` (model=tiny → model.Tiny); a `_target_` the project
does not know (a user's class) gets the group's open schema: the keys every such node shares are typed,
any other key is passed on to the class. A value written as an interpolation (`${algorithm.group_size}`)
is checked where it is written, not again where it is read. Checks across keys stay in config.py.
"""
from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import BaseModel, ValidationError

from run.errors import nearest
from run.validation.schemas import algorithm, data, env, generator, model, reward, task, top, trainer
from run.validation.schemas.base import Must, Node, Targeted

# (key, {target: schema}, schema for any other target): one row a group
GROUPS = (("model", model.SCHEMAS, model.FALLBACK), ("data", data.SCHEMAS, data.FALLBACK),
          ("algorithm", algorithm.SCHEMAS, algorithm.FALLBACK), ("correction", algorithm.CORRECTIONS, None),
          ("generator", generator.SCHEMAS, generator.FALLBACK), ("reward", reward.SCHEMAS, reward.FALLBACK),
          ("task", task.SCHEMAS, task.FALLBACK), ("trainer", trainer.SCHEMAS, trainer.FALLBACK),
          ("env", env.SCHEMAS, env.FALLBACK))
SKIP = object()


def check_schemas(cfg: DictConfig, errors: list[str]) -> None:
    """One message per bad value or unknown key, naming the key: `model.num_layers=0 must be a positive
    integer`."""
    for prefix, schema, values in bindings(cfg, plain):
        if schema is not None:
            errors.extend(problems(schema, values, prefix))


def bindings(cfg: DictConfig, read) -> list[tuple[str, type[BaseModel] | None, dict]]:
    """(key prefix, schema, the node's values as `read` gives them) for every node a schema checks: each
    group's node by its `_target_`, the top-level keys, and every node a schema's field holds as a
    `Targeted` node (a callback, a logger, an environment's tool, a reward source's generator...), by its
    own `_target_`. None: a node no schema covers."""
    out: list = []
    for key, table, fallback in GROUPS:
        node = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        if isinstance(node, DictConfig):
            _bind(read(node), table, fallback, f"{key}.", out)
    groups = {key.split(".")[0] for key, _, _ in GROUPS} | {"hydra"}
    _bind({k: v for k, v in read(cfg).items() if k not in groups}, {}, top.TopLevel, "", out)
    return out


def _bind(values: dict, table: dict, fallback, prefix: str, out: list) -> None:
    schema = table.get(values.get("_target_"), fallback)
    out.append((prefix, schema, values))
    for key, field in (_fields(schema) if schema is not None else {}).items():
        mark = next((m for m in field.metadata if isinstance(m, Targeted)), None)
        child = values.get(key)
        if mark is None or not isinstance(child, dict):
            continue
        entries = child.items() if mark.each else [(None, child)]
        for name, entry in entries:
            if isinstance(entry, dict):
                where = f"{prefix}{key}." + (f"{name}." if name is not None else "")
                _bind(entry, mark.table, mark.fallback, where, out)


def stage_list_problems(cfg: DictConfig) -> list[str]:
    """The `stages` list's entries against top.StageSpec, before the stages are composed from them."""
    stages = OmegaConf.select(cfg, "stages", default=None, throw_on_resolution_failure=False)
    if not isinstance(stages, ListConfig):
        return problems(top.TopLevel, {"stages": stages}, "") if stages is not None else []
    return problems(top.TopLevel, {"stages": plain(stages)}, "")


def _check(node: dict, table: dict, fallback, prefix: str, errors: list[str]) -> None:
    schema = table.get(node.get("_target_"), fallback)
    if schema is not None:
        errors.extend(problems(schema, node, prefix))


def plain(node) -> dict | list:
    """`node` as Python values, leaving out values written as interpolations and required `???` values."""
    if isinstance(node, DictConfig):
        values = {str(k): _value(node._get_node(k)) for k in node.keys()}
        return {k: v for k, v in values.items() if v is not SKIP}
    return [v for v in (_value(node._get_node(i)) for i in range(len(node))) if v is not SKIP]


def _value(child):
    if child._is_interpolation() or child._is_missing():
        return SKIP
    if isinstance(child, (DictConfig, ListConfig)):
        return None if child._is_none() else plain(child)
    return child._value()


def problems(schema: type[BaseModel], values: dict, prefix: str) -> list[str]:
    """`schema`'s complaints about `values`, one line each, deduplicated by key."""
    try:
        schema.model_validate(values)
    except ValidationError as e:
        lines = {}
        for err in e.errors():
            key, line = _line(schema, values, err, prefix)
            lines.setdefault(key, line)
        return list(lines.values())
    return []


def _line(schema, values, err: dict, prefix: str) -> tuple[str, str]:
    """(key, message) for one pydantic error, the key found by walking `err['loc']` through the schema
    (a union's member names in the loc are not keys and are skipped)."""
    path, model, field, value = [], schema, None, values
    for part in err["loc"]:
        fields = _fields(model) if model else {}
        if isinstance(part, str) and part in fields:
            field = fields[part]
            path.append(part)
            value = value.get(part) if isinstance(value, dict) else None
            model = _model_in(field.annotation)
        elif isinstance(part, int) and isinstance(value, list) and path:
            path[-1] += f"[{part}]"
            value = value[part] if part < len(value) else None
        elif err["type"] == "extra_forbidden" and isinstance(part, str):
            key = prefix + ".".join(path + [part])
            known = [k for k in fields if k not in ("_target_", "_partial_", "_convert_")]
            near = nearest(part, known)
            where = (values.get("_target_") if not path else None) or prefix + ".".join(path) or "the config"
            hint = f"; did you mean `{prefix}{'.'.join(path + [near])}`?" if near else ""
            return key, f"{key}: {where} has no key `{part}` (its keys: {', '.join(known)}){hint}"
    key = prefix + ".".join(path)
    return key, f"{key}={value!r} must be {_must(field, err)}"


def _fields(model) -> dict:
    """The schema's fields by their config name (`_target_`, not `target`)."""
    return {(f.alias or name): f for name, f in model.model_fields.items()}


def _model_in(annotation):
    """The schema class inside a field's annotation (`Sandbox`, `OpenNode | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _must(field, err: dict) -> str:
    for item in reversed(field.metadata if field is not None else ()):
        if isinstance(item, Must):
            return item.text
    return err["msg"][0].lower() + err["msg"][1:].removeprefix("nput should be ")


__all__ = ["GROUPS", "Node", "bindings", "check_schemas", "plain", "problems", "stage_list_problems"]
