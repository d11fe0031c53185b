"""Bad values and combinations of values, caught when the stages are planned."""
from __future__ import annotations

from tests.bad_inputs.case import Case
from tests.bad_inputs.setups import ADAPTIVE, NO_GPU, REPLAY, no_vllm

C = Case

CASES: list[Case] = [
    # ---- values
    C("max-steps-float", "a fractional step count", ("trainer.max_steps=2.5",),
      "error: stage sft: trainer.max_steps=2.5 must be a positive integer"),
    C("max-steps-zero", "no steps", ("trainer.max_steps=0",),
      "error: stage sft: trainer.max_steps=0 must be a positive integer"),
    C("max-examples-negative", "a negative example limit", ("++data.max_examples=-5",),
      "error: stage sft: data.max_examples=-5 must be a positive integer, or null for all"),
    C("max-epochs-zero", "zero epochs", ("trainer.max_epochs=0",),
      "error: stage sft: trainer.max_epochs=0 must be a positive integer, or -1 for no limit (then trainer.max_steps "
      "ends the stage)"),
    C("seed-text", "a seed that is not a number", ("seed=abc",),
      "error: stage sft: seed='abc' must be an integer in [0, 2**32)"),
    C("lr-negative", "a negative learning rate", ("algorithm.optimizer.lr=-1e-4",),
      "error: stage sft: algorithm.optimizer.lr=-0.0001 must be a positive number"),
    C("timeout-negative", "a negative reward timeout", ("+reward.timeout_s=-1",),
      "error: stage sft: reward.timeout_s=-1 must be a positive number"),
    C("top-p", "top_p above 1", ("generator.top_p=1.5",),
      "error: stage sft: generator.top_p=1.5 must be in (0, 1]"),
    C("temperature-zero", "temperature 0", ("generator.temperature=0",),
      "error: stage sft: generator.temperature=0 must be a positive number"),
    C("max-new-tokens-float", "a fractional token budget", ("generator.max_new_tokens=2.5",),
      "error: stage sft: generator.max_new_tokens=2.5 must be a positive integer"),
    C("every-n-steps", "a negative evaluation interval", ("callbacks.evaluate.every_n_steps=-1",),
      "error: stage sft: callbacks.evaluate.every_n_steps=-1 must be an integer ≥ 0"),
    C("eval-schedule", "an evaluation schedule that does not parse", ('callbacks.evaluate.schedule="5:50,x"',),
      "error: stage sft: callbacks.evaluate.schedule='5:50,x' must be null (every callbacks.evaluate.every_n_steps "
      "steps), a list of steps ([10, 50, 100]) or 'EVERY:UNTIL,...,EVERY' ('5:50,25': every 5 steps up to step 50, "
      "then every 25): 'x' in segment 'x' is not an integer ≥ 1"),
    C("group-size-zero", "groups of 0", ("algorithm.group_size=0",),
      "error: stage grpo: algorithm.group_size=0 must be a positive integer"),
    C("group-size-one", "groups of 1 for group-relative advantages", ("algorithm.group_size=1",),
      "error: stage grpo: algorithm.group_size=1: group-relative advantages need at least 2"),
    C("round-not-divisible", "a round that does not split into batches",
      ("data.prompts_per_round=3", "data.batch_size=16"),
      "error: stage grpo: data.prompts_per_round × algorithm.group_size = 3 × 8 = 24 records per round is not "
      "divisible by data.batch_size=16"),
    C("beta-negative", "a negative KL coefficient", ("algorithm.beta=-0.1",),
      "error: stage grpo: algorithm.beta=-0.1 must be a number ≥ 0"),
    C("epochs-per-round-zero", "μ = 0", ("algorithm=grpo", "algorithm.epochs_per_round=0"),
      "error: stage grpo: algorithm.epochs_per_round=0 must be a positive integer"),
    C("screen-size-zero", "a screen of no samples", ("algorithm=grpo", "algorithm.screen.size=0"),
      "error: stage grpo: algorithm.screen.size=0 must be a positive integer, or null (off)"),
    C("screen-size-whole-group", "a screen as large as the group", ("algorithm=grpo", "algorithm.screen.size=8"),
      "error: stage grpo: algorithm.screen.size=8 must be less than algorithm.group_size=8 (the screen is the first "
      "samples of a group; the rest of it is the expansion)"),
    C("screen-min-signal", "a screen threshold above 1", ("algorithm=grpo", "algorithm.screen.min_signal=1.5"),
      "error: stage grpo: algorithm.screen.min_signal=1.5 must be a number in [0, 1]"),
    C("refill-unknown", "an unknown refill rule", ("algorithm=grpo", "algorithm.refill=half"),
      "error: stage grpo: algorithm.refill='half' must be one of full, measured"),
    C("carry-without-dynamic", "carrying surplus groups without dynamic sampling",
      ("algorithm=grpo", "algorithm.carry_surplus=true"),
      "error: stage grpo: algorithm.carry_surplus=true shapes dynamic sampling's refills: set "
      "algorithm.dynamic_sampling=true, or leave algorithm.carry_surplus=false"),
    C("stored-success-cap", "a stored-success weight cap below 1", ("algorithm=grpo", "algorithm.stored_success.cap=0.5"),
      "error: stage grpo: algorithm.stored_success.cap=0.5 must be a number ≥ 1 (a stored success with π = μ keeps "
      "its weight)"),
    C("pass-threshold-text", "a pass threshold that is not a number", ("algorithm=grpo", "algorithm.pass_threshold=high"),
      "error: stage grpo: algorithm.pass_threshold='high' must be a number (a sample passes when its reward ≥ it)"),
    C("micro-batch-zero", "a micro-batch of 0", ("data.micro_batch_size=0",),
      "error: stage sft: data.micro_batch_size=0 must be a positive integer (records per forward pass)"),
    C("micro-batch-indivisible", "a micro-batch that does not divide the batch", ("data.micro_batch_size=3",),
      "error: stage sft: data.micro_batch_size=3 must divide data.batch_size=64 (batch_size / micro_batch_size = "
      "gradient-accumulation steps)"),
    C("dtype", "an unknown weight dtype", ("model.dtype=float8",),
      "error: stage sft: model.dtype='float8' must be one of float32, bfloat16, float16"),
    C("bf16-weights", "16-bit trainable weights (no float32 master copy)", ("model.dtype=bfloat16",),
      "error: stage sft: model.dtype=bfloat16 trains bfloat16 weights with no float32 master copy (small updates "
      "round away): use model.dtype=float32 trainer.precision=bf16-mixed (float32 weights and optimizer state, "
      "bf16 compute), or a LoRA adapter (model.lora) over the bfloat16 base"),
    C("bool-key", "a yes/no key given a word", ("model.activation_checkpointing=maybe",),
      "error: stage sft: model.activation_checkpointing='maybe' must be true or false"),
    C("grad-norm-negative", "a negative clipping norm", ("algorithm.max_grad_norm=-1",),
      "error: stage sft: algorithm.max_grad_norm=-1 must be a positive number, or null for no clipping"),
    C("annotate-batch-zero", "an annotation batch of 0", ("algorithm.annotate_batch_size=0",),
      "error: stage grpo: algorithm.annotate_batch_size=0 must be a positive integer, or null (= data.micro_batch_size)"),
    C("grpo-on-demos", "GRPO on demonstrations", ("data=demonstrations",),
      "error: stage grpo: algorithm=grpo learns from whole groups of its own samples, and data=demonstrations "
      "serves demonstrations: use data=fresh_rollouts, replay_mix or adaptive with it, or algorithm=sft on this data"),
    C("uncorrected-replay", "replayed data with no off-policy correction",
      REPLAY + ("correction=none", "data.replay_ratio=0.5"),
      "error: stage grpo: correction=none trains on replayed/harvested data (data.replay_ratio=0.5, data.harvest=None) "
      "as if it were on-policy: choose correction=ppo_clip, truncated_is or masked_is, or set "
      "data.allow_uncorrected=true to accept the bias"),
    C("replay-ratio", "a replay ratio of 1", REPLAY + ("data.replay_ratio=1.0",),
      "error: stage grpo: data.replay_ratio=1.0 must be in [0, 1) (0: pure on-policy)"),
    # ---- data=adaptive's policy (data.policy.*): every key refused by name
    C("adaptive-fresh-bounds", "a minimum fresh share above the maximum",
      ADAPTIVE + ("data.policy.min_fresh_frac=0.8", "data.policy.max_fresh_frac=0.5"),
      "error: stage grpo: data.policy.min_fresh_frac=0.8 must be at most data.policy.max_fresh_frac=0.5 (the bounds "
      "of each round's fresh share)"),
    C("adaptive-min-fresh-negative", "a negative minimum fresh share", ADAPTIVE + ("data.policy.min_fresh_frac=-0.1",),
      "error: stage grpo: data.policy.min_fresh_frac=-0.1 must be a number in [0, 1]"),
    C("adaptive-max-fresh-zero", "a maximum fresh share of 0 (no fresh data ever)",
      ADAPTIVE + ("data.policy.max_fresh_frac=0",), "error: stage grpo: data.policy.max_fresh_frac=0 must be in (0, 1]"),
    C("adaptive-min-ess", "an ESS bound above 1", ADAPTIVE + ("data.policy.min_ess_frac=1.5",),
      "error: stage grpo: data.policy.min_ess_frac=1.5 must be a number in [0, 1]"),
    C("adaptive-max-kl", "a negative KL bound", ADAPTIVE + ("data.policy.max_kl=-1",),
      "error: stage grpo: data.policy.max_kl=-1 must be a positive number"),
    C("adaptive-decay", "evidence that decays to nothing at once", ADAPTIVE + ("data.policy.decay=0",),
      "error: stage grpo: data.policy.decay=0 must be in (0, 1] (1: evidence never fades)"),
    C("adaptive-ema", "a smoothing rate above 1", ADAPTIVE + ("data.policy.ema=1.5",),
      "error: stage grpo: data.policy.ema=1.5 must be in (0, 1]"),
    C("adaptive-skip-margin", "a skip margin past one half", ADAPTIVE + ("data.policy.skip_margin=0.7",),
      "error: stage grpo: data.policy.skip_margin=0.7 must be in (0, 0.5]"),
    C("adaptive-skip-confidence", "a negative skip confidence", ADAPTIVE + ("data.policy.skip_confidence=-0.1",),
      "error: stage grpo: data.policy.skip_confidence=-0.1 must be in (0, 1]"),
    C("adaptive-pass-threshold", "a pass threshold that is not a number", ADAPTIVE + ("data.policy.pass_threshold=abc",),
      "error: stage grpo: data.policy.pass_threshold='abc' must be a number in (0, 1] (a reward at or above it passes; "
      "rewards are in [0, 1]), or null for non-binary rewards (mean/variance)"),
    C("adaptive-selection", "a selection rule that does not exist", ADAPTIVE + ("data.policy.selection=greedy",),
      "error: stage grpo: data.policy.selection='greedy' must be one of thompson, stream, greso"),
    C("greso-needs-threshold", "GRESO's skipping without a pass threshold",
      ADAPTIVE + ("data.policy.selection=greso", "data.policy.pass_threshold=null"),
      "error: stage grpo: data.policy.selection=greso needs data.policy.pass_threshold (a number): a tie at pass and "
      "a tie at fail are skipped with separate strengths"),
    C("greso-explore-init", "GRESO's starting exploration outside its bounds",
      ADAPTIVE + ("data.policy.greso.explore_init=0.99",),
      "error: stage grpo: data.policy.greso.explore_init=0.99 must be in [data.policy.greso.explore_min, "
      "data.policy.greso.explore_max] = [0.05, 0.95] (GRESO's exploration probabilities)"),
    *[C(f"greso-{key.replace('_', '-')}", f"GRESO's {key} outside [0, 1]", ADAPTIVE + (f"data.policy.greso.{key}={bad}",),
        f"error: stage grpo: data.policy.greso.{key}={bad} must be a number in [0, 1]")
      for key, bad in (("target_tie_share", 1.5), ("pass_share", -0.1), ("explore_step", 2), ("explore_min", -0.5),
                       ("explore_max", 1.5), ("revisit_floor", -0.01))],
    C("greso-seed", "a GRESO seed that is not a number", ADAPTIVE + ("data.policy.greso.seed=abc",),
      "error: stage grpo: data.policy.greso.seed='abc' must be an integer in [0, 2**32)"),
    C("adaptive-price", "a negative token price for the mix", ADAPTIVE + ("data.policy.usd_per_mtok_generated=-1",),
      "error: stage grpo: data.policy.usd_per_mtok_generated=-1 must be a number ≥ 0"),
    C("adaptive-policy-target", "a policy class that does not exist",
      ADAPTIVE + ("data.policy._target_=data_modules.adaptive_policy.NoSuchPolicy",),
      "error: stage grpo: data.policy._target_=data_modules.adaptive_policy.NoSuchPolicy: "
      "data_modules.adaptive_policy has no `NoSuchPolicy`"),
    C("adaptive-max-reuse-zero", "an adaptive reuse cap of 0", ADAPTIVE + ("data.max_reuse=0",),
      "error: stage grpo: data.max_reuse=0 must be a positive integer, or null for no cap (0 would replay nothing)"),
    C("adaptive-uncorrected", "adaptive replay with no off-policy correction", ADAPTIVE + ("correction=none",),
      "error: stage grpo: correction=none trains on replayed/harvested data (data=adaptive, data.harvest=None) as if "
      "it were on-policy: choose correction=ppo_clip, truncated_is or masked_is, or set data.allow_uncorrected=true "
      "to accept the bias"),
    C("harvest-missing", "a harvest store that does not exist", REPLAY + ("data.harvest=DIR/store",),
      "error: stage grpo: data.harvest='DIR/store': no such directory (a store written with data.store=...)"),
    C("no-gpu", "hardware=gpu on a machine without one", ("hardware=gpu",),
      "error: stage sft: hardware=gpu (trainer.accelerator=gpu): torch sees no CUDA GPU here: use hardware=cpu, or "
      "check the driver and CUDA_VISIBLE_DEVICES", patches=NO_GPU),
    C("ranks-batch", "a batch that does not split over the ranks", ("hardware=ddp", "data.batch_size=33"),
      "error: stage sft: data.batch_size=33 (records per optimizer step) must be a multiple of the 2 ranks "
      "(trainer.devices × trainer.num_nodes): each rank takes batch_size / 2"),
    C("fsdp-lora", "FSDP2 over a LoRA model", ("algorithm=grpo", "hardware=fsdp", "model.lora={r: 4}"),
      "error: stage grpo: hardware=fsdp with model.lora: FSDP2 over a peft model is not supported yet; use "
      "hardware=ddp for LoRA"),
    C("vllm-ranks-tp", "a vLLM engine over several devices on each of several ranks",
      ("algorithm=grpo", "hardware=ddp", "generator=vllm", "generator.tensor_parallel_size=2"),
      "error: stage grpo: generator.tensor_parallel_size=2 with 2 ranks: each rank owns one engine on its own "
      "device (tensor_parallel_size=1); an engine over several devices is one process's only",
      patches=(("generators.vllm.check_vllm_available", lambda: "0.32.0"),)),
    C("no-vllm", "generator=vllm without vllm installed", ("generator=vllm",),
      "error: stage sft: generator=vllm: generator=vllm needs the vllm package, which is not installed in this "
      "environment: install it with `bash scripts/install_vllm.sh…", needs=no_vllm),
    C("heldout-too-many", "holding out more pairs than there are", ("task.num_heldout=20000",),
      "error: task (tasks.arithmetic.arithmetic_task): task.num_heldout=20000 leaves no training pairs "
      "out of 10000"),
    C("unimportable-target", "a reward function that cannot be imported (was Hydra's 'Error locating target' "
      "after the run started)", ("reward=function", "reward.fn._target_=my_rewards.score"),
      "error: stage sft: reward.fn._target_=my_rewards.score: no module named 'my_rewards' (is it installed, or is "
      "the checkout on PYTHONPATH?)"),
    C("moved-target", "a `_target_` path from before the code moved (a saved config)",
      ("generator._target_=models.generation.HFGenerator",),
      "error: stage sft: generator._target_=models.generation.HFGenerator: that path moved to "
      "generators.hf.HFGenerator (set generator._target_=generators.hf.HFGenerator)"),
    C("algorithm-data-mismatch", "an algorithm with a data source that needs another's keys",
      ("algorithm=sft", "data=fresh_rollouts"),
      "error: stage sft: algorithm=sft imitates reference completions, and data=fresh_rollouts serves rollouts: use "
      "data=demonstrations, conversations or episode_demonstrations with it, or algorithm=grpo, ppo, rloo, dr_grpo or "
      "reinforce_pp on this data"),
    C("lora-rank-zero", "a LoRA adapter of rank 0", ("algorithm=sft", "model.lora={r: 0}"),
      "error: stage sft: model.lora.r=0 must be a positive integer"),
    C("lora-unknown-module", "a LoRA target module the model does not have, beside one it has",
      ("algorithm=sft", "model.lora={r: 4, target_modules: [q_proj, qproj]}"),
      "error: stage sft: model.lora.target_modules: ['qproj'] match no module of LlamaForCausalLM (its linear "
      "layers: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj; or target_modules: all-linear)"),
    C("clip-low-above-one", "a PPO clip range whose lower bound is negative", ("correction.clip_low=1.5",),
      "error: stage sft: correction.clip_low=1.5 must be a number in [0, 1): ρ is clipped below at 1 - clip_low"),
    C("no-heldout", "no held-out examples with the held-out evaluation on", ("task.num_heldout=0",),
      "error: stage sft: task arithmetic2 holds out no examples (task.num_heldout=0, or an empty held-out file), "
      "but callbacks.evaluate reports held-out accuracy on them: hold some out, or turn the evaluation off "
      "with callbacks.evaluate=null"),
    C("buffer-under-a-round", "an experience buffer smaller than one round",
      ("algorithm=grpo", "data=replay_mix", "data.buffer_capacity=100"),
      "error: stage grpo: data.buffer_capacity=100 holds less than one round (data.prompts_per_round × "
      "algorithm.group_size = 64 × 8 = 512 records): raise it to at least 512"),
    C("code-exec-no-tests", "reward=code_exec on a task without unit tests", ("reward=code_exec",),
      "error: stage sft: callbacks.evaluate.verifier=auto (the stage's reward=code_exec) scores a completion by "
      "running the example's unit tests, but task arithmetic2, heldout example 1 ('97+70=') has none ('entry_point' "
      "and 'tests'): use task=code, or a task file whose lines carry entry_point and tests"),
    C("sandbox-budget", "a code_exec batch limit shorter than one sandbox run", ("reward=code_exec", "reward.timeout_s=5"),
      "error: stage sft: reward.timeout_s=5 must exceed reward.sandbox.wall_seconds + 2 = 12: a batch must fit at "
      "least one run"),
    C("push-offline", "push_to_hub with the Hub offline (train.py's default)",
      ("algorithm=sft", "push_to_hub.repo_id=me/my-model"),
      "error: stage sft: push_to_hub.repo_id=me/my-model: HF_HUB_OFFLINE=1 (train.py's default) forbids the upload, "
      "which would fail after the training: run with HF_HUB_OFFLINE=0, or drop push_to_hub and upload <run>/policy "
      "later (hf upload me/my-model <run>/policy)"),
    C("env-without-tool-task-demos", "teacher episodes (data=episode_demonstrations) with no environment",
      ("algorithm=sft", "data=episode_demonstrations"),
      "error: stage sft: data=episode_demonstrations plays teacher turns against an environment, and env=none has "
      "none: pick one (env=calculator)"),
    C("env-with-ppo", "a multi-turn environment in a PPO stage",
      ("algorithm=ppo", "env=calculator"),
      "error: stage ppo: env=envs.tool_env.ToolEnv with algorithm=ppo: episodes train with the GRPO family (grpo, "
      "dr_grpo, rloo, reinforce_pp) or serve SFT data and held-out evaluation; use env=none for this stage"),
]
