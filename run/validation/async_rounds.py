"""Checks of asynchronous rounds across keys (`callbacks.regenerate.max_staleness` > 0; docs/scaling.md):
what the engine in its own process supports today, each refused in one line at plan time. The key's own
range and `past_bound`'s choices: the schema (run/validation/schemas/top.py)."""
from __future__ import annotations

from omegaconf import DictConfig

from hardware.processes import world_size_of
from run.validation.values import is_int, raw

HF, SERVER = "generators.hf.HFGenerator", "generators.vllm_server.VLLMServerGenerator"
STALE_CORRECTIONS = ("losses.correction.decoupled_ppo", "losses.correction.ppo_clip", "losses.correction.truncated_is")


def check_async(cfg: DictConfig, errors: list[str]) -> None:
    k = raw(cfg, "callbacks.regenerate.max_staleness")
    if not is_int(k) or k <= 0:
        return
    said = f"callbacks.regenerate.max_staleness={k}"
    if raw(cfg, "data.prompts_per_round") is None:
        errors.append(f"{said}: algorithm={raw(cfg, 'algorithm.name')} with data={raw(cfg, 'data._target_')} makes "
                      f"no rollouts, so there are no rounds to overlap; use max_staleness=0")
        return
    correction = raw(cfg, "algorithm.correction._target_")
    if correction is not None and correction not in STALE_CORRECTIONS:
        errors.append(f"{said} trains on samples up to {k} versions old, and correction={correction.rsplit('.', 1)[-1]} "
                      f"does not correct for that: use correction=decoupled_ppo (or ppo_clip, truncated_is)")
    generator = raw(cfg, "generator._target_")
    server = generator == SERVER
    if generator not in (HF, SERVER):
        errors.append(f"{said}: asynchronous rounds run generator=hf (in a spawned process) or generator=vllm_server "
                      f"(its engines) (generator._target_={generator}); a vLLM engine per rank is not built for them")
    if server and raw(cfg, "generator.sync_every") not in (None, 1):
        errors.append(f"{said} with generator.sync_every={raw(cfg, 'generator.sync_every')}: the staleness bound "
                      f"decides when weights are pushed; use sync_every=1")
    if raw(cfg, "env._target_") is not None:
        errors.append(f"{said} with env={raw(cfg, 'env._target_')}: multi-turn episodes are played in the trainer's "
                      f"process; use max_staleness=0 with an environment")
    if raw(cfg, "algorithm.dynamic_sampling"):
        errors.append(f"{said} with algorithm.dynamic_sampling=true: DAPO's refills depend on the round's rewards; "
                      f"use max_staleness=0 with dynamic sampling")
    precision = str(raw(cfg, "trainer.precision"))
    if precision.endswith("-mixed") and not server:
        errors.append(f"{said} with trainer.precision={precision}: under a mixed precision a round's behaviour "
                      f"log-probs are rescored by the trainer's forward of the current weights, not the engine's "
                      f"older version they were sampled with; use trainer.precision=32-true")
    accelerator = raw(cfg, "trainer.accelerator")
    if accelerator != "cpu" and not server:
        errors.append(f"{said} with trainer.accelerator={accelerator}: the spawned generator=hf engine runs on CPU "
                      f"only; use generator=vllm_server (engines on GPUs of their own), max_staleness=0 or hardware=cpu")
    trainer = cfg.get("trainer")
    if trainer is not None and is_int(trainer.get("devices", 1)) and is_int(trainer.get("num_nodes", 1)) \
            and world_size_of(trainer) > 1:
        errors.append(f"{said} with {world_size_of(trainer)} ranks (trainer.devices × trainer.num_nodes): the "
                      f"engine serves one process; use max_staleness=0 with several ranks")
