"""Bad command lines: caught before Hydra composes, or when keys are routed to stages."""
from __future__ import annotations

from tests.bad_inputs.case import Case

C = Case

CASES: list[Case] = [
    # ---- the command line, before Hydra composes it
    C("key-typo", "a misspelled key", ("algorithm.betta=0.1",),
      "error: algorithm.betta=0.1: no `algorithm.betta` in the config; did you mean `algorithm.beta`?", when="command line"),
    C("node-typo", "a misspelled node", ("algoritm.beta=0.1",),
      "error: algoritm.beta=0.1: no `algoritm.beta` in the config; did you mean `algorithm.beta`?", when="command line"),
    C("trainer-typo", "a misspelled Lightning key", ("trainer.max_step=5",),
      "error: trainer.max_step=5: no `trainer.max_step` in the config; did you mean `trainer.max_steps`?",
      when="command line"),
    C("other-stage-key", "a key only another stage's group has, without ++", ("data.max_examples=5",),
      "error: data.max_examples=5: data=fresh_rollouts has no `max_examples`, data=conversations, demonstrations, "
      "episode_demonstrations, filtered_rollouts has: for the stages whose data has it, write ++data.max_examples=5", when="command line"),
    C("plus-existing", "'+' on a key that exists", ("+algorithm.beta=0.1",),
      "error: +algorithm.beta=0.1: `algorithm.beta` already exists; '+' only adds a new key: write algorithm.beta=0.1 "
      "to change it", when="command line"),
    C("plus-group-typo", "'+' on a misspelled group (was accepted and ignored: exit 0)", ("+algoritm=grpo",),
      "error: +algoritm=grpo: the config has no `algoritm`, so '+' would add it and nothing would read it; did you "
      "mean `algorithm`?", when="command line"),
    C("choice-typo", "a misspelled group choice", ("algorithm=grpoo",),
      "error: algorithm=grpoo: there is no algorithm=grpoo (choices: dpo, dr_grpo, grpo, ipo, kto, online_dpo, ppo, "
      "reinforce_pp, rejection_sampling, reward_model, rloo, sft, spin); did you mean algorithm=grpo?", when="command line"),
    C("experiment-typo", "a misspelled experiment", ("experiment=quickstar",),
      "error: experiment=quickstar: there is no experiment=quickstar (choices: grpo_code, instructgpt, onpolicy_vs_replay, "
      "quickstart, quickstart_smoke, rm_vs_gold, sft_then_dpo, sft_then_online_dpo, sft_then_spin, short_sft_adaptive, short_sft_dpo, short_sft_grpo, single, "
      "tool_use, tool_use_chat); did you mean experiment=quickstart?",
      when="command line"),
    C("sweep-choice-typo", "a misspelled choice in a sweep", ("-m", "correction=ppo_clip,trunc_is"),
      "error: correction=ppo_clip,trunc_is: there is no correction=trunc_is (choices: decoupled_ppo, masked_is, none, "
      "ppo_clip, truncated_is); did you mean correction=truncated_is?", when="command line"),
    C("unparsable", "an override that does not parse", ("algorithm.beta=[0.1",),
      "error: 'algorithm.beta=[0.1' is not a valid override (no viable alternative at input '[0.1'); quote a value "
      "holding spaces or brackets: 'key=\"a b\"'", when="command line"),
    C("delete-missing", "deleting a key that is not there", ("~data.max_exampels",),
      "error: ~data.max_exampels: no `data.max_exampels` in the config to delete; did you mean `data.max_examples`?",
      when="command line"),
    # ---- keys no run reads (issue 34): refused before anything is imported, naming the key that means it here
    C("plus-typo", "an added top-level key with no near match (ran the whole quickstart)", ("+typo=1",),
      "error: +typo=1: the config has no `typo`, so '+' would add it and nothing would read it", when="command line"),
    C("plus-trl-learning-rate", "TRL's learning_rate added with '+' (trained at the default rate, exit 0)",
      ("+learning_rate=1e-5",),
      "error: +learning_rate=1e-5: the config has no `learning_rate`, so '+' would add it and nothing would read it; "
      "did you mean `algorithm.optimizer.lr`? (`learning_rate` is TRL's name)", when="command line"),
    C("trl-learning-rate", "TRL's learning_rate", ("learning_rate=1e-5",),
      "error: learning_rate=1e-5: no `learning_rate` in the config; did you mean `algorithm.optimizer.lr`? "
      "(`learning_rate` is TRL's name)", when="command line"),
    C("trl-num-train-epochs", "TRL's num_train_epochs", ("num_train_epochs=3",),
      "error: num_train_epochs=3: no `num_train_epochs` in the config; did you mean `trainer.max_epochs`? "
      "(`num_train_epochs` is TRL's name)", when="command line"),
    C("trl-per-device-batch", "TRL's per_device_train_batch_size", ("per_device_train_batch_size=4",),
      "error: per_device_train_batch_size=4: no `per_device_train_batch_size` in the config; did you mean "
      "`data.micro_batch_size`? (`per_device_train_batch_size` is TRL's name)", when="command line"),
    C("trl-beta", "TRL's beta at the top level", ("beta=0.1",),
      "error: beta=0.1: no `beta` in the config; did you mean `algorithm.beta`? (`beta` is TRL's name)",
      when="command line"),
    C("trl-num-generations", "TRL's num_generations", ("num_generations=4",),
      "error: num_generations=4: no `num_generations` in the config; did you mean `algorithm.group_size`? "
      "(`num_generations` is TRL's name)", when="command line"),
    C("trl-max-completion-length", "TRL's max_completion_length", ("max_completion_length=64",),
      "error: max_completion_length=64: no `max_completion_length` in the config; did you mean "
      "`generator.max_new_tokens`? (`max_completion_length` is TRL's name)", when="command line"),
    C("group-name-typo", "a misspelled group name", ("experimnt=quickstart",),
      "error: experimnt=quickstart: no `experimnt` in the config; did you mean experiment=quickstart?",
      when="command line"),
    C("plus-algorithm-trl-name", "TRL's name added to the algorithm's node", ("+algorithm.learning_rate=1e-5",),
      "error: +algorithm.learning_rate=1e-5: trainers.grpo.GRPOModule, trainers.sft.SFTModule take(s) no "
      "`learning_rate` (stages: sft, grpo); did you mean `algorithm.optimizer.lr`? (`learning_rate` is TRL's name)"),
    C("plus-key-in-closed-node", "a key added to a node no code reads it from", ("+cost.note=1",),
      "error: stage sft: cost.note: cost has no key `note` (its keys: usd_per_mtok_generated, usd_per_mtok_trained)"),
    # ---- keys routed to stages: added keys against the code's signature
    C("plus-trainer-typo", "an added key Lightning's Trainer does not take", ("+trainer.max_step=5",),
      "error: +trainer.max_step=5: lightning.Trainer take(s) no `max_step` (stages: sft, grpo); did you mean "
      "`trainer.max_steps`?"),
    C("plus-algorithm-typo", "an added key no algorithm takes", ("+algorithm.bta=0.1",),
      "error: +algorithm.bta=0.1: trainers.grpo.GRPOModule, trainers.sft.SFTModule take(s) no `bta` (stages: sft, "
      "grpo); did you mean `algorithm.beta`?"),
    C("plus-optimizer-typo", "an added optimizer argument AdamW does not take", ("+algorithm.optimizer.bettas=[0.9,0.95]",),
      "error: +algorithm.optimizer.bettas=[0.9,0.95]: torch.optim.AdamW take(s) no `bettas` (stages: sft, grpo); "
      "did you mean `algorithm.optimizer.betas`?"),
    C("force-add-typo", "a misspelled ++ key", ("++data.max_exampels=5",),
      "error: ++data.max_exampels=5: data_modules.demonstrations.DemonstrationsDataModule, "
      "data_modules.fresh_rollouts.FreshRolloutsDataModule take(s) no `max_exampels` (stages: sft, grpo); did you "
      "mean `data.max_examples`?"),
    C("plus-stage-existing", "'+' on a key a stage has", ("+data.max_examples=5",),
      "error: +data.max_examples=5: `data.max_examples` already exists (stage sft); '+' only adds a new key: write "
      "++data.max_examples=5 to set it where it exists"),
    C("key-of-no-stage", "a key the chosen algorithm does not have", ("algorithm=sft", "++algorithm.beta=0.1"),
      "error: ++algorithm.beta=0.1: trainers.sft.SFTModule take(s) no `beta` (stages: sft)"),
]
