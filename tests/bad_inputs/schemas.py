"""Bad inputs that ran silently, or failed after the model was built (issue 20): caught by the config
schemas (run/validation/schemas/), the dry-built buffer and store, the model-folder probes and the task
file checks."""
from __future__ import annotations

import json
import os
from pathlib import Path

from tests.bad_inputs.case import Case
from tests.bad_inputs.setups import HF, JSONL, REPLAY, edit_config, jsonl, model_folder

C = Case
CODE_EXEC = ("reward=code_exec",)


def no_eos(p: Path) -> None:
    config = json.loads((p / "tokenizer_config.json").read_text())
    (p / "tokenizer_config.json").write_text(json.dumps(config | {"eos_token": None}))


def code_line(entry_point: str):
    return jsonl("c.jsonl", raw=(json.dumps({"prompt": "def f(x):", "answer": "  return x", "entry_point": entry_point,
                                             "tests": [{"args": [1], "expected": 1}]}) + "\n").encode())


def fifo(folder: Path) -> None:
    os.mkfifo(folder / "t.jsonl")


def symlink_loop(folder: Path) -> None:
    os.symlink(folder / "t.jsonl", folder / "t.jsonl")


def a_file(folder: Path) -> None:
    (folder / "f").write_text("not a folder")


CASES: list[Case] = [
    # ---- values the schemas refuse (each ran silently, or failed after the model was built)
    C("num-layers-zero", "a model with no layers", ("model.num_layers=0",),
      "error: stage sft: model.num_layers=0 must be a positive integer"),
    C("hidden-size-negative", "a negative model width", ("model.hidden_size=-128",),
      "error: stage sft: model.hidden_size=-128 must be a positive integer"),
    C("num-heads-zero", "no attention heads", ("model.num_heads=0",),
      "error: stage sft: model.num_heads=0 must be a positive integer"),
    C("heads-indivisible", "a width that does not split over the heads", ("model.num_heads=3",),
      "error: stage sft: model.hidden_size=128 must be a multiple of model.num_heads=3 (each head takes "
      "hidden_size / num_heads dimensions)"),
    C("max-reuse-zero", "replay whose records may be served 0 times (replay off)", REPLAY + ("data.max_reuse=0",),
      "error: stage grpo: data.max_reuse=0 must be a positive integer, or null for no limit (0 would replay nothing)"),
    C("buffer-capacity-negative", "a negative buffer capacity", ("data.buffer_capacity=-1",),
      "error: stage grpo: data.buffer_capacity=-1 must be a positive integer"),
    C("eviction-newest", "an eviction policy that does not exist", REPLAY + ("data.eviction=newest",),
      "error: stage grpo: data.eviction='newest' must be one of oldest, lowest_priority"),
    C("sampling-prioritised", "a sampling policy spelled the British way", REPLAY + ("data.sampling=prioritised",),
      "error: stage grpo: data.sampling='prioritised' must be one of uniform, prioritized"),
    C("spin-chosen-source-rollout", "SPIN's demonstrations labelled as the policy's own samples",
      ("algorithm=spin", "algorithm.chosen_source=policy_rollout"),
      "error: stage spin: algorithm.chosen_source='policy_rollout' must be one of dataset, teacher, human, "
      "external_model (who wrote the demonstrations; policy_rollout is the rejected side's)"),
    C("spin-max-examples-zero", "SPIN's prompts drawn from the first 0 training examples",
      ("algorithm=spin", "data=filtered_rollouts", "data.max_examples=0"),
      "error: stage spin: data.max_examples=0 must be a positive integer, or null for all"),
    C("spin-ref-update-every-zero", "SPIN's reference refreshed every 0 rounds", ("algorithm=spin", "algorithm.ref_update_every=0"),
      "error: stage spin: algorithm.ref_update_every=0 must be a positive integer, or null for never"),
    C("lora-yes", "model.lora given a word", ("model.lora=yes",),
      "error: stage sft: model.lora='yes' must be null (no adapter) or a mapping of peft LoraConfig fields, e.g. "
      "{r: 8, lora_alpha: 16, target_modules: all-linear}"),
    C("precision-banana", "a precision Lightning does not have", ("trainer.precision=banana",),
      "error: stage sft: trainer.precision='banana' must be one of …"),
    C("sandbox-wall-zero", "a sandbox wall-clock limit of 0 (every run times out)", CODE_EXEC
      + ("reward.sandbox.wall_seconds=0",),
      "error: stage sft: reward.sandbox.wall_seconds=0 must be a positive number"),
    C("sandbox-memory-zero", "a sandbox memory limit of 0", CODE_EXEC + ("reward.sandbox.memory_mb=0",),
      "error: stage sft: reward.sandbox.memory_mb=0 must be a positive integer"),
    C("usd-negative", "a negative price per million tokens", ("cost.usd_per_mtok_generated=-1",),
      "error: stage sft: cost.usd_per_mtok_generated=-1 must be a number ≥ 0"),
    C("unknown-key-in-stage", "a misspelled key added in a stage's overrides (an experiment file)",
      ('stages=[{name: a, overrides: ["algorithm=sft", "data=demonstrations", "+model.hidden_sise=16"]}]',),
      "error: stage a: model.hidden_sise: models.tiny.build_tiny has no key `hidden_sise` (its keys: hidden_size, "
      "num_layers, num_heads, intermediate_size, max_position_embeddings, seed, dtype, activation_checkpointing, "
      "packing, compile, lora); did you mean `model.hidden_size`?"),
    C("stage-key-typo", "a misspelled key in a stage of `stages`", ('stages=[{name: a, overides: ["algorithm=sft"]}]',),
      "error: stages[0].overides: stages[0] has no key `overides` (its keys: name, overrides); did you mean "
      "`stages[0].overrides`?"),
    # ---- across keys, dry builds and probes
    C("lora-unknown-field", "a LoRA field peft does not have (refused by building the adapter on the model's "
      "skeleton)", ("algorithm=sft", "model.lora={r: 4, alpha: 16}"),
      "error: stage sft: model.lora={'r': 4, 'alpha': 16}: ValueError: model.lora={'r': 4, 'alpha': 16}: not a peft "
      "LoraConfig (LoraConfig.__init__() got an unexpected keyword argument 'alpha')"),
    C("stages-with-algorithm", "stages=[...] together with algorithm= (the stages were dropped)",
      ("algorithm=grpo", 'stages=[{name: a, overrides: ["algorithm=sft"]}]'),
      'error: stages=[{name: a, overrides: ["algorithm=sft"]}] is not run: algorithm=grpo without experiment= runs '
      "that one algorithm alone; put algorithm=grpo in each stage's overrides, or drop the stages"),
    C("warmup-over-max-steps", "a warmup longer than the stage", ("algorithm=grpo", "trainer.max_steps=5"),
      "warning: stage grpo: algorithm.scheduler.num_warmup_steps=10 is longer than trainer.max_steps=5: the "
      "learning rate never reaches algorithm.optimizer.lr=0.0003 (at most 50% of it); lower the warmup or raise "
      "max_steps", when="plan (warning)"),
    C("bf16-on-cpu", "bf16-mixed on a CPU (right, and slow)", ("algorithm=sft", "trainer.precision=bf16-mixed"),
      "warning: stage sft: trainer.precision=bf16-mixed on a CPU: right, but CPU autocast makes each step several "
      "times slower than 32-true (7× on a 2-core machine); use it to check a GPU config, not for speed",
      when="plan (warning)"),
    C("store-is-a-file", "data.store naming a file", ("data.store=DIR/f",),
      "error: stage grpo: data.store='DIR/f' is a file, not a directory: the store is a folder of Parquet files "
      "(name a new or existing folder)", setup=a_file),
    C("no-eos", "a tokenizer without an eos token", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: the tokenizer of DIR/m has no eos token (DIR/m/tokenizer_config.json: eos_token is unset): "
      "generation would never stop before generator.max_new_tokens and demonstrations would have no end; set "
      "eos_token (the token the model was trained to end with)", setup=model_folder("m", no_eos)),
    C("context-zero", "max_position_embeddings: 0 in a model folder's config.json", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m/config.json: max_position_embeddings=0 must be a positive integer (the model's "
      "context in tokens)", setup=model_folder("m", edit_config(max_position_embeddings=0))),
    C("entry-point-keyword", "a code task whose entry_point is a Python keyword", ("task=code", "task.path=DIR/c.jsonl"),
      "error: DIR/c.jsonl:1: 'entry_point' must name a function; 'class' is a Python keyword, not a function name",
      setup=code_line("class")),
    # ---- task files that are not regular files (were "file not found")
    C("task-fifo", "a FIFO as a task file", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl: a FIFO (named pipe), not a regular file: a task file must be a .jsonl file", setup=fifo),
    C("task-dev-zero", "/dev/zero as a task file", JSONL + ("task.train_path=/dev/zero",),
      "error: /dev/zero: a device, not a regular file: a task file must be a .jsonl file"),
    C("task-symlink-loop", "a symlink loop as a task file", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl: a symlink loop (the link points back at itself): point it at a file", setup=symlink_loop),
]
