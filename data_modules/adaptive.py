"""Adaptive experience (`data=adaptive`, the "experience economist"): replay_mix's buffer and round, with
every choice made from measurements by a pure policy object (data_modules/adaptive_policy.py, swappable by
`data.policy._target_`) instead of fixed `replay_ratio`, `max_reuse` and `max_staleness` lines:

    which prompts get fresh samples   a pass-rate posterior per training prompt from all its past groups
                                      (fresh at generation, harvested at load); confidently solved or hopeless
                                      prompts are skipped, the rest ranked by a Thompson draw of their signal
                                      (selection=thompson), or the stream passed over with GRESO's calibrated
                                      probability (selection=greso, data_modules/greso.py)
    how long replay stays servable    the last round's measured ESS and KL of the served replay set a
                                      staleness limit (the user's max_staleness and max_reuse stay as caps);
                                      replayed groups are drawn by priority (mean |advantage|)
    the fresh / replay / harvest mix  value per cost of each source, smoothed, clamped to [min_fresh_frac,
                                      max_fresh_frac]

The round keeps replay_mix's shape: prompts_per_round groups, so its steps are constant; replay and harvest
take their share as far as the buffer can supply it, fresh groups the rest. The signal of a round is read
when the next one is planned (after its last step): the current policy's log-probs of buffered records
exist only after a forward, so the previous round's measured ESS/KL of its served replay is the signal (no
extra forward pass). Decisions read only the whole round's records (gathered on every rank), the step's
all-reduced diagnostics and a seeded RNG, so every rank decides alike; the policy's state (posteriors,
EMAs, limit, RNG) is in the checkpoint. Per round: `mix/*` metrics (docs/experience.md, "Adaptive
experience"), and a console line when the reason changes.
"""
from __future__ import annotations

import time

from data_modules.adaptive_policy import (REASONS, REUSE_REASONS, SAY_REASON, SAY_REUSE, AdaptivePolicy, ReplayMeasure,
                                         SourceMeasure)
from data_modules.experience import ExperienceRecord
from data_modules.replay_mix import ReplayMixDataModule
from data_modules.state_checks import StateError, field, integer, mapping, number, sequence
from data_modules.stored_success import STORED
from hardware.console import say
from tasks.base import encode_example

SERVED = {"fresh": "fresh", "replay": "replay", "dataset": "harvest"}  # served_as → the policy's source


def informative(records: list[ExperienceRecord]) -> list[ExperienceRecord]:
    """The records of the groups (by group id, among `records`) whose rewards do not all tie."""
    rewards: dict[int, list[float]] = {}
    for r in records:
        rewards.setdefault(r.group_id, []).append(r.reward)
    return [r for r in records if max(rewards[r.group_id]) - min(rewards[r.group_id]) >= 1e-6]


class AdaptiveDataModule(ReplayMixDataModule):
    def __init__(self, policy: AdaptivePolicy, max_staleness: int | None, max_reuse: int | None, eviction: str,
                 priority_alpha: float, harvest: str | None, harvest_mismatch: str, allow_uncorrected: bool,
                 refresh_on_drift: bool, **kwargs):
        super().__init__(replay_ratio=0.0, max_staleness=max_staleness, max_reuse=max_reuse, eviction=eviction,
                         sampling="prioritized", priority_alpha=priority_alpha, harvest=harvest,
                         harvest_mismatch=harvest_mismatch, allow_uncorrected=allow_uncorrected,
                         refresh_on_drift=refresh_on_drift, **kwargs)
        self.policy = policy
        self.group_prompt: dict[int, int] = {}  # fresh group id → training prompt index
        self.decision: dict[str, float] = {}    # the current round's mix/* metrics
        self.reason = ""                         # the current round's reason ("value/kl")
        self.reasons: dict[str, int] = {}        # rounds per reason (summary.json)
        self.fresh_fracs: list[float] = []
        self._prompt_index: dict[str, int] | None = None
        self.said: str | None = None  # the reason the console last showed
        self.decision_seconds = 0.0   # the controller's own bookkeeping: planning rounds, taking in evidence
        self.decision_ms = 0.0        # the last round's planning
        self._generated: dict[int, list[float]] | None = None  # the round's groups `generated` took, until `put`
        self._carried: set[int] = set()  # the round's carried groups (algorithm.carry_surplus), taken the round before

    # ---- planning a round ----------------------------------------------------------------------------
    def next_prompts(self, n: int | None = None):
        """Plan the round (timed: `mix/decision_ms` per round, `mix/decision_seconds` in summary.json)."""
        start = time.perf_counter()
        prompts = self._plan()
        took = time.perf_counter() - start
        self.decision_seconds += took
        self.decision_ms = 1000 * took  # kept out of `decision`: a timing, not a decision (ranks differ)
        return prompts

    def _plan(self):
        """Measure the last round, retire replay past the limit, set the mix, pick the fresh prompts."""
        if self.harvest and not self.harvested:
            self._harvest()
            self._observe([r for g in self.buffer.groups.values() for r in g if r.provenance.policy_version is None],
                          generated=False)
        self._measure()
        greso = self.policy.greso if self._greso() else None
        if greso is not None:  # the last round's tie shares move the skip strengths (data_modules/greso.py)
            greso.update()
        limit = self.policy.update_reuse(self._replay_measure(), self.buffer.max_staleness)
        self.buffer.expire(self.policy_version)  # the user's caps: max_staleness, max_reuse
        if limit is not None:
            for gid, group in list(self.buffer.groups.items()):
                age = self.buffer.staleness(group, self.policy_version)
                if age is not None and age > limit:
                    self.buffer.retire(gid, "adaptive")
        counts, reason = self._counts()
        own, harvested = self._pools()
        self.replay_ids = (self.buffer.sample_groups(counts["replay"], self.rng, exclude=harvested)
                           + self.buffer.sample_groups(counts["harvest"], self.rng, exclude=own))
        planned = self._choose(counts["fresh"])
        if not planned["prompts"] and counts["fresh"]:
            reason = "no_prompts"
        self._decide(counts, reason, limit, planned)
        return planned["prompts"]

    def _pools(self) -> tuple[set[int], set[int]]:
        """(group ids of this run's replayable groups, of harvested groups) in the buffer."""
        own = {g for g, rs in self.buffer.groups.items() if rs[0].provenance.policy_version is not None}
        return own, set(self.buffer.groups) - own

    def _counts(self) -> tuple[dict[str, int], str]:
        """Groups per source this round: the policy's shares, as far as the buffer can supply them."""
        P = self.prompts_per_round
        own, harvested = self._pools()
        if self.refresh:
            return {"fresh": P, "replay": 0, "harvest": 0}, "refresh"
        shares, reason = self.policy.shares({"replay": bool(own), "harvest": bool(harvested)})
        replay = min(round(shares["replay"] * P), len(own))
        harvest = min(round(shares["harvest"] * P), len(harvested), P - 1 - replay)
        replay = min(replay, P - 1 - harvest)  # at least one fresh group
        if replay < round(shares["replay"] * P) or harvest < round(shares["harvest"] * P):
            reason = "short_replay" if reason != "start" else reason
        return {"fresh": P - replay - harvest, "replay": replay, "harvest": harvest}, reason

    def _choose(self, budget: int) -> dict:
        """The round's fresh prompts. selection=stream: the stream from the cursor, settled prompts passed over
        (the cursor moves past all it read); thompson: the policy's choice among seen prompts, then unseen ones
        in stream order."""
        seen = sorted(self.policy.evidence)
        if self._greso():
            choice = self._greso_walk(budget)
            return {"prompts": [self._prompt(k) for k in choice.seen], "skipped": choice.skipped,
                    "expected_zero_var": choice.expected_zero_var, "seen": len(seen),
                    "skipped_pass": choice.skipped_pass, "skipped_fail": choice.skipped_fail}
        if self.policy.select_prompts and getattr(self.policy, "selection", "stream") == "stream":
            n = len(self._order)
            order = (self._order[(self.cursor + i) % n] for i in range(n))  # one pass, read lazily
            choice = self.policy.filter_stream(order, budget, self.group_size, self.rounds_put)
            self.cursor += choice.looked
            return {"prompts": [self._prompt(k) for k in choice.seen], "skipped": choice.skipped,
                    "expected_zero_var": choice.expected_zero_var, "seen": len(seen)}
        unseen = len(self.task.train) - len(seen)
        choice = self.policy.choose_prompts(seen, unseen, budget, self.group_size, self.rounds_put)
        prompts = [self._prompt(k) for k in choice.seen] + self.fresh_prompts(choice.unseen)
        return {"prompts": prompts, "skipped": choice.skipped, "expected_zero_var": choice.expected_zero_var,
                "seen": len(seen)}

    def _greso(self) -> bool:
        return self.policy.select_prompts and getattr(self.policy, "selection", "stream") == "greso"

    def _greso_walk(self, budget: int):
        """selection=greso: the stream from the cursor (one pass, read lazily), GRESO's draw passing over prompts
        with runs of tied visits; the cursor moves past all it read."""
        n = len(self._order)
        order = (self._order[(self.cursor + i) % n] for i in range(n))
        choice = self.policy.greso_stream(order, budget, self.group_size, self.rounds_put)
        self.cursor += choice.looked
        return choice

    def fresh_prompts(self, n: int):
        """The next n prompts of the seeded stream that have no evidence yet (any, once every one has some);
        also dynamic sampling's refills. selection=greso: the next n GRESO does not pass over (the refill is
        skipped before rollout as the round's planned prompts are; its skips are added to the round's counts)."""
        if self._greso():
            choice = self._greso_walk(n)
            for key, add in (("prompts_skipped", choice.skipped), ("prompts_skipped_pass", choice.skipped_pass),
                             ("prompts_skipped_fail", choice.skipped_fail)):
                self.decision[f"mix/{key}"] = self.decision.get(f"mix/{key}", 0.0) + add
            return [self._prompt(k) for k in choice.seen]
        out, looked = [], 0
        while len(out) < n:
            idx = self._order[self.cursor % len(self._order)]
            self.cursor += 1
            looked += 1
            if idx not in self.policy.evidence or looked > len(self._order):
                out.append(self._prompt(idx))
        return out

    def _prompt(self, idx: int):
        ex = self.task.train[idx]
        if idx not in self._encoded:
            self._encoded[idx] = encode_example(self.tokenizer, ex, self.task.chat)
        gid, self.next_group_id = self.next_group_id, self.next_group_id + 1
        self.group_prompt[gid] = idx
        return ex, self._encoded[idx], gid

    def _decide(self, counts: dict[str, int], reason: str, limit: int | None, planned: dict) -> None:
        P = self.prompts_per_round
        self.reason = f"{reason}/{self.policy.reuse_reason}"
        self.reasons[self.reason] = self.reasons.get(self.reason, 0) + 1
        self.decision = {
            "mix/fresh_frac": counts["fresh"] / P, "mix/replay_frac": counts["replay"] / P,
            "mix/harvest_frac": counts["harvest"] / P, "mix/fresh_prompts": float(len(planned["prompts"])),
            "mix/prompts_skipped": float(planned["skipped"]),
            "mix/skipped_share": planned["skipped"] / max(planned["seen"], 1),
            "mix/samples_per_prompt": float(self.group_size),
            "mix/reuse_limit": float(-1 if limit is None else limit),
            "mix/zero_var_expected": planned["expected_zero_var"],
            "mix/reason_code": float(REASONS.index(reason)),
            "mix/reuse_reason_code": float(REUSE_REASONS.index(self.policy.reuse_reason)),
            **{f"mix/value_per_cost/{s}": v for s, v in self.policy.values.items()}}
        if self._greso():
            g = self.policy.greso
            self.decision |= {"mix/prompts_skipped_pass": float(planned["skipped_pass"]),
                              "mix/prompts_skipped_fail": float(planned["skipped_fail"]),
                              "mix/greso_explore_pass": g.explore["pass"], "mix/greso_explore_fail": g.explore["fail"],
                              "mix/greso_tie_share_pass": g.last["pass"], "mix/greso_tie_share_fail": g.last["fail"]}
        self.fresh_fracs.append(counts["fresh"] / P)
        if self.trainer is not None and self.reason != self.said:
            say(self.trainer, f"[mix] round {self.rounds_put + 1}: {counts['fresh']} fresh prompts × {self.group_size}, "
                              f"{counts['replay']} replayed, {counts['harvest']} harvested groups; "
                              f"{planned['skipped']} prompts skipped; reuse limit "
                              f"{'none' if limit is None else limit} ({SAY_REUSE[self.policy.reuse_reason]}); "
                              f"{SAY_REASON[reason]}")
        self.said = self.reason

    # ---- measuring the last round --------------------------------------------------------------------
    def _diagnostics(self) -> dict[str, float]:
        module = self.trainer.lightning_module if self.trainer is not None else None
        return dict(getattr(module, "last_diagnostics", {}) or {})

    def _measure(self) -> None:
        """Feed the last round's served records (value, ESS, unclipped share, cost per source) to the policy's
        EMAs, each source over its informative records only (groups whose rewards do not all tie): replay is
        drawn mostly from informative groups, fresh data is not, and comparing the two over all records would
        value replay 1/(1 − z) too high at a tie share z. A source whose every served group tied realised
        nothing: value 0."""
        served = [r for r in self.epoch_records() if r.provenance.times_used > 0] if self.rounds_put else []
        diag = self._diagnostics()
        measures = {}
        for label, source in SERVED.items():
            rs = [r for r in served if r.served_as == label]
            if not rs:
                continue
            useful = informative(rs)
            priced = useful or rs
            generated = sum(len(r.completion_ids) for r in priced) / len(priced) if source == "fresh" else 0.0
            trained = self.passes * sum(len(r.prompt_ids) + len(r.completion_ids) for r in priced) / len(priced)
            measures[source] = SourceMeasure(
                records=len(rs), mean_abs_advantage=sum(abs(r.advantage) for r in useful) / max(len(useful), 1),
                ess_frac=float(diag.get(f"train/ess_frac/source_{label}", 1.0)),
                cost=self.policy.record_cost(generated, trained),
                unclipped=1.0 - float(diag.get(f"train/adv_clip_frac/source_{label}", 0.0)))
        self.policy.update_values(measures)

    def _replay_measure(self) -> ReplayMeasure | None:
        """The last step's ESS/KL of the served replay and its mean staleness at that step (None: none served,
        or no step measured it, e.g. the first round after a resume)."""
        diag = self._diagnostics()
        replay = [r for r in self.epoch_records() if r.served_as == "replay" and r.provenance.times_used > 0]
        if not replay or "train/ess_frac/source_replay" not in diag or not self.rounds_put:
            return None
        step = self.policy_version - 1  # the weights the last step ran with
        ages = [step - r.provenance.policy_version for r in replay]
        return ReplayMeasure(ess_frac=float(diag["train/ess_frac/source_replay"]),
                             kl=float(diag.get("train/kl_behaviour/source_replay", 0.0)),
                             staleness=sum(ages) / len(ages))

    # ---- taking a round --------------------------------------------------------------------------------
    def generated(self, records: list[ExperienceRecord], carried_groups=()) -> None:
        """Every scored group the round generated, before any is dropped (dynamic sampling's tied groups and
        surplus, callbacks/regenerate.py): into the prompts' evidence and GRESO's runs of tied visits, so the
        groups a filter drops count as visits too. `put` then skips the groups already taken here, and the
        `carried_groups` (algorithm.carry_surplus): generated, and taken here, the round before."""
        start = time.perf_counter()
        self._generated = self._observe(records, self.rounds_put)
        self._carried = set(carried_groups)
        self.decision_seconds += time.perf_counter() - start

    def put(self, records: list[ExperienceRecord]) -> None:
        """Take the round, then add its groups' rewards to their prompts' evidence (those `generated` did not)."""
        round_ = self.rounds_put
        super().put(records)
        start = time.perf_counter()
        seen, self._generated = self._generated or {}, None
        taken, self._carried = set(seen) | self._carried, set()
        groups = seen | self._observe([r for r in records if r.group_id not in taken], round_)
        self.decision_seconds += time.perf_counter() - start
        zero = [max(rs) - min(rs) < 1e-6 for rs in groups.values()]  # of every group generated this round
        self.decision["mix/zero_var_realised"] = sum(zero) / len(zero) if zero else 0.0

    def _observe(self, records: list[ExperienceRecord], round_: int | None = None,
                 generated: bool = True) -> dict[int, list[float]]:
        """Each group's rewards into its prompt's evidence (harvested groups by their prompt text)."""
        groups: dict[int, list[float]] = {}
        for r in records:
            if r.served_as != STORED:  # a reused stored success is no new evidence (it was counted when sampled)
                groups.setdefault(r.group_id, []).append(r.reward)
        for gid, rewards in groups.items():
            idx = self.group_prompt.get(gid)
            if idx is None:
                idx = self._index_of(next(r for r in records if r.group_id == gid).prompt_text)
            if idx is not None:
                self.policy.observe(idx, rewards, self.rounds_put if round_ is None else round_, generated)
        return groups

    def _index_of(self, prompt: str) -> int | None:
        if self._prompt_index is None:
            self._prompt_index = {}
            for i, ex in enumerate(self.task.train):
                self._prompt_index.setdefault(ex.prompt, i)
        return self._prompt_index.get(prompt)

    # ---- logging and checkpoint ----------------------------------------------------------------------
    def round_stats(self) -> dict[str, float]:
        return super().round_stats() | self.decision | {"mix/decision_ms": self.decision_ms}

    def summary(self) -> dict:
        """summary.json: the last round's decision, rounds per reason, mean fresh share."""
        if not self.fresh_fracs:
            return {}
        return {**self.decision, "mix/reason": self.reason, "mix/fresh_frac_mean": sum(self.fresh_fracs) / len(self.fresh_fracs),
                "mix/decision_seconds": self.decision_seconds,
                **{f"mix/reasons/{k}": v for k, v in self.reasons.items()}}

    def state_dict(self) -> dict:
        return super().state_dict() | {"policy": self.policy.state_dict(), "group_prompt": dict(self.group_prompt),
                                       "decision": dict(self.decision), "reason": self.reason,
                                       "reasons": dict(self.reasons), "fresh_fracs": list(self.fresh_fracs)}

    def max_cursor(self, group_ids: int, rounds: int) -> int:
        """Each prompt taken may have read one pass of the stream, and each round one pass more."""
        return (group_ids + rounds + 1) * (len(self._order) + 1)

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        prompts, ids = len(self.task.train), state["next_group_id"]
        self.policy.check_state(field(state, "policy"), "policy", prompts, integer(state.get("rounds_put", 0), "rounds_put"))
        for gid, idx in mapping(field(state, "group_prompt"), "group_prompt").items():
            integer(int(gid) if isinstance(gid, str) and gid.isdigit() else gid, f"group_prompt[{gid!r}]", high=ids - 1)
            integer(idx, f"group_prompt[{gid!r}]", high=prompts - 1)
        for name, v in mapping(field(state, "decision"), "decision").items():
            number(v, f"decision.{name}", low=None, nan=True)
        if not isinstance(field(state, "reason"), str):
            raise StateError("reason", f"{state['reason']!r} is not a text")
        for name, n in mapping(field(state, "reasons"), "reasons").items():
            integer(n, f"reasons.{name}")
        for i, frac in enumerate(sequence(field(state, "fresh_fracs"), "fresh_fracs")):
            number(frac, f"fresh_fracs[{i}]", high=1.0)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.policy.load_state_dict(state["policy"])
        self.group_prompt = {int(k): v for k, v in state["group_prompt"].items()}
        self.decision, self.reason = dict(state["decision"]), state["reason"]
        self.reasons, self.fresh_fracs = dict(state["reasons"]), list(state["fresh_fracs"])
