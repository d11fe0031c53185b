"""The `python train.py ...` commands that README.md and docs/*.md show in code blocks, as the user would
paste them, and the same commands made runnable here (tests/test_docs.py): files the user brings are
replaced by small fixtures, sweeps by their first job, launchers and output folders dropped.

    commands()                      -> [Documented(page, line, text, args)]
    runnable(args, fixtures)        -> the overrides to plan (or None: the command needs what a test lacks)
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
ENTRY = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:\S*python \S*train\.py|torchrun (?:--\S+ (?:\d+ )?)*train\.py|policyshift)\b")


@dataclass(frozen=True)
class Documented:
    page: str       # README.md, docs/experience.md, ...
    line: int       # 1-based line of the command's first line
    text: str       # the command as shown (continuations joined, comment dropped)
    args: tuple     # the overrides after train.py
    env: tuple = ()  # VAR=value words before the command (HF_HUB_OFFLINE=0 python train.py ...)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a `#` outside quotes, after whitespace)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _closed(text: str) -> bool:
    try:
        shlex.split(text)
        return True
    except ValueError:  # a quoted value that runs on to the next line
        return False


def _after_entry(text: str) -> tuple[list[str], list[str]]:
    """(the overrides after train.py, the VAR=value words before the command)."""
    words = shlex.split(text)
    i = next(i for i, w in enumerate(words) if w.endswith("train.py") or w == "policyshift")
    return words[i + 1:], [w for w in words[:i] if re.match(r"^[A-Z_]+=", w)]


def commands(pages: list[Path] = PAGES) -> list[Documented]:
    found = []
    for page in pages:
        lines, fence = page.read_text().splitlines(), None
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if m:
                fence = None if fence is not None else (m[1] or "text")
                i += 1
                continue
            if fence in ("bash", "sh", "console") and ENTRY.match(lines[i].strip()):
                start, raw = i, lines[i].strip()
                text = _strip_comment(raw)
                while (text.endswith("\\") or not _closed(text)) and i + 1 < len(lines):
                    i += 1
                    raw = (text.removesuffix("\\").rstrip() if text.endswith("\\") else raw) + " " + lines[i].strip()
                    text = _strip_comment(raw)
                rel = page.relative_to(ROOT).as_posix()
                args, env = _after_entry(text)
                found.append(Documented(rel, start + 1, text, tuple(args), tuple(env)))
            i += 1
    return found


SWEEP = re.compile(r"^([\w./+~-]+)=([^'\"\[{(]*,[^'\"\[{(]*)$")  # key=a,b,c (not inside brackets or quotes)
DROPPED = ("hydra.", "hydra/", "-m", "--multirun", "resume_allow_changes")


def runnable(args: tuple, fixtures: dict[str, str]) -> list[str] | str:
    """The overrides a test can plan: a sweep's first job, no launcher or output-folder keys, the user's files
    and models replaced by `fixtures` (keys: jsonl, prefs, chats, model, reward_fn). A string: why it cannot be
    planned alone (it continues a run, or replays the store an earlier command writes)."""
    out = []
    for arg in args:
        if arg in ("-m", "--multirun") or arg.startswith(DROPPED[:2]):
            continue
        if arg == "resume=true":
            return "continues a run (resume=true)"
        if arg.startswith("data.harvest="):
            return "replays the experience store an earlier command writes (data.store=...)"
        m = SWEEP.match(arg)
        if m:
            arg = f"{m[1]}={m[2].split(',')[0]}"
        key, _, value = arg.partition("=")
        if key in ("task.train_path", "task.heldout_path"):
            arg = f"{key}={fixtures['jsonl']}"
        elif key == "data.path":
            arg = f"{key}={fixtures['chats'] if 'data=conversations' in args else fixtures['prefs']}"
        elif key in ("model.name_or_path", "data.synthetic.checkpoint"):
            arg = f"{key}={fixtures['model']}"
        elif "name_or_path: " in value:  # a model folder inside a node: reward.model={..., name_or_path: X}
            arg = re.sub(r"name_or_path: [^,}]+", f"name_or_path: {fixtures['model']}", arg)
        elif key == "reward.fn._target_":
            arg = f"{key}={fixtures['reward_fn']}"
        elif key == "seed" and not value.isdigit():
            arg = "seed=1"
        elif key == "algorithm" and value.startswith("<"):
            arg = "algorithm=dpo"
        out.append(arg)
    return out
