"""The bad inputs of docs/bad_inputs.md: each case is a command line (with the files it names, written
into DIR), when it is caught, and the exact line the user sees. tests/test_bad_inputs.py runs every case;
the doc's table is generated from this list by tests/bad_inputs_doc.py:

    python -m tests.bad_inputs_doc            # rewrite the table in docs/bad_inputs.md
    python -m tests.bad_inputs_doc --observe  # print what each case shows now (to write a new case)

A message ending in "…" is compared up to there (the rest is a library's own text).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    id: str
    what: str                      # the bad input in words
    argv: tuple[str, ...]          # the command line after `python train.py` (DIR: the case's folder)
    message: str                   # what the user sees on stderr (DIR for the folder)
    setup: Callable[[Path], None] | None = None   # writes the files the command line names
    when: str = "plan"             # command line | plan | load (see docs/bad_inputs.md)
    patches: tuple = ()            # (target, value) for unittest.mock.patch, e.g. no GPU
    needs: Callable[[], str | None] = field(default=lambda: None)  # a reason to skip, or None


# ---------------------------------------------------------------- files the cases name
GOOD = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(30)]


def jsonl(name: str, lines: list[str] | None = None, raw: bytes | None = None, at: int = 2):
    """A setup writing DIR/<name>: GOOD with `lines` inserted at line `at` + 1, or `raw` bytes."""
    def write(folder: Path) -> None:
        data = raw if raw is not None else "".join(
            x + "\n" for x in GOOD[:at] + list(lines or []) + GOOD[at:]).encode()
        (folder / name).write_bytes(data)
    return write


def text(name: str, content: str, encoding: str):
    return jsonl(name, raw=content.encode(encoding))


def model_folder(name: str, edit: Callable[[Path], None] | None = None, tokenizer: bool = True):
    """A setup saving the tests' tiny model (and its tokenizer) into DIR/<name>, then `edit`ing it."""
    def write(folder: Path) -> None:
        from tests.helpers import tiny_model
        model, tok = tiny_model()
        model.save_pretrained(folder / name)
        if tokenizer:
            tok.save_pretrained(folder / name)
        if edit:
            edit(folder / name)
    return write


def drop(*names: str):
    return lambda p: [os.remove(p / n) for n in names]


def truncated_weights(p: Path) -> None:
    """A safetensors file cut short: its header points at 4,000 bytes of tensor data; 1,000 are there."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
    (p / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(1000))


def bigger_tokenizer(p: Path) -> None:
    from models.tokenizer import build_char_tokenizer
    build_char_tokenizer(vocab_size=150).save_pretrained(p)  # the model's embedding has 100 rows


def edit_config(**changes):
    def edit(p: Path) -> None:
        config = json.loads((p / "config.json").read_text())
        (p / "config.json").write_text(json.dumps(config | changes))
    return edit


def sharded_with_a_missing_shard(p: Path) -> None:
    os.rename(p / "model.safetensors", p / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (p / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def adapter_of_a_hub_model(p: Path) -> None:
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        os.remove(p / name)
    (p / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-0.5B"}))


def adapter_on_a_local_base(folder: Path) -> None:
    """DIR/base: the tiny model; DIR/m: an adapter folder naming it as its base (no weights needed to plan)."""
    model_folder("base")(folder)
    (folder / "m").mkdir()
    (folder / "m" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(folder / "base")}))


def write_over(name: str, content: str):
    return lambda p: (p / name).write_text(content)


def no_vllm() -> str | None:
    import importlib.util
    return "vllm is installed here: the refusal cannot happen" if importlib.util.find_spec("vllm") else None


NO_GPU = (("torch.cuda.is_available", lambda: False),)
HF = ("model=hf",)
JSONL = ("task=jsonl", "task.num_heldout=5")
REPLAY = ("algorithm=grpo", "data=replay_mix")

C = Case  # the list reads as a table


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
      "error: data.max_examples=5: data=fresh_rollouts has no `max_examples`, data=demonstrations has: for the "
      "stages whose data has it, write ++data.max_examples=5", when="command line"),
    C("plus-existing", "'+' on a key that exists", ("+algorithm.beta=0.1",),
      "error: +algorithm.beta=0.1: `algorithm.beta` already exists; '+' only adds a new key: write algorithm.beta=0.1 "
      "to change it", when="command line"),
    C("choice-typo", "a misspelled group choice", ("algorithm=grpoo",),
      "error: algorithm=grpoo: there is no algorithm=grpoo (choices: dpo, dr_grpo, grpo, ipo, kto, online_dpo, ppo, "
      "reinforce_pp, rejection_sampling, reward_model, rloo, sft); did you mean algorithm=grpo?", when="command line"),
    C("experiment-typo", "a misspelled experiment", ("experiment=quickstar",),
      "error: experiment=quickstar: there is no experiment=quickstar (choices: grpo_code, instructgpt, onpolicy_vs_replay, "
      "quickstart, rm_vs_gold, sft_then_dpo, sft_then_online_dpo, short_sft_dpo, short_sft_grpo, single); did you mean experiment=quickstart?",
      when="command line"),
    C("sweep-choice-typo", "a misspelled choice in a sweep", ("-m", "correction=ppo_clip,trunc_is"),
      "error: correction=ppo_clip,trunc_is: there is no correction=trunc_is (choices: masked_is, none, ppo_clip, "
      "truncated_is); did you mean correction=truncated_is?", when="command line"),
    C("unparsable", "an override that does not parse", ("algorithm.beta=[0.1",),
      "error: 'algorithm.beta=[0.1' is not a valid override (no viable alternative at input '[0.1'); quote a value "
      "holding spaces or brackets: 'key=\"a b\"'", when="command line"),
    C("delete-missing", "deleting a key that is not there", ("~data.max_exampels",),
      "error: ~data.max_exampels: no `data.max_exampels` in the config to delete; did you mean `data.max_examples`?",
      when="command line"),
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
    C("micro-batch-zero", "a micro-batch of 0", ("data.micro_batch_size=0",),
      "error: stage sft: data.micro_batch_size=0 must be a positive integer (records per forward pass)"),
    C("micro-batch-indivisible", "a micro-batch that does not divide the batch", ("data.micro_batch_size=3",),
      "error: stage sft: data.micro_batch_size=3 must divide data.batch_size=64 (batch_size / micro_batch_size = "
      "gradient-accumulation steps)"),
    C("dtype", "an unknown weight dtype", ("model.dtype=float8",),
      "error: stage sft: model.dtype='float8': choose float32, bfloat16 or float16"),
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
      "error: stage grpo: algorithm=grpo learns from groups of its own samples, but "
      "data=data_modules.demonstrations.DemonstrationsDataModule makes no rollouts: use data=fresh_rollouts"),
    C("uncorrected-replay", "replayed data with no off-policy correction",
      REPLAY + ("correction=none", "data.replay_ratio=0.5"),
      "error: stage grpo: correction=none trains on replayed/harvested data (data.replay_ratio=0.5, data.harvest=None) "
      "as if it were on-policy: choose correction=ppo_clip, truncated_is or masked_is, or set "
      "data.allow_uncorrected=true to accept the bias"),
    C("replay-ratio", "a replay ratio of 1", REPLAY + ("data.replay_ratio=1.0",),
      "error: stage grpo: data.replay_ratio=1.0 must be in [0, 1) (0: pure on-policy)"),
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
    C("no-vllm", "generator=vllm without vllm installed", ("generator=vllm",),
      "error: stage sft: generator=vllm: generator=vllm needs the vllm package, which is not installed in this "
      "environment: install it with `bash scripts/install_vllm.sh…", needs=no_vllm),
    C("heldout-too-many", "holding out more pairs than there are", ("task.num_heldout=20000",),
      "error: task (tasks.arithmetic.arithmetic_task): task.num_heldout=20000 leaves no training pairs "
      "out of 10000"),
    C("moved-target", "a `_target_` path from before the code moved (a saved config)",
      ("generator._target_=models.generation.HFGenerator",),
      "error: stage sft: generator._target_=models.generation.HFGenerator: that path moved to "
      "generators.hf.HFGenerator (set generator._target_=generators.hf.HFGenerator)"),
    C("algorithm-data-mismatch", "an algorithm with a data source that needs another's keys",
      ("algorithm=sft", "data=fresh_rollouts"),
      "error: stage sft: data.group_size=${algorithm.group_size} does not resolve (InterpolationKeyError: "
      "Interpolation key 'algorithm.group_size' not found); algorithm=sft may not fit "
      "data=data_modules.fresh_rollouts.FreshRolloutsDataModule: its own is data=demonstrations…"),
    C("lora-rank-zero", "a LoRA adapter of rank 0", ("algorithm=sft", "model.lora={r: 0}"),
      "error: stage sft: model.lora={'r': 0}: ValueError: `r` should be a positive integer value but the value "
      "passed is 0"),
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
    # ---- data files
    C("file-missing", "a task file that does not exist", JSONL + ("task.train_path=DIR/missing.jsonl",),
      "error: DIR/missing.jsonl: file not found"),
    C("bad-json", "a line that is not JSON", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl:3: not valid JSON (Expecting value)", setup=jsonl("t.jsonl", ['{"prompt": "1+1=", "answer": '])),
    C("not-object", "a line that is not an object", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl:3: expected a JSON object, got list", setup=jsonl("t.jsonl", ['["1+1=", "2"]'])),
    C("missing-field", "a line without a prompt", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl:3: missing or empty string field 'prompt'", setup=jsonl("t.jsonl", ['{"answer": "2"}'])),
    C("empty-file", "a file of blank lines", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl: no examples", setup=jsonl("t.jsonl", raw=b"\n  \n")),
    C("too-few-lines", "fewer lines than task.num_heldout", ("task=jsonl", "task.train_path=DIR/t.jsonl"),
      "error: DIR/t.jsonl: task.num_heldout=50 but only 30 lines", setup=jsonl("t.jsonl")),
    C("latin-1", "a Latin-1 file", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl:3: not UTF-8 (byte 0xe9 at column 16): save the file as UTF-8",
      setup=text("t.jsonl", "\n".join(GOOD[:2] + ['{"prompt": "café=", "answer": "1"}'] + GOOD[2:]) + "\n", "latin-1")),
    C("utf-16", "a UTF-16 file", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl: UTF-16 (or UTF-32) text, not UTF-8: save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)",
      setup=text("t.jsonl", "\n".join(GOOD) + "\n", "utf-16")),
    C("huge-line", "a 2 MB prompt", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: stage sft: DIR/t.jsonl:3: the prompt + answer is 2,000,001 characters (over 1,040 tokens), more than "
      "the model's context of 64 tokens (model.max_position_embeddings)",
      setup=jsonl("t.jsonl", [json.dumps({"prompt": "1" * 2_000_000, "answer": "1"})])),
    C("prompt-too-long", "a prompt longer than the model's context", ("algorithm=grpo",) + JSONL
      + ("task.train_path=DIR/t.jsonl",),
      "error: stage grpo: DIR/t.jsonl:3: the prompt is 63 tokens + generator.max_new_tokens=8, more than the model's "
      "context of 64 tokens (model.max_position_embeddings)",
      setup=jsonl("t.jsonl", [json.dumps({"prompt": "1+" * 30 + "1=", "answer": "31"})])),
    C("answer-too-long", "a demonstration longer than the model's context", ("algorithm=sft",) + JSONL
      + ("task.train_path=DIR/t.jsonl",),
      "error: stage sft: DIR/t.jsonl:3: the prompt + answer is 74 tokens, more than the model's context of 64 tokens "
      "(model.max_position_embeddings)", setup=jsonl("t.jsonl", [json.dumps({"prompt": "1=", "answer": "9" * 70})])),
    C("no-room", "a token budget as large as the context", ("generator.max_new_tokens=64",),
      "error: stage sft: generator.max_new_tokens=64 leaves no room for a prompt in the model's context of 64 tokens "
      "(model.max_position_embeddings)"),
    C("chat-no-template", "task.chat=true with a tokenizer without a chat template",
      JSONL + ("task.train_path=DIR/t.jsonl", "task.chat=true"),
      "error: stage sft: task.chat=true but model=tiny's character tokenizer has no chat template",
      setup=jsonl("t.jsonl")),
    C("code-tests-malformed", "a code task line whose tests are malformed", ("task=code", "task.path=DIR/c.jsonl"),
      "error: DIR/c.jsonl:1: 'tests' must be a non-empty list of {args, expected}",
      setup=jsonl("c.jsonl", raw=(json.dumps({"prompt": "def f(x):", "answer": "  return x", "entry_point": "f",
                                               "tests": []}) + "\n").encode())),
    # ---- model folders
    C("model-missing", "a model folder that does not exist", HF + ("model.name_or_path=DIR/none",),
      "error: stage sft: model.name_or_path='DIR/none': no such local directory (nothing is downloaded)"),
    C("no-tokenizer", "a model folder without tokenizer files", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m: no tokenizer files (tokenizer.json, tokenizer.model or vocab.json + merges.txt; the "
      "folder has config.json, generation_config.json, model.safetensors): save the tokenizer there too "
      "(tokenizer.save_pretrained)", setup=model_folder("m", tokenizer=False)),
    C("config-only", "a model folder with config.json only", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin; the "
      "folder has config.json)", setup=model_folder("m", drop("model.safetensors", "generation_config.json"), False)),
    C("no-config", "a model folder without config.json", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m: no config.json (the folder has generation_config.json, model.safetensors, "
      "tokenizer.json, tokenizer_config.json): not a saved Hugging Face model (model.save_pretrained writes "
      "config.json and the weights)", setup=model_folder("m", drop("config.json"))),
    C("config-not-json", "a config.json that is not JSON", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m/config.json: not valid JSON (Expecting property name enclosed in double quotes)",
      setup=model_folder("m", write_over("config.json", "{oops"))),
    C("truncated-weights", "truncated weights", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m/model.safetensors: truncated (1,075 bytes, its header needs 4,075): copy or save the "
      "model again", setup=model_folder("m", truncated_weights)),
    C("missing-shard", "a sharded model with a shard missing", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m: model.safetensors.index.json names 1 missing shard(s): "
      "model-00002-of-00002.safetensors", setup=model_folder("m", sharded_with_a_missing_shard)),
    C("adapter-hub-base", "a LoRA adapter folder whose base model is not local", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: model.name_or_path='DIR/m': a LoRA adapter whose base model is not a local folder "
      "(DIR/m/adapter_config.json base_model_name_or_path='Qwen/Qwen2.5-0.5B'; nothing is downloaded): copy the "
      "base model to that path, or point model.name_or_path at a merged model (model.lora.save_merged=true writes "
      "policy_merged/) or at the base model", setup=model_folder("m", adapter_of_a_hub_model)),
    C("adapter-continue-with-lora", "a second LoRA adapter on one that continues",
      HF + ("model.name_or_path=DIR/m", "model.lora={r: 4, target_modules: all-linear}"),
      "error: stage sft: model.lora with model.adapter=continue: DIR/m is a LoRA adapter, which this run keeps "
      "training (with its own settings); one adapter trains at a time: drop model.lora, or set model.adapter=merge "
      "(the adapter is merged into the base, then model.lora adds a fresh one)", setup=adapter_on_a_local_base),
    C("adapter-mode", "an unknown model.adapter", HF + ("model.name_or_path=DIR/m", "model.adapter=copy"),
      "error: stage sft: model.adapter='copy': choose one of continue, merge (how a LoRA run's policy/ given as "
      "model.name_or_path is loaded)", setup=model_folder("m")),
    C("vocab-exceeds-embedding", "a tokenizer larger than the embedding", HF + ("model.name_or_path=DIR/m",),
      "error: DIR/m: the tokenizer has 150 tokens but the model's embedding has 100 rows (config.json vocab_size): "
      "ids ≥ 100 index past it; use the tokenizer saved with these weights",
      setup=model_folder("m", bigger_tokenizer)),
    C("tokenizer-broken", "a tokenizer.json that is not JSON", HF + ("model.name_or_path=DIR/m",),
      "error: DIR/m: the tokenizer does not load (…", setup=model_folder("m", write_over("tokenizer.json", "{oops"))),
    C("weights-mismatch", "weights of another shape than config.json says", HF + ("model.name_or_path=DIR/m",),
      "error: DIR/m: the weights do not load (RuntimeError: …", when="load",
      setup=model_folder("m", edit_config(intermediate_size=48))),
]


# ---------------------------------------------------------------- running a case
def observe(case: Case, folder: Path) -> str | None:
    """What `python train.py <case.argv>` prints for this case (DIR for `folder`), or None if it runs.
    Before a load-time case's model node, building a model fails the case (AssertionError)."""
    from unittest import mock

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    from run.command_line import command_line_problem
    from run.errors import format_error, user_error
    from run.stages import plan_stages

    if case.setup:
        case.setup(folder)
    argv = [a.replace("DIR", str(folder)) for a in case.argv]
    patches = [mock.patch(target, value) for target, value in case.patches]
    if case.when != "load":
        patches += [mock.patch("models.tiny.build_tiny", _no_model), mock.patch("models.hf._load_weights", _no_model)]
    for p in patches:
        p.start()
    try:
        GlobalHydra.instance().clear()
        problem = command_line_problem(argv)
        if problem:
            return f"error: {problem}".replace(str(folder), "DIR")
        overrides = [a for a in argv if not a.startswith(("-", "hydra.", "hydra/"))]  # as hc.overrides.task
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            try:
                stages = plan_stages(compose("train", overrides=overrides), overrides)
                if case.when == "load":
                    instantiate(stages[0].cfg.model)
            except Exception as e:  # noqa: BLE001 - the test asserts it is a project error
                err = user_error(e)
                if err is None:
                    raise
                return format_error(err).replace(str(folder), "DIR")
        return None
    finally:
        GlobalHydra.instance().clear()
        for p in reversed(patches):
            p.stop()


def _no_model(*_, **__):
    raise AssertionError("a model was built before the input was refused")


def matches(expected: str, shown: str | None) -> bool:
    if shown is None:
        return False
    return shown.startswith(expected[:-1]) if expected.endswith("…") else shown == expected


