"""The `data` group (conf/data): the project's data modules are closed. Cross-key checks (a round that
splits into batches, a buffer that holds a round, replay without correction) are in
run/validation/config.py; the buffer is dry-built in run/validation/dry_build.py."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from run.validation.schemas.model import Seed
from run.validation.schemas.base import (Bool, Fraction, Mapping, NonNegativeInt, NonNegativeNumber, Node, OpenNode,
                                          OptionalPath, PositiveInt, PositiveNumber, Text, choice, must, optional)

EVICTIONS, SAMPLINGS = ("oldest", "lowest_priority"), ("uniform", "prioritized")  # data_modules/buffer.py


class Batches(Node):
    batch_size: PositiveInt = None
    micro_batch_size: must(Annotated[int, Field(gt=0)], "a positive integer (records per forward pass)") = None
    seed: Seed = None


class Demonstrations(Batches):
    """data_modules.demonstrations.DemonstrationsDataModule: the task's reference answers (SFT)."""
    source: Text = None
    max_examples: optional(PositiveInt, "for all") = None


class EpisodeDemonstrations(Demonstrations):
    """data_modules.episode_demonstrations.EpisodeDemonstrationsDataModule: teacher episodes (env group)."""
    demonstrate: Mapping = None


class Rollouts(Batches):
    """data_modules.fresh_rollouts / filtered_rollouts: on-policy rounds."""
    prompts_per_round: PositiveInt = None
    group_size: PositiveInt = None
    epochs_per_round: PositiveInt = None
    buffer_capacity: PositiveInt = None
    store: OptionalPath = None


class FilteredRollouts(Rollouts):
    """data_modules.filtered_rollouts.FilteredRolloutsDataModule: rounds the algorithm filters (online DPO, SPIN,
    rejection sampling), prompts from the first max_examples training examples."""
    max_examples: optional(PositiveInt, "for all") = None


class ReplayMix(Rollouts):
    """data_modules.replay_mix.ReplayMixDataModule: fresh rollouts mixed with replay from the buffer."""
    replay_ratio: must(Annotated[float, Field(ge=0, lt=1)], "in [0, 1) (0: pure on-policy)") = None
    max_staleness: optional(NonNegativeInt, "for no limit") = None
    max_reuse: optional(PositiveInt, "for no limit (0 would replay nothing)") = None
    eviction: choice(*EVICTIONS) = None
    sampling: choice(*SAMPLINGS) = None
    priority_alpha: NonNegativeNumber = None
    harvest: OptionalPath = None
    harvest_mismatch: choice("refuse", "retokenize") = None
    refresh_on_drift: Bool = None
    allow_uncorrected: Bool = None


class GresoSkip(Node):
    """data_modules.greso.GresoSkip (data.policy.greso): GRESO's calibrated skipping. explore_min ≤ explore_init ≤
    explore_max: run/validation/config.py."""
    target_tie_share: Fraction = None
    pass_share: Fraction = None
    explore_init: Fraction = None
    explore_step: Fraction = None
    explore_min: Fraction = None
    explore_max: Fraction = None
    revisit_floor: Fraction = None
    seed: Seed = None


class AdaptivePolicy(OpenNode):
    """data_modules.adaptive_policy.AdaptivePolicy (data.policy of data=adaptive); another `_target_` may take
    other keys: the named ones are checked, any other passed on. min ≤ max: run/validation/config.py."""
    pass_threshold: optional(must(Annotated[float, Field(gt=0, le=1)], "a number in (0, 1] (a reward at or above it "
                                   "passes; rewards are in [0, 1])"), "for non-binary rewards (mean/variance)") = None
    decay: must(Annotated[float, Field(gt=0, le=1)], "in (0, 1] (1: evidence never fades)") = None
    skip_margin: must(Annotated[float, Field(gt=0, le=0.5)], "in (0, 0.5]") = None
    skip_confidence: must(Annotated[float, Field(gt=0, le=1)], "in (0, 1]") = None
    min_ess_frac: Fraction = None
    max_kl: PositiveNumber = None
    min_fresh_frac: Fraction = None
    max_fresh_frac: must(Annotated[float, Field(gt=0, le=1)], "in (0, 1]") = None
    ema: must(Annotated[float, Field(gt=0, le=1)], "in (0, 1]") = None
    usd_per_mtok_generated: NonNegativeNumber = None
    usd_per_mtok_trained: NonNegativeNumber = None
    select_prompts: Bool = None
    adaptive_reuse: Bool = None
    selection: choice("thompson", "stream", "greso") = None
    greso: GresoSkip = None
    seed: Seed = None


class Adaptive(Rollouts):
    """data_modules.adaptive.AdaptiveDataModule: the mix, prompts and reuse decided by `policy` each round
    (max_staleness 0 would refuse every replayed record: replay silently off)."""
    max_staleness: optional(PositiveInt, "for no cap (0 would replay nothing)") = None
    max_reuse: optional(PositiveInt, "for no cap (0 would replay nothing)") = None
    eviction: choice(*EVICTIONS) = None
    priority_alpha: NonNegativeNumber = None
    harvest: OptionalPath = None
    harvest_mismatch: choice("refuse", "retokenize") = None
    refresh_on_drift: Bool = None
    allow_uncorrected: Bool = None
    policy: AdaptivePolicy = None


class SyntheticPairs(OpenNode):
    """data_modules.synthetic_preferences.*: pairs made for the task (arithmetic_pairs) or by sampling a
    saved policy (checkpoint_pairs)."""
    checkpoint: Text = None
    num_pairs: optional(PositiveInt, "for one per training prompt") = None
    samples_per_prompt: must(Annotated[int, Field(ge=2)], "an integer ≥ 2 (a best and a worst sample)") = None
    temperature: PositiveNumber = None
    max_new_tokens: PositiveInt = None
    batch_size: PositiveInt = None
    seed: Seed = None
    verifier: Mapping = None


class Conversations(Batches):
    """data_modules.conversations.ConversationsDataModule: multi-turn chats (SFT)."""
    path: OptionalPath = None
    heldout_path: OptionalPath = None
    num_heldout: NonNegativeInt = None
    split: Text = None
    messages_key: Text = None
    last_turn_only: Bool = None
    max_examples: optional(PositiveInt, "for all") = None
    max_length: optional(PositiveInt, "(the model's context)") = None
    source: Text = None


class Preferences(Batches):
    """data_modules.static_preferences.StaticPreferencesDataModule: offline preference pairs."""
    path: OptionalPath = None
    heldout_path: OptionalPath = None
    num_heldout: NonNegativeInt = None
    split: Text = None
    columns: Mapping = None
    chat: Bool = None
    skip_bad_rows: Bool = None
    max_length: optional(PositiveInt, "(the model's context)") = None
    unpaired: Bool = None
    synthetic: SyntheticPairs | None = None


class AnyData(Batches):
    """Another data module: its batch keys are checked, any other key passed on."""
    model_config = OpenNode.model_config


SCHEMAS = {"data_modules.demonstrations.DemonstrationsDataModule": Demonstrations,
           "data_modules.episode_demonstrations.EpisodeDemonstrationsDataModule": EpisodeDemonstrations,
           "data_modules.fresh_rollouts.FreshRolloutsDataModule": Rollouts,
           "data_modules.filtered_rollouts.FilteredRolloutsDataModule": FilteredRollouts,
           "data_modules.replay_mix.ReplayMixDataModule": ReplayMix,
           "data_modules.adaptive.AdaptiveDataModule": Adaptive,
           "data_modules.static_preferences.StaticPreferencesDataModule": Preferences,
           "data_modules.conversations.ConversationsDataModule": Conversations}
FALLBACK = AnyData
