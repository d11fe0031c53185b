"""docs/config/<group>.md from the YAML comments of conf/: one page per config group, a table per choice
(key as written on the command line, default as written in the file, meaning from the comment), plus
docs/config/base.md for conf/train.yaml and docs/config/index.md linking them all.

    python -m scripts.config_docs           # rewrite docs/config/
    python -m scripts.config_docs --check   # exit 1 naming undocumented keys and stale pages

A key's meaning is its inline comment (`key: value  # meaning`, continued on comment lines below at the
same column) or, without one, the comment lines directly above it at the key's own indentation. A file's
opening comment lines describe the choice. Hydra's `_target_`, `_partial_`, `_convert_`, `_recursive_`
need no comment. tests/test_config_docs.py checks that every leaf key has one and that the committed
pages are what this script writes now.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
DOCS = ROOT / "docs" / "config"
HYDRA_KEYS = {"_target_": "what is built: the class or function Hydra instantiates",
              "_partial_": "built as a partial: the code passes the runtime arguments (optimizer, policy, ...)",
              "_convert_": "how the node is passed to the target (all: plain dicts and lists)",
              "_recursive_": "whether nested nodes are instantiated first"}
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w\-.]*|'[^']*'|\"[^\"]*\"):(?:\s+(?P<rest>.*))?$")
BLOCK_SCALAR = re.compile(r"^[|>][-+]?\d*$")


@dataclass
class Entry:
    key: str                  # dotted, relative to the file's package
    value: str                # as written ("" for a mapping)
    comment: str              # the meaning ("" when none)
    mapping: bool = False     # a node with keys below it (not a leaf)
    line: int = 0


@dataclass
class ConfigFile:
    path: Path
    package: str              # "" for _global_
    description: str
    defaults: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)


def split_comment(text: str) -> tuple[str, str, int]:
    """(value, comment, column of '#' in `text` or -1): a '#' after whitespace, outside quotes."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"" and (i == 0 or text[i - 1] in " [{,:"):
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip(), text[i + 1:].strip(), i
    return text.rstrip(), "", -1


def parse(path: Path, package: str, skip_hydra: bool = False) -> ConfigFile:
    """The file's keys with their values and comments (a line parser for the block YAML in conf/);
    `skip_hydra`: leave out the `hydra:` node (train.yaml's Hydra settings, documented by Hydra)."""
    lines = path.read_text().splitlines()
    header, i = [], 0
    while i < len(lines) and lines[i].lstrip().startswith("#"):  # the opening comment block
        text = lines[i].strip().lstrip("#").strip()
        if text.startswith("@package"):
            package = text.split(None, 1)[1].strip()
        else:
            header.append(text)
        i += 1
    cfg = ConfigFile(path, "" if package == "_global_" else package.removeprefix("_global_."), " ".join(header))
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    above: list[tuple[int, str]] = []  # comment-only lines since the last key line: (column, text)
    last, last_column = None, -1       # the previous key and its inline comment's column (continuations)
    sequence: tuple[Entry, int] | None = None   # a key whose value is a block sequence, and its indent
    in_defaults = False
    while i < len(lines):
        raw = lines[i]
        i += 1
        stripped = raw.strip()
        if not stripped:
            above, last = [], None
            continue
        column = len(raw) - len(raw.lstrip())
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if last is not None and column == last_column:
                last.comment = f"{last.comment} {text}"  # the inline comment continues
            else:
                above.append((column, text))
                last = None
            continue
        last = None
        if in_defaults and stripped.startswith("- "):
            cfg.defaults.append(split_comment(stripped[2:])[0])
            continue
        if sequence is not None and column > sequence[1]:  # inside a block sequence: part of its value
            owner, (item, note, _) = sequence[0], split_comment(stripped)
            owner.value = f"{owner.value}\n{' ' * (column - sequence[1] - 2)}{item}".strip("\n")
            owner.comment = f"{owner.comment} {note}".strip()  # a comment on an item: more of the key's meaning
            above = []
            continue
        sequence = None
        match = KEY.match(raw)
        if match is None:  # a line of a multi-line flow value: kept out of the docs
            continue
        indent, key = len(match["indent"]), match["key"].strip("'\"")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        value, comment, hash_col = split_comment(match["rest"] or "")
        in_defaults = not stack and key == "defaults"
        dotted = ".".join([k for _, k in stack] + [key])
        comment = comment or " ".join(t for c, t in above if c == indent)
        above = []
        if in_defaults:
            continue
        if BLOCK_SCALAR.match(value):  # a multi-line string: its lines are the value
            block = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                block.append(lines[i].strip())
                i += 1
            value = "\n".join(block).strip()
        if skip_hydra and dotted.split(".")[0] == "hydra":
            if not value:
                stack.append((indent, key))
            continue
        mapping = value == "" and _next_is_deeper_key(lines, i, indent)
        entry = Entry(dotted, value, comment.strip(), mapping, i)
        cfg.entries.append(entry)
        if mapping:
            stack.append((indent, key))
        elif value == "":
            sequence = (entry, indent)
        if hash_col >= 0:
            last, last_column = entry, match.start("rest") + hash_col
    return cfg


def _next_is_deeper_key(lines: list[str], i: int, indent: int) -> bool:
    """Whether the lines after a `key:` with no value open a mapping (keys deeper than `indent`)."""
    for raw in lines[i:]:
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        return len(raw) - len(raw.lstrip()) > indent and not stripped.startswith("- ")
    return False


def undocumented(cfg: ConfigFile) -> list[str]:
    """`file:line key` for every leaf key without a comment (Hydra's own keys need none)."""
    where = cfg.path.relative_to(ROOT) if cfg.path.is_relative_to(ROOT) else cfg.path
    return [f"{where}:{e.line} {e.key}" for e in cfg.entries
            if not e.mapping and not e.comment and e.key.rsplit(".", 1)[-1] not in HYDRA_KEYS]


def groups() -> dict[str, list[Path]]:
    """Config group (conf/<group>/, nested ones as a/b) → its choices' files."""
    out = {}
    for d in sorted(p for p in CONF.rglob("*") if p.is_dir()):
        files = sorted(d.glob("*.yaml"))
        if files:
            out[d.relative_to(CONF).as_posix()] = files
    return out


def package_of(group: str) -> str:
    return group.replace("/", ".")


def full_key(cfg: ConfigFile, key: str) -> str:
    return f"{cfg.package}.{key}" if cfg.package else key


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _code(text: str) -> str:
    if text == "":
        return ""
    return "<br>".join(f"`` {line.replace('|', chr(92) + '|')} ``" for line in text.splitlines())


def table(cfg: ConfigFile) -> list[str]:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for e in cfg.entries:
        meaning = e.comment or HYDRA_KEYS.get(e.key.rsplit(".", 1)[-1], "")
        default = "*(node)*" if e.mapping else _code(e.value)
        rows.append(f"| `{full_key(cfg, e.key)}` | {default} | {_cell(meaning)} |")
    return rows


def page(group: str, files: list[Path]) -> str:
    title = "the base config (conf/train.yaml)" if group == "base" else f"`{group}`"
    out = [f"# Config group {title}" if group != "base" else f"# {title[0].upper()}{title[1:]}", "",
           "Generated from the YAML comments by `python -m scripts.config_docs`; do not edit by hand.", ""]
    if group != "base":
        choices = ", ".join(f"[`{f.stem}`](#{f.stem.replace('_', '_')})" for f in files)
        out += [f"Choose one on the command line: `{group}=<choice>`. Choices: {choices}.", ""]
    for f in files:
        cfg = parse(f, "_global_" if group == "base" else package_of(group), skip_hydra=group == "base")
        if group != "base":
            out += [f"## {f.stem}", ""]
        out += [f"`{f.relative_to(ROOT)}`" + (f" · package `{cfg.package or '_global_'}`")
                + (f" · defaults list: {', '.join(f'`{d}`' for d in cfg.defaults)}" if cfg.defaults else ""), ""]
        if cfg.description:
            out += [_cell(cfg.description), ""]
        out += table(cfg) if cfg.entries else ["*(no keys)*"]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def pages() -> dict[Path, str]:
    """Every page this script writes, by path."""
    found = groups()
    out = {DOCS / "base.md": page("base", [CONF / "train.yaml"])}
    for group, files in found.items():
        out[DOCS / f"{group.replace('/', '_')}.md"] = page(group, files)
    index = ["# Config reference", "",
             "Every key of every config group, with its default and meaning, generated from the YAML comments "
             "of `conf/` by `python -m scripts.config_docs` (tests/test_config_docs.py keeps it current).", "",
             "| group | choices | page |", "|---|---|---|",
             "| *(base)* | `conf/train.yaml` | [base.md](base.md) |"]
    for group, files in found.items():
        name = f"{group.replace('/', '_')}.md"
        index.append(f"| `{group}` | {', '.join(f'`{f.stem}`' for f in files)} | [{name}]({name}) |")
    out[DOCS / "index.md"] = "\n".join(index) + "\n"
    return out


def all_undocumented() -> list[str]:
    base = [undocumented(parse(CONF / "train.yaml", "_global_", skip_hydra=True))]
    return [u for us in base + [undocumented(parse(f, package_of(g))) for g, fs in groups().items() for f in fs]
            for u in us]


def main(argv: list[str]) -> int:
    wanted = pages()
    if "--check" in argv:
        missing = all_undocumented()
        stale = [str(p.relative_to(ROOT)) for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
        for m in missing:
            print(f"undocumented: {m}")
        for s in stale:
            print(f"stale: {s} (run: python -m scripts.config_docs)")
        return 1 if missing or stale else 0
    DOCS.mkdir(parents=True, exist_ok=True)
    for p in DOCS.glob("*.md"):
        if p not in wanted:
            p.unlink()
    for p, text in wanted.items():
        p.write_text(text)
    print(f"wrote {len(wanted)} pages into {DOCS.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
