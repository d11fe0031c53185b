"""Which keys of a composed config no schema declares (tests/run/test_schema_coverage.py walks every
config file in conf/ through it, so a node or key added without a schema fails that test). A key is
covered when the schema its node is checked against names it; a node is covered when it has a schema
(its group's, a callback's, a tool's, a logger's: `bindings`); a value a schema types as a free mapping
(a DeepSpeed config, vLLM's engine arguments) is covered as a whole."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from run.validation.schemas import bindings
from run.validation.schemas import _fields, _model_in

def uncovered(cfg: DictConfig) -> list[str]:
    """Every key of `cfg` (dotted) that no schema declares."""
    def read(node):
        return OmegaConf.to_container(node, resolve=False)
    bound = bindings(cfg, read)
    prefixes = [prefix for prefix, _, _ in bound]
    out = []
    for prefix, schema, values in bound:
        out += _walk(schema, values, prefix, prefixes)
    return sorted(set(out))


def _walk(schema, values: dict, prefix: str, prefixes: list[str]) -> list[str]:
    if schema is None:
        return [prefix.rstrip(".") or "(top level)"]
    fields, out = _fields(schema), []
    for key, value in values.items():
        path = prefix + str(key)
        if str(key) not in fields:
            out.append(path)
        elif isinstance(value, dict) and not any(p.startswith(path + ".") for p in prefixes):
            inner = _model_in(fields[str(key)].annotation)
            if inner is not None:
                out += _walk(inner, value, path + ".", prefixes)
    return out
