"""What every task provides: train and held-out examples with reference answers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: unpickling an Example (a reward worker process) needs no transformers
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, hash=False, compare=False)
    # a conversational row's message lists (tasks/formats.py): the prompt rendered with the chat template
    # (`prompt` then holds its text as rewards see it), the completion whose content `answer` holds
    messages: list[dict] | None = field(default=None, hash=False, compare=False)
    completion_messages: list[dict] | None = field(default=None, hash=False, compare=False)


@dataclass
class Task:
    """A named set of examples. `chat=True` formats prompts with the tokenizer's chat template."""

    name: str
    train: list[Example]
    heldout: list[Example]
    chat: bool = False
    chat_why: str = "task.chat=true"  # what asked for the chat template (a conversational row names itself)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, chat: bool,
                  tools: list[dict] | None = None) -> list[int]:
    """Prompt text → token ids, through the chat template when asked (with the generation prompt; `tools`:
    JSON schemas the template lists, for a chat tool environment)."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("task.chat=true but the tokenizer has no chat template")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], tools=tools,
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(text)["input_ids"]


def encode_example(tokenizer: PreTrainedTokenizerBase, ex: Example, chat: bool,
                   tools: list[dict] | None = None) -> list[int]:
    """An example's prompt ids: a conversational prompt's messages through the chat template (with the
    generation prompt), else encode_prompt of its text."""
    if ex.messages is None:
        return encode_prompt(tokenizer, ex.prompt, chat, tools)
    from tasks.formats import chat_ids, has_template
    if not has_template(tokenizer):
        raise ValueError(f"{ex.meta.get('origin', 'a task row')}: a conversational prompt but the tokenizer "
                         f"has no chat template")
    return chat_ids(tokenizer, ex.messages, True, tools)


def encode_completion(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Completion text → ids, with eos appended (no bos)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
