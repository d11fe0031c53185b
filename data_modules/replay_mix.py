"""Replay mixed with fresh data (`data=replay_mix`): each round serves prompts_per_round groups, of which
round(replay_ratio × prompts_per_round) are replayed from the buffer (as many as it can supply, after
its staleness and reuse rules) and the rest are freshly generated. replay_ratio 0 is pure on-policy;
0.9 generates a tenth of the tokens per round. Groups stay whole, so a round's size (and steps) is
constant. With `refresh_on_drift`, a round that a drift trigger ended early (callbacks/drift.py) is
followed by an all-fresh round. `harvest=<dir>` adds the experience of an earlier run's store to the
buffer before the first round, as off-policy data (served_as "dataset"; its behaviour log-probs kept when the tokenizer matches,
else recomputed under the starting policy: `harvest_mismatch=retokenize`, or refused: `refuse`).
"""
from __future__ import annotations

import random

from data_modules.buffer import ExperienceBuffer
from data_modules.experience import ExperienceRecord, collate
from data_modules.fresh_rollouts import FreshRolloutsDataModule
from data_modules.state_checks import StateError, field, integer, python_rng, sequence
from data_modules.store import load_experience

DRIFT_TRIGGERS = ("ess", "kl", "staleness")  # callbacks/drift.py's reasons


class ReplayMixDataModule(FreshRolloutsDataModule):
    def __init__(self, replay_ratio: float, max_staleness: int | None, max_reuse: int | None,
                 eviction: str, sampling: str, priority_alpha: float, harvest: str | None,
                 harvest_mismatch: str, allow_uncorrected: bool, refresh_on_drift: bool, **kwargs):
        # allow_uncorrected is read by run/validation/config.py (correction=none on replayed data)
        self.buffer_rules = dict(max_staleness=max_staleness, max_reuse=max_reuse, eviction=eviction,
                                 sampling=sampling, priority_alpha=priority_alpha)
        super().__init__(**kwargs)
        if not 0.0 <= replay_ratio < 1.0:
            raise ValueError(f"data.replay_ratio={replay_ratio} must be in [0, 1)")
        self.replay_ratio, self.harvest, self.harvest_mismatch = replay_ratio, harvest, harvest_mismatch
        self.rng = random.Random(self.seed)
        self.replay_ids: list[int] = []  # groups replayed in the current round
        self.harvested = False
        self.refresh_on_drift, self.refresh = refresh_on_drift, False

    def make_buffer(self, capacity: int) -> ExperienceBuffer:
        return ExperienceBuffer(capacity, **self.buffer_rules)

    def on_trigger(self, trigger: str) -> None:
        """Told why the coming round is made: after a drift trigger (callbacks/drift.py) and with
        refresh_on_drift, it is all fresh; the replay ratio applies again from the round after."""
        self.refresh = self.refresh_on_drift and trigger in DRIFT_TRIGGERS

    def next_prompts(self, n: int | None = None):
        """Plan the round: expire old groups, pick the replayed ones, return prompts for the rest."""
        if self.harvest and not self.harvested:
            self._harvest()
        self.buffer.expire(self.policy_version)
        want = min(round(self.replay_ratio * self.prompts_per_round), self.prompts_per_round - 1)
        want = 0 if self.refresh else want
        self.replay_ids = self.buffer.sample_groups(want, self.rng)
        return super().next_prompts(self.prompts_per_round - len(self.replay_ids))

    def epoch_records(self) -> list[ExperienceRecord]:
        fresh = super().epoch_records()
        replay = [r for gid in self.replay_ids if gid in self.buffer.groups for r in self.buffer.groups[gid]]
        for r in replay:
            r.served_as = "dataset" if r.provenance.policy_version is None else "replay"
        return fresh + replay

    def round_stats(self) -> dict[str, float]:
        """Logged by RegenerateExperience each round: the replay share actually served, and the buffer."""
        stats = {"rollout/replay_frac": len(self.replay_ids) / self.prompts_per_round,
                 "rollout/buffer_records": float(len(self.buffer)),
                 "rollout/buffer_evicted_unused": float(self.buffer.evicted_unused)}
        oldest = self.buffer.oldest_staleness(self.policy_version)
        return stats | ({"rollout/buffer_oldest_staleness": float(oldest)} if oldest is not None else {})

    def round_oldest_version(self) -> int | None:
        """Policy version of the oldest record served this round (None: none from this run)."""
        versions = [r.provenance.policy_version for r in self.epoch_records()
                    if r.provenance.policy_version is not None]
        return min(versions) if versions else None

    def _harvest(self) -> None:
        """Load the store at `harvest` into the buffer (new group ids; annotated by the current module)."""
        module = self.trainer.lightning_module
        vocab = getattr(getattr(module.policy, "config", None), "vocab_size", None)  # ids must index its embedding
        records = load_experience(self.harvest, self.tokenizer, self.harvest_mismatch, vocab)
        new_ids: dict[int, int] = {}
        for r in records:
            if r.group_id not in new_ids:
                new_ids[r.group_id] = self.next_group_id
                self.next_group_id += 1
            r.group_id = new_ids[r.group_id]
            r.provenance.policy_version = None  # another run's version numbers mean nothing here
            r.provenance.times_used = 0
            r.served_as = "dataset"
        missing = [r for r in records if r.behaviour_logprobs is None]
        for lo in range(0, len(missing), 256):  # retokenized: behaviour = the policy we start from
            chunk = missing[lo : lo + 256]
            for r, lp in zip(chunk, module.frozen_logprobs(module.policy, collate(chunk, self.tokenizer.pad_token_id))):
                r.behaviour_logprobs = lp
        self.buffer.put(module.annotate(records))
        self.buffer.latest_ids = []  # harvested data is replay, not this round's fresh data
        self.harvested = True

    def state_dict(self) -> dict:
        return super().state_dict() | {"rng": self.rng.getstate(), "replay_ids": list(self.replay_ids),
                                       "harvested": self.harvested, "refresh": self.refresh}

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        python_rng(field(state, "rng"), "rng")
        ids = state["next_group_id"]  # checked above
        for i, gid in enumerate(sequence(field(state, "replay_ids"), "replay_ids")):
            integer(gid, f"replay_ids[{i}]", high=ids - 1)  # a group this module made or harvested
        for key in ("harvested", "refresh"):
            if not isinstance(state.get(key, False), bool):
                raise StateError(key, f"{state[key]!r} is not true or false")

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.rng.setstate(_as_tuple(state["rng"]))
        self.replay_ids, self.harvested = list(state["replay_ids"]), state["harvested"]
        self.refresh = state.get("refresh", False)


def _as_tuple(x):
    """random.Random state back from a checkpoint (lists may come back where tuples went in)."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
