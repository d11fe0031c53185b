"""The top-level keys of conf/train.yaml (seed, stages, the run switches, the cost ledger's prices) and
the model's recipe (conf/recipe), and the callbacks (conf/callbacks): each callback's node is open (a user's subclass may take more), its
counts and limits typed."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from run.validation.schemas.base import (Bool, Fraction, NonNegativeInt, NonNegativeNumber, Node, OpenNode, Path,
                                         PositiveInt, PositiveNumber, Text, must, node, optional)
from run.validation.schemas.model import Seed


class StageSpec(Node):
    """One entry of `stages`: {name, overrides}."""
    name: optional(Text, "(the algorithm's name)") = None
    overrides: must(list[str], "a list of overrides ([algorithm=sft, trainer.max_steps=100])") = None


class Cost(Node):
    """The cost ledger's price list (callbacks/cost.py): a negative price makes cost/usd meaningless."""
    usd_per_mtok_generated: NonNegativeNumber = None
    usd_per_mtok_trained: NonNegativeNumber = None


class Budget(Node):
    """Stop conditions of each stage (callbacks/budget.py): null is off; a budget ≤ 0 would end a stage
    before it trains."""
    generated_tokens: optional(PositiveInt, "(off)") = None
    usd: optional(PositiveNumber, "(off)") = None


Epochs = must(Annotated[int, Field(ge=1)] | Literal[-1], "a positive integer, or -1 (trainer.max_steps ends the stage)")


class RecipeLr(OpenNode):
    """recipe.lr: a peak learning rate per algorithm (open: a user's algorithm may read its own)."""
    sft: PositiveNumber = None
    dpo: PositiveNumber = None
    online_dpo: PositiveNumber = None
    spin: PositiveNumber = None
    kto: PositiveNumber = None
    reward_model: PositiveNumber = None
    grpo: PositiveNumber = None
    ppo: PositiveNumber = None
    rejection_sampling: PositiveNumber = None


class RecipeWarmup(OpenNode):
    sft: NonNegativeInt = None
    default: NonNegativeInt = None


class RecipeEpochs(OpenNode):
    sft: Epochs = None
    dpo: Epochs = None
    ipo: Epochs = None
    kto: Epochs = None
    reward_model: Epochs = None


class Recipe(OpenNode):
    """The model's recipe (conf/recipe): the values the algorithm, scheduler, generator and trainer configs
    interpolate, checked here, where they are written."""
    name: Text = None
    lr: RecipeLr = None
    warmup_steps: RecipeWarmup = None
    epochs: RecipeEpochs = None
    max_new_tokens: PositiveInt = None


class PushToHub(Node):
    """push_to_hub (run/push_to_hub.py): where the final policy is uploaded, if anywhere."""
    repo_id: optional(Text, "(no upload)") = None
    private: Bool = None
    revision: optional(Text, "(main)") = None
    folder: must(Literal["policy", "policy_merged"], "policy or policy_merged") = None


class Run(Node):
    """run.*: filled in by train.py for each stage (not for users): strings, or `???` until then."""
    output_dir: Path = None
    stage: Text = None
    group: Text = None
    name: Text = None
    wandb_id: Text = None
    log_version: Text = None


class Regenerate(OpenNode):
    max_dropped_rounds: PositiveInt = None
    max_staleness: NonNegativeInt = None
    past_bound: must(Literal["wait", "drop"], "wait or drop") = None
    engine_timeout_s: PositiveNumber = None
    engine_threads: PositiveInt = None
    engine_startup: must(Literal["overlap", "wait"], "overlap or wait") = None


class Evaluate(OpenNode):
    every_n_steps: NonNegativeInt = None
    schedule: must(list[Annotated[int, Field(gt=0)]] | str | None, "a list of positive steps [10, 50], a string "
                   "\"EVERY:UNTIL,...,EVERY\", or null (every_n_steps)") = None
    every_n_tokens: optional(PositiveInt, "(off)") = None
    num_examples: optional(PositiveInt, "for all") = None
    verifier: must(Literal["auto", "exact"] | OpenNode | None,
                   "auto, exact or a reward node ({_target_: ...})") = None
    on_other_data: Bool = None


class PreferenceEval(OpenNode):
    every_n_steps: NonNegativeInt = None
    batch_size: PositiveInt = None


class HeldoutLoss(OpenNode):
    every_n_steps: NonNegativeInt = None
    batch_size: PositiveInt = None
    num_examples: optional(PositiveInt, "for all") = None


class CostLedger(OpenNode):
    usd_per_mtok_generated: NonNegativeNumber = None
    usd_per_mtok_trained: NonNegativeNumber = None


class Checkpoint(OpenNode):
    """lightning's ModelCheckpoint: the keys conf/callbacks/default.yaml sets (any other of its arguments passes)."""
    dirpath: Path = None
    save_last: must(bool | Literal["link"], "true, false or link") = None
    save_top_k: must(Annotated[int, Field(ge=-1)], "an integer ≥ -1 (-1: every save)") = None
    every_n_epochs: PositiveInt = None
    save_on_train_epoch_end: Bool = None
    enable_version_counter: Bool = None


class Plots(OpenNode):
    output_dir: Path = None
    stage: Text = None


class Drift(OpenNode):
    min_ess_frac: optional(Fraction, "(off)") = None
    max_kl: optional(PositiveNumber, "(off)") = None
    max_staleness: optional(PositiveInt, "(off)") = None


class Guards(OpenNode):
    patience_rounds: PositiveInt = None
    patience_steps: PositiveInt = None
    max_truncated_frac: Fraction = None


class BudgetCallback(OpenNode):
    generated_tokens: optional(PositiveInt, "(off)") = None
    usd: optional(PositiveNumber, "(off)") = None


class Progress(OpenNode):
    refresh_rate: NonNegativeInt = None
    stage: Text = None


class Samples(OpenNode):
    rows_per_round: NonNegativeInt = None
    every_n_rounds: PositiveInt = None


CALLBACKS = {"callbacks.regenerate.RegenerateExperience": Regenerate,
             "callbacks.evaluate.HeldOutEvaluation": Evaluate,
             "callbacks.preference_eval.PreferenceEvaluation": PreferenceEval,
             "callbacks.budget.StageBudget": BudgetCallback,
             "callbacks.drift.DriftTrigger": Drift, "callbacks.guards.LearningGuards": Guards,
             "callbacks.progress.StageProgressBar": Progress, "callbacks.wandb_run.WandbSamples": Samples,
             "callbacks.heldout_loss.HeldOutLoss": HeldoutLoss, "callbacks.cost.CostLedger": CostLedger,
             "lightning.pytorch.callbacks.ModelCheckpoint": Checkpoint, "callbacks.run_plots.RunPlots": Plots}


class CSV(OpenNode):
    """callbacks.csv_metrics.StageCSVLogger (logger=csv): lightning's CSVLogger writing each row as it is logged."""
    save_dir: Path = None
    name: Text = None
    version: Text = None


class Wandb(OpenNode):
    """callbacks.wandb_run.StageWandbLogger (logger=wandb): lightning's WandbLogger with stage-prefixed keys
    (any other WandbLogger / wandb.init argument passes)."""
    stage: Text = None
    step_offset: optional(NonNegativeInt, "(the steps of the stages before it)") = None
    project: Text = None
    save_dir: Path = None
    group: Text = None
    name: Text = None
    id: Text = None
    resume: must(Literal["allow", "must", "never", "auto"] | bool, "allow, must, never, auto, true or false") = None
    job_type: Text = None


LOGGERS = {"lightning.pytorch.loggers.CSVLogger": CSV, "callbacks.csv_metrics.StageCSVLogger": CSV,
           "callbacks.wandb_run.StageWandbLogger": Wandb}


class TopLevel(Node):
    """The top-level keys: closed (a key no run reads is refused, `+typo=1` in a stage's overrides too)."""
    seed: Seed = None
    stages: must(list[StageSpec], "a list of {name, overrides}") = None
    print_config: Bool = None
    resume: Bool = None
    resume_allow_changes: Bool = None
    checkpoint_every_n_rounds: PositiveInt = None
    cost: Cost = None
    budget: Budget = None
    recipe: Recipe = None
    push_to_hub: PushToHub = None
    run: Run = None
    callbacks: node(CALLBACKS, OpenNode, "a mapping of callback names to nodes ({_target_: ...})", each=True) = None
    logger: node(LOGGERS, OpenNode, "a mapping of logger names to nodes ({_target_: ...})", each=True) = None


TOP_KEYS = tuple(TopLevel.model_fields)
