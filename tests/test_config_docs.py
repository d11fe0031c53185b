"""docs/config/*.md (scripts/config_docs.py): every key of every config group has a comment in its YAML,
the line parser finds exactly the keys YAML loads, and the committed pages are what the generator
writes now (after changing conf/, run `python -m scripts.config_docs`)."""
from __future__ import annotations

import textwrap

import pytest
import yaml

from scripts import config_docs
from scripts.config_docs import CONF, DOCS, ROOT, all_undocumented, groups, package_of, pages, parse

# conf/logger/* is being reworked with the W&B change (docs/wandb.md); its keys get their comments there.
AWAITING_COMMENTS: set[str] = set()  # keys allowed to lack a comment: none
FILES = [(CONF / "train.yaml", "_global_", True)] + [(f, package_of(g), False) for g, fs in groups().items() for f in fs]


def test_every_leaf_key_has_a_comment():
    missing = {" ".join((where.split(":")[0], key)) for where, key in (m.split(" ") for m in all_undocumented())}
    assert missing <= AWAITING_COMMENTS, "add a comment (inline or on the line above) to:\n" + "\n".join(
        sorted(all_undocumented()))


def yaml_keys(node, prefix: str, leaves: set[str]) -> set[str]:
    """Every dotted key YAML loads, not descending into a node the parser reads as one value ({a: b})."""
    out = set()
    for key, value in (node or {}).items():
        dotted = f"{prefix}{key}"
        out.add(dotted)
        if isinstance(value, dict) and dotted not in leaves:
            out |= yaml_keys(value, f"{dotted}.", leaves)
    return out


@pytest.mark.parametrize("path, package, base", FILES, ids=[str(f.relative_to(CONF)) for f, _, _ in FILES])
def test_the_parser_finds_exactly_the_keys_yaml_loads(path, package, base):
    cfg = parse(path, package, skip_hydra=base)
    found = {e.key for e in cfg.entries}
    loaded = yaml.safe_load(path.read_text()) or {}
    loaded = {k: v for k, v in loaded.items() if k != "defaults" and not (base and k == "hydra")}
    assert found == yaml_keys(loaded, "", {e.key for e in cfg.entries if not e.mapping})
    assert [d.split(":")[0].split()[-1] for d in cfg.defaults] == [
        (next(iter(d)) if isinstance(d, dict) else d).split()[-1] for d in yaml.safe_load(path.read_text()).get("defaults", [])]


def test_comments_inline_continued_and_above(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(textwrap.dedent("""\
        # @package algorithm.scheduler
        # What this choice does,
        # in two lines.
        defaults:
          - base      # not a key
          - _self_
        a: 1          # the meaning of a,
                      # continued below it
        # b's meaning, on the line above
        b: "x # not a comment"
        node:         # a mapping's own comment
          # c's meaning, above at c's indent
          c: [1, 2]
          d: {e: f}   # a flow mapping: one value
        items:        # a block sequence: one value
          - one       # with an item comment
          - two
        e: null
        """))
    cfg = parse(path, "scheduler")
    assert cfg.package == "algorithm.scheduler" and cfg.description == "What this choice does, in two lines."
    assert cfg.defaults == ["base", "_self_"]
    got = {e.key: (e.value, e.comment, e.mapping) for e in cfg.entries}
    assert got == {"a": ("1", "the meaning of a, continued below it", False),
                   "b": ('"x # not a comment"', "b's meaning, on the line above", False),
                   "node": ("", "a mapping's own comment", True),
                   "node.c": ("[1, 2]", "c's meaning, above at c's indent", False),
                   "node.d": ("{e: f}", "a flow mapping: one value", False),
                   "items": ("- one\n- two", "a block sequence: one value with an item comment", False),
                   "e": ("null", "", False)}
    assert config_docs.undocumented(cfg) == [f"{path}:18 e"]


def test_the_committed_pages_are_what_the_generator_writes():
    wanted = pages()
    stale = [str(p.relative_to(ROOT)) for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    extra = sorted(str(p.relative_to(ROOT)) for p in DOCS.glob("*.md") if p not in wanted)
    assert not stale and not extra, f"run: python -m scripts.config_docs (stale: {stale}, not generated: {extra})"
    assert {p.name for p in wanted} >= {"index.md", "base.md", "algorithm.md", "scheduler.md", "callbacks.md"}
    scheduler = (DOCS / "scheduler.md").read_text()
    assert "| `algorithm.scheduler.num_training_steps` | `` ${trainer.max_steps} `` |" in scheduler
