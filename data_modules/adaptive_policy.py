"""The decisions of `data=adaptive` (data_modules/adaptive.py), as a pure object: statistics in, decisions
out, nothing read from a trainer. Swappable by `data.policy._target_`; docs/experience.md, "Adaptive
experience", states the rules with their equations. In short, each round:

    prompts   each training prompt keeps a posterior of its pass rate p from its past rollouts: Beta(α, β),
              α = 1 + passes, β = 1 + fails, the evidence decayed by `decay` per round since it was seen
              (non-binary rewards, `pass_threshold: null`: a decayed mean and variance). Fresh prompts are
              ranked by a Thompson draw of the signal of a group of G, 1 − p^G − (1 − p)^G (p drawn from the
              posterior; its expectation is `expected_signal`), unseen prompts from a Beta prior of mass 2 at
              the pooled pass rate of all evidence; prompts
              confidently solved (P(p > 1 − skip_margin) ≥ skip_confidence) or hopeless
              (P(p < skip_margin) ≥ skip_confidence) are skipped.
    reuse     the last round's served replay had ESS fraction e and KL(μ ‖ π) per token k at mean staleness
              s̄: drift per policy version κ_ess = −ln(e)/s̄, κ_kl = k/s̄; replay older than
              L = min(max_staleness, ⌊ln(1/min_ess_frac)/κ_ess⌋, ⌊max_kl/κ_kl⌋) versions is retired. A round
              that served no replay measures nothing: L grows by one (a probe) up to max_staleness.
    mix       value per cost of each source s (fresh, replay, harvest) from its served informative records
              (groups whose rewards do not all tie): u_s = mean|A| · ESS_s · (1 − c_s) / cost per record,
              c_s its |A|-weighted clipped share (generated and trained tokens at the ledger's prices),
              smoothed ū_s ← (1 − ema)·ū_s + ema·u_s; fresh share f = clamp(ū_f / Σ ū, min_fresh_frac,
              max_fresh_frac), the rest split over replay and harvest ∝ ū.

That ranking is `selection: thompson`. `selection: greso` walks the stream too, but passes over a prompt with a
probability that grows with its run of tied visits, calibrated each round to a target tie share
(data_modules/greso.py, `data.policy.greso`). The default, `selection: stream`, instead walks the prompt
stream in its seeded order and skips only the prompts confidently solved or hopeless: it never prefers a seen
prompt to an unseen one, so within one pass over the prompts it takes exactly what fresh_rollouts takes, and
past it spends no samples on prompts already settled (docs/experience.md: why it is the default).

Each lever can be switched off for an ablation: `select_prompts: false` takes prompts in the stream's order,
`adaptive_reuse: false` keeps max_staleness as the only limit, min_fresh_frac = max_fresh_frac fixes the mix.

Every draw comes from one seeded random.Random, so decisions are a function of (seed, inputs): the same on
every rank given the same statistics, and restored exactly from `state_dict`.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from data_modules.greso import GresoSkip
from data_modules.state_checks import StateError, field, integer, mapping, number, one_of, python_rng, sequence

SOURCES = ("fresh", "replay", "harvest")
REASONS = ("start", "value", "min_fresh", "max_fresh", "refresh", "short_replay", "no_prompts")
REUSE_REASONS = ("cap", "ess", "kl", "probe")
SAY_REASON = {  # the console's words for each reason (mix/reason_code logs its index in REASONS)
    "start": "a source not measured yet is tried",
    "value": "the mix follows each source's measured value per cost",
    "min_fresh": "fresh held at data.policy.min_fresh_frac (replay measured more valuable)",
    "max_fresh": "fresh held at data.policy.max_fresh_frac (fresh measured more valuable)",
    "refresh": "all fresh: a drift trigger ended the last round (data.refresh_on_drift)",
    "short_replay": "all fresh: nothing servable to replay or harvest yet",
    "no_prompts": "no fresh prompt left to sample",
}
SAY_REUSE = {  # and for the reuse limit's reason (mix/reuse_reason_code: its index in REUSE_REASONS)
    "cap": "data.max_reuse", "ess": "the ESS rule", "kl": "the KL rule", "probe": "probing a longer reuse",
}
SELECTIONS = ("thompson", "stream", "greso")


@dataclass(frozen=True)
class SourceMeasure:
    """What one source's served records of the last round said, over its informative records (groups whose
    rewards do not all tie): mean |advantage|, the ESS fraction measured on them (1 for unmeasured on-policy
    data), the cost of one record (generated + trained tokens, priced) and the |advantage|-weighted share of
    its tokens the correction did not clip (1 − train/adv_clip_frac/source_*; 1 when not measured)."""
    records: int
    mean_abs_advantage: float
    ess_frac: float
    cost: float
    unclipped: float = 1.0


@dataclass(frozen=True)
class ReplayMeasure:
    """The last round's served replay: its ESS fraction, KL(behaviour ‖ current) per token, mean staleness."""
    ess_frac: float
    kl: float
    staleness: float


@dataclass(frozen=True)
class PromptChoice:
    """A round's fresh prompts: the seen ones chosen (keys, best first), how many unseen ones to take from the
    stream, how many seen prompts were skipped as confidently solved or hopeless, and the expected share of
    the chosen groups whose rewards all tie (no gradient). selection=stream: `seen` holds every chosen prompt
    in stream order, seen before or not."""
    seen: list
    unseen: int
    skipped: int
    expected_zero_var: float
    looked: int = 0  # selection=stream/greso: how far the stream was read (the data module advances its cursor so far)
    skipped_pass: int = 0  # selection=greso: prompts passed over for a run of all-pass visits (all-fail below)
    skipped_fail: int = 0


def beta_moment(a: float, b: float, g: int) -> float:
    """E[p^g] under Beta(a, b) = Π_{k<g} (a + k) / (a + b + k)."""
    out = 1.0
    for k in range(g):
        out *= (a + k) / (a + b + k)
    return out


def expected_signal(a: float, b: float, g: int) -> float:
    """E[1 − p^g − (1 − p)^g] under Beta(a, b): the chance a group of g binary samples is not all equal."""
    return 1.0 - beta_moment(a, b, g) - beta_moment(b, a, g)


def beta_cdf(x: float, a: float, b: float) -> float:
    """P(p ≤ x) under Beta(a, b): the regularised incomplete beta I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side only
        return 1.0 - beta_cdf(1.0 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, c, d = 1e-300, 1.0, 0.0
    f = None
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f = c * d if f is None else f * c * d
        if abs(1.0 - c * d) < 1e-12:
            break
    return front * (f - 1.0)


class AdaptivePolicy:
    def __init__(self, pass_threshold: float | None, decay: float, skip_margin: float, skip_confidence: float,
                 min_ess_frac: float, max_kl: float, min_fresh_frac: float, max_fresh_frac: float, ema: float,
                 usd_per_mtok_generated: float, usd_per_mtok_trained: float, seed: int,
                 select_prompts: bool = True, adaptive_reuse: bool = True, selection: str = "stream",
                 greso: GresoSkip | None = None):
        _check(decay=(decay, 0.0, 1.0, False), skip_margin=(skip_margin, 0.0, 0.5, False),
               skip_confidence=(skip_confidence, 0.0, 1.0, False), min_ess_frac=(min_ess_frac, 0.0, 1.0, True),
               min_fresh_frac=(min_fresh_frac, 0.0, 1.0, True), max_fresh_frac=(max_fresh_frac, 0.0, 1.0, False),
               ema=(ema, 0.0, 1.0, False))
        if selection not in SELECTIONS:
            raise ValueError(f"data.policy.selection={selection!r}: choose one of {', '.join(SELECTIONS)}")
        if selection == "greso" and (greso is None or pass_threshold is None):
            raise ValueError("data.policy.selection=greso needs data.policy.greso and a data.policy.pass_threshold "
                             "(a tie at pass and a tie at fail are skipped with separate strengths)")
        if max_kl <= 0 or min_fresh_frac > max_fresh_frac or min(usd_per_mtok_generated, usd_per_mtok_trained) < 0:
            raise ValueError(f"data.policy: max_kl={max_kl} must be > 0, min_fresh_frac={min_fresh_frac} at most "
                             f"max_fresh_frac={max_fresh_frac}, prices ≥ 0")
        self.pass_threshold, self.decay = pass_threshold, decay
        self.skip_margin, self.skip_confidence = skip_margin, skip_confidence
        self.min_ess_frac, self.max_kl = min_ess_frac, max_kl
        self.min_fresh_frac, self.max_fresh_frac, self.ema = min_fresh_frac, max_fresh_frac, ema
        self.price_generated, self.price_trained = usd_per_mtok_generated / 1e6, usd_per_mtok_trained / 1e6
        self.rng = random.Random(seed)
        self.select_prompts, self.adaptive_reuse = select_prompts, adaptive_reuse  # the levers (ablations: off)
        self.selection, self.greso = selection, greso  # greso: the runs of tied visits (kept for any selection)
        # per prompt key: [passes, fails, weight n, Σ w·r, Σ w·r², round last updated] (decayed lazily)
        self.evidence: dict[int, list[float]] = {}
        self.values: dict[str, float] = {}  # ū_s: smoothed value per cost of each source measured so far
        self.limit: int | None = None       # the staleness limit of replay (None: not yet set)
        self.reuse_reason = "cap"

    # ---- prompt value --------------------------------------------------------------------------------
    def observe(self, key: int, rewards: list[float], round_: int, generated: bool = True) -> None:
        """Add one group's rewards to prompt `key`'s evidence (after decaying it to `round_`), and to its run of
        tied visits (`generated`: a group this run generated, counted toward the round's tie shares)."""
        if self.greso is not None and self.pass_threshold is not None:
            self.greso.observe(key, rewards, self.pass_threshold, generated)
        e = self._decayed(key, round_)
        for r in rewards:
            passed = self.pass_threshold is not None and r >= self.pass_threshold
            e[0] += passed
            e[1] += not passed
            e[2] += 1.0
            e[3] += r
            e[4] += r * r
        e[5] = round_
        self.evidence[key] = e

    def _decayed(self, key: int, round_: int) -> list[float]:
        """Prompt `key`'s evidence as of `round_` (a copy): every count times decay^(rounds since update)."""
        e = self.evidence.get(key)
        if e is None:
            return [0.0, 0.0, 0.0, 0.0, 0.0, round_]
        w = self.decay ** max(round_ - e[5], 0)
        return [x * w for x in e[:5]] + [e[5]]

    def posterior(self, key: int, round_: int) -> tuple[float, float]:
        """Beta(α, β) of the pass rate: α = 1 + passes, β = 1 + fails (decayed)."""
        e = self._decayed(key, round_)
        return 1.0 + e[0], 1.0 + e[1]

    def pooled(self, round_: int) -> tuple[float, float, float]:
        """What all prompts' evidence says together: the Beta prior of an unseen prompt, mass 2 (as Beta(1, 1))
        at the pooled pass rate p̄ = (1 + Σ passes) / (2 + Σ samples), so the expected signal of unseen prompts
        follows the task; and the mean reward variance v̄ over seen prompts (non-binary rewards)."""
        passes = total = var = 0.0
        for key in self.evidence:
            e = self._decayed(key, round_)
            passes, total = passes + e[0], total + e[0] + e[1]
            var += self.variance(key, round_) if self.pass_threshold is None else 0.0
        mean = (1.0 + passes) / (2.0 + total)
        return 2.0 * mean, 2.0 * (1.0 - mean), var / max(len(self.evidence), 1)

    def variance(self, key: int, round_: int) -> float:
        """Non-binary rewards: the decayed reward variance of prompt `key` (0 with under two samples' weight)."""
        _, _, n, s1, s2, _ = self._decayed(key, round_)
        return max(s2 / n - (s1 / n) ** 2, 0.0) if n >= 2.0 else 0.0

    def confident(self, key: int, round_: int) -> str | None:
        """'solved' or 'hopeless' when the posterior is sure enough to skip the prompt, else None."""
        if self.pass_threshold is None:  # non-binary: skipped once ≥ 2 samples' weight show no spread at all
            n = self._decayed(key, round_)[2]
            return "solved" if n >= 2.0 and self.variance(key, round_) < 1e-12 else None
        a, b = self.posterior(key, round_)
        if 1.0 - beta_cdf(1.0 - self.skip_margin, a, b) >= self.skip_confidence:
            return "solved"
        return "hopeless" if beta_cdf(self.skip_margin, a, b) >= self.skip_confidence else None

    def signal(self, key: int | None, group_size: int, round_: int, pooled: tuple | None = None) -> float:
        """Expected chance that a group of `group_size` is not all equal (None: an unseen prompt). Non-binary
        rewards: v / (v + v̄), the prompt's variance against the mean over seen prompts (unseen: 0.5)."""
        if key is None or self.pass_threshold is None:
            pooled = pooled or self.pooled(round_)
        if self.pass_threshold is None:
            v, mean = (pooled[2], pooled[2]) if key is None or key not in self.evidence else (
                self.variance(key, round_), pooled[2])
            return v / (v + mean) if v + mean > 0 else 0.5 * (key is None)
        a, b = self.posterior(key, round_) if key is not None else pooled[:2]
        return expected_signal(a, b, group_size)

    def _draw(self, key: int | None, group_size: int, round_: int, pooled: tuple) -> float:
        """Thompson draw of a group's signal: p ~ posterior (unseen: the pooled prior), 1 − p^G − (1 − p)^G
        (non-binary rewards: the expected signal)."""
        if self.pass_threshold is None:
            return self.signal(key, group_size, round_, pooled)
        a, b = self.posterior(key, round_) if key is not None else pooled[:2]
        p = self.rng.betavariate(a, b)
        return 1.0 - p ** group_size - (1.0 - p) ** group_size

    def choose_prompts(self, seen: list[int], unseen: int, budget: int, group_size: int, round_: int) -> PromptChoice:
        """Spend `budget` fresh groups: rank the seen prompts that are not confidently solved/hopeless and up
        to `budget` unseen ones (the stream has `unseen` left) by a Thompson draw of their signal; if too few
        remain, the skipped ones fill in, most promising first. With `select_prompts` off: the next `budget`
        prompts of the stream, as fresh_rollouts takes them (the selection lever's ablation)."""
        group_size = max(group_size, 2)  # PPO's groups of one: rank by the chance two samples differ, 2p(1 − p)
        if not self.select_prompts:
            zero = 1.0 - self.signal(None, group_size, round_, self.pooled(round_))
            return PromptChoice(seen=[], unseen=budget, skipped=0, expected_zero_var=zero)
        kept, skipped = [], []
        for key in seen:
            (skipped if self.confident(key, round_) else kept).append(key)
        pooled = self.pooled(round_)
        ranked = [(self._draw(k, group_size, round_, pooled), 0, k) for k in kept]
        ranked += [(self._draw(None, group_size, round_, pooled), 1, None) for _ in range(min(unseen, budget))]
        ranked.sort(key=lambda x: (-x[0], x[1], -1 if x[2] is None else x[2]))
        chosen = [k for _, _, k in ranked[:budget]]
        if len(chosen) < budget:
            skipped.sort(key=lambda k: (-self.signal(k, group_size, round_, pooled), k))
            chosen += skipped[: budget - len(chosen)]
        picked = [k for k in chosen if k is not None]
        zero = [1.0 - self.signal(k, group_size, round_, pooled) for k in chosen]
        return PromptChoice(seen=picked, unseen=len(chosen) - len(picked), skipped=len(skipped),
                            expected_zero_var=sum(zero) / len(zero) if zero else 0.0)

    def filter_stream(self, order: Iterable[int], budget: int, group_size: int, round_: int) -> PromptChoice:
        """selection=stream: the first `budget` prompts of `order` (the stream from its cursor, one pass) that are
        not confidently solved or hopeless; a prompt without evidence is always taken. If the pass leaves fewer,
        the skipped fill in, in stream order."""
        chosen, skipped, looked = [], [], 0
        for key in order:
            if len(chosen) == budget:
                break
            looked += 1
            (skipped if key in self.evidence and self.confident(key, round_) else chosen).append(key)
        chosen += skipped[: budget - len(chosen)]
        pooled = self.pooled(round_)
        zero = [1.0 - self.signal(k if k in self.evidence else None, max(group_size, 2), round_, pooled)
                for k in chosen]
        return PromptChoice(seen=chosen, unseen=0, skipped=len(skipped),
                            expected_zero_var=sum(zero) / len(zero) if zero else 0.0, looked=looked)

    def greso_stream(self, order: Iterable[int], budget: int, group_size: int, round_: int) -> PromptChoice:
        """selection=greso: the first `budget` prompts of `order` that GRESO's draw does not pass over
        (data_modules/greso.py); the passed-over fill in if one pass leaves fewer."""
        walk = self.greso.walk(order, budget)
        pooled = self.pooled(round_)
        zero = [1.0 - self.signal(k if k in self.evidence else None, max(group_size, 2), round_, pooled)
                for k in walk.chosen]
        return PromptChoice(seen=walk.chosen, unseen=0, skipped=walk.skipped_pass + walk.skipped_fail,
                            expected_zero_var=sum(zero) / len(zero) if zero else 0.0, looked=walk.looked,
                            skipped_pass=walk.skipped_pass, skipped_fail=walk.skipped_fail)

    # ---- reuse ---------------------------------------------------------------------------------------
    def update_reuse(self, measure: ReplayMeasure | None, cap: int | None) -> int | None:
        """The staleness limit of replay after the last round (None: no limit); see the module docstring.
        With `adaptive_reuse` off: the cap (max_staleness) alone, as replay_mix has it (the reuse lever's ablation)."""
        if not self.adaptive_reuse:
            self.limit, self.reuse_reason = cap, "cap"
            return cap
        if measure is None:  # nothing measured: probe one version further, up to the cap
            self.limit = cap if self.limit is None else _min(self.limit + 1, cap)
            self.reuse_reason = "cap" if self.limit == cap else "probe"
            return self.limit
        s = max(measure.staleness, 1.0)
        bounds = {"cap": cap}
        if measure.ess_frac < 1.0:
            kappa = -math.log(max(measure.ess_frac, 1e-12)) / s
            bounds["ess"] = math.floor(-math.log(max(self.min_ess_frac, 1e-12)) / kappa) if kappa > 0 else None
        if measure.kl > 0:
            bounds["kl"] = math.floor(self.max_kl / (measure.kl / s))
        finite = {k: v for k, v in bounds.items() if v is not None}
        self.reuse_reason = min(finite, key=lambda k: (finite[k], k != "cap")) if finite else "cap"
        self.limit = finite.get(self.reuse_reason)
        return self.limit

    # ---- the mix -------------------------------------------------------------------------------------
    def record_cost(self, generated: float, trained: float) -> float:
        """Cost of one record at the ledger's prices: generated tokens and trained tokens (all passes)."""
        return generated * self.price_generated + trained * self.price_trained

    def update_values(self, measures: dict[str, SourceMeasure]) -> None:
        """ū_s ← (1 − ema)·ū_s + ema·u_s for each source served last round, u_s = mean|A| · ESS · unclipped / cost."""
        for s, m in measures.items():
            if m.records == 0:
                continue
            u = m.mean_abs_advantage * m.ess_frac * m.unclipped / max(m.cost, 1e-12)
            self.values[s] = u if s not in self.values else (1 - self.ema) * self.values[s] + self.ema * u
            self.values[s] = max(self.values[s], 0.0)

    def shares(self, available: dict[str, bool]) -> tuple[dict[str, float], str]:
        """Target share of the round per source and the reason; a source never measured is valued like the
        mean of those that were (like fresh at the start), so a new source gets tried."""
        live = [s for s in SOURCES if s == "fresh" or available.get(s)]
        if len(live) == 1:
            return {"fresh": 1.0, "replay": 0.0, "harvest": 0.0}, "short_replay"
        known = [self.values[s] for s in live if s in self.values]
        prior = sum(known) / len(known) if known else 1.0
        u = {s: self.values.get(s, prior) for s in live}
        total = sum(u.values())
        target = u["fresh"] / total if total > 0 else 0.5
        fresh = min(max(target, self.min_fresh_frac), self.max_fresh_frac)
        reason = ("start" if len(known) < len(live) else "min_fresh" if target < self.min_fresh_frac
                  else "max_fresh" if target > self.max_fresh_frac else "value")
        rest = {s: u[s] for s in live if s != "fresh"}
        norm = sum(rest.values())
        out = {s: 0.0 for s in SOURCES} | {"fresh": fresh}
        for s, v in rest.items():
            out[s] = (1 - fresh) * (v / norm if norm > 0 else 1 / len(rest))
        return out, reason

    # ---- checkpoint ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "evidence": {k: list(v) for k, v in self.evidence.items()},
                "values": dict(self.values), "limit": self.limit, "reuse_reason": self.reuse_reason,
                "greso": None if self.greso is None else self.greso.state_dict()}

    def check_state(self, state: dict, where: str, prompts: int, rounds: int) -> None:
        """StateError naming `where.<key>` unless `state` is one this policy could have written, over
        `prompts` training prompts and `rounds` rounds: counts finite and ≥ 0, keys real prompts."""
        python_rng(field(state, "rng", where), f"{where}.rng")
        for k, e in mapping(field(state, "evidence", where), f"{where}.evidence").items():
            key = f"{where}.evidence[{k!r}]"
            integer(int(k) if isinstance(k, str) and k.isdigit() else k, key, high=prompts - 1)
            e = sequence(e, key)
            if len(e) != 6:
                raise StateError(key, f"{len(e)} numbers, not 6 (passes, fails, weight, Σ w·r, Σ w·r², round)")
            for i, name in enumerate(("passes", "fails", "weight")):
                number(e[i], f"{key}.{name}")
            number(e[3], f"{key}.reward_sum", low=None)
            number(e[4], f"{key}.reward_square_sum")
            number(e[5], f"{key}.round", high=rounds)
        for source, v in mapping(field(state, "values", where), f"{where}.values").items():
            one_of(source, f"{where}.values", SOURCES)
            number(v, f"{where}.values.{source}")
        if field(state, "limit", where) is not None:
            integer(state["limit"], f"{where}.limit")
        one_of(field(state, "reuse_reason", where), f"{where}.reuse_reason", REUSE_REASONS)
        if self.greso is not None and state.get("greso") is not None:  # a checkpoint from before GRESO: fresh state
            self.greso.check_state(state["greso"], f"{where}.greso", prompts)

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(_as_tuple(state["rng"]))
        self.evidence = {int(k): list(v) for k, v in state["evidence"].items()}
        self.values, self.limit = dict(state["values"]), state["limit"]
        self.reuse_reason = state["reuse_reason"]
        if self.greso is not None and state.get("greso") is not None:
            self.greso.load_state_dict(state["greso"])


def _min(a: int, b: int | None) -> int:
    return a if b is None else min(a, b)


def _check(**keys: tuple) -> None:
    """Each (value, low, high, low included): in range, or a ValueError naming data.policy.<key>."""
    for name, (value, low, high, closed) in keys.items():
        if not (low <= value <= high if closed else low < value <= high):
            raise ValueError(f"data.policy.{name}={value} must be in {'[' if closed else '('}{low:g}, {high:g}]")


def _as_tuple(x):
    """random.Random state back from a checkpoint (lists may come back where tuples went in)."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
