"""GRPO (Shao et al. 2024): group-relative advantages, an off-policy-corrected (PPO-clipped by default)
surrogate, and k3 KL to a frozen reference. Everything but the advantages lives in trainers/rollout.py.
DAPO's options (Yu et al. 2025): dynamic sampling (callbacks/dynamic_sampling.py builds such a round;
this module only carries its settings), the soft overlong penalty added to the reward before advantages
and overlong filtering (losses/overlong.py)."""
from __future__ import annotations

from typing import Callable

import torch

from data_modules.experience import ExperienceBatch, ExperienceRecord
from data_modules.screening import ScreenSettings
from generators.base import finished, stop_ids
from losses.advantages import turn_advantages, turn_returns
from losses.common import aggregate
from losses.overlong import overlong_penalty, truncated
from trainers import shared_prefix
from trainers.rollout import RolloutModule

TURN_CREDITS = ("outcome", "per_turn")
REFILLS = ("full", "measured")


class GRPOModule(RolloutModule):
    """group_size samples per prompt; μ = epochs_per_round passes over each round; β·KL(π‖π_ref)."""

    def __init__(self, advantage: Callable, dynamic_sampling: bool, max_gen_batches: int,
                 overlong_cache: int | None, overlong_max_len: int, overlong_filter: bool,
                 turn_credit: str = "outcome", turn_gamma: float = 1.0, refill: str = "full",
                 carry_surplus: bool = False, screen: dict | None = None, pass_threshold: float = 0.5,
                 stored_success: dict | None = None, shared_prefix: bool = False, **kwargs):
        super().__init__(**kwargs)
        if refill not in REFILLS:
            raise ValueError(f"algorithm.refill={refill!r}: choose one of {', '.join(REFILLS)}")
        # issue 33's round economy, read by RegenerateExperience (callbacks/round_economy.py)
        self.refill, self.carry_surplus, self.pass_threshold = refill, carry_surplus, pass_threshold
        size = (screen or {}).get("size")
        self.screen = (ScreenSettings(size, self.group_size, screen["min_signal"], pass_threshold)
                       if size is not None else None)
        reuse = stored_success or {}
        self.stored_success = bool(reuse.get("enabled", False))
        self.stored_success_cap = float(reuse.get("cap", 1.0))  # trainers/rollout.py: truncated IS of stored successes
        if turn_credit not in TURN_CREDITS:
            raise ValueError(f"algorithm.turn_credit={turn_credit!r}: choose one of {', '.join(TURN_CREDITS)}")
        self.advantage_fn, self.turn_credit, self.turn_gamma = advantage, turn_credit, turn_gamma
        self.dynamic_sampling, self.max_gen_batches = dynamic_sampling, max_gen_batches  # read by RegenerateExperience
        self.overlong_cache, self.overlong_max_len = overlong_cache, overlong_max_len
        self.overlong_filter = overlong_filter
        self.shared_prefix = shared_prefix  # each distinct prompt of a micro-batch computed once (trainers/shared_prefix.py)

    def annotate(self, records: list[ExperienceRecord]) -> list[ExperienceRecord]:
        """Advantages from rewards (+ the overlong penalty when on) and group ids (`algorithm.advantage`:
        group-relative, leave-one-out or REINFORCE++-baseline, losses/advantages.py); reference log-probs
        when β > 0. With overlong_filter, truncated samples count in their group's baseline but are not
        returned (not served, so out of the loss entirely)."""
        rewards = torch.tensor([r.reward for r in records])
        groups = torch.tensor([r.group_id for r in records])
        shaped, overlong = self._overlong(records, rewards)
        adv, stats = self.advantage_fn(shaped, groups)
        for r, a in zip(records, adv.tolist()):
            r.advantage = a
        if self.turn_credit == "per_turn":
            self._credit_turns(records, shaped.tolist())
        self.last_round_stats = {k: float(v) for k, v in stats.items()} | overlong
        if self.overlong_filter:
            cut = self._truncated(records).tolist()
            records = [r for r, c in zip(records, cut) if not c]
        self.annotate_reference(records)
        return records

    def _credit_turns(self, records: list[ExperienceRecord], shaped: list[float]) -> None:
        """turn_credit=per_turn: each policy turn's tokens get their turn's advantage (losses/advantages.py
        `turn_advantages` of the discounted reward-to-go; the scored reward, less the per-turn rewards it
        holds, is the last turn's); observation tokens 0 (they carry no loss). A record without turns is
        one turn. Sets `token_advantages`, and `advantage` to the first turn's (priorities, logs)."""
        spans, returns = [], []
        for r, total in zip(records, shaped):
            policy = [t for t in r.turns or () if t["kind"] == "policy"] or [
                {"start": 0, "length": len(r.completion_ids), "reward": None}]
            rewards = [t.get("reward") or 0.0 for t in policy]
            rewards[-1] += total - sum(rewards)
            spans.append(policy)
            returns.append(turn_returns(rewards, self.turn_gamma))
        advantages = turn_advantages(self.advantage_fn, returns, [r.group_id for r in records])
        for r, policy, adv in zip(records, spans, advantages):
            tokens = [0.0] * len(r.completion_ids)
            for turn, a in zip(policy, adv):
                tokens[turn["start"]: turn["start"] + turn["length"]] = [a] * turn["length"]
            r.token_advantages, r.advantage = tokens, adv[0]

    def _truncated(self, records: list[ExperienceRecord]) -> torch.Tensor:
        stops = set(stop_ids(self.policy, self.tokenizer))
        lengths = torch.tensor([len(r.completion_ids) for r in records])
        ended = torch.tensor([finished(r.completion_ids, stops) for r in records], dtype=torch.bool)
        return truncated(lengths, ended, self.overlong_max_len)

    def _overlong(self, records, rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The rewards the advantages see (DAPO's soft overlong penalty added when overlong_cache is set;
        the records keep their scored reward) and the round's rollout/overlong_* metrics."""
        stats = {"overlong_filtered": float(self._truncated(records).sum())} if self.overlong_filter else {}
        if self.overlong_cache is None or rewards.numel() == 0:
            return rewards, stats
        lengths = torch.tensor([len(r.completion_ids) for r in records])
        penalty = overlong_penalty(lengths, self.overlong_max_len, self.overlong_cache)
        return rewards.float() + penalty, stats | {"overlong_penalty_mean": float(penalty.mean()),
                                                   "overlong_penalized_frac": float((penalty < 0).float().mean())}

    def sequence_logprobs(self, model, batch: ExperienceBatch) -> torch.Tensor:
        """With `shared_prefix`: each distinct prompt computed once (the policy's and the reference's forwards);
        else, or when nothing is shared, the padded path."""
        if self.shared_prefix:
            logp = shared_prefix.sequence_logprobs(model, batch, self.temperature, self.top_k, self.top_p)
            if logp is not None:
                return logp
        return super().sequence_logprobs(model, batch)

    def micro_loss(self, batch: ExperienceBatch):
        logp = self.sequence_logprobs(self.policy, batch)
        self.keep_logps(logp)
        advantages = batch.token_advantages if self.turn_credit == "per_turn" else batch.advantages
        if advantages is None:
            raise RuntimeError("algorithm.turn_credit=per_turn: a batch has records without per-token advantages "
                               "(annotated by another run or before the setting changed)")
        per_token, metrics = self.policy_loss(batch, logp, advantages)
        return aggregate(per_token, batch.completion_mask, self.loss_agg_mode, self.loss_max_len), metrics
