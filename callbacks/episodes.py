"""One seam for the callbacks that sample (callbacks/regenerate.py, callbacks/evaluate.py): a single turn
per prompt through the generator (env=none), or multi-turn episodes against the stage's environment
(envs/rollout.py); and the tool statistics of a round (docs/episodes.md). Model output cannot make the round
raise: a turn that does not parse is an `error: ...` observation, a tool's time is bounded by the round's
`env.round_tool_seconds` (tests/envs/test_tool_trust.py drives the attacks through `run_episodes`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from data_modules.experience import ExperienceRecord
from envs.rollout import Episode, run_episodes
from generators.base import GenerationOutput, at_version, completion_texts, stop_ids, weights_held
from tasks.base import Example


@dataclass
class Sampled:
    """A round's samples: the generator seam's output (episodes: all their ids, behaviour log-probs 0.0 at
    observation tokens), the texts rewards score (an episode's final answer), and the episodes (None
    without an environment) with their tool statistics."""

    out: GenerationOutput
    texts: list[str]
    episodes: list[Episode] | None = None
    stats: dict[str, float] = field(default_factory=dict)
    version: int | None = None  # the weights version that made them (None: the caller's)


def sample(generator, policy, tokenizer, prompts: list[list[int]], examples: list[Example], env=None,
           chat: bool = False, greedy: bool = False, policy_version: int | None = None) -> Sampled:
    """Sample one completion per prompt, or play one episode per example when `env` (a factory) is set
    (the episode's prompt is then the environment's first observation, from the example). `version`: the
    weights version the samples were made with (an engine with its own copy: the one it holds,
    generators.base.at_version; greedy is held-out evaluation: the current weights exactly)."""
    with at_version(generator, policy, tokenizer, policy_version, exact=greedy) as version:
        if env is None:
            out = generator.sample(policy, tokenizer, prompts, greedy=greedy)
            return Sampled(out, completion_texts(tokenizer, out.completions, stop_ids(policy, tokenizer)),
                           version=version)
        with weights_held(generator):  # no optimizer step inside a round: vLLM syncs once, not every turn
            played = run_episodes(generator, policy, tokenizer, env, examples, chat, greedy, version)
    return Sampled(played.output(), [e.final_text for e in played.episodes], played.episodes, played.stats(),
                   version=version)


def as_episode(record: ExperienceRecord, episode: Episode | None, tokenizer) -> ExperienceRecord:
    """`record` with its episode's prompt, loss mask and per-turn provenance, the whole transcript as its
    completion text (logs, W&B tables; the reward scored the final answer alone), and the environment's
    per-turn rewards (kept apart as rewards['env'], added to the trained scalar)."""
    if episode is None:
        return record
    record.prompt_ids, record.loss_mask, record.turns = episode.prompt_ids, episode.loss_mask, episode.turn_records()
    record.completion_text = tokenizer.decode(episode.completion_ids, skip_special_tokens=True)
    if episode.env_reward is not None:
        record.rewards["env"] = episode.env_reward
        record.reward += episode.env_reward
    return record

