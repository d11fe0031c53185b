"""Checks of the `env` group across keys (docs/episodes.md): what an environment runs with. Episodes are
sampled by the HF or the vLLM generator (the engines whose `sample` takes stop sequences and a per-turn
token limit), trained by the GRPO family (group advantages over whole episodes) or used for SFT data and
held-out evaluation, with any number of ranks (each plays its shard of the round; the tool statistics are
summed over ranks); data=episode_demonstrations needs an environment."""
from __future__ import annotations

from omegaconf import DictConfig

from run.validation.values import raw

EPISODE_GENERATORS = ("generators.hf.HFGenerator", "generators.vllm.VLLMGenerator")
EPISODE_TRAINERS = ("trainers.grpo.GRPOModule", "trainers.sft.SFTModule")


def check_env(cfg: DictConfig, errors: list[str]) -> None:
    target = raw(cfg, "env._target_")
    if target is None:
        if raw(cfg, "data._target_") == "data_modules.episode_demonstrations.EpisodeDemonstrationsDataModule":
            errors.append("data=episode_demonstrations plays teacher turns against an environment, and env=none "
                          "has none: pick one (env=calculator)")
        return
    if raw(cfg, "env._partial_") is not True:
        errors.append(f"env._partial_ must be true (env={target} is built once per episode): add "
                      f"`_partial_: true` to the env node")
    generator = raw(cfg, "generator._target_")
    if generator not in EPISODE_GENERATORS:
        errors.append(f"env={target} needs generator=hf or generator=vllm: multi-turn episodes are sampled by "
                      f"those engines only (generator._target_={generator})")
    _check_tags(cfg, errors)
    algorithm = raw(cfg, "algorithm._target_")
    if algorithm not in EPISODE_TRAINERS:
        errors.append(f"env={target} with algorithm={raw(cfg, 'algorithm.name')}: episodes train with the GRPO "
                      f"family (grpo, dr_grpo, rloo, reinforce_pp) or serve SFT data and held-out evaluation; "
                      f"use env=none for this stage")


def _check_tags(cfg: DictConfig, errors: list[str]) -> None:
    """env.format (the tag format): a turn stops at the close tag and a call is found by its open tag, so the
    two must differ, and the separator must be neither (each a non-empty string: the schema)."""
    tags = {k: raw(cfg, f"env.format.{k}") for k in ("open", "close", "separator")}
    if not all(isinstance(v, str) and v for v in tags.values()):
        return
    if tags["open"] == tags["close"]:
        errors.append(f"env.format.close={tags['close']!r} equals env.format.open: the policy's turn stops at the "
                      f"close tag, so a call's arguments could never be read; use distinct tags (<tool>, </tool>)")
    elif tags["separator"] in (tags["open"], tags["close"]):
        errors.append(f"env.format.separator={tags['separator']!r} equals a tag (env.format.open/close): use a "
                      f"separator of its own (:)")
