"""README.md and docs/*.md stay true: every relative link resolves, no page cites a file the repository
lacks, the numbers they quote match the configs they describe, the W&B names they show are the ones runs
produce, and every `python train.py ...` command they show plans (composes and validates every stage) as
pasted, with the user's own files replaced by small fixtures (tests/documented_commands.py). The commands
that promise learning run with `-m slow` (tests/test_docs_learning.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from run.stages import plan_stages
from tests.documented_commands import PAGES, ROOT, commands, runnable

LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|sh|txt|toml))`")  # `dir/file.ext` in backticks
TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:|^#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_of_the_repository(page):
    broken = [t for t in _relative_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: links to files that do not exist: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_cites_a_file_the_repository_lacks(page):
    """A path in backticks whose first folder is one of the repository's names a file that is here; no page
    cites the project's design notes, which are not part of the repository."""
    text = page.read_text()
    missing = [c for c in CITED.findall(text) if c.split("/")[0] in TOP and not (ROOT / c).exists()]
    assert not missing, f"{page.relative_to(ROOT)} cites files that are not in the repository: {missing}"
    assert "DESIGN" not in text, f"{page.relative_to(ROOT)} cites DESIGN.md, which is not in the repository"


# ---------------------------------------------------------------------------------------------------------
# every documented command plans

DOCUMENTED = commands()
ELSEWHERE = re.compile(r"torch sees no CUDA GPU|needs the vllm package|deepspeed is not installed")  # not the docs' fault


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """Small stand-ins for what the user brings: prompts + answers, preference pairs, chats, a model folder."""
    from models.synthetic import write_qwen_like
    from tests.helpers import CHAT_MODEL
    d = tmp_path_factory.mktemp("user_files")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n"
                                             for a in range(300)))
    (d / "prefs.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+1=", "chosen": str(a + 1),
                                                       "rejected": str(a)}) + "\n" for a in range(300)))
    chat = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]
    (d / "chats.jsonl").write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(300)))
    write_qwen_like(d / "model", seed=0, tokenizer="bpe", **(CHAT_MODEL | {"max_position_embeddings": 1024}))
    (d / "store").mkdir()
    return {"store": str(d / "store"), "jsonl": str(d / "prompts.jsonl"), "prefs": str(d / "prefs.jsonl"), "chats": str(d / "chats.jsonl"),
            "model": str(d / "model"), "reward_fn": "tests.helpers.char_sum_scores"}


def test_the_pages_show_commands():
    pages = {c.page for c in DOCUMENTED}
    assert "README.md" in pages and len(DOCUMENTED) >= 30, sorted(pages)


@pytest.mark.parametrize("doc", DOCUMENTED, ids=lambda c: c.where)
def test_documented_command_plans(doc, fixtures, hydra_conf):
    """The command composes and every stage validates, as train.py plans it before building a model."""
    overrides = runnable(doc.args, fixtures)
    if overrides is None:
        pytest.skip(f"{doc.where}: continues a run (resume=true)")
    try:
        stages = plan_stages(hydra_conf(overrides), overrides)
    except Exception as e:  # noqa: BLE001  (any failure: name the page, the line and the command)
        if ELSEWHERE.search(str(e)):
            pytest.skip(f"{doc.where} needs what this machine lacks: {ELSEWHERE.search(str(e))[0]}")
        pytest.fail(f"{doc.where}: `{doc.text}` does not plan: {type(e).__name__}: {e}")
    assert stages, doc.where
