"""The `algorithm` group (conf/algorithm), with its optimizer and scheduler nodes, and the `correction`
group (conf/correction). An algorithm's node is open: each LightningModule takes its own keys, and an
added key is checked against the module's signature on the command line (run/overrides.py); the keys
the project's modules share are typed here. The correction's bounds keep on-policy tokens (importance
ratio 1) trained as they are."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from losses.common import AGGREGATIONS
from losses.correction import LEVELS
from run.validation.schemas.base import (Bool, Fraction, NonNegativeInt, NonNegativeNumber, Node, OpenNode,
                                          OptionalPath, PositiveInt, PositiveNumber, Text, choice, must, optional)
from run.validation.schemas.generator import TopK, TopP


class Optimizer(OpenNode):
    """A torch optimizer (`_partial_`): any of its keyword arguments may be added."""
    lr: PositiveNumber = None
    weight_decay: NonNegativeNumber = None


class Scheduler(OpenNode):
    """A transformers schedule with warmup (conf/scheduler)."""
    num_warmup_steps: NonNegativeInt = None
    num_training_steps: must(Annotated[int, Field(gt=0)], "a positive integer (the optimizer steps the "
                             "learning rate decays over; default: trainer.max_steps)") = None


class Fn(Node):
    """A loss-side function node (`_partial_`): a KL estimator, a value loss."""


class Advantage(Node):
    """losses.advantages.*: how a group's (or the batch's) rewards become advantages."""
    scale_by_std: Bool = None


class PreferenceLoss(Node):
    """losses.preference.*: its β follows algorithm.beta (checked there)."""
    beta: PositiveNumber = None
    label_smoothing: must(Annotated[float, Field(ge=0, lt=0.5)], "in [0, 0.5) (the chance a label is flipped)") = None
    desirable_weight: PositiveNumber = None
    undesirable_weight: PositiveNumber = None
    center_coef: NonNegativeNumber = None


class Screen(Node):
    """GRPO's screen, then expand (data_modules/screening.py); size < group_size: run/validation/economy.py."""
    size: optional(PositiveInt, "(off)") = None
    min_signal: Fraction = None


class StoredSuccess(Node):
    """GRPO's reuse of stored successes (data_modules/stored_success.py)."""
    enabled: Bool = None
    cap: must(Annotated[float, Field(ge=1)], "a number ≥ 1 (a stored success with π = μ keeps its weight)") = None


class Algorithm(OpenNode):
    """Every algorithm's LightningModule (trainers/); the keys below wherever a module has them."""
    name: Text = None
    default_data: Text = None
    group_size: PositiveInt = None
    epochs_per_round: PositiveInt = None
    beta: NonNegativeNumber = None
    temperature: PositiveNumber = None
    top_k: TopK = None
    top_p: TopP = None
    max_nonfinite: PositiveInt = None
    max_grad_norm: optional(PositiveNumber, "for no clipping") = None
    annotate_batch_size: optional(PositiveInt, "(= data.micro_batch_size)") = None
    ref_update_every: optional(PositiveInt, "for never") = None
    ref_update_alpha: must(Annotated[float, Field(gt=0, le=1)],
                           "in (0, 1] (1: the reference becomes a copy of the policy)") = None
    loss_agg_mode: choice(*sorted(AGGREGATIONS)) = None
    precompute_reference: Bool = None
    length_normalize: Bool = None
    unpaired: Bool = None
    nll_coef: NonNegativeNumber = None
    min_reward_gap: NonNegativeNumber = None
    chosen_source: choice("dataset", "teacher", "human", "external_model",
                          why="who wrote the demonstrations; policy_rollout is the rejected side's") = None
    keep_per_group: PositiveInt = None
    gamma: must(Annotated[float, Field(ge=0, le=1)], "in [0, 1]") = None
    lam: must(Annotated[float, Field(ge=0, le=1)], "in [0, 1]") = None
    vf_coef: NonNegativeNumber = None
    value_clip: optional(PositiveNumber, "for no clipping") = None
    whiten_advantages: Bool = None
    kl_in_reward: Bool = None
    kl_coef: NonNegativeNumber = None
    target_kl: optional(PositiveNumber, "for no early stop") = None
    save_dir: OptionalPath = None
    dynamic_sampling: Bool = None
    max_gen_batches: PositiveInt = None
    refill: choice("full", "measured") = None
    carry_surplus: Bool = None
    screen: Screen = None
    pass_threshold: must(float, "a number (a sample passes when its reward ≥ it)") = None
    stored_success: StoredSuccess = None
    overlong_cache: optional(PositiveInt, "(off)") = None
    overlong_max_len: PositiveInt = None
    overlong_filter: Bool = None
    turn_credit: choice("outcome", "per_turn") = None
    turn_gamma: must(Annotated[float, Field(ge=0, le=1)], "in [0, 1]") = None
    shared_prefix: Bool = None
    loss_max_len: PositiveInt = None
    critic: choice("shared", "separate") = None
    threshold: must(float, "a number (the minimum reward a kept sample reaches)") = None
    correction: must(dict | None, "a correction node (the `correction` group)") = None
    advantage: Advantage = None
    kl_estimator: Fn = None
    value_loss: Fn = None
    loss: PreferenceLoss = None
    optimizer: Optimizer = None
    scheduler: Scheduler | None = None


class Preference(Algorithm):
    """The DPO family (dpo, ipo, spin, online_dpo) and KTO: β scales the implicit reward; at 0 the loss is a
    constant (log 2 for DPO) with no gradient, so nothing trains."""
    beta: must(Annotated[float, Field(gt=0)], "a positive number (β = 0 makes the loss flat: nothing trains)") = None


def _bounded(test, text: str):
    ge, gt, le, lt = test
    return must(Annotated[float, Field(ge=ge, gt=gt, le=le, lt=lt)], f"a number {text}")


Level = choice(*LEVELS)


class PPOClip(Node):
    clip_low: _bounded((0, None, None, 1), "in [0, 1): ρ is clipped below at 1 - clip_low") = None
    clip_high: _bounded((None, 0, None, None), "> 0: ρ is clipped above at 1 + clip_high") = None
    level: Level = None


class DecoupledPPO(PPOClip):
    cap: _bounded((1, None, None, None), "≥ 1: fresh tokens (π_prox = μ) keep their weight") = None


class TruncatedIS(Node):
    cap: _bounded((1, None, None, None), "≥ 1: on-policy tokens (ρ = 1) keep their weight") = None
    level: Level = None


class MaskedIS(Node):
    low: _bounded((0, None, 1, None), "in [0, 1]: on-policy tokens (ρ = 1) are kept") = None
    high: _bounded((1, None, None, None), "≥ 1: on-policy tokens (ρ = 1) are kept") = None
    level: Level = None


class NoCorrection(Node):
    level: Level = None


SCHEMAS = {t: Preference for t in ("trainers.dpo.DPOModule", "trainers.spin.SPINModule", "trainers.kto.KTOModule",
                                   "trainers.online_dpo.OnlineDPOModule")}
FALLBACK = Algorithm
CORRECTIONS = {"losses.correction.ppo_clip": PPOClip, "losses.correction.truncated_is": TruncatedIS,
               "losses.correction.masked_is": MaskedIS, "losses.correction.no_correction": NoCorrection,
               "losses.correction.decoupled_ppo": DecoupledPPO}
