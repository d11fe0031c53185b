"""SFT from files (`data=conversations`): multi-turn chats (only the assistant turns carry loss), plain text
(every token carries loss) and prompt-completion pairs (only the completion carries loss).

Rows (JSON lines, Parquet, a `datasets.save_to_disk` folder or a Hub dataset id: read as preference files
are, data_modules/preference_files.py) are in one of TRL's SFT formats (tasks/formats.py, docs/datasets.md):

    {"messages": [...]}                 a chat (`data.messages_key`); roles system, user, assistant, tool
    {"text": "..."}                     language modeling: the text's tokens + eos, every one trained but
                                        the first (bos, or the first text token for a tokenizer without bos)
    {"prompt": "...", "completion": "..."}      prompt tokens (bos + text), completion tokens + eos trained
    {"prompt": [...], "completion": [...]}      a chat: prompt messages then completion messages (a string is a
                                        user / an assistant message); only the completion's assistant turns train

An assistant message may carry `tool_calls` (its content may then be empty or null); a tool message is a
tool's result.

Rendering: the tokenizer's chat template (`apply_chat_template`), or, for a tokenizer without one (model=tiny's
character tokenizer), the plain template `PlainTemplate`:

    <bos>system: {content}\\n user: {content}\\n assistant: {content}<eos> tool: {content}\\n ...

(no spaces between turns; an assistant turn ends with eos, its end-of-turn token; tool calls follow the
content as `tool_calls: <JSON>`.)

One record per conversation. Token boundaries are exact: the conversation's prefixes that end at a turn
boundary are rendered (before each assistant turn with the generation prompt, after it, and after each run
of non-assistant messages, which is cut as one piece: Qwen2.5's template writes consecutive tool results
as one user turn), and each piece's tokens are the difference of consecutive renderings; a template whose renderings are not prefixes of each other (one that
rewrites earlier turns, e.g. drops past reasoning) is refused naming the row. An assistant turn's header
(`<|im_start|>assistant\\n`, the generation prompt) is not trained; its content and its end-of-turn token
(`<|im_end|>`) are; the whitespace the template writes after that token, before the next turn (ChatML's
`\\n`), is not: a policy never samples it (generation stops at the end-of-turn token; `trained_length`).
The record's prompt is everything before the first trained turn's content; its completion is the rest, up to
the last trained turn, with `loss_mask` 1 on trained tokens and 0 on the user/tool/system turns (and untrained
assistant turns) between them.
`last_turn_only: true` trains the last assistant turn alone. Messages after the last assistant turn train
nothing and are dropped.

Every bad row is a DataFileError naming the file and row (`file:line`, or `file row i` for tables); the run
refuses them when it is planned, before a model is built (run/validation/conversation_data.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from transformers import PreTrainedTokenizerBase

from data_modules.base import ExperienceDataModule
from data_modules.experience import ExperienceRecord, Provenance
from data_modules.preference_files import read_rows
from hardware.console import say0
from tasks.base import Task, encode_completion
from tasks.formats import (LANGUAGE_MODELING, PROMPT_COMPLETION, Columns, as_messages, row_format, text_or_messages,
                          trained_length)
from tasks.jsonl import DataFileError

ROLES = ("system", "user", "assistant", "tool")
OPTIONAL_KEYS = ("tool_calls", "name", "tool_call_id")  # kept when present (and not null)
NO_LIMIT = 1_000_000  # tokenizers without a real limit report ~1e30

Render = Callable[[list[dict], bool], list[int]]  # (messages, add_generation_prompt) → token ids; .tokenizer
SFT_FORMATS = (LANGUAGE_MODELING, PROMPT_COMPLETION)


@dataclass
class SftRow:
    """A row as data=conversations trains it: a conversation, or a standard (plain-text) row."""
    messages: list[dict] | None = None  # a chat: a messages row, or a conversational prompt + its completion
    prompt_turns: int = 0               # the chat's assistant turns that belong to the prompt (never trained)
    text: str | None = None             # a standard language-modeling row
    prompt: str | None = None           # a standard prompt-completion row
    completion: str | None = None


def parse_row(loc: str, row: dict, messages_key: str) -> SftRow:
    """The row in the SFT format its columns make, checked; DataFileError naming `loc` otherwise."""
    fmt = row_format(loc, row, SFT_FORMATS, "data=conversations", DataFileError, Columns(messages=messages_key))
    if fmt.name == LANGUAGE_MODELING:
        if messages_key in row:
            return SftRow(messages=parse_conversation(loc, row, messages_key))
        if not isinstance(row["text"], str) or not row["text"].strip():
            raise DataFileError(f"{loc}: 'text' must be a non-empty string, got {_kind(row['text'])}")
        return SftRow(text=row["text"])
    if not fmt.conversational:
        return SftRow(prompt=text_or_messages(loc, "prompt", row, DataFileError),
                      completion=text_or_messages(loc, "completion", row, DataFileError))
    prompt, completion = (as_messages(row["prompt"], "user"), as_messages(row["completion"], "assistant"))
    if not isinstance(prompt, list) or not isinstance(completion, list):
        raise DataFileError(f"{loc}: 'prompt' and 'completion' must be text or message lists")
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in completion):
        raise DataFileError(f"{loc}: the completion has no assistant message: nothing to train on")
    messages = parse_conversation(loc, {"prompt + completion": prompt + completion}, "prompt + completion")
    return SftRow(messages=messages, prompt_turns=sum(m["role"] == "assistant" for m in messages[: len(prompt)]))


# ---------------------------------------------------------------- rows (no tokenizer)
def parse_conversation(loc: str, row: dict, key: str) -> list[dict]:
    """The row's messages, checked and normalised ({role, content} + tool_calls/name/tool_call_id when
    given); raises DataFileError naming `loc`."""
    messages = row.get(key)
    if messages is None:
        raise DataFileError(f"{loc}: no {key!r} list of messages; row has {sorted(row)}")
    if not isinstance(messages, list) or not messages:
        raise DataFileError(f"{loc}: {key!r} must be a non-empty list of {{role, content}} messages, "
                            f"got {_kind(messages)}")
    parsed = [_message(loc, j, m) for j, m in enumerate(messages)]
    if not any(m["role"] == "assistant" for m in parsed):
        raise DataFileError(f"{loc}: no assistant message: nothing to train on")
    return parsed


def _message(loc: str, j: int, m) -> dict:
    if not isinstance(m, dict):
        raise DataFileError(f"{loc}: message {j} must be an object with 'role' and 'content', got {_kind(m)}")
    role = m.get("role")
    if not isinstance(role, str):
        raise DataFileError(f"{loc}: message {j} has no 'role' string")
    if role not in ROLES:
        raise DataFileError(f"{loc}: message {j} has unknown role {role!r} (one of {', '.join(ROLES)})")
    calls = m.get("tool_calls")
    if calls is not None and (role != "assistant" or not isinstance(calls, list)):
        raise DataFileError(f"{loc}: message {j}: 'tool_calls' must be a list, on an assistant message")
    content = m.get("content")
    if content is None and calls:
        content = ""
    if not isinstance(content, str):
        raise DataFileError(f"{loc}: message {j} ({role}) has no 'content' string")
    return {"role": role, "content": content} | {k: m[k] for k in OPTIONAL_KEYS if m.get(k) is not None}


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def read_conversations(path: str, split: str, key: str, messages_key: str) -> list[tuple[str, SftRow]]:
    """[(location, row)] of every row of `path` (the value of config key `key`)."""
    rows = read_rows(path, split, key, error=DataFileError)
    if not rows:
        raise DataFileError(f"{path}: no conversations")
    return [(loc, parse_row(loc, row, messages_key)) for loc, row in rows]


def conversation_split(path: str, heldout_path: str | None, num_heldout: int, split: str, messages_key: str,
                       max_examples: int | None) -> tuple[list, list]:
    """(train, held-out) conversations: held-out from `heldout_path`, else the last `num_heldout` rows of
    `path`; train cut to its first `max_examples` (null: all)."""
    if not path:
        raise DataFileError("data=conversations needs data.path: a .jsonl/.parquet file or a save_to_disk "
                            "folder of {\"messages\": [...]}, {\"text\": ...} or {\"prompt\", \"completion\"} rows")
    train = read_conversations(path, split, "data.path", messages_key)
    if heldout_path:
        heldout = read_conversations(heldout_path, split, "data.heldout_path", messages_key)
    elif num_heldout:
        if num_heldout >= len(train):
            raise DataFileError(f"{path}: data.num_heldout={num_heldout} but only {len(train)} conversations")
        train, heldout = train[: len(train) - num_heldout], train[len(train) - num_heldout:]
    else:
        heldout = []
    return train[:max_examples] if max_examples else train, heldout


# ---------------------------------------------------------------- rendering
class PlainTemplate:
    """The template of a tokenizer without a chat template (see the module docstring), built from ids so
    every rendering is a prefix of the next."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.start = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def turn(self, m: dict) -> list[int]:
        text = m["content"]
        if m.get("tool_calls"):
            text += (" " if text else "") + "tool_calls: " + json.dumps(m["tool_calls"], ensure_ascii=False)
        if m["role"] == "assistant":
            return self._ids(f"assistant: {text}") + [self.tokenizer.eos_token_id]
        return self._ids(f"{m['role']}: {text}\n")

    def __call__(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        ids = self.start + [t for m in messages for t in self.turn(m)]
        return ids + self._ids("assistant: ") if add_generation_prompt else ids


def renderer(tokenizer: PreTrainedTokenizerBase) -> Render:
    """The tokenizer's chat template as a Render, or PlainTemplate when it has none."""
    if not getattr(tokenizer, "chat_template", None):
        return PlainTemplate(tokenizer)
    return ChatTemplate(tokenizer)


class ChatTemplate:
    """The tokenizer's chat template (`apply_chat_template`) as a Render."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer

    def __call__(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@dataclass
class Segment:
    """A turn's tokens: `head` (a run of non-assistant messages, or an assistant turn's header) and, for an
    assistant turn, `body` (its content, tool calls and end-of-turn tokens)."""
    role: str
    head: list[int]
    body: list[int]


def segments(render: Render, messages: list[dict], loc: str) -> list[Segment]:
    """The conversation's tokens cut at its assistant turns, each piece the difference of consecutive
    renderings of the conversation's prefixes: a run of non-assistant messages between two assistant turns
    is one segment (a template may render the run as one turn and close it only at its end, as Qwen2.5's
    does with consecutive tool results), an assistant turn is its header (the prefix with the generation
    prompt) and its body. Raises DataFileError naming `loc` when a rendering does not extend the one
    before it."""
    out, prev, cut, i = [], [], -1, 0  # cut: the last message of the rendering `prev`
    while i < len(messages):
        if messages[i]["role"] == "assistant":
            head = _rendered(render, messages[:i], True, loc, i)
            full = _rendered(render, messages[: i + 1], False, loc, i)
            _extends(prev, head, loc, i - 1, cut, " + the generation prompt", "")
            _extends(head, full, loc, i, i - 1, "", " + the generation prompt")
            out.append(Segment("assistant", head[len(prev):], full[len(head):]))
            end = i
        else:
            end = next((j for j in range(i, len(messages)) if messages[j]["role"] == "assistant"), len(messages)) - 1
            full = _rendered(render, messages[: end + 1], False, loc, end)
            _extends(prev, full, loc, end, cut, "", "")
            out.append(Segment("+".join(dict.fromkeys(m["role"] for m in messages[i: end + 1])), full[len(prev):], []))
        prev, cut, i = full, end, end + 1
    return out


def _rendered(render: Render, messages: list[dict], add_generation_prompt: bool, loc: str, i: int) -> list[int]:
    try:
        return render(messages, add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - a template raises what its author chose (jinja's TemplateError, ...)
        raise DataFileError(f"{loc}: the chat template cannot render messages 0-{i} ({type(e).__name__}: {e})") from None


def _extends(before: list[int], after: list[int], loc: str, i: int, j: int, after_what: str, before_what: str) -> None:
    """`after` (messages 0..i rendered, + `after_what`) must start with `before` (messages 0..j)."""
    if after[: len(before)] != before:
        raise DataFileError(f"{loc}: the chat template's rendering of messages 0-{i}{after_what} does not start "
                            f"with its rendering of messages 0-{j}{before_what} (it rewrites earlier turns), "
                            f"so turn boundaries are not exact; cannot mask by turn")


# ---------------------------------------------------------------- records
def conversation_record(loc: str, row: SftRow | list[dict], render: Render, last_turn_only: bool, index: int,
                        source: str, max_length: int | None = None, limit_source: str = "data.max_length",
                        decode: Callable[[list[int]], str] | None = None) -> ExperienceRecord:
    """One record: prompt = every token before the first trained tokens; completion = the rest up to the last
    trained token, with loss_mask 1 on trained tokens (a chat's trained assistant turns; a text's every
    token but the first; a completion's every token). Raises DataFileError naming `loc` (template problems,
    a row longer than `max_length` tokens)."""
    row = row if isinstance(row, SftRow) else SftRow(messages=row)
    if row.messages is None:
        prompt, completion, mask = _plain_ids(render.tokenizer, row)
    else:
        prompt, completion, mask = _turn_ids(loc, row, render, last_turn_only)
    if not any(mask):
        raise DataFileError(f"{loc}: the assistant turns render to no tokens: nothing to train on")
    n = len(prompt) + len(completion)
    if max_length and n > max_length:
        what = "conversation" if row.messages is not None else "row"
        raise DataFileError(f"{loc}: the {what} is {n:,} tokens after rendering, more than the model's "
                            f"context of {max_length:,} tokens ({limit_source})")
    show = decode or (lambda ids: "")
    return ExperienceRecord(prompt_ids=prompt, completion_ids=completion, loss_mask=mask,
                            provenance=Provenance(source=source, created_step=0, origin=loc), group_id=index,
                            prompt_text=show(prompt), completion_text=show(completion))


def _plain_ids(tokenizer: PreTrainedTokenizerBase, row: SftRow) -> tuple[list[int], list[int], list[int]]:
    """A standard row's (prompt, completion, loss mask): a text's tokens (with bos when the tokenizer adds
    one) + eos, the first the prompt; a prompt's tokens, then the completion's + eos."""
    if row.text is not None:
        ids = tokenizer(row.text)["input_ids"] + [tokenizer.eos_token_id]
        return ids[:1], ids[1:], [1] * (len(ids) - 1)
    completion = encode_completion(tokenizer, row.completion)
    return tokenizer(row.prompt)["input_ids"], completion, [1] * len(completion)


def _turn_ids(loc: str, row: SftRow, render: Render, last_turn_only: bool) -> tuple[list[int], list[int], list[int]]:
    """A chat's (prompt, completion, loss mask): its assistant turns after the prompt's trained."""
    segs = segments(render, row.messages, loc)
    trained = [i for i, s in enumerate(segs) if s.role == "assistant"][row.prompt_turns:]
    trained = trained[-1:] if last_turn_only else trained
    first, last = trained[0], trained[-1]
    prompt = [t for s in segs[:first] for t in s.head + s.body] + segs[first].head
    tokenizer, completion, mask = getattr(render, "tokenizer", None), [], []
    for i in range(first, last + 1):
        s = segs[i]
        head = s.head if i > first else []  # the first trained turn's header ends the prompt
        n = 0 if i not in trained else trained_length(tokenizer, s.body) if tokenizer is not None else len(s.body)
        completion += head + s.body
        mask += [0] * len(head) + [1] * n + [0] * (len(s.body) - n)
    return prompt, completion, mask


def context_limit(tokenizer: PreTrainedTokenizerBase, max_length: int | None) -> int | None:
    """The tokens a conversation may take: data.max_length, capped by the tokenizer's own limit."""
    limit = min(max_length or NO_LIMIT, tokenizer.model_max_length or NO_LIMIT)
    return None if limit >= NO_LIMIT else limit


class ConversationsDataModule(ExperienceDataModule):
    """Offline SFT data from chat files; `heldout_records` feed callbacks/heldout_loss.py."""

    trains_on_task = False  # the task's prompts are not what it trains: callbacks/evaluate.py skips them

    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, batch_size: int, micro_batch_size: int,
                 seed: int, path: str | None, heldout_path: str | None, num_heldout: int, split: str,
                 messages_key: str, last_turn_only: bool, max_examples: int | None, max_length: int | None,
                 source: str):
        super().__init__(task, tokenizer, batch_size, micro_batch_size, seed)
        train, heldout = conversation_split(path, heldout_path, num_heldout, split, messages_key, max_examples)
        render, limit = renderer(tokenizer), context_limit(tokenizer, max_length)
        decode = lambda ids: tokenizer.decode(ids)  # noqa: E731

        def record(i: int, loc: str, row: SftRow) -> ExperienceRecord:
            return conversation_record(loc, row, render, last_turn_only, i, source, limit, decode=decode)
        self.records = [record(i, loc, m) for i, (loc, m) in enumerate(train)]
        self.heldout_records = [record(i, loc, m) for i, (loc, m) in enumerate(heldout)]  # never trained on
        trained = sum(sum(r.loss_mask) for r in self.records)
        chats = all(row.messages is not None for _, row in train)
        what = "conversations" if chats else "rows"
        say0(f"[data] {path}: {len(self.records)} training {what} ({trained:,} {'assistant ' if chats else ''}tokens "
              f"trained{', last turns only' if last_turn_only else ''}), {len(self.heldout_records)} held out")

    def epoch_records(self) -> list[ExperienceRecord]:
        return self.records
