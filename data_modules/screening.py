"""Screen, then expand (`algorithm.screen.size`): which screened prompts get the rest of their group.

A round's candidate prompts first get s = `algorithm.screen.size` samples each (the screen). A prompt whose
screen already shows signal (its rewards are not all equal) gets the other G − s (G = algorithm.group_size):
its group is informative whatever they say. A prompt whose screen ties (all pass or all fail, a sample
passing when its reward ≥ `algorithm.pass_threshold`) is expanded only when the rest is likely to break the
tie. With the pass rate p's posterior after the screen, Beta(α, β) = Beta(1 + passes, 1 + fails), and
m = G − s more samples:

    E[p^m] = Π_{j<m} (α + j) / (α + β + j)        (the Beta moments; E[(1 − p)^m] the same with α ↔ β)
    P(break) = 1 − E[p^m]          screen all pass (a fail among the m breaks the tie)
             = 1 − E[(1 − p)^m]    screen all fail (a pass breaks it)
    expand  ⇔  the screen shows signal,  or  P(break) ≥ min_signal   (`algorithm.screen.min_signal`)

e.g. s = 2 passes, G = 8: α = 3, β = 1, E[p^6] = 3/9, P(break) = 2/3; s = 4 fails: E[(1 − p)^4] = 5/9,
P(break) = 4/9. A screen whose every sample was dropped (reward abstained) knows nothing: expanded.
An unexpanded prompt's group is its s screen samples (tied: advantage 0), so a round's groups have unequal
sizes; advantages are computed within each group by group id (losses/advantages.py). Pure functions: the
callback (callbacks/screening.py) generates, this module decides.
"""
from __future__ import annotations

from dataclasses import dataclass

from losses.advantages import EPS


@dataclass(frozen=True)
class ScreenSettings:
    size: int           # s: samples per prompt in the screen (< group_size)
    group_size: int     # G: a full group
    min_signal: float   # expand a tied screen when P(the other G − s break the tie) ≥ this
    pass_threshold: float


def moment(alpha: float, beta: float, m: int) -> float:
    """E[p^m] for p ~ Beta(alpha, beta): Π_{j<m} (alpha + j) / (alpha + beta + j)."""
    out = 1.0
    for j in range(m):
        out *= (alpha + j) / (alpha + beta + j)
    return out


def break_probability(rewards: list[float], settings: ScreenSettings) -> float:
    """P(the other G − s samples break a tied screen's tie); 1.0 when the screen already shows signal or
    has no scored sample."""
    if not rewards or max(rewards) - min(rewards) >= EPS:
        return 1.0
    passes = sum(r >= settings.pass_threshold for r in rewards)
    fails = len(rewards) - passes
    m = settings.group_size - settings.size
    alpha, beta = 1.0 + passes, 1.0 + fails
    return 1.0 - (moment(alpha, beta, m) if passes else moment(beta, alpha, m))


def to_expand(groups: dict[int, list[float]], settings: ScreenSettings) -> list[int]:
    """The group ids (in the order given) whose screen rewards warrant the rest of the group."""
    return [gid for gid, rewards in groups.items() if break_probability(rewards, settings) >= settings.min_signal]
