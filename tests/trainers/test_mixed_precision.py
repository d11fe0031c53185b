"""Mixed precision keeps its updates: two GRPO steps at lr 1e-6 through the real stage runner (Lightning
Trainer, CPU). Under `trainer.precision=bf16-mixed` the decoder computes in bfloat16 (CPU autocast) while
the weights and AdamW's state stay float32, so ≥ 99 % of the weights move, as in plain float32. Pure
bfloat16 weights (what `model.dtype=bfloat16` trained before it was refused at plan time) lose almost every
update: 1e-6 is below half a bfloat16 step (2⁻⁹ of the weight or more) of any weight above ~5e-4 (2.2 % of
the weights moved here, 100 % in float32 and bf16-mixed). A LoRA adapter over a bfloat16 base is float32
and trains; the base stays bfloat16 and frozen."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from run import stages
from run.errors import ConfigError
from run.stages import plan_stages, run_stage, set_run_fields
from run.validation.config import validate
from tests.helpers import TINY

GRPO = TINY + ["algorithm=grpo", "reward._target_=tests.helpers.LengthReward", "data.prompts_per_round=2",
               "algorithm.group_size=4", "data.batch_size=8", "trainer.max_steps=2", "generator.max_new_tokens=4",
               "callbacks.evaluate.every_n_steps=0", "algorithm.optimizer.lr=1e-6", "algorithm.scheduler=null"]
LORA = "model.lora={r: 4, lora_alpha: 8, target_modules: all-linear}"


class Probe(L.Callback):
    """Records the dtypes of the optimizer's parameters and state, and of a decoder matmul's output in the
    forwards that build a gradient (the training steps': bfloat16 when autocast computes them)."""

    def on_train_start(self, trainer, pl_module):
        self.compute = set()
        attention = next(m for n, m in pl_module.policy.named_modules() if n.endswith("self_attn"))
        attention.q_proj.register_forward_hook(self.record)

    def record(self, module, args, out):
        if torch.is_grad_enabled():
            self.compute.add(out.dtype)

    def on_train_end(self, trainer, pl_module):
        opt = trainer.optimizers[0]
        self.params = {p.dtype for group in opt.param_groups for p in group["params"]}
        self.state = {v.dtype for s in opt.state.values() for k, v in s.items() if k != "step"}


def train_grpo(hydra_conf, tmp_path, monkeypatch, overrides: list[str], dtype: str | None = None):
    """(policy, trainable weights before, probe) after 2 GRPO steps; `dtype` replaces model.dtype after
    planning (so a config the plan refuses can still be measured)."""
    [stage] = plan_stages(hydra_conf(GRPO + overrides), GRPO + overrides)
    if dtype is not None:
        stage.cfg.model.dtype = dtype
    set_run_fields(stage.cfg, tmp_path, stage.name, "test", "test")
    probe, build_callbacks = Probe(), stages.build_callbacks
    monkeypatch.setattr(stages, "build_callbacks", lambda *a: build_callbacks(*a) + [probe])
    policy, tokenizer = instantiate(stage.cfg.model)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    policy, _, metrics = run_stage(stage, policy, tokenizer)
    assert metrics["train/steps"] == 2
    return policy, before, probe


def changed_fraction(policy, before: dict) -> float:
    now = dict(policy.named_parameters())
    moved = sum(int((now[n].detach() != w).sum()) for n, w in before.items())
    return moved / sum(w.numel() for w in before.values())


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_small_updates_are_kept_with_float32_weights(hydra_conf, tmp_path, monkeypatch, precision):
    policy, before, probe = train_grpo(hydra_conf, tmp_path, monkeypatch, [f"trainer.precision={precision}"])
    assert changed_fraction(policy, before) >= 0.99
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert probe.params == probe.state == {torch.float32}
    assert probe.compute == ({torch.bfloat16} if precision == "bf16-mixed" else {torch.float32})


def test_pure_bfloat16_weights_lose_the_updates(hydra_conf, tmp_path, monkeypatch):
    """Why model.dtype=bfloat16 is refused: the same two steps move almost no weight."""
    policy, before, _ = train_grpo(hydra_conf, tmp_path, monkeypatch, [], dtype="bfloat16")
    assert changed_fraction(policy, before) < 0.2


def test_lora_over_a_bfloat16_base_trains_float32_adapters(hydra_conf, tmp_path, monkeypatch):
    overrides = ["model.dtype=bfloat16", LORA, "trainer.precision=bf16-mixed"]
    policy, before, probe = train_grpo(hydra_conf, tmp_path, monkeypatch, overrides)
    adapter = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    assert adapter and all("lora_" in n for n in adapter) and probe.params == probe.state == {torch.float32}
    assert {p.dtype for p in adapter.values()} == {torch.float32}
    assert {p.dtype for p in policy.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert changed_fraction(policy, before) >= 0.95  # 99.3 % measured (2 steps, 2,176 adapter weights)


@pytest.mark.parametrize("overrides, message", [
    (["model.dtype=bfloat16"], "model.dtype=bfloat16 trains bfloat16 weights with no float32 master copy (small "
     "updates round away): use model.dtype=float32 trainer.precision=bf16-mixed"),
    (["model.dtype=float16"], "use model.dtype=float32 trainer.precision=bf16-mixed"),
    (["trainer.precision=bf16-true"], "trainer.precision=bf16-true casts the trainable weights to 16 bits"),
    (["hardware=fsdp", "trainer.precision=16-mixed"], "hardware=fsdp with trainer.precision=16-mixed"),
])
def test_low_precision_trainable_weights_are_refused_at_plan_time(hydra_conf, overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(hydra_conf(TINY + overrides), "sft")
    assert any(message in p for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("overrides", [["model.dtype=bfloat16", LORA], ["trainer.precision=bf16-mixed"],
                                       ["hardware=fsdp", "trainer.precision=bf16-mixed"]])
def test_mixed_precision_and_a_lora_over_bfloat16_pass(hydra_conf, overrides):
    validate(hydra_conf(TINY + overrides), "sft")
