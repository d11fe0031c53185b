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
from dataclasses import asdict, dataclass, field

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

    def output(self) -> GenerationOutput:
        """The round as the generator seam's output: every episode's ids and behaviour log-probs."""
        return GenerationOutput([e.completion_ids for e in self.episodes], [e.logprobs for e in self.episodes],
                                self.generation_seconds)

    def stats(self) -> dict[str, float]:
        n = max(len(self.episodes), 1)
        return {"tool_calls": float(sum(e.tool_calls for e in self.episodes)),
                "tool_malformed": float(sum(e.malformed for e in self.episodes)),
                "tool_seconds": sum(e.tool_seconds for e in self.episodes),
                "observation_tokens": float(sum(len(e.loss_mask) - sum(e.loss_mask) for e in self.episodes)),
                "turns_per_episode": sum(e.policy_turns for e in self.episodes) / n}


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def context_limit(model) -> int | None:
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def run_episodes(generator, model, tokenizer, make_env, examples: list[Example], chat: bool = False,
                 greedy: bool = False, policy_version: int | None = None) -> EpisodeRound:
    """Play `make_env()` on every example (repeat examples for groups) with the policy; see the module."""
    envs = [make_env() for _ in examples]
    rendering = chat_rendering(envs[0], tokenizer) if envs else None
    episodes = [Episode(first_prompt(env, ex, tokenizer, chat)) for env, ex in zip(envs, examples)]
    stops, limit = set(stop_ids(model, tokenizer)), context_limit(model)
    sequences = [encode(tokenizer, s) for s in envs[0].stop_strings] if envs else []
    active, seconds = list(range(len(episodes))), 0.0
    while active:
        contexts = [episodes[i].prompt_ids + episodes[i].completion_ids for i in active]
        room = generator.max_new_tokens if limit is None else min(generator.max_new_tokens,
                                                                  limit - max(map(len, contexts)))
        if room < 1:
            break
        out = generator.sample(model, tokenizer, contexts, greedy=greedy, stop_sequences=sequences,
                               max_new_tokens=room)
        seconds += out.seconds
        active = [i for i, ids, lps in zip(active, out.completions, out.logprobs)
                  if _turn(episodes[i], envs[i], tokenizer, ids, lps, stops, policy_version, out.seconds, limit,
                           rendering)]
    for ep in episodes:  # episodes the full context ended: their last policy turn is the answer
        policy = [t for t in ep.turns if t.kind == "policy"]
        if not ep.final_text and policy:
            ep.final_text = _text(tokenizer, ep.completion_ids[policy[-1].start: policy[-1].start + policy[-1].length],
                                  stops)
    return EpisodeRound(episodes, seconds)


def _text(tokenizer, ids: list[int], stops: set[int]) -> str:
    return tokenizer.decode(ids[:-1] if finished(ids, stops) else ids, skip_special_tokens=True)


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


def observation_ids(turn_ids: list[int], env, tokenizer, text: str, rendering: ChatRendering | None) -> list[int]:
    """An observation's ids, its text cut to `env.max_observation_tokens` tokens first; a chat environment's
    text is then wrapped as the template renders a tool message after the policy turn `turn_ids`."""
    ids = encode(tokenizer, text)
    if rendering is None:
        return ids[: env.max_observation_tokens]
    if len(ids) > env.max_observation_tokens:
        text = tokenizer.decode(ids[: env.max_observation_tokens])
    closed = bool(turn_ids) and turn_ids[-1] == rendering.turn_end_id
    return rendering.observation_ids(text, turn_closed=closed)


def _turn(ep: Episode, env, tokenizer, ids, logprobs, stops, version, seconds, limit, rendering=None) -> bool:
    """Add one sampled policy turn and the environment's answer to `ep`; whether the episode goes on (a
    tag-format call ends its turn at the close tag; a chat call at the turn-end id, after its block)."""
    ep.add_policy(ids, logprobs, version, seconds)
    text = _text(tokenizer, ids, stops)
    result = env.step(text)
    if result.reward is not None:
        ep.env_rewards.append(float(result.reward))
        ep.turns[-1].reward = float(result.reward)
    ep.tool_calls += result.tool is not None or result.malformed  # a call, well-formed or not
    ep.malformed += result.malformed
    ep.tool_seconds += result.seconds
    called = any(text.endswith(s) for s in env.stop_strings) or (rendering is not None and finished(ids, stops))
    if result.done or result.observation is None or not called or ep.policy_turns >= env.max_turns:
        ep.final_text = text
        return False
    obs = observation_ids(ids, env, tokenizer, result.observation, rendering)
    if limit is not None and len(ep.prompt_ids) + len(ep.completion_ids) + len(obs) >= limit:
        ep.final_text = text  # no room for the observation and a turn after it
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
        result = env.step(text)
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
