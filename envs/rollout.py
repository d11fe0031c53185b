"""Episodes: policy turns and observation turns as one token sequence (docs/episodes.md).

`run_episodes` plays one environment per example (envs/base.py) against the policy. Each round of the
loop samples the next policy turn of every unfinished episode in one batched generator call (generator=hf
or vllm, stopping at a stop id or at a tool call's close tag), asks each episode's
environment for its observation, and appends the observation's token ids. The next turn is sampled from
the exact ids so far (prompt + every turn's ids, re-prefilled: the ids, never a re-tokenisation of the
text; one prefill per turn, a cost that is small next to the decode of a turn).

An `Episode` is what becomes one experience record: `completion_ids` are the sampled ids and the
observation ids in order, `logprobs` the behaviour log-probs of the sampled ids and 0.0 at observation
positions, `loss_mask` 1 on sampled ids and 0 on observation ids (they carry no loss), `turns` the
provenance of every turn (kind, span, policy version, tool, seconds, malformed). The outcome reward is
scored on `final_text`, the last policy turn's text.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

from envs.base import StepResult, ToolBudget
from envs.chat_tools import ChatRendering
from generators.base import GenerationOutput, finished, stop_ids
from tasks.base import Example, encode_prompt


@dataclass
class Turn:
    kind: str  # policy | observation
    start: int  # offset of its first token in the episode's completion ids
    length: int
    policy_version: int | None = None  # policy turns: the weights that sampled it
    tool: str | None = None  # observation turns: the tool that answered (None: no tool, e.g. an error)
    seconds: float = 0.0  # policy turns: the batched turn's generation seconds; observations: the tool's
    malformed: bool = False
    reward: float | None = None  # policy turns: the environment's reward for the turn (None: none given)
    special_dropped: int = 0  # policy turns: special ids in it (not its final stop id) that its text lacks


@dataclass
class Episode:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_text: str = ""
    env_rewards: list[float] = field(default_factory=list)  # the environment's per-turn rewards given
    tool_calls: int = 0
    malformed: int = 0
    tool_seconds: float = 0.0
    budget_spent: int = 0  # calls refused or stopped: the round's tool time budget was spent

    def add_policy(self, ids: list[int], logprobs: list[float], version: int | None, seconds: float) -> None:
        self.turns.append(Turn("policy", len(self.completion_ids), len(ids), version, seconds=seconds))
        self.completion_ids += ids
        self.logprobs += logprobs
        self.loss_mask += [1] * len(ids)

    def add_observation(self, ids: list[int], tool: str | None, seconds: float, malformed: bool) -> None:
        self.turns.append(Turn("observation", len(self.completion_ids), len(ids), None, tool, seconds, malformed))
        self.completion_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)

    def count(self, result: StepResult) -> None:
        """The environment's answer to a policy turn: its reward and the call's statistics."""
        if result.reward is not None:
            self.env_rewards.append(float(result.reward))
            self.turns[-1].reward = float(result.reward)
        self.tool_calls += result.tool is not None or result.malformed  # a call, well-formed or not
        self.malformed += result.malformed
        self.tool_seconds += result.seconds
        self.budget_spent += result.budget_spent

    @property
    def policy_turns(self) -> int:
        return sum(t.kind == "policy" for t in self.turns)

    @property
    def env_reward(self) -> float | None:
        return sum(self.env_rewards) if self.env_rewards else None

    def turn_records(self) -> list[dict]:
        return [asdict(t) for t in self.turns]


@dataclass
class EpisodeRound:
    episodes: list[Episode]
    generation_seconds: float
    tool_wait_seconds: float = 0.0  # wall seconds the batch waited for its environments' steps (tool calls)

    def output(self) -> GenerationOutput:
        """The round as the generator seam's output: every episode's ids and behaviour log-probs."""
        return GenerationOutput([e.completion_ids for e in self.episodes], [e.logprobs for e in self.episodes],
                                self.generation_seconds)

    def stats(self) -> dict[str, float]:
        n = max(len(self.episodes), 1)
        return {"tool_calls": float(sum(e.tool_calls for e in self.episodes)),
                "tool_malformed": float(sum(e.malformed for e in self.episodes)),
                "tool_seconds": sum(e.tool_seconds for e in self.episodes),
                "tool_wait_seconds": self.tool_wait_seconds,
                "tool_budget_spent": float(sum(e.budget_spent for e in self.episodes)),
                "special_dropped": float(sum(t.special_dropped for e in self.episodes for t in e.turns)),
                "observation_tokens": float(sum(len(e.loss_mask) - sum(e.loss_mask) for e in self.episodes)),
                "turns_per_episode": sum(e.policy_turns for e in self.episodes) / n}


@dataclass
class PendingTurn:
    """A sampled policy turn waiting for its environment's answer: `final` (the episode's last turn: it
    goes to env.answer) and `room` (tokens its observation's text may take: the context's room, at most
    max_observation_tokens)."""

    index: int
    ids: list[int]
    text: str
    final: bool
    room: int


def encode(tokenizer, text: str, split: bool = False) -> list[int]:
    """`text`'s ids; `split`: special tokens' text encoded as text (a tool's output, never a turn marker)."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=split)["input_ids"]


def context_limit(model) -> int | None:
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def run_episodes(generator, model, tokenizer, make_env, examples: list[Example], chat: bool = False,
                 greedy: bool = False, policy_version: int | None = None) -> EpisodeRound:
    """Play `make_env()` on every example (repeat examples for groups) with the policy; see the module."""
    envs = [make_env() for _ in examples]
    budget = round_budget(envs)
    rendering = chat_rendering(envs[0], tokenizer) if envs else None
    episodes = [Episode(first_prompt(env, ex, tokenizer, chat)) for env, ex in zip(envs, examples)]
    stops, limit = set(stop_ids(model, tokenizer)), context_limit(model)
    sequences = [encode(tokenizer, s) for s in envs[0].stop_strings] if envs else []
    active, seconds, waited = list(range(len(episodes))), 0.0, 0.0
    workers = getattr(envs[0], "tool_workers", 1) if envs else 1
    with ThreadPoolExecutor(workers, thread_name_prefix="tool") if workers > 1 else nullcontext() as pool:
        while active:
            contexts = [episodes[i].prompt_ids + episodes[i].completion_ids for i in active]
            room = generator.max_new_tokens if limit is None else min(generator.max_new_tokens,
                                                                      limit - max(map(len, contexts)))
            if room < 1:
                break
            out = generator.sample(model, tokenizer, contexts, greedy=greedy, stop_sequences=sequences,
                                   max_new_tokens=room)
            seconds += out.seconds
            pending = [_sampled(i, episodes[i], envs[i], tokenizer, ids, lps, stops, policy_version, out.seconds,
                                limit, rendering) for i, ids, lps in zip(active, out.completions, out.logprobs)]
            start = time.perf_counter()
            with budget.phase() if budget is not None else nullcontext():
                results = list((pool.map if pool is not None else map)(lambda t: _answer(envs[t.index], t), pending))
            waited += time.perf_counter() - start
            active = [t.index for t, r in zip(pending, results)
                      if _observe(episodes[t.index], envs[t.index], tokenizer, t, r, limit, rendering)]
    for ep in episodes:  # episodes the full context ended: their last policy turn is the answer
        policy = [t for t in ep.turns if t.kind == "policy"]
        if not ep.final_text and policy:
            ep.final_text = _text(tokenizer, ep.completion_ids[policy[-1].start: policy[-1].start + policy[-1].length],
                                  stops)
    return EpisodeRound(episodes, seconds, waited)


def round_budget(envs: list) -> ToolBudget | None:
    """The batch's ToolBudget (`env.round_tool_seconds`), shared by its environments; None: the environment
    sets no budget (a user's environment without the key)."""
    seconds = getattr(envs[0], "round_tool_seconds", None) if envs else None
    budget = None if seconds is None else ToolBudget(seconds)
    for env in envs:
        env.tool_budget = budget
    return budget


def _text(tokenizer, ids: list[int], stops: set[int]) -> str:
    return tokenizer.decode(ids[:-1] if finished(ids, stops) else ids, skip_special_tokens=True)


def special_dropped(tokenizer, ids: list[int], stops: set[int]) -> int:
    """Special ids of a turn (its final stop id aside) that `_text` drops: the text a tool runs lacks them."""
    special = set(tokenizer.all_special_ids)
    return sum(i in special for i in (ids[:-1] if finished(ids, stops) else ids))


def chat_rendering(env, tokenizer) -> ChatRendering | None:
    """How a chat environment's observations become ids (`observation_role = "tool"`: the template's
    rendering of a tool message, envs/chat_tools.py); None: the observation text is encoded as it is."""
    return ChatRendering(tokenizer) if getattr(env, "observation_role", None) == "tool" else None


def first_prompt(env, example: Example, tokenizer, chat: bool) -> list[int]:
    """The prompt's ids: the environment's first observation, through the chat template (with the tools'
    schemas) for a chat environment, whatever `task.chat` says."""
    if getattr(env, "observation_role", None) == "tool":
        return encode_prompt(tokenizer, env.reset(example), True, tools=getattr(env, "tool_schemas", None))
    return encode_prompt(tokenizer, env.reset(example), chat)


def wrapping(env, text: str) -> tuple[str, str]:
    """The environment's `result_prefix` and `result_suffix` when `text` is wrapped in them, else ("", "")."""
    head, tail = getattr(env, "result_prefix", "") or "", getattr(env, "result_suffix", "") or ""
    if len(text) >= len(head) + len(tail) and text.startswith(head) and text.endswith(tail):
        return head, tail
    return "", ""


def wrapper_length(turn_ids: list[int], env, tokenizer, rendering: ChatRendering | None) -> int:
    """Tokens an observation takes beside its text: the template's tool turn and the next header, or the
    tag format's prefix and suffix."""
    if rendering is not None:
        return rendering.wrapper_length(bool(turn_ids) and turn_ids[-1] == rendering.turn_end_id)
    head, tail = getattr(env, "result_prefix", "") or "", getattr(env, "result_suffix", "") or ""
    return len(encode(tokenizer, head)) + len(encode(tokenizer, tail))


def observation_ids(turn_ids: list[int], env, tokenizer, text: str, rendering: ChatRendering | None,
                    max_tokens: int | None = None) -> list[int]:
    """An observation's ids: its text (special tokens' text as text) cut to `max_tokens` (default
    `env.max_observation_tokens`) tokens, then wrapped: as the template renders a tool message after the
    policy turn `turn_ids` (chat), or in the environment's result prefix and suffix, kept whole."""
    n = env.max_observation_tokens if max_tokens is None else max_tokens
    if rendering is not None:
        ids = encode(tokenizer, text, split=True)
        if len(ids) > n:
            text = tokenizer.decode(ids[:n])
        closed = bool(turn_ids) and turn_ids[-1] == rendering.turn_end_id
        return rendering.observation_ids(text, turn_closed=closed)
    head, tail = wrapping(env, text)
    body = encode(tokenizer, text[len(head): len(text) - len(tail)], split=True)[:n]
    return (encode(tokenizer, head) if head else []) + body + (encode(tokenizer, tail) if tail else [])


def _sampled(i: int, ep: Episode, env, tokenizer, ids, logprobs, stops, version, seconds, limit,
             rendering) -> PendingTurn:
    """Add one sampled policy turn to `ep`; what its environment is to be asked. The turn is the episode's
    last (`final`) when it did not end with a call (a tag-format call ends at the close tag; a chat call at
    the turn-end id, after its block), after max_turns turns, or when the context has no room for an
    observation and one token after it."""
    ep.add_policy(ids, logprobs, version, seconds)
    ep.turns[-1].special_dropped = special_dropped(tokenizer, ids, stops)
    text = _text(tokenizer, ids, stops)
    called = any(text.endswith(s) for s in env.stop_strings) or (rendering is not None and finished(ids, stops))
    room = env.max_observation_tokens
    if limit is not None:
        used = len(ep.prompt_ids) + len(ep.completion_ids)
        room = min(room, limit - used - 1 - wrapper_length(ids, env, tokenizer, rendering))
    return PendingTurn(i, ids, text, not called or ep.policy_turns >= env.max_turns or room < 1, room)


def _answer(env, turn: PendingTurn) -> StepResult:
    return env.answer(turn.text) if turn.final else env.step(turn.text)


def _observe(ep: Episode, env, tokenizer, turn: PendingTurn, result: StepResult, limit, rendering) -> bool:
    """Count the environment's answer and append its observation; whether the episode goes on."""
    ep.count(result)
    if turn.final or result.done or result.observation is None:
        ep.final_text = turn.text
        return False
    obs = observation_ids(turn.ids, env, tokenizer, result.observation, rendering, turn.room)
    if limit is not None and len(ep.prompt_ids) + len(ep.completion_ids) + len(obs) >= limit:
        ep.final_text = turn.text  # the cut text re-encoded longer than its room (a backstop: never seen)
        return False
    ep.add_observation(obs, result.tool, result.seconds, result.malformed)
    return True


def play(env, tokenizer, example: Example, turns: list[str], chat: bool = False) -> Episode:
    """A scripted episode: `turns` (a teacher's policy turns, as text) played against `env`, the
    observations appended exactly as in `run_episodes`; the last turn ends with eos. Behaviour log-probs
    are 0.0 (no policy sampled them): SFT demonstrations (data_modules/episode_demonstrations.py)."""
    rendering = chat_rendering(env, tokenizer)
    ep = Episode(first_prompt(env, example, tokenizer, chat))
    for i, text in enumerate(turns):
        last = i == len(turns) - 1
        end = [rendering.turn_end_id] if rendering is not None else [tokenizer.eos_token_id] if last else []
        ids = encode(tokenizer, text) + end
        ep.add_policy(ids, [0.0] * len(ids), None, 0.0)
        result = env.answer(text) if last else env.step(text)
        if last:
            break
        if result.observation is None:
            raise ValueError(f"demonstration of {example.prompt!r}: turn {i} ({text!r}) got no observation")
        ep.tool_calls += result.tool is not None or result.malformed  # a call, well-formed or not
        ep.add_observation(observation_ids(ids, env, tokenizer, result.observation, rendering), result.tool,
                           result.seconds, result.malformed)
    ep.final_text = turns[-1]
    return ep


def demonstration(make_env, tokenizer, example: Example, chat: bool = False) -> Episode:
    """The teacher's episode on `example`: `env.demonstration(example)`'s turns played by `play`."""
    env = make_env()
    return play(env, tokenizer, example, env.demonstration(example), chat)
