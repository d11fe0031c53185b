"""The house's rules (../shared/DESIGN.md §2), read from the imports themselves (every `import` and
`from ... import`, at any depth of a function), so a change that breaks one fails here with the file,
line and import named:

- imports run one way: policyshift (the Python API) → train.py → run → callbacks → trainers →
  {data_modules, rewards, envs} → tasks → generators → models → hardware → losses; `hardware` may be used by every layer above losses;
- data_modules/, rewards/ and envs/ do not import each other;
- losses/ imports only torch (and the standard library);
- no import cycles between the project's modules.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = [("policyshift",), ("train",), ("run",), ("callbacks",), ("trainers",), ("data_modules", "rewards", "envs"),
          ("tasks",), ("generators",), ("models",), ("hardware",), ("losses",)]
RANK = {package: i for i, layer in enumerate(LAYERS) for package in layer}
LOSSES_MAY_IMPORT = {"losses", "torch", "__future__"} | set(sys.stdlib_module_names)


def project_files(root: Path) -> dict[str, Path]:
    """Module name → file, for train.py and every package of the layers found under `root`."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[0] not in RANK:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    return files


def imports_of(path: Path, modules: dict[str, Path]) -> list[tuple[int, str, str]]:
    """(line, module imported as written, project module it resolves to or "") for each import in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, _resolve(a.name, modules)) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:  # `from hardware import distributed` imports the module hardware.distributed
                sub = f"{node.module}.{a.name}"
                found.append((node.lineno, sub if sub in modules else node.module,
                              sub if sub in modules else _resolve(node.module, modules)))
    return sorted(set(found))


def _resolve(name: str, modules: dict[str, Path]) -> str:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def violations(root: Path = ROOT) -> list[str]:
    """Every broken rule under `root`, one line each: `file:line: import X: why`."""
    modules = project_files(root)
    problems, graph = [], {name: set() for name in modules}
    for name, path in modules.items():
        package = name.split(".")[0]
        for line, written, target in imports_of(path, modules):
            where = f"{path.relative_to(root)}:{line}: import {written}"
            top = written.split(".")[0]
            if package == "losses" and top not in LOSSES_MAY_IMPORT:
                problems.append(f"{where}: losses/ imports only torch and the standard library")
            if not target:
                continue
            graph[name].add(target)
            other = target.split(".")[0]
            if other != package and RANK[other] == RANK[package]:
                problems.append(f"{where}: {package}/ and {other}/ do not import each other "
                                f"(pass the object in, or move what both need down a layer)")
            elif RANK[other] < RANK[package]:
                problems.append(f"{where}: {package}/ may not import {other}/, a layer above it "
                                f"(order: {' → '.join('/'.join(layer) for layer in LAYERS)})")
    problems += [f"import cycle: {' → '.join(cycle)}" for cycle in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path of module names) per strongly connected group of modules (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                found.append(_closed_path(graph, set(group), min(group)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _closed_path(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """The shortest path start → ... → start inside `group` (breadth first)."""
    paths, frontier = {start: [start]}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return [start, start]


def test_the_project_keeps_the_import_rules():
    problems = violations()
    assert not problems, "\n".join(problems)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_each_kind_of_broken_rule_is_named_with_its_file_and_line(tmp_path):
    root = _tree(tmp_path, {
        "train.py": "from run import stages\n",
        "run/__init__.py": "", "run/stages.py": "from trainers.base import Module\n",
        "trainers/__init__.py": "", "trainers/base.py": "class Module: ...\n",
        "models/__init__.py": "",
        "models/forward.py": "import os\n\ndef f():\n    from trainers import base\n",  # upward, in a function
        "data_modules/__init__.py": "", "data_modules/buffer.py": "from rewards.verifier import Verifier\n",
        "rewards/__init__.py": "", "rewards/verifier.py": "class Verifier: ...\n",
        "losses/__init__.py": "", "losses/kl.py": "import numpy\nimport math\nimport torch\n",
        "tasks/__init__.py": "", "tasks/a.py": "from tasks.b import x\n", "tasks/b.py": "from tasks.a import y\n",
    })
    problems = violations(root)
    assert len(problems) == 4, problems
    assert problems[0].startswith("data_modules/buffer.py:1: import rewards.verifier: data_modules/ and rewards/")
    assert problems[1].startswith("losses/kl.py:1: import numpy: losses/ imports only torch")
    assert problems[2].startswith("models/forward.py:4: import trainers.base: models/ may not import trainers/")
    assert problems[3] == "import cycle: tasks.a → tasks.b → tasks.a"


def test_importing_a_lower_layer_or_hardware_is_allowed(tmp_path):
    root = _tree(tmp_path, {
        "train.py": "import run.stages\n",
        "run/__init__.py": "", "run/stages.py": "from callbacks import log\nfrom hardware import distributed\n",
        "callbacks/__init__.py": "", "callbacks/log.py": "from trainers import base\n",
        "trainers/__init__.py": "", "trainers/base.py": "from data_modules import buffer\nfrom losses import kl\n",
        "data_modules/__init__.py": "", "data_modules/buffer.py": "from tasks.base import Task\n",
        "tasks/__init__.py": "", "tasks/base.py": "from generators.hf import HFGenerator\n",
        "generators/__init__.py": "", "generators/hf.py": "from models.forward import f\n",
        "models/__init__.py": "", "models/forward.py": "from hardware.sharding import is_sharded\n",
        "hardware/__init__.py": "", "hardware/sharding.py": "import torch\n", "hardware/distributed.py": "",
        "losses/__init__.py": "", "losses/kl.py": "import torch\n",
    })
    assert violations(root) == []
