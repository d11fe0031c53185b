"""GRESO's calibrated skipping before rollout (`data.policy.selection=greso`; Zheng et al. 2025, "Act Only
When It Pays: Efficient Reinforcement Learning for LLM Reasoning via Selective Rollouts", arXiv 2506.02177,
its `presampling_selector.py` and `ray_trainer.py`). docs/experience.md, "Calibrated skipping", has the
equations. In short:

    a visit      a fresh group of G samples of a prompt; it ties at pass when every reward passes
                 (r ≥ pass_threshold) and all are equal, at fail when every reward fails and all are equal
    the run      k(x): how many of prompt x's latest visits in a row tied the same way (0 after a group with
                 signal); its kind: pass or fail
    skip         p_skip(x) = 1 − max(e_kind^k, revisit_floor)    (GRESO: 1 − max(p^k, 0.01))
                 e_pass, e_fail: the exploration probabilities, one per kind; revisit_floor keeps a settled
                 prompt revisited now and then (≥ floor per reading of the stream)
    controller   after each round, z_pass and z_fail are the shares of its generated groups that tied at pass
                 and at fail; the targets are t_pass = target_tie_share · pass_share and
                 t_fail = target_tie_share · (1 − pass_share) (GRESO: ⅓ and ⅔ of its target_zero_variance):
                     e_kind ← max(e_kind − explore_step, explore_min)   if z_kind ≥ t_kind   (skip more)
                     e_kind ← min(e_kind + explore_step, explore_max)   otherwise            (skip less)
                 a round that generated no group measures nothing and moves nothing

Every draw comes from one seeded random.Random that is part of `state_dict`, and a prompt with k = 0 takes
no draw, so the decisions are a function of (seed, the groups observed): the same on every rank, exact on
resume. The object holds no trainer, tensor or config: observations in, decisions out.
"""
from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from data_modules.state_checks import StateError, field, integer, mapping, number, python_rng, sequence

KINDS = ("pass", "fail")


@dataclass(frozen=True)
class GresoWalk:
    """What one walk of the prompt stream did: the prompts taken (stream order), how far it read, and how many
    it passed over per kind (a prompt passed over and then taken to fill the budget counts as taken)."""
    chosen: list
    looked: int
    skipped_pass: int
    skipped_fail: int


def tie_kind(rewards: list[float], pass_threshold: float) -> str | None:
    """'pass' when the group's rewards all tie and pass, 'fail' when they all tie and fail, else None."""
    if not rewards or max(rewards) - min(rewards) >= 1e-6:
        return None
    return "pass" if rewards[0] >= pass_threshold else "fail"


class GresoSkip:
    def __init__(self, target_tie_share: float, pass_share: float, explore_init: float, explore_step: float,
                 explore_min: float, explore_max: float, revisit_floor: float, seed: int):
        bounds = {"target_tie_share": (target_tie_share, 0.0, 1.0), "pass_share": (pass_share, 0.0, 1.0),
                  "explore_step": (explore_step, 0.0, 1.0), "explore_min": (explore_min, 0.0, 1.0),
                  "explore_max": (explore_max, 0.0, 1.0), "revisit_floor": (revisit_floor, 0.0, 1.0)}
        for name, (value, low, high) in bounds.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"data.policy.greso.{name}={value!r} must be a number in [{low:g}, {high:g}]")
        if not explore_min <= explore_init <= explore_max:
            raise ValueError(f"data.policy.greso.explore_init={explore_init!r} must be in [explore_min, explore_max] "
                             f"= [{explore_min:g}, {explore_max:g}]")
        self.target_tie_share, self.pass_share = float(target_tie_share), float(pass_share)
        self.step, self.low, self.high = float(explore_step), float(explore_min), float(explore_max)
        self.floor = float(revisit_floor)
        self.explore = {k: float(explore_init) for k in KINDS}  # e_pass, e_fail
        self.rng = random.Random(seed)
        self.runs: dict[int, list] = {}          # prompt key → [kind, k]
        self.measured = {"groups": 0, "pass": 0, "fail": 0}  # generated groups since the controller last moved
        self.last = {"pass": 0.0, "fail": 0.0}   # the tie shares the controller last read (logged)

    # ---- the rule ------------------------------------------------------------------------------------
    def targets(self) -> dict[str, float]:
        """t_pass = target_tie_share · pass_share, t_fail = target_tie_share · (1 − pass_share)."""
        return {"pass": self.target_tie_share * self.pass_share, "fail": self.target_tie_share * (1 - self.pass_share)}

    def skip_probability(self, kind: str | None, run: int) -> float:
        """p_skip = 1 − max(e_kind^run, revisit_floor); 0 for a prompt whose latest visit had signal (run 0)."""
        if kind is None or run <= 0:
            return 0.0
        return 1.0 - max(self.explore[kind] ** run, self.floor)

    def skips(self, key: int) -> str | None:
        """Whether prompt `key` is passed over this time: its run's kind, or None (no draw when its run is 0)."""
        kind, run = self.runs.get(key, (None, 0))
        p = self.skip_probability(kind, run)
        return kind if p > 0 and self.rng.random() < p else None

    def walk(self, order: Iterable[int], budget: int) -> GresoWalk:
        """The first `budget` prompts of `order` (the stream from its cursor, at most one pass) that are not
        passed over; if the pass leaves fewer, the passed-over ones fill in, in stream order."""
        chosen, passed, looked, count = [], [], 0, {"pass": 0, "fail": 0}
        for key in order:
            if len(chosen) == budget:
                break
            looked += 1
            kind = self.skips(key)
            if kind is None:
                chosen.append(key)
            else:
                passed.append((key, kind))
        fill = passed[: budget - len(chosen)]
        for _, kind in passed[len(fill):]:
            count[kind] += 1
        return GresoWalk(chosen=chosen + [k for k, _ in fill], looked=looked, skipped_pass=count["pass"],
                         skipped_fail=count["fail"])

    # ---- observations and the controller -------------------------------------------------------------
    def observe(self, key: int, rewards: list[float], pass_threshold: float, generated: bool = True) -> None:
        """One visit of prompt `key`: extend or reset its run; a generated group also counts toward this round's
        measured tie shares (a harvested group updates the run only)."""
        kind = tie_kind(rewards, pass_threshold)
        old_kind, run = self.runs.get(key, (None, 0))
        self.runs[key] = [kind, run + 1 if kind is not None and kind == old_kind else int(kind is not None)]
        if generated:
            self.measured["groups"] += 1
            if kind is not None:
                self.measured[kind] += 1

    def update(self) -> dict[str, float]:
        """Move e_pass and e_fail one step toward the target tie shares from the groups measured since the last
        update (none: nothing moves), then start a new measurement. Returns the shares read."""
        n = self.measured["groups"]
        if n:
            targets = self.targets()
            for kind in KINDS:
                share = self.measured[kind] / n
                self.last[kind] = share
                e = self.explore[kind]
                self.explore[kind] = max(e - self.step, self.low) if share >= targets[kind] else min(e + self.step, self.high)
        self.measured = {"groups": 0, "pass": 0, "fail": 0}
        return dict(self.last)

    # ---- checkpoint ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "explore": dict(self.explore),
                "runs": {k: list(v) for k, v in self.runs.items()}, "measured": dict(self.measured),
                "last": dict(self.last)}

    def check_state(self, state: dict, where: str, prompts: int) -> None:
        """StateError naming `where.<key>` unless `state` is one this object could have written."""
        python_rng(field(state, "rng", where), f"{where}.rng")
        explore = mapping(field(state, "explore", where), f"{where}.explore")
        for kind in KINDS:
            number(field(explore, kind, f"{where}.explore"), f"{where}.explore.{kind}", low=0.0, high=1.0)
        for k, v in mapping(field(state, "runs", where), f"{where}.runs").items():
            key = f"{where}.runs[{k!r}]"
            integer(int(k) if isinstance(k, str) and k.isdigit() else k, key, high=prompts - 1)
            v = sequence(v, key)
            if len(v) != 2 or v[0] not in (None, *KINDS):
                raise StateError(key, f"{v!r} is not [kind (pass | fail | None), run]")
            integer(v[1], f"{key}.run")
            if (v[0] is None) != (v[1] == 0):
                raise StateError(key, f"{v!r}: a run of 0 has no kind, a kind has a run ≥ 1")
        measured = mapping(field(state, "measured", where), f"{where}.measured")
        groups = integer(field(measured, "groups", f"{where}.measured"), f"{where}.measured.groups")
        for kind in KINDS:
            integer(field(measured, kind, f"{where}.measured"), f"{where}.measured.{kind}", high=groups)
        last = mapping(field(state, "last", where), f"{where}.last")
        for kind in KINDS:
            number(field(last, kind, f"{where}.last"), f"{where}.last.{kind}", high=1.0)

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(python_rng(state["rng"], "rng"))
        self.explore = {k: float(state["explore"][k]) for k in KINDS}
        self.runs = {int(k): list(v) for k, v in state["runs"].items()}
        self.measured = dict(state["measured"])
        self.last = {k: float(state["last"][k]) for k in KINDS}
