"""Checks of a stage's task data against its model and reward, when the run is planned (no weights are
loaded: the tokenizer is built, or read from the model folder, alone):

- every prompt fits the model's context with room for generator.max_new_tokens (evaluation and rollouts
  generate that many), and an SFT demonstration (prompt + answer) fits it; a 2 MB line is refused here
  instead of training until it asks for tens of GB;
- task.chat=true needs a tokenizer with a chat template;
- reward=code_exec (or a held-out verifier that is code_exec) needs unit tests in every example it scores.

Messages name the file and line (jsonl and code tasks) or the task and example.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from run.errors import ConfigError
from run.validation.folders import config_problems, eos_problem, model_eos
from run.validation.pairing import teacher_tools_problem
from tasks.base import Example, Task, encode_prompt

CODE_EXEC = "rewards.code_exec.CodeExecReward"
MARGIN = 4  # tokens never exceed UTF-8 bytes + special tokens; a few more for safety


def check_stage_data(name: str, cfg: DictConfig, task: Task, tokenizers: dict) -> None:
    """Raise ConfigError listing what in `task` this stage's model or reward cannot take."""
    problems: list[str] = []
    _check_tests(cfg, task, problems)
    _check_heldout(cfg, task, problems)
    tools = teacher_tools_problem(cfg, task.train)
    if tools:
        problems.append(tools)
    tok, context, source, tok_name = plan_tokenizer(cfg, tokenizers)
    found, folder, stated = _folder_problems(cfg, tokenizers)
    problems.extend(found)
    data = OmegaConf.select(cfg, "data", default=None)
    rollouts_only = isinstance(data, DictConfig) and "prompts_per_round" in data
    if tok is not None and not found:
        eos = eos_problem(tok, tok_name, folder, rollouts_only, stated)
        if eos:
            problems.append(eos)
        elif task.chat and not getattr(tok, "chat_template", None):
            problems.append(f"{task.chat_why} but {tok_name} has no chat template")
        elif context:
            _check_lengths(cfg, task, tok, context, source, problems)
        _check_chat_env(cfg, tok, tok_name, problems)
        _check_top_k(cfg, tokenizers.get(("vocab", tok_name), len(tok)), tok_name, problems)
    if problems:
        raise ConfigError(f"invalid data for stage {name!r}:\n  - " + "\n  - ".join(problems),
                          problems=problems, where=f"stage {name}")


def _folder_problems(cfg: DictConfig, cache: dict) -> tuple[list[str], str | None, object]:
    """(the model=hf folder's config.json problems: run/validation/folders.py, its tokenizer's folder, the
    eos its generation config states), or ([], None, None) for another model."""
    path = str(OmegaConf.select(cfg, "model.name_or_path", default=""))
    return cache.get(("probe", path), ([], None, None))


def plan_tokenizer(cfg: DictConfig, cache: dict):
    """(tokenizer, context length, where the context comes from, the tokenizer's name) for the stage's
    model, or Nones for a model node this does not know. Builds or loads the tokenizer only (cached)."""
    target = OmegaConf.select(cfg, "model._target_", default=None)
    if target == "models.tiny.build_tiny":
        if "tiny" not in cache:
            from models.tokenizer import build_char_tokenizer
            cache["tiny"] = build_char_tokenizer()
        return (cache["tiny"], cfg.model.max_position_embeddings, "model.max_position_embeddings",
                "model=tiny's character tokenizer")
    if target == "models.hf.load_hf":
        from models.hf_checks import (adapter_chain, check_folder, check_vocab, context_length, load_tokenizer,
                                      tokenizer_folder)
        path = str(cfg.model.name_or_path)
        if path not in cache:
            config = check_folder(path)
            chain = adapter_chain(path)  # [path], or an adapter folder down to its base model
            tok = load_tokenizer(tokenizer_folder(chain))
            check_vocab(path, tok, config.get("vocab_size"))
            cache[("vocab", path)] = config.get("vocab_size")  # the embedding's rows (run/validation/harvest_data.py)
            context, source = context_length(config), f"{chain[-1]}/config.json"
            cache[("probe", path)] = (config_problems(config, Path(source)), str(tokenizer_folder(chain)),
                                      model_eos(chain, config))
            limit = tok.model_max_length  # transformers' "unset" is ~1e30
            if limit and limit < 10**8 and (context is None or limit < context):
                context, source = limit, f"the model_max_length of {path}'s tokenizer"
            cache[path] = (tok, context, source, f"the tokenizer of {path}")
            cache[("vocab", f"the tokenizer of {path}")] = max(len(tok), config.get("vocab_size") or 0)
        return cache[path]
    return None, None, None, None


def _check_chat_env(cfg: DictConfig, tok, tok_name: str, problems: list[str]) -> None:
    """A chat tool environment (envs.chat_tools.ChatToolEnv) renders tools and tool results with the
    tokenizer's chat template: without one, every episode would fail once the stage has started."""
    target = OmegaConf.select(cfg, "env._target_", default=None)
    if target == "envs.chat_tools.ChatToolEnv" and not getattr(tok, "chat_template", None):
        problems.append(f"env._target_={target} (env=chat_calculator, chat_python) needs a tokenizer with a chat "
                        f"template and {tok_name} has none: use model=hf with a chat model, or env=calculator "
                        f"(tool calls in tags)")


def _check_top_k(cfg: DictConfig, vocab: int, tok_name: str, problems: list[str]) -> None:
    """generator.top_k keeps the k most likely tokens; k above the vocabulary names tokens that do not exist."""
    top_k = OmegaConf.select(cfg, "generator.top_k", default=None)
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > vocab:
        problems.append(f"generator.top_k={top_k} is above the vocabulary of {vocab:,} tokens ({tok_name}): use "
                        f"a top_k ≤ {vocab:,}, or 0 (off)")


def _decodes_task(cfg) -> bool:
    """Whether callbacks/evaluate.py decodes the task's held-out prompts: not for data that does not train on
    the task (data=conversations, a preference file: `trains_on_task` False) unless on_other_data=true."""
    if OmegaConf.select(cfg, "callbacks.evaluate", default=None) is None:
        return False
    if OmegaConf.select(cfg, "callbacks.evaluate.on_other_data", default=False):
        return True
    target = str(OmegaConf.select(cfg, "data._target_", default=""))
    other_file = target.endswith("StaticPreferencesDataModule") and OmegaConf.select(cfg, "data.path", default=None)
    return not (target.endswith("ConversationsDataModule") or other_file)


def _check_lengths(cfg, task: Task, tok, context: int, source: str, problems: list[str]) -> None:
    new = OmegaConf.select(cfg, "generator.max_new_tokens", default=0)
    data = OmegaConf.select(cfg, "data", default=None)
    splits = []
    if _decodes_task(cfg):
        splits.append(("heldout", task.heldout, False))
    if isinstance(data, DictConfig) and "prompts_per_round" in data:
        splits.append(("train", task.train, False))
    elif str(OmegaConf.select(cfg, "data._target_", default="")).endswith("DemonstrationsDataModule"):
        splits.append(("train", task.train[: data.get("max_examples") or None], True))
    if any(not answer for _, _, answer in splits) and isinstance(new, int) and new >= context:
        problems.append(f"generator.max_new_tokens={new} leaves no room for a prompt in the model's context of "
                        f"{context:,} tokens ({source})")
        return
    for split, examples, with_answer in splits:
        room = context - (0 if with_answer else new)
        found = _too_long(tok, task, examples, room, with_answer)
        if found:
            (i, ex, n), more = found[0], len(found) - 1
            what = "prompt + answer" if with_answer else "prompt"
            after = "" if with_answer else f" + generator.max_new_tokens={new}"
            chars = len(ex.prompt) + (len(ex.answer) if with_answer else 0)
            size = f"{n:,} tokens" if chars <= 16 * (room + 1) else f"{chars:,} characters (over {n - 1:,} tokens)"
            problems.append(f"{where(cfg, task, split, i, ex)}: the {what} is {size}{after}, more than the "
                            f"model's context of {context:,} tokens ({source})"
                            + (f"; {more:,} more {split} example(s) too" if more else ""))


def _too_long(tok, task: Task, examples: list[Example], room: int, with_answer: bool) -> list[tuple]:
    """(index, example, tokens) of each example longer than `room` tokens. Only examples whose UTF-8 size
    could exceed it are tokenized, and a huge one only as far as needed (its count is then a lower bound)."""
    from transformers.utils import logging as hf_logging
    overhead = len(encode_prompt(tok, "", task.chat)) + (1 if with_answer else 0) + MARGIN
    found, verbosity = [], hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # no "sequence length is longer than the maximum" warning here
    try:
        for i, ex in enumerate(examples):
            size = len(ex.prompt.encode()) + (len(ex.answer.encode()) if with_answer else 0)
            if size + overhead > room:
                n = _tokens(tok, task, ex, room, with_answer)
                if n > room:
                    found.append((i, ex, n))
    finally:
        hf_logging.set_verbosity(verbosity)
    return found


def _tokens(tok, task: Task, ex: Example, room: int, with_answer: bool) -> int:
    cut = 16 * (room + 1)  # characters: beyond this the text is too long whatever the tokenizer
    n = len(encode_prompt(tok, ex.prompt[:cut], task.chat))
    if with_answer and n <= room:
        n += len(tok(ex.answer[:cut], add_special_tokens=False)["input_ids"]) + 1  # + eos
    return n


def _check_heldout(cfg: DictConfig, task: Task, problems: list[str]) -> None:
    """Held-out evaluation needs held-out examples: over none its accuracy is nan (and so is every figure
    that the summary, the plots and a sweep's objective take from it)."""
    if OmegaConf.select(cfg, "callbacks.evaluate", default=None) is not None and not task.heldout:
        problems.append(f"task {task.name} holds out no examples (task.num_heldout=0, or an empty held-out "
                        f"file), but callbacks.evaluate reports held-out accuracy on them: hold some out, or "
                        f"turn the evaluation off with callbacks.evaluate=null")


def _check_tests(cfg: DictConfig, task: Task, problems: list[str]) -> None:
    from rewards.code_exec import untested_example
    data = OmegaConf.select(cfg, "data", default=None)
    scored = []
    if _targets(OmegaConf.select(cfg, "reward", default=None)) & {CODE_EXEC} and isinstance(data, DictConfig) \
            and "prompts_per_round" in data:
        scored.append(("train", task.train, "reward=code_exec"))
    verifier = OmegaConf.select(cfg, "callbacks.evaluate.verifier", default=None)
    auto = verifier == "auto" and OmegaConf.select(cfg, "callbacks.evaluate", default=None) is not None
    rewarded = OmegaConf.select(cfg, "reward._target_", default=None)
    if CODE_EXEC in _targets(verifier):
        scored.append(("heldout", task.heldout, "callbacks.evaluate.verifier (code_exec)"))
    elif auto and rewarded == CODE_EXEC:
        scored.append(("heldout", task.heldout, "callbacks.evaluate.verifier=auto (the stage's reward=code_exec)"))
    for split, examples, who in scored:
        bad = untested_example(examples)
        if bad:
            problems.append(f"{who} scores a completion by running the example's unit tests, but "
                            f"{where(cfg, task, split, *bad)} has none ('entry_point' and 'tests'): use task=code, "
                            f"or a task file whose lines carry entry_point and tests")
            return


def _targets(node) -> set[str]:
    """Every literal _target_ in `node`, nested ones included."""
    if not isinstance(node, DictConfig):
        return set()
    tree = OmegaConf.to_container(node, resolve=False)
    found, stack = set(), [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("_target_"), str):
                found.add(item["_target_"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def where(cfg: DictConfig, task: Task, split: str, index: int, ex: Example) -> str:
    """file:line for an example read from a file (the full path when the task config names it), else
    the task, split and example number."""
    origin = ex.meta.get("origin")
    if origin:
        name = origin.rpartition(":")[0]
        for value in OmegaConf.to_container(cfg.task, resolve=False).values():
            if isinstance(value, str) and Path(value).name == name:
                return f"{Path(value).parent / origin}"
        return origin
    shown = ex.prompt if len(ex.prompt) <= 30 else ex.prompt[:30] + "…"
    return f"task {task.name}, {split} example {index + 1} ({shown!r})"
