"""A stage's conversation files (`data=conversations`), read and rendered at plan time, before any model is
built: a row that is not JSON, has no `messages`, a message without role or content or with an unknown role,
no assistant turn, a chat template that rewrites earlier turns, or a conversation longer than the model's
context once rendered is refused naming the key, the file and the row. The rows are parsed and rendered as
the data module does (data_modules/conversations.py), with the stage's tokenizer alone (run/validation/data.py
builds or reads it, no weights)."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from data_modules.conversations import context_limit, conversation_record, conversation_split, renderer
from run.errors import ConfigError
from run.validation.data import plan_tokenizer
from run.validation.values import raw
from tasks.jsonl import DataFileError

CONVERSATIONS = "data_modules.conversations.ConversationsDataModule"


def conversation_records(name: str, cfg: DictConfig, tokenizers: dict) -> int | None:
    """The training records data=conversations serves per epoch in stage `name` (None: another data
    source); raises ConfigError naming the key, file and row of the first bad conversation."""
    if raw(cfg, "data._target_") != CONVERSATIONS:
        return None
    data = OmegaConf.to_container(cfg.data, resolve=True)
    try:
        train, heldout = conversation_split(data["path"], data["heldout_path"], data["num_heldout"], data["split"],
                                            data["messages_key"], data["max_examples"])
        _render_all(cfg, data, train + heldout, tokenizers)
    except DataFileError as e:
        held = data["heldout_path"] and str(e).startswith(str(data["heldout_path"]))
        key = "data.heldout_path" if held else "data.path"
        problem = f"{key}={data[key.split('.')[1]]}: {e}"
        raise ConfigError(f"invalid data for stage {name!r}: {problem}", problems=[problem],
                          where=f"stage {name}") from None
    return len(train)


def _render_all(cfg: DictConfig, data: dict, conversations: list, tokenizers: dict) -> None:
    """Render every conversation with the stage's tokenizer, against the model's context."""
    tok, context, source, _ = plan_tokenizer(cfg, tokenizers)
    if tok is None:  # a model node this does not know: checked when the stage builds its data
        return
    limit, limit_source = context_limit(tok, data["max_length"]), "data.max_length"
    if context and (limit is None or context <= limit):
        limit, limit_source = context, source
    render = renderer(tok)
    for i, (loc, messages) in enumerate(conversations):
        conversation_record(loc, messages, render, data["last_turn_only"], i, data["source"], limit, limit_source)
