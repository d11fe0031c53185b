"""Which data each algorithm learns from: every algorithm × data pairing is served or refused here, at plan
time, in one line (before, `algorithm=sft data=static_preferences` crashed at its first step, and
`algorithm=dpo data=demonstrations` printed its sentence inside a traceback). The table is read from the
`_target_` strings, with nothing imported, so a refusal costs no model and no torch import.

A data module serves one kind of record:
    demonstrations     (prompt, reference completion): demonstrations, conversations, episode_demonstrations
    preferences        (prompt, chosen, rejected) pairs or KTO's labelled rows: static/checkpoint_preferences
    rollouts           the policy's own groups of samples, whole: fresh_rollouts, replay_mix, adaptive
    filtered_rollouts  the policy's samples, filtered by the algorithm (pairs, best-of-n): filtered_rollouts
A data module or algorithm this table does not name (a user's own `_target_`) is not checked.
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from run.validation.values import raw

DATA_KINDS = {
    "data_modules.demonstrations.DemonstrationsDataModule": "demonstrations",
    "data_modules.conversations.ConversationsDataModule": "demonstrations",
    "data_modules.episode_demonstrations.EpisodeDemonstrationsDataModule": "demonstrations",
    "data_modules.static_preferences.StaticPreferencesDataModule": "preferences",
    "data_modules.fresh_rollouts.FreshRolloutsDataModule": "rollouts",
    "data_modules.replay_mix.ReplayMixDataModule": "rollouts",
    "data_modules.adaptive.AdaptiveDataModule": "rollouts",
    "data_modules.filtered_rollouts.FilteredRolloutsDataModule": "filtered_rollouts",
}
DATA_CHOICES = {
    "demonstrations": "data=demonstrations, conversations or episode_demonstrations",
    "preferences": "data=static_preferences or checkpoint_preferences",
    "rollouts": "data=fresh_rollouts, replay_mix or adaptive",
    "filtered_rollouts": "data=filtered_rollouts",
}
TAKES = {  # algorithm _target_ → (the kind it learns from, what it does with it)
    "trainers.sft.SFTModule": ("demonstrations", "imitates reference completions"),
    "trainers.dpo.DPOModule": ("preferences", "learns from chosen/rejected pairs"),
    "trainers.kto.KTOModule": ("preferences", "learns from labelled completions (or pairs split in two)"),
    "trainers.reward_model.RewardModelModule": ("preferences", "learns a reward from chosen/rejected pairs"),
    "trainers.grpo.GRPOModule": ("rollouts", "learns from whole groups of its own samples"),
    "trainers.ppo.PPOModule": ("rollouts", "learns from its own samples with a critic"),
    "trainers.rejection_sampling.RejectionSamplingModule": ("filtered_rollouts", "keeps the best of its own samples"),
    "trainers.online_dpo.OnlineDPOModule": ("filtered_rollouts", "pairs its own best and worst samples"),
    "trainers.spin.SPINModule": ("filtered_rollouts", "pairs its own samples with the demonstrations"),
}
SUGGEST = {  # for a refusal: an algorithm that learns from the data given
    "demonstrations": "algorithm=sft", "preferences": "algorithm=dpo, ipo, kto or reward_model",
    "rollouts": "algorithm=grpo, ppo, rloo, dr_grpo or reinforce_pp",
    "filtered_rollouts": "algorithm=rejection_sampling, online_dpo or spin",
}


def pairing_problem(algorithm_target: str | None, data_target: str | None, algorithm: str | None,
                    data: str | None) -> str | None:
    """One line when the algorithm cannot learn from what the data module serves; None when it can (or
    when either side is not in the table)."""
    takes, kind = TAKES.get(algorithm_target or ""), DATA_KINDS.get(data_target or "")
    if takes is None or kind is None or takes[0] == kind:
        return None
    return (f"algorithm={algorithm} {takes[1]}, and data={data} serves {kind.replace('_', ' ')}: "
            f"use {DATA_CHOICES[takes[0]]} with it, or {SUGGEST[kind]} on this data")


def check_pairing(cfg: DictConfig, errors: list[str]) -> None:
    data_target = raw(cfg, "data._target_")
    data = _data_name(data_target.rsplit(".", 1)[-1]) if data_target in DATA_KINDS else data_target
    problem = pairing_problem(raw(cfg, "algorithm._target_"), data_target, raw(cfg, "algorithm.name"), data)
    if problem:
        errors.append(problem)


def teacher_tools_problem(cfg: DictConfig, examples) -> str | None:
    """data=episode_demonstrations plays each example's teacher calls (`meta["calls"]`: [[tool, arguments],
    ...]) against the environment: a tool the environment does not offer is refused here (it ended in a bare
    StopIteration after the model was built)."""
    if raw(cfg, "data._target_") != "data_modules.episode_demonstrations.EpisodeDemonstrationsDataModule":
        return None
    tools = OmegaConf.select(cfg, "env.tools", default=None)
    offered = set(tools.keys()) if isinstance(tools, DictConfig) else set()
    used = {call[0] for ex in examples for call in (ex.meta.get("calls") or [])
            if isinstance(call, (list, tuple)) and call}
    missing = sorted(used - offered)
    if not missing or not offered:  # no tools node (a tag env's own check names it)
        return None
    return (f"data=episode_demonstrations: the task's teacher calls {', '.join(missing)}, which env.tools does "
            f"not offer (it offers {', '.join(sorted(offered))}): pick an env with those tools (the task's "
            f"env, e.g. env=chat_calculator), or train SFT on data=demonstrations")


def _data_name(cls: str) -> str:
    """FreshRolloutsDataModule → fresh_rollouts (the config group's choice)."""
    stem = cls.removesuffix("DataModule")
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in stem).lstrip("_")
