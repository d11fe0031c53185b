"""What checkpoints/<stage>/ holds (run/checkpointing.py): a resume checkpoint without the frozen
reference, a weights-only final.ckpt; a module loads weights without `reference.*` and keeps the
reference it was built with (the stage's starting policy). In-process, the tiny model (seconds)."""
from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from run.stages import build, checkpoint_dir, plan_stages, run_stage, set_run_fields
from tests.conftest import CONF
from tests.helpers import TINY, TINY_MODEL

OVERRIDES = TINY + ["algorithm=grpo", "data.prompts_per_round=2", "algorithm.group_size=4", "data.batch_size=8",
                    "trainer.max_steps=2", "generator.max_new_tokens=4", "checkpoint_every_n_rounds=1",
                    "callbacks.evaluate.every_n_steps=0"]


def tensor_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_grpo_checkpoints_hold_no_reference_and_final_ckpt_no_optimizer(tmp_path):
    """GRPO with β > 0 keeps a frozen reference; neither last.ckpt nor final.ckpt holds it, final.ckpt
    holds the policy's final weights and no optimizer, scheduler or callback state, and its size is the
    policy's tensors plus a little (loops, the data module's small buffer)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        [stage] = plan_stages(compose("train", overrides=OVERRIDES), OVERRIDES)
    GlobalHydra.instance().clear()
    set_run_fields(stage.cfg, tmp_path, stage.name, "group", "name")
    assert stage.cfg.algorithm.beta > 0
    policy, _, _ = run_stage(stage)
    folder = checkpoint_dir(stage)
    last, final = (torch.load(folder / name, map_location="cpu", weights_only=True)
                   for name in ("last.ckpt", "final.ckpt"))
    weights = {f"policy.{k}": v for k, v in policy.state_dict().items()}
    for ckpt in (last, final):
        assert not [k for k in ckpt["state_dict"] if k.startswith("reference.")]
        assert ckpt["state_dict"].keys() == weights.keys()
    assert last["optimizer_states"] and "callbacks" in last and last["global_step"] == 2
    assert not {"optimizer_states", "lr_schedulers", "callbacks"} & final.keys()
    assert all(torch.equal(final["state_dict"][k], v) for k, v in weights.items())
    size = tensor_bytes(policy.state_dict())
    assert (folder / "final.ckpt").stat().st_size < 1.1 * size + 64 * 1024
    assert (folder / "last.ckpt").stat().st_size < 3.3 * size + 64 * 1024  # policy + Adam's two moments


def test_a_module_loads_weights_without_its_reference_and_refuses_a_missing_policy_key(hydra_conf):
    cfg = hydra_conf(["algorithm=grpo", *TINY_MODEL])
    policy, tok = instantiate(cfg.model)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    start = {k: v.clone() for k, v in module.reference.state_dict().items()}
    trained = {k: v + 1 if v.is_floating_point() else v for k, v in module.state_dict().items()
               if not k.startswith("reference.")}
    module.load_state_dict(trained)
    assert all(torch.equal(module.state_dict()[k], v) for k, v in trained.items())
    assert all(torch.equal(v, start[k]) for k, v in module.reference.state_dict().items())
    trained.pop(next(iter(trained)))
    with pytest.raises(RuntimeError, match="missing keys"):
        module.load_state_dict(trained)
    module.load_state_dict(trained, strict=False)
