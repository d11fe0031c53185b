"""TRL's dataset formats, told apart by a row's columns, and the checks and encodings every reader shares
(tasks/jsonl.py, data_modules/conversations.py, data_modules/preference_files.py; docs/datasets.md is the
table of which data source takes which format):

    language modeling     {text}                          {messages: [...]}
    prompt-only           {prompt}                        {prompt: [...]}
    prompt-completion     {prompt, completion}            {prompt: [...], completion: [...]}
    preference            {prompt, chosen, rejected}      the same with message lists; or {chosen, rejected}
                                                          whole conversations (the "implicit prompt")
    unpaired preference   {prompt, completion, label}     the same with message lists; label a boolean

Each text is standard (a string) or conversational (a list of {"role": ..., "content": ...} messages, which
the tokenizer's chat template renders: a prompt with the generation prompt appended, a completion as the
template's continuation of its prompt). A row that fits none of the formats its data source takes is refused
in one line naming `file:line` (or `file row i`) and the formats expected.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LANGUAGE_MODELING, PROMPT_ONLY, PROMPT_COMPLETION = "language modeling", "prompt-only", "prompt-completion"
PREFERENCE, UNPAIRED = "preference", "unpaired preference"
SHAPES = {LANGUAGE_MODELING: "{text} or {messages}", PROMPT_ONLY: "{prompt}",
          PROMPT_COMPLETION: "{prompt, completion}", PREFERENCE: "{prompt, chosen, rejected}",
          UNPAIRED: "{prompt, completion, label}"}
DOC = "docs/datasets.md"


@dataclass(frozen=True)
class Columns:
    """The column names each field is read from (TRL's names by default; preference data renames them with
    data.columns, the jsonl task its prompt with task.prompt_key)."""
    prompt: str = "prompt"
    completion: str = "completion"
    chosen: str = "chosen"
    rejected: str = "rejected"
    label: str = "label"
    text: str = "text"
    messages: str = "messages"


@dataclass(frozen=True)
class RowFormat:
    name: str             # one of SHAPES
    conversational: bool  # a message list in any of its text columns


def detect(row: dict, c: Columns = Columns()) -> str | None:
    """The format a row's columns make, or None (the most specific first: a preference row has a prompt too)."""
    if c.chosen in row and c.rejected in row:
        return PREFERENCE
    if c.completion in row and c.label in row:
        return UNPAIRED
    if c.prompt in row:
        return PROMPT_COMPLETION if c.completion in row else PROMPT_ONLY
    if c.text in row or c.messages in row:
        return LANGUAGE_MODELING
    return None


def shape(name: str, c: Columns = Columns()) -> str:
    """A format's columns as the data source names them, e.g. "{prompt, chosen, rejected}"."""
    if name == LANGUAGE_MODELING:
        return f"{{{c.text}}} or {{{c.messages}}}"
    return "{" + ", ".join(col for col in _text_columns(name, c) + ((c.label,) if name == UNPAIRED else ())) + "}"


def _text_columns(name: str, c: Columns) -> tuple[str, ...]:
    return {LANGUAGE_MODELING: (c.text, c.messages), PROMPT_ONLY: (c.prompt,), PROMPT_COMPLETION: (c.prompt, c.completion),
            PREFERENCE: (c.prompt, c.chosen, c.rejected), UNPAIRED: (c.prompt, c.completion)}[name]


def row_format(loc: str, row: dict, accepted: tuple[str, ...], taker: str, error: type[Exception],
               c: Columns = Columns()) -> RowFormat:
    """The row's format, if `taker` (the data source, e.g. "data=conversations") accepts it; else `error`
    naming `loc`, what the row is and the formats expected."""
    name = detect(row, c)
    if name not in accepted:
        what = f"a {name} row" if name else f"a row of no dataset format (columns {sorted(row)})"
        want = " or ".join(f"{a} {shape(a, c)}" for a in accepted)
        raise error(f"{loc}: {what}; {taker} takes {want} rows (see {DOC})")
    return RowFormat(name, any(isinstance(row.get(k), list) for k in _text_columns(name, c)))


def text_or_messages(loc: str, key: str, row: dict, error: type[Exception]):
    """row[key] checked: a non-empty string, or a non-empty list of {"role": str, "content": str} messages
    with some content; anything else raises `error` naming `loc` and the column."""
    value = row.get(key)
    if isinstance(value, str):
        if not value.strip():
            raise error(f"{loc}: {key!r} is empty")
        return value
    if isinstance(value, list):
        if not value:
            raise error(f"{loc}: {key!r} is an empty message list")
        for m in value:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise error(f"{loc}: {key!r} must be text or a list of {{'role': str, 'content': str}} messages, got {m!r}")
        if not any(m["content"].strip() for m in value):
            raise error(f"{loc}: {key!r} has only empty messages")
        return [{"role": m["role"], "content": m["content"]} for m in value]
    if value is None:
        raise error(f"{loc}: {key!r} is missing or null")
    raise error(f"{loc}: {key!r} must be text or chat messages, got {type(value).__name__}")


def as_messages(value, role: str) -> list[dict]:
    """A conversational value as is; a string as one message of `role`."""
    return value if isinstance(value, list) else [{"role": role, "content": value}]


def flatten(value) -> str:
    """A text as shown to rewards and logs: the string, or a message list's `role: content` lines (a lone
    message's content alone)."""
    if isinstance(value, str):
        return value
    if len(value) == 1:
        return value[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in value)


def has_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool,
             tools: list[dict] | None = None) -> list[int]:
    """The chat template's token ids for `messages`."""
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def encode_completion_after(tokenizer: PreTrainedTokenizerBase, loc: str, prompt, prompt_ids: list[int],
                            completion, error: type[Exception]) -> list[int]:
    """A conversational completion's ids: the template's rendering of prompt + completion (as the assistant)
    after the prompt's own rendering (with the generation prompt), which must be its prefix."""
    full = chat_ids(tokenizer, as_messages(prompt, "user") + as_messages(completion, "assistant"), False)
    if full[: len(prompt_ids)] != prompt_ids or len(full) == len(prompt_ids):
        raise error(f"{loc}: the chat template does not render the completion as a continuation of the prompt; "
                    f"cannot split prompt and completion")
    return full[len(prompt_ids):]


def trained_length(tokenizer: PreTrainedTokenizerBase, body: list[int]) -> int:
    """How many of an assistant turn's tokens train: up to and including its end-of-turn token (the last
    special token, e.g. ChatML's <|im_end|>); the whitespace the template writes after it before the next
    turn (ChatML's "\n") is not trained, since a policy never samples it: generation stops at the end-of-turn
    token and the next turn's header (the template's generation prompt, `<|im_start|>assistant\n`) follows
    it. A turn with no special token, or with more than whitespace after its last one, trains whole."""
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    ends = [i for i, t in enumerate(body) if t in special]
    if not ends or ends[-1] == len(body) - 1:
        return len(body)
    return ends[-1] + 1 if not tokenizer.decode(body[ends[-1] + 1:]).strip() else len(body)
