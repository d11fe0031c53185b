"""Several reward sources combined with weights; each is scored (and logged) separately, and an optional
`gold` source is scored and logged beside them but never trained on, so proxy-vs-gold divergence (reward
hacking of a learned RM or a judge) shows in the curves."""
from __future__ import annotations

from collections.abc import Mapping

from rewards.base import RewardSource, ScoreReport, safe_score

GOLD = "gold"


class WeightedReward(RewardSource):
    """score_i = Σ_k w_k · s_k,i over the trained sources k.

    sources: {key: {weight: float, source: RewardSource}}; the key names the source in the logs
    (`rollout/reward/<key>`). missing: what a sample gets when a trained source abstains on it —
    "abstain" (the sample abstains) or "renormalize" (Σ w_k s_k / Σ w_k over the sources that scored it;
    abstain only if none did). gold: a source logged as `rollout/reward/gold`, not trained on.
    Each child runs under safe_score with its own timeout, so a failing child costs only its scores.
    """

    version = "1"

    def __init__(self, name: str, sources: Mapping, missing: str, gold: RewardSource | None = None):
        if missing not in ("abstain", "renormalize"):
            raise ValueError(f"reward.missing={missing!r}: choose abstain or renormalize")
        if not sources:
            raise ValueError("reward.sources is empty: give at least one {weight, source}")
        self.name, self.missing, self.gold = name, missing, gold
        self.children: dict[str, tuple[float, RewardSource]] = {}
        for key, node in sources.items():
            if key == GOLD:
                raise ValueError(f"reward.sources.{GOLD}: the key 'gold' is reserved for reward.gold")
            if not isinstance(node, Mapping) or set(node) != {"weight", "source"}:
                raise ValueError(f"reward.sources.{key} must be {{weight: float, source: <reward node>}}")
            if not isinstance(node["source"], RewardSource) and not hasattr(node["source"], "score"):
                raise TypeError(f"reward.sources.{key}.source is not a reward source: {node['source']!r}")
            self.children[key] = (float(node["weight"]), node["source"])
        every = [s for _, s in self.children.values()] + ([gold] if gold is not None else [])
        self.timeout_s = sum(float(getattr(s, "timeout_s", RewardSource.timeout_s)) for s in every) + 5.0
        self.version = "1:" + ",".join(f"{k}={w:g}x{getattr(s, 'name', k)}@{getattr(s, 'version', '?')}"
                                       for k, (w, s) in self.children.items())

    def score(self, prompts, completions, examples):
        return self.score_report(prompts, completions, examples).scores

    def score_report(self, prompts, completions, examples) -> ScoreReport:
        reports = {key: safe_score(s, prompts, completions, examples) for key, (_, s) in self.children.items()}
        report = ScoreReport([self._combine([(self.children[k][0], r.scores[i]) for k, r in reports.items()])
                              for i in range(len(completions))])
        if self.gold is not None:
            reports[GOLD] = safe_score(self.gold, prompts, completions, examples)
        for key, r in reports.items():
            report.per_source[key] = r.scores
            report.errors += r.errors
            report.timeouts += r.timeouts
            report.first_error = report.first_error or r.first_error
        return report

    def _combine(self, scored: list[tuple[float, float | None]]) -> float | None:
        present = [(w, s) for w, s in scored if s is not None]
        if not present or (self.missing == "abstain" and len(present) < len(scored)):
            return None
        total = sum(w * s for w, s in present)
        if self.missing == "renormalize":
            norm = sum(w for w, _ in present)
            return total / norm if norm else None
        return total

    def to(self, device):
        for _, s in self.children.values():
            getattr(s, "to", lambda d: s)(device)
        if self.gold is not None:
            getattr(self.gold, "to", lambda d: None)(device)
        return self

    def stats(self) -> dict:
        out = {}
        for s in [s for _, s in self.children.values()] + ([self.gold] if self.gold is not None else []):
            out |= getattr(s, "stats", dict)()
        return out
