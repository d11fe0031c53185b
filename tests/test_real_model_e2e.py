"""`model=hf` through `python train.py` as issue #9 asks: a Qwen2-shaped local folder (random weights,
a tokenizer of the same vocabulary built in code), GRPO in micro-batches, bfloat16 weights, LoRA with
the merged model saved, and the next run chaining from that merged folder."""
from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from models.synthetic import write_qwen_like
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
