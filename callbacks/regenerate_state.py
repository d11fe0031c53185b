"""The check RegenerateExperience (callbacks/regenerate.py) runs on the state a checkpoint hands it, before
taking any of it: a resumed run refuses a tampered or corrupt state in one line (data_modules/state_checks.py)."""
from __future__ import annotations

from data_modules.state_checks import StateError, integer, mapping, number, sequence


def check_regenerate_state(state: dict) -> None:
    """StateError (data_modules/state_checks.py) unless `state` is one this callback could have written:
    counts are integers ≥ 0, totals finite and ≥ 0, a round made at most one round end ahead."""
    mapping(state, "RegenerateExperience")
    rounds = integer(state.get("rounds", 0), "rounds")
    ended = integer(state.get("epochs_ended", 0), "epochs_ended")
    if rounds > ended + 1:  # offline data: round ends, no rounds made
        raise StateError("rounds", f"{rounds} rounds made for {ended} ended: a round is made at most one ahead")
    integer(state.get("last_end_step", -1), "last_end_step", low=-1)
    for key in ("abstained", "timeouts", "dropped_in_a_row"):
        integer(state.get(key, 0), key)
    for key in ("totals", "dynamic_totals", "tool_totals", "async_totals"):
        for name, v in mapping(state.get(key, {}), key).items():
            number(v, f"{key}.{name}", low=0.0 if key != "dynamic_totals" else None)
    for name, n in mapping(state.get("triggers", {}), "triggers").items():
        integer(n, f"triggers.{name}")
    for i, frac in enumerate(sequence(state.get("replay_fracs", []), "replay_fracs")):
        number(frac, f"replay_fracs[{i}]", high=1.0)
    for i, m in enumerate(sequence(state.get("reward_means", []), "reward_means")):
        number(m, f"reward_means[{i}]", low=None, nan=True)  # NaN: a round whose every sample abstained
    for name, means in mapping(state.get("source_means", {}), "source_means").items():
        for i, m in enumerate(sequence(means, f"source_means.{name}")):
            number(m, f"source_means.{name}[{i}]", low=None, nan=True)
    for name, v in mapping(state.get("last_round", {}), "last_round").items():
        number(v, f"last_round.{name}", low=None, nan=True)
