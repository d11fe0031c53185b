"""Checks on a composed config before anything heavy is built. Every message names the key at fault.
Single values (types, ranges, choices, unknown keys): the schemas, run/validation/schemas/; here, and in
values.py, hardware.py, model.py and dry_build.py beside it, the checks across keys; the data against
the model: run/validation/data.py."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, InterpolationToMissingValueError, MissingMandatoryValue

from models.hf_checks import ModelFolderError, check_folder
from run.errors import ConfigError
from run.push_to_hub import push_problems
from run.validation.async_rounds import check_async
from run.validation.dry_build import check_buffer, check_store
from run.validation.economy import check_economy
from run.validation.env import check_env
from run.validation.hardware import check_hardware, check_ranks
from run.validation.model import check_lora, check_model_shape, check_precision
from run.validation.moved import check_moved_targets
from run.validation.pairing import check_pairing
from run.validation.schemas import check_schemas
from run.validation.vllm_server import check_vllm_server
from run.validation.values import check_values, is_int, raw


def _get(cfg: DictConfig, key: str, errors: list[str]):
    try:
        return OmegaConf.select(cfg, key, default=None)
    except InterpolationResolutionError as e:
        errors.append(f"{key} does not resolve ({e.__class__.__name__}: {str(e).splitlines()[0]}); "
                      f"algorithm={raw(cfg, 'algorithm.name')} may not fit data={raw(cfg, 'data._target_')}")
        return None


def _check_resolves(cfg: DictConfig, errors: list[str]) -> None:
    """Every value resolves (`${...}` names a key that exists, a resolver that works): the stage's whole
    config is resolved here, at plan time, so no interpolation fails after a file has been written.
    Required values left `???` (the run fields train.py fills in, a model path) are checked elsewhere."""
    _resolve_all(cfg, "", cfg, errors)


def _resolve_all(node, prefix: str, cfg: DictConfig, errors: list[str]) -> None:
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        try:
            value = node[key]
        except (MissingMandatoryValue, InterpolationToMissingValueError):
            continue
        except Exception as e:  # noqa: BLE001 - any resolution failure (missing key, bad resolver, grammar)
            written = OmegaConf.to_container(node, resolve=False)[key]
            errors.append(f"{prefix}{key}={written} does not resolve ({type(e).__name__}: "
                          f"{str(e).splitlines()[0]}); algorithm={raw(cfg, 'algorithm.name')} may not fit "
                          f"data={raw(cfg, 'data._target_')}: its own is data={raw(cfg, 'algorithm.default_data')}")
            continue
        if isinstance(value, (DictConfig, ListConfig)) and not OmegaConf.is_interpolation(node, key):
            _resolve_all(value, f"{prefix}{key}.", cfg, errors)


def _check_rounds(cfg: DictConfig, errors: list[str]) -> None:
    group = _get(cfg, "algorithm.group_size", errors)
    prompts, batch = _get(cfg, "data.prompts_per_round", errors), _get(cfg, "data.batch_size", errors)
    if group is None or errors:
        return
    if prompts is None:
        errors.append(f"algorithm={cfg.algorithm.name} learns from groups of its own samples, but "
                      f"data={cfg.data._target_} makes no rollouts: use data=fresh_rollouts")
        return
    if group < 2 and raw(cfg, "algorithm.advantage") is not None:  # PPO's critic needs no groups
        errors.append(f"algorithm.group_size={group}: group-relative advantages need at least 2")
    elif (prompts * group) % batch:
        errors.append(f"data.prompts_per_round × algorithm.group_size = {prompts} × {group} = "
                      f"{prompts * group} records per round is not divisible by data.batch_size={batch}")
    capacity = raw(cfg, "data.buffer_capacity")
    if is_int(capacity) and capacity < prompts * group:  # the buffer would evict part of the round it serves
        errors.append(f"data.buffer_capacity={capacity} holds less than one round (data.prompts_per_round × "
                      f"algorithm.group_size = {prompts} × {group} = {prompts * group} records): raise it to "
                      f"at least {prompts * group}")


def _check_replay(cfg: DictConfig, errors: list[str]) -> None:
    """Replayed or harvested data is off-policy: an uncorrected loss on it is refused unless asked for."""
    ratio, harvest = raw(cfg, "data.replay_ratio"), raw(cfg, "data.harvest")
    adaptive = raw(cfg, "data._target_") == "data_modules.adaptive.AdaptiveDataModule"  # replays when it pays
    if ratio is None and not adaptive:  # its range: run/validation/schemas/data.py
        return
    uncorrected = raw(cfg, "algorithm.correction._target_") == "losses.correction.no_correction"
    said = "data=adaptive" if adaptive else f"data.replay_ratio={ratio}"
    if (adaptive or ratio > 0 or harvest) and uncorrected and not raw(cfg, "data.allow_uncorrected"):
        errors.append(f"correction=none trains on replayed/harvested data ({said}, "
                      f"data.harvest={harvest}) as if it were on-policy: choose correction=ppo_clip, "
                      f"truncated_is or masked_is, or set data.allow_uncorrected=true to accept the bias")
    if harvest and not Path(str(harvest)).is_dir():
        errors.append(f"data.harvest={harvest!r}: no such directory (a store written with data.store=...)")


def _check_adaptive(cfg: DictConfig, errors: list[str]) -> None:
    """data=adaptive's fresh-share bounds (each in range: the schema) must not cross."""
    low, high = raw(cfg, "data.policy.min_fresh_frac"), raw(cfg, "data.policy.max_fresh_frac")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > high:
        errors.append(f"data.policy.min_fresh_frac={low} must be at most data.policy.max_fresh_frac={high} "
                      f"(the bounds of each round's fresh share)")
    low, start, high = (raw(cfg, f"data.policy.greso.explore_{k}") for k in ("min", "init", "max"))
    if all(isinstance(x, (int, float)) for x in (low, start, high)) and not low <= start <= high:
        errors.append(f"data.policy.greso.explore_init={start} must be in [data.policy.greso.explore_min, "
                      f"data.policy.greso.explore_max] = [{low}, {high}] (GRESO's exploration probabilities)")
    if raw(cfg, "data.policy.selection") == "greso" and raw(cfg, "data.policy.pass_threshold") is None:
        errors.append("data.policy.selection=greso needs data.policy.pass_threshold (a number): a tie at pass and a "
                      "tie at fail are skipped with separate strengths")


def _check_overlong(cfg: DictConfig, errors: list[str]) -> None:
    """GRPO's overlong penalty ramps over the last overlong_cache tokens of overlong_max_len (losses/overlong.py)."""
    cache, limit = raw(cfg, "algorithm.overlong_cache"), raw(cfg, "algorithm.overlong_max_len")
    if is_int(cache) and is_int(limit) and cache > limit:
        errors.append(f"algorithm.overlong_cache={cache} must be at most algorithm.overlong_max_len={limit} "
                      f"(the penalty ramps over the last overlong_cache tokens before the length limit)")


def _check_micro_batches(cfg: DictConfig, errors: list[str]) -> None:
    """The micro-batch divides the batch (each is a positive integer: the schema)."""
    batch, micro = raw(cfg, "data.batch_size"), raw(cfg, "data.micro_batch_size")
    if is_int(micro) and is_int(batch) and (micro > batch or batch % micro):
        errors.append(f"data.micro_batch_size={micro} must divide data.batch_size={batch} "
                      f"(batch_size / micro_batch_size = gradient-accumulation steps)")


def _check_reference_refresh(cfg: DictConfig, errors: list[str]) -> None:
    """online_dpo's algorithm.ref_update_every copies the policy's weights into its frozen reference: with
    LoRA there is no copy (the reference is the base with the adapter disabled)."""
    every = raw(cfg, "algorithm.ref_update_every")
    if every is None:
        return
    if raw(cfg, "model.lora"):
        errors.append(f"algorithm.ref_update_every={every} with model.lora: the reference is the base with the "
                      f"adapter disabled, so refreshing it would mean merging the adapter into the base; use "
                      f"algorithm.ref_update_every=null with LoRA")


def _check_generator(cfg: DictConfig, errors: list[str]) -> None:
    """generator=vllm needs the vllm package, installed its own way (scripts/install_vllm.sh)."""
    target = raw(cfg, "generator._target_") or ""
    if target.startswith("generators.vllm."):
        from generators.vllm import check_vllm_available
        try:
            check_vllm_available()
        except (ImportError, RuntimeError) as e:
            errors.append(f"generator=vllm: {e}")


def _check_files(cfg: DictConfig, errors: list[str]) -> None:
    """Every local model folder (the policy's, a judge's): present, complete, not truncated."""
    seen = set()
    for key, path in model_folders(cfg):
        if path in seen:  # an interpolated node (reward.model: ${model}) is the same folder
            continue
        seen.add(path)
        try:
            check_folder(path, key)
        except ModelFolderError as e:
            errors.append(str(e))


def _check_push(cfg: DictConfig, errors: list[str]) -> None:
    """push_to_hub: refused now if the upload could not happen after the training (run/push_to_hub.py)."""
    errors.extend(push_problems(cfg))


def model_folders(cfg: DictConfig, node=None, prefix: str = "") -> list[tuple[str, str]]:
    """(key, path) of each node built by models.hf.load_hf, read without resolving the rest."""
    node = cfg if node is None else node
    found = []
    if raw(node, "_target_") == "models.hf.load_hf":
        path = raw(node, "name_or_path")
        if isinstance(path, str) and path != "???":
            found.append((f"{prefix}name_or_path", path))
    for k in node.keys():
        child = OmegaConf.select(node, str(k), default=None, throw_on_resolution_failure=False)
        if isinstance(child, DictConfig) and k != "hydra":
            found += model_folders(cfg, child, f"{prefix}{k}.")
    return found


CHECKS = (_check_rounds, _check_replay, _check_adaptive, _check_overlong, _check_files, _check_micro_batches, _check_generator,
          _check_reference_refresh, check_values, check_hardware, check_ranks, check_lora, check_model_shape,
          check_precision, check_buffer, check_store, _check_push, check_env, check_async, check_vllm_server,
          check_economy)
GATES = (check_moved_targets, check_pairing, _check_resolves, check_schemas)  # an old path, data the algorithm
# cannot learn from, a broken ${...}, a bad value:
# the checks across keys would echo it (or trip over its type)


def validate(cfg: DictConfig, stage: str) -> None:
    """Raise ConfigError listing every problem found in stage `stage`'s config."""
    errors: list[str] = []
    for gate in GATES:
        gate(cfg, errors)
        if errors:
            break
    else:
        for check in CHECKS:
            check(cfg, errors)
    if errors:
        raise ConfigError(f"invalid config for stage {stage!r}:\n  - " + "\n  - ".join(errors),
                          problems=errors, where=f"stage {stage}")
