"""PPO with a learned critic (Schulman et al. 2017; RLHF as in Ouyang et al. 2022): per-token rewards
(the score at the last completion token, optionally minus kl_coef·KL to the reference in every token),
GAE advantages whitened over the round, the off-policy-corrected (PPO-clipped by default) surrogate, a
clipped value loss, and an early end of the round when KL(behaviour ‖ current) passes `target_kl`.
Everything shared with GRPO (the corrected loss, β·KL as a loss term, diagnostics, ending a round) lives
in trainers/rollout.py; the maths in losses/value.py; the critic in models/value_head.py.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch

from data_modules.experience import ExperienceBatch, ExperienceRecord, collate
from losses.common import aggregate, masked_mean
from losses.value import gae, token_rewards, whiten
from models.forward import sequence_token_logprobs
from models.value_head import build_critic
from trainers.rollout import RolloutModule


@contextmanager
def eval_mode(*modules: torch.nn.Module):
    """Modules in eval mode inside the block, each restored to its own mode after it."""
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)


class PPOModule(RolloutModule):
    """critic: shared | separate (models/value_head.py); value_loss(values, old_values, returns, mask,
    clip_range) → (per-token loss, metrics), losses.value.clipped_value_loss; γ, λ for GAE; the KL to the
    reference in the reward (kl_in_reward, kl_coef) and/or as a loss term (RolloutModule's β)."""

    def __init__(self, critic: str, value_loss: Callable, gamma: float, lam: float, vf_coef: float,
                 value_clip: float, kl_in_reward: bool, kl_coef: float, target_kl: float | None,
                 whiten_advantages: bool, **kwargs):
        super().__init__(**kwargs)
        self.critic = build_critic(critic, self.policy)
        self.value_loss_fn, self.gamma, self.lam = value_loss, gamma, lam
        self.vf_coef, self.value_clip, self.target_kl = vf_coef, value_clip, target_kl
        self.kl_coef = kl_coef if kl_in_reward else 0.0  # KL in the reward; β (RolloutModule) is the loss term
        self.whiten_advantages = whiten_advantages
        if self.kl_coef > 0 and not self.use_reference:  # RolloutModule adds a reference only for β > 0
            self.add_reference()  # with β = 0, policy_loss adds 0·KL and logs train/kl

    # ---- annotation: values, rewards, GAE ------------------------------------------------------
    @torch.no_grad()
    def annotate(self, records: list[ExperienceRecord]) -> list[ExperienceRecord]:
        """Reference log-probs, critic values V(s_t), per-token rewards, GAE advantages (whitened over the
        round) and returns, each stored on the records as one float per completion token."""
        self.annotate_reference(records)
        with eval_mode(self.policy, self.critic):
            for chunk, batch in self.annotation_batches(records, self.collate):
                values = self.values(batch).cpu()
                for r, row, m in zip(chunk, values, batch.completion_mask.cpu().bool()):
                    r.values = row[m].tolist()
        batch = collate(records, self.tokenizer.pad_token_id)  # the whole round, on CPU: [N, T] floats
        mask = batch.completion_mask
        kl = None
        if self.kl_coef > 0:
            kl = (batch.behaviour_logprobs - batch.ref_logprobs) * mask  # k1 of the sampled tokens
        rewards = token_rewards(batch.rewards, mask, kl, self.kl_coef)
        advantages, returns = gae(rewards, batch.values, mask, self.gamma, self.lam)
        stats = {"value_mean": masked_mean(batch.values, mask), "return_mean": masked_mean(returns, mask),
                 "advantage_mean": masked_mean(advantages, mask),
                 "advantage_std": masked_mean((advantages - masked_mean(advantages, mask)) ** 2, mask).sqrt()}
        if kl is not None:
            stats["kl_ref"] = masked_mean(kl, mask)
        if self.whiten_advantages:
            advantages = whiten(advantages, mask)
        keep = mask.bool()
        for r, adv, ret, m in zip(records, advantages, returns, keep):
            r.token_advantages, r.returns = adv[m].tolist(), ret[m].tolist()
            r.advantage = float(adv[m].mean()) if m.any() else 0.0  # a per-record summary, for inspection
        self.last_round_stats = {k: float(v) for k, v in stats.items()}
        return records

    # ---- the step ------------------------------------------------------------------------------
    def shared_forward(self, batch: ExperienceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Shared critic: one forward of the policy → (token log-probs, values [B, T])."""
        logp, hidden = sequence_token_logprobs(self.policy, batch.input_ids, batch.attention_mask,
                                               self.temperature, with_hidden=True,
                                               top_k=self.top_k, top_p=self.top_p)
        return logp, self.critic(batch.input_ids, batch.attention_mask, hidden_states=hidden)

    def values(self, batch: ExperienceBatch) -> torch.Tensor:
        """V(s_t) [B, T], aligned with the batch's target positions."""
        return self.critic(batch.input_ids, batch.attention_mask)  # a shared critic runs the backbone alone

    def logprobs_and_values(self, batch: ExperienceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Token log-probs and values [B, T]: one policy forward for a shared critic, two for a separate one."""
        if not self.critic.shares_policy_forward:
            return self.sequence_logprobs(self.policy, batch), self.values(batch)
        return self.shared_forward(batch)

    def micro_loss(self, batch: ExperienceBatch):
        if batch.token_advantages is None or batch.returns is None or batch.values is None:
            raise ValueError("algorithm=ppo needs records annotated by PPOModule.annotate (values, returns, "
                             "token_advantages on every record of the batch)")
        mask = batch.completion_mask
        logp, values = self.logprobs_and_values(batch)
        self.keep_logps(logp)
        pg, metrics = self.policy_loss(batch, logp, batch.token_advantages)
        vf, vf_metrics = self.value_loss_fn(values, batch.values, batch.returns, mask, self.value_clip)
        pg_loss = aggregate(pg, mask, self.loss_agg_mode, self.loss_max_len)
        vf_loss = aggregate(vf, mask, self.loss_agg_mode, self.loss_max_len)
        loss = pg_loss + self.vf_coef * vf_loss
        return loss, metrics | {"pg_loss": pg_loss.detach(), "vf_loss": vf_loss.detach()} | vf_metrics

    def log_step(self, batch: ExperienceBatch, loss: torch.Tensor, metrics: dict) -> dict[str, float]:
        row = super().log_step(batch, loss, metrics)
        kl = self.last_diagnostics.get("train/kl_behaviour", 0.0)
        if self.target_kl is not None and kl > self.target_kl:
            self.request_round_end("target_kl")
        return row

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The policy's trainable weights and the critic's (a shared critic's: its head alone)."""
        return super().trainable_parameters() + [p for p in self.critic.parameters() if p.requires_grad]
