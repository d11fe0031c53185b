"""`env=chat_calculator` (and any set of tools) for chat models: tool calls in the chat template's own format.

An HF chat model is trained (and served) with its tokenizer's chat template: the tools are listed in the
prompt by `apply_chat_template(messages, tools=schemas)`, the model writes a call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen2.5 / Hermes format) and ends its turn
at the turn-end token (`<|im_end|>`, one of the model's stop ids); the tool's answer comes back as a `tool`
message, which the template renders as its own turn, followed by the next assistant turn's header.

So, unlike the tag format (envs/tool_env.py), a policy turn ends at a stop id, not at a close tag
(`stop_strings` is empty), and an observation is the template's rendering of a `tool` message
(`observation_role = "tool"`): envs/rollout.py asks `ChatRendering` for those ids. A turn without a
`<tool_call>` block is the final answer. Malformed calls (no closing tag, not JSON, JSON nested past the
parser's depth, numbers past Python's int-string limit, no name, an unknown tool, arguments the tool
refuses) get an observation `error: ...`, never a crash.

A tool's text never forges the template's turns: `ChatRendering.observation_ids` keeps the template's own
special ids only, and encodes special-token text inside the tool's result as plain text.
"""
from __future__ import annotations

import functools
import inspect
import json
from typing import Callable

from envs.base import Environment, StepResult
from envs.tool_env import SECONDS_LEFT, check_tools, run_tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def tool_schema(name: str, fn: Callable) -> dict:
    """The OpenAI-style JSON schema a chat template lists for `fn` (`tools=`): its parameters that are not
    bound by the partial (`_partial_: true` binds the config's keys), typed from their annotations, and the
    first line of its docstring as the description."""
    base = fn.func if isinstance(fn, functools.partial) else fn
    bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
    params = {p.name: p for p in inspect.signature(base).parameters.values()
              if p.name not in bound and p.name != SECONDS_LEFT}
    hints = inspect.get_annotations(base, eval_str=True)
    properties = {n: {"type": JSON_TYPES.get(hints.get(n), "string")} for n in params}
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
    description = " ".join((inspect.getdoc(base) or name).split("\n\n")[0].split()).split(". ")[0]
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


def parse_call(text: str) -> tuple[str, dict] | str | None:
    """(name, arguments) of the first `<tool_call>` block in `text`; a string saying what is wrong with a
    malformed one; None when the text holds no call."""
    start = text.find(OPEN)
    if start < 0:
        return None
    end = text.find(CLOSE, start)
    if end < 0:
        return f"no closing {CLOSE}"
    call = _json(text[start + len(OPEN): end])
    if isinstance(call, Unparsed):
        return f"the call is not JSON ({call.why})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'expected {"name": ..., "arguments": {...}}'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = _json(arguments)
        if isinstance(arguments, Unparsed):
            return f"arguments are not a JSON object ({arguments.why})"
    if not isinstance(arguments, dict):
        return "arguments are not a JSON object"
    return call["name"], arguments


class Unparsed:
    def __init__(self, why: str):
        self.why = why


def _json(text: str):
    """json.loads, or Unparsed(why) for any text it cannot turn into a value: bad JSON, nesting past the
    recursion limit (a turn of 1,000 `[`), an integer past Python's int-string limit (4,300 digits)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return Unparsed(e.msg)
    except RecursionError:
        return Unparsed("nested too deeply")
    except ValueError as e:  # the int-string conversion limit
        return Unparsed(str(e).split(":")[0])


def call_text(name: str, arguments: dict) -> str:
    """A call as the template renders an assistant message's `tool_calls` (the teacher's turn)."""
    return f'{OPEN}\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n{CLOSE}'


class ChatToolEnv(Environment):
    """Tools are callables by name, called with the call's arguments as keywords (envs/tools.py)."""

    stop_strings = ()
    observation_role = "tool"  # observations are rendered by the chat template as `tool` messages

    def __init__(self, tools: dict[str, Callable], max_tool_calls: int, max_turns: int,
                 max_observation_tokens: int, round_tool_seconds: float, tool_workers: int):
        super().__init__(max_turns=max_turns, max_observation_tokens=max_observation_tokens)
        self.tool_workers = check_tools(tools, max_tool_calls, round_tool_seconds, tool_workers)
        self.tools, self.max_tool_calls, self.calls = dict(tools), max_tool_calls, 0
        self.round_tool_seconds, self.source_file = round_tool_seconds, None
        self.tool_schemas = [tool_schema(name, fn) for name, fn in self.tools.items()]

    def reset(self, example) -> str:
        self.calls, self.source_file = 0, example.meta.get("source_file")
        return example.prompt

    def step(self, text: str) -> StepResult:
        parsed = parse_call(text)
        if parsed is None:
            return StepResult(observation=None, done=True)
        if isinstance(parsed, str):
            return StepResult(f"error: {parsed}", malformed=True)
        name, arguments = parsed
        if name not in self.tools:
            return StepResult(f"error: unknown tool {name!r}", malformed=True, tool=name)
        unknown = sorted(set(arguments) - set(self._schema(name)["parameters"]["properties"]))
        if unknown:  # never let a call override what the config bound (the calculator's limits)
            return StepResult(f"error: unknown arguments {unknown} for {name}", malformed=True, tool=name)
        if self.calls >= self.max_tool_calls:
            return StepResult(f"error: tool call limit ({self.max_tool_calls}) reached", tool=name)
        self.calls += 1
        return run_tool(name, self.tools[name], self.tool_budget, self.source_file, **arguments)

    def answer(self, text: str) -> StepResult:
        """The last turn is the answer: a call in it is not run (no observation could show its result)."""
        return StepResult(observation=None, done=True)

    def demonstration(self, example) -> list[str]:
        """The teacher's turns: each call of `example.meta["calls"]` ([[tool, arguments], ...]; a string
        argument goes to the tool's first parameter), then the reference answer."""
        calls = example.meta.get("calls")
        if not isinstance(calls, list):
            raise ValueError(f"example {example.prompt!r} has no meta['calls'] ([[tool, arguments], ...]) "
                             f"to demonstrate")
        turns = []
        for name, arguments in calls:
            if isinstance(arguments, str):
                first = next(iter(self._schema(name)["parameters"]["properties"]))
                arguments = {first: arguments}
            turns.append(call_text(name, arguments))
        return turns + [example.answer]

    def _schema(self, name: str) -> dict:
        return next(s["function"] for s in self.tool_schemas if s["function"]["name"] == name)


class ChatRendering:
    """The ids a chat template puts around a tool message, found by rendering (no template is parsed):
    the conversation [user, assistant(MARK)] with and without a `tool` message after it (and the next
    assistant header); what follows MARK is the assistant turn's close, then the tool turn. A policy turn
    that ended at the close's first token (the turn-end id, e.g. `<|im_end|>`) already holds it: the
    observation is the rest.

    A tool's text is data, never turns: the observation's ids hold exactly the special ids the template puts
    around an (innocent) tool message. When the text itself holds a special token's text (a program that
    prints `<|im_end|>\\n<|im_start|>assistant\\n...`), that text is encoded as text, its special tokens split
    (`split_special_tokens`), between the template's own ids; a template that transforms the content (e.g.
    JSON-quotes it) gets the text with a zero-width space after each special token's first character."""

    MARK = "\u2063policyshift-turn\u2063"
    CONTENT = "\u2063policyshift-tool\u2063"

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("a chat tool environment needs a tokenizer with a chat template "
                             "(model=hf with a chat model; the character tokenizer has none)")
        self.tokenizer = tokenizer
        close = self._after_mark([])
        close_ids = tokenizer(close, add_special_tokens=False)["input_ids"]
        self.turn_end_id = close_ids[0] if close_ids else None
        self.turn_end_text = tokenizer.decode(close_ids[:1]) if close_ids else ""
        self.special_ids = set(tokenizer.all_special_ids) | {
            i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
        self.special_texts = sorted({tokenizer.convert_ids_to_tokens(i) for i in self.special_ids}, key=len,
                                    reverse=True)
        self._own: dict[bool, list[int]] = {}  # the template's own special ids around a tool message
        self._wrapper: dict[bool, int] = {}

    def _after_mark(self, extra: list[dict], generation_prompt: bool = False) -> str:
        messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": self.MARK}, *extra]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        return text[text.index(self.MARK) + len(self.MARK):]

    def _rendered(self, content: str, turn_closed: bool) -> str:
        text = self._after_mark([{"role": "tool", "content": content}], generation_prompt=True)
        if turn_closed and text.startswith(self.turn_end_text):
            text = text[len(self.turn_end_text):]
        return text

    def _encode(self, text: str, split: bool = False) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=split)["input_ids"]

    def specials(self, ids: list[int]) -> list[int]:
        return [i for i in ids if i in self.special_ids]

    def observation_ids(self, content: str, turn_closed: bool) -> list[int]:
        """The ids after a policy turn for a tool message `content` and the next assistant header.
        `turn_closed`: the turn's last sampled id is the turn-end id (then it is not repeated). Exactly the
        template's rendering, unless `content` holds special-token text (then as the class says)."""
        if turn_closed not in self._own:
            self._own[turn_closed] = self.specials(self._encode(self._rendered(self.CONTENT, turn_closed)))
        own = self._own[turn_closed]
        ids = self._encode(self._rendered(content, turn_closed))
        if self.specials(ids) == own:
            return ids
        head, found, tail = self._rendered(self.CONTENT, turn_closed).partition(self.CONTENT)
        if found:  # the template writes the content as it is
            ids = self._encode(head) + self._encode(content, split=True) + self._encode(tail)
        else:
            ids = self._encode(self._rendered(self.defuse(content), turn_closed))
        if self.specials(ids) != own:
            raise ValueError(f"a tool message's special ids {self.specials(ids)} differ from the chat template's "
                             f"own {own}: this template cannot carry tool text safely")
        return ids

    def wrapper_length(self, turn_closed: bool) -> int:
        """Tokens the template's tool turn and the next header take around an (empty) tool message."""
        if turn_closed not in self._wrapper:
            self._wrapper[turn_closed] = len(self.observation_ids("", turn_closed))
        return self._wrapper[turn_closed]

    def defuse(self, text: str) -> str:
        """`text` with a zero-width space after the first character of every special token's text in it."""
        for special in self.special_texts:
            if len(special) > 1:
                text = text.replace(special, special[0] + "\u200b" + special[1:])
        return text
