"""`model=hf` through `python train.py` as issue #9 asks: a Qwen2-shaped local folder (random weights,
a tokenizer of the same vocabulary built in code), GRPO in micro-batches, bfloat16 weights, LoRA with
the merged model saved, and the next run chaining from that merged folder; and the BPE chat model
(a turn end that is not the tokenizer's eos) through SFT then GRPO with the chat template."""
from __future__ import annotations

import csv
import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from models.bpe import IM_END
from models.synthetic import write_qwen_like
from tests.helpers import chat_model, force_stop_after
from tests.test_train_e2e import train

SMALL = ["algorithm=grpo", "trainer.max_steps=2", "data.prompts_per_round=4", "data.batch_size=16",
         "data.micro_batch_size=4", "algorithm.group_size=4", "generator.max_new_tokens=6",
         "task.num_heldout=8", "callbacks.evaluate.num_examples=8", "callbacks.progress.refresh_rate=0",
         "logger=none", "reward=function", "reward.fn._target_=tests.helpers.char_sum_scores",
         "algorithm.optimizer.lr=1e-2"]  # a reward that varies even for random weights; big enough steps for bf16


def test_qwen_shaped_grpo_bf16_lora_micro_batches_then_chain_from_the_merged_model(tmp_path):
    model_dir = write_qwen_like(tmp_path / "qwen", vocab_size=1000, hidden_size=64, num_layers=1,
                                num_heads=2, intermediate_size=128)
    out = tmp_path / "run"
    lora = "model.lora={r: 4, lora_alpha: 8, target_modules: all-linear, save_merged: true}"
    proc = train("model=hf", f"model.name_or_path={model_dir}", "model.dtype=bfloat16", lora, *SMALL,
                 f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    assert summary["train/steps"] == 2 and summary["rollout/rounds"] == 2  # optimizer steps, not micro-batches
    assert (out / "policy" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out / "policy_merged", local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    assert merged.config.vocab_size == 1000 and merged.dtype == torch.bfloat16
    changed = [k for k, v in merged.state_dict().items() if not torch.equal(v, base.state_dict()[k].to(v.dtype))]
    assert changed and all("proj" in k for k in changed)  # the LoRA deltas, merged into the linear layers

    chained = tmp_path / "run2"
    proc = train("model=hf", f"model.name_or_path={out / 'policy_merged'}", *SMALL, f"hydra.run.dir={chained}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((chained / "summary.json").read_text())["grpo"]["train/steps"] == 2


def write_sums(path, n: int = 48) -> None:
    """A jsonl task of `a+b=` prompts with their sums."""
    rng = random.Random(0)
    pairs = [(rng.randrange(100), rng.randrange(100)) for _ in range(n)]
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in pairs))


def test_bpe_chat_model_sft_then_grpo_stops_at_the_turn_end(tmp_path):
    """The BPE chat model (models.synthetic, tokenizer="bpe": eos <|endoftext|>, generation config
    eos [<|im_end|>, <|endoftext|>]) through `python train.py`, SFT then GRPO on a jsonl task with
    task.chat=true. Its weights make <|im_end|> follow the generation prompt's final "\\n" with
    probability ≈ ½ (tests.helpers.force_stop_after, b=0.8: e^6.2 ≈ the 499 other tokens' weight), so
    greedy evaluation ends every turn at step 1 and about half the sampled completions do: a generator
    that stopped at the tokenizer's eos only would run to generator.max_new_tokens instead."""
    model_dir, sums = tmp_path / "chat", tmp_path / "sums.jsonl"
    policy, tok = chat_model(model_dir)
    force_stop_after(policy, tok.convert_tokens_to_ids("Ċ"), tok.convert_tokens_to_ids(IM_END), b=0.8)
    policy.save_pretrained(model_dir)
    write_sums(sums)
    out = tmp_path / "run"
    proc = train("model=hf", f"model.name_or_path={model_dir}", "task=jsonl", f"task.train_path={sums}",
                 "task.chat=true", "task.num_heldout=8", "trainer.max_steps=2", "data.prompts_per_round=4",
                 "data.batch_size=16", "algorithm.group_size=4", "generator.max_new_tokens=6",
                 "callbacks.evaluate.num_examples=8", "callbacks.progress.refresh_rate=0", "logger=csv",
                 "reward=function", "reward.fn._target_=tests.helpers.char_sum_scores", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sft"]["train/steps"] == summary["grpo"]["train/steps"] == 2
    assert summary["sft"]["val/response_len_mean"] == summary["grpo"]["val/response_len_mean"] == 1.0
    rounds = [r for r in csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()) if r.get("rollout/eos_frac")]
    assert len(rounds) == 2
    for r in rounds:  # each completion either ended at a stop id or hit the limit, and some ended
        assert 0 < float(r["rollout/eos_frac"]) < 1
        assert float(r["rollout/eos_frac"]) + float(r["rollout/truncated_frac"]) == pytest.approx(1.0)
    saved = AutoModelForCausalLM.from_pretrained(out / "policy", local_files_only=True)
    assert saved.generation_config.eos_token_id == policy.generation_config.eos_token_id  # kept for serving


def test_bpe_chat_model_grpo_with_top_k_top_p_sees_fresh_data_as_on_policy(tmp_path):
    """Issue 19's done-when through `python train.py`: a fresh-data GRPO step with temperature 0.7,
    top_p 0.7 and top_k 20 logs ratio 1 ± 1e-4, ESS ≥ 0.9999 and no clipped token (the trainer used to
    score the full softmax: ratio ≈ 0.7, ESS ≈ 0.5, half the tokens clipped)."""
    model_dir, sums = tmp_path / "chat", tmp_path / "sums.jsonl"
    chat_model(model_dir)
    write_sums(sums)
    out = tmp_path / "run"
    proc = train("algorithm=grpo", "model=hf", f"model.name_or_path={model_dir}", "task=jsonl",
                 f"task.train_path={sums}", "task.chat=true", "task.num_heldout=8", "trainer.max_steps=1",
                 "data.prompts_per_round=4", "data.batch_size=16", "data.micro_batch_size=8",
                 "algorithm.group_size=4", "generator.max_new_tokens=6", "generator.temperature=0.7",
                 "generator.top_p=0.7", "generator.top_k=20", "callbacks.evaluate.num_examples=8",
                 "callbacks.progress.refresh_rate=0", "logger=csv", "reward=function",
                 "reward.fn._target_=tests.helpers.char_sum_scores", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()) if r.get("train/ratio_mean")]
    assert len(steps) == 1
    assert float(steps[0]["train/ratio_mean"]) == pytest.approx(1.0, abs=1e-4)
    assert float(steps[0]["train/ratio_max"]) == pytest.approx(1.0, abs=1e-4)
    assert float(steps[0]["train/ess_frac"]) >= 0.9999 and float(steps[0]["train/clip_frac"]) == 0.0


def test_bpe_chat_model_lora_sft_then_grpo_then_the_next_run_from_policy(tmp_path):
    """The chain a user of the BPE chat model takes: SFT → GRPO with a LoRA adapter in one run, whose
    policy/ (the adapter alone) is the next run's `model.name_or_path` (model.adapter=continue: the same
    adapter keeps training, the original base stays the reference)."""
    model_dir, sums = tmp_path / "chat", tmp_path / "sums.jsonl"
    chat_model(model_dir)
    write_sums(sums)
    common = ("model=hf", "task=jsonl", f"task.train_path={sums}", "task.chat=true", "task.num_heldout=8",
              "callbacks.evaluate.num_examples=8", "callbacks.progress.refresh_rate=0", "logger=none",
              "generator.max_new_tokens=6", "data.prompts_per_round=4", "data.batch_size=16",
              "algorithm.group_size=4", "algorithm.scheduler.num_warmup_steps=0", "algorithm.optimizer.lr=1e-2",
              "reward=function", "reward.fn._target_=tests.helpers.char_sum_scores")  # rewards that vary
    first, second = tmp_path / "run1", tmp_path / "run2"
    proc = train(f"model.name_or_path={model_dir}", *common, "trainer.max_steps=2",
                 "model.lora={r: 4, lora_alpha: 8, target_modules: all-linear}", f"hydra.run.dir={first}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((first / "summary.json").read_text())
    assert summary["sft"]["train/steps"] == summary["grpo"]["train/steps"] == 2
    adapter = json.loads((first / "policy" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(model_dir)
    proc = train("algorithm=grpo", f"model.name_or_path={first / 'policy'}", *common, "trainer.max_steps=1",
                 f"hydra.run.dir={second}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((second / "summary.json").read_text())["grpo"]["train/steps"] == 1
    from safetensors.torch import load_file
    before, after = (load_file(d / "policy" / "adapter_model.safetensors") for d in (first, second))
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
