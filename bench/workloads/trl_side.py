"""TRL's side of a workload: GRPOTrainer / DPOTrainer / SFTTrainer of TRL 1.16 on the same model folder,
the same examples and the same settings as policyshift's side. Run with the bench venv's python
(bench/trl_env.sh); imports nothing of the project but bench/workloads/spec.py (plain data).

    /work/venv-trl/bin/python bench/workloads/trl_side.py --workload tiny_grpo_b0.04 \\
        --model-dir /tmp/policyshift-bench/models/tiny --data-dir /tmp/policyshift-bench/data --out r.json

Every setting that changes the work is set to policyshift's (the list, with reasons, is in
bench/README_speed.md). Timing: a TrainerCallback marks every optimizer step (on_step_end), as
bench/workloads/ps_timer.py does on the policyshift side; GRPO also times `_generate` (prompt
tokenisation + `model.generate`) and `_generate_and_score_completions` (generation + reward +
reference log-probs + advantages) per step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

for key, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                   "WANDB_MODE": "disabled", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}.items():
    os.environ.setdefault(key, value)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.workloads.spec import (CLIP_EPS, DPO_BETA, MAX_GRAD_NORM, OPTIM, SEED,  # noqa: E402
                                  TRL_LOGGING_STEPS, WORKLOADS, Workload, quick)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def exact_match(prompts, completions, answer, **kwargs) -> list[float]:
    """rewards.verifier.ExactMatchVerifier: the completion (stripped, up to its first newline) equals
    the reference answer. `completions` are decoded with skip_special_tokens, as policyshift decodes them."""
    return [1.0 if c.strip().split("\n", 1)[0].strip() == a.strip() else 0.0 for c, a in zip(completions, answer)]


def common_args(w: Workload, out_dir: str) -> dict:
    """TrainingArguments shared by the three trainers: what matches policyshift's run."""
    o = OPTIM[w.algorithm]
    return dict(
        output_dir=out_dir, max_steps=w.steps, seed=SEED, use_cpu=True,
        bf16=False, fp16=False,                  # TRL defaults bf16=True (even on CPU): policyshift is float32
        activation_checkpointing=False,          # TRL defaults it on (its `gradient_checkpointing=True`, which
        gradient_checkpointing=False,            # transformers 5 maps to this): policyshift recomputes nothing
        learning_rate=o["lr"], weight_decay=o["weight_decay"], max_grad_norm=MAX_GRAD_NORM,
        lr_scheduler_type=o["schedule"], warmup_steps=o["warmup_steps"],  # TRL's default: linear decay to 0
        gradient_accumulation_steps=1, per_device_train_batch_size=w.records_per_step,
        logging_steps=TRL_LOGGING_STEPS, report_to="none", save_strategy="no", eval_strategy="no",
        dataloader_num_workers=0, model_init_kwargs={"dtype": "float32"},
    )


class StepTimer:
    """transformers TrainerCallback (built lazily: transformers is imported in main)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Timer(TrainerCallback):
            def __init__(self):
                self.ends, self.begins, self.logs = [], [], []

            def on_step_begin(self, args, state, control, **kwargs):
                self.begins.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kwargs):
                self.ends.append(time.perf_counter())

            def on_log(self, args, state, control, logs=None, **kwargs):
                self.logs.append(dict(logs or {}) | {"step": state.global_step})

        return _Timer()


def timed_method(obj, name: str, sink: list) -> None:
    inner = getattr(obj, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        sink.append(time.perf_counter() - start)
        return out

    setattr(obj, name, wrapper)


def build_grpo(w: Workload, model_dir: Path, data_dir: Path, out_dir: str, tokenizer):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = read_jsonl(data_dir / (f"prompts_prefix{w.prompt_prefix}.jsonl" if w.prompt_prefix else w.prompts))
    config = GRPOConfig(
        **common_args(w, out_dir),
        num_generations=w.group,                 # per_device_train_batch_size counts completions: 16 × 8
        max_completion_length=w.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=w.beta,                             # 0: no reference model loaded (as policyshift)
        epsilon=CLIP_EPS, epsilon_high=CLIP_EPS, importance_sampling_level="token",
        loss_type="dapo",                        # = policyshift's loss_agg_mode=token_mean (one micro-batch)
        scale_rewards="group", num_iterations=1, steps_per_generation=1,
        mask_truncated_completions=False, use_vllm=False, log_completions=False,
        shuffle_dataset=True,
    )
    return GRPOTrainer(model=str(model_dir), reward_funcs=exact_match, args=config,
                       train_dataset=Dataset.from_list(rows), processing_class=tokenizer)


def build_dpo(w: Workload, model_dir: Path, data_dir: Path, out_dir: str, tokenizer):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    rows = read_jsonl(data_dir / f"pairs_{w.steps * w.batch}.jsonl")
    config = DPOConfig(**common_args(w, out_dir), beta=DPO_BETA, loss_type=["sigmoid"], label_smoothing=0.0,
                       precompute_ref_log_probs=w.precompute, precompute_ref_batch_size=w.batch,
                       max_length=None, padding_free=False)
    # an in-memory dataset: its precomputed reference log-probs are cached in a temp dir, never reused
    # by the next run (a load_dataset would cache them under ~/.cache across runs)
    return DPOTrainer(model=str(model_dir), args=config, train_dataset=Dataset.from_list(rows),
                      processing_class=tokenizer)


def build_sft(w: Workload, model_dir: Path, data_dir: Path, out_dir: str, tokenizer):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = read_jsonl(data_dir / f"demos_{w.steps * w.batch}.jsonl")
    config = SFTConfig(**common_args(w, out_dir), completion_only_loss=True, packing=False,
                       padding_free=False, max_length=None)
    return SFTTrainer(model=str(model_dir), args=config, train_dataset=Dataset.from_list(rows),
                      processing_class=tokenizer)


BUILDERS = {"grpo": build_grpo, "dpo": build_dpo, "sft": build_sft}


def run(w: Workload, model_dir: Path, data_dir: Path) -> dict:
    import torch
    from transformers import AutoTokenizer

    scratch = tempfile.TemporaryDirectory()
    os.environ["HF_DATASETS_CACHE"] = str(Path(scratch.name) / "datasets")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    setup_start = time.perf_counter()
    trainer = BUILDERS[w.algorithm](w, model_dir, data_dir, scratch.name, tokenizer)
    setup_s = time.perf_counter() - setup_start  # DPO precomputed: includes the reference pass
    timer = StepTimer()
    trainer.add_callback(timer)
    generate_s, prepare_s = [], []
    if w.algorithm == "grpo":
        timed_method(trainer, "_generate", generate_s)
        timed_method(trainer, "_generate_and_score_completions", prepare_s)
    trainer.train()
    steps = trainer.state.global_step
    if steps != w.steps:
        raise RuntimeError(f"expected {w.steps} optimizer steps, TRL ran {steps}")
    result = {"side": "trl", "ends": timer.ends, "train_step": [e - b for b, e in zip(timer.begins, timer.ends)],
              "optimizer_steps": steps, "setup_s": setup_s,
              "parameters": sum(p.numel() for p in trainer.model.parameters()),
              "torch_threads": torch.get_num_threads(), "reference_model": getattr(trainer, "ref_model", None) is not None}
    if w.algorithm == "grpo":
        lengths = {log["step"]: log["completions/mean_length"] for log in timer.logs if "completions/mean_length" in log}
        result["generated_tokens"] = [lengths.get(k + 1, float("nan")) * w.records_per_step for k in range(steps)]
        result["generation"] = generate_s[:steps]
        result["prepare"] = prepare_s[:steps]  # generation + reward + reference log-probs + advantages
    import trl
    import transformers
    result["checks"] = {"bf16": trainer.args.bf16, "activation_checkpointing": trainer.args.activation_checkpointing,
                        "model_checkpointing": bool(getattr(trainer.model, "is_activation_checkpointing", False)),
                        "model_dtype": str(trainer.model.dtype), "lr_scheduler_type": str(trainer.args.lr_scheduler_type),
                        "per_device_train_batch_size": trainer.args.per_device_train_batch_size,
                        "optim": str(trainer.args.optim), "logging_steps": trainer.args.logging_steps}
    result["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__,
                          "torch": torch.__version__}
    scratch.cleanup()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=list(WORKLOADS))
    p.add_argument("--quick", action="store_true", help="spec.quick(): the plumbing-only shape")
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    w = quick(WORKLOADS[a.workload]) if a.quick else WORKLOADS[a.workload]
    a.out.write_text(json.dumps(run(w, a.model_dir, a.data_dir)))


if __name__ == "__main__":
    main()
