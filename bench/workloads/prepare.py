"""What every side reads from disk, written once by the runner in the project's environment:

  <cache>/models/<name>/   a Hugging Face folder (config, weights, tokenizer) of each bench model with
                           random weights: `tiny` is exactly what `model=tiny` builds in code with the
                           bench's sizes and seed 1 (models.tiny.build_tiny); `big` a Llama of the
                           sizes in spec.MODELS with the character tokenizer padded to 32,000 tokens
  <cache>/data/prompts.jsonl        {"prompt", "answer"}: the arithmetic task's training prompts
                                    (conf/task/arithmetic.yaml: 2 digits, 500 held out, split seed 0)
  <cache>/data/prompts_mixed.jsonl  the same prompts, each behind a filler of spaced digits so that the
                                    whole prompt is 16-256 characters (= tokens: the character tokenizer),
                                    uniform and seeded (spec.MIXED_LENGTHS)
  <cache>/data/prompts_prefix<N>.jsonl   the same prompts after an N-character system prompt (spec.system_prompt)
  <cache>/data/pairs_<N>.jsonl      {"prompt", "chosen", "rejected"}: the first N synthetic pairs
                                    policyshift makes itself (data_modules.synthetic_preferences.
                                    arithmetic_pairs, num_pairs=N, seed 1), in its order
  <cache>/data/demos_<N>.jsonl      {"prompt", "completion"}: the first N demonstrations
                                    (data=demonstrations with max_examples=N: the task's exact answers)

So the TRL side and the bare loop train on the same weights and the same examples as policyshift,
without importing it. Folders already written with the same settings are reused.

    python -m bench.workloads.prepare /tmp/policyshift-bench
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.workloads.spec import MIXED_LENGTHS, MODELS, SEED, Workload, system_prompt  # noqa: E402

TASK = {"digits": 2, "num_heldout": 500, "seed": 0}  # conf/task/arithmetic.yaml


def _fresh(folder: Path, settings: dict) -> bool:
    """Whether `folder` already holds what `settings` describe (its bench_settings.json matches)."""
    stamp = folder / "bench_settings.json"
    return stamp.is_file() and json.loads(stamp.read_text()) == settings


def _stamp(folder: Path, settings: dict) -> None:
    (folder / "bench_settings.json").write_text(json.dumps(settings, sort_keys=True))


def write_model(cache: Path, name: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.tiny import build_tiny
    from models.tokenizer import build_char_tokenizer

    spec = MODELS[name]
    out = cache / "models" / name
    if _fresh(out, spec):
        return out
    out.mkdir(parents=True, exist_ok=True)
    if spec["vocab_size"] is None:  # the embedded default, as model=tiny builds it
        model, tokenizer = build_tiny(spec["hidden_size"], spec["num_layers"], spec["num_heads"],
                                      spec["intermediate_size"], spec["max_position_embeddings"], spec["seed"])
    else:
        tokenizer = build_char_tokenizer(spec["vocab_size"])
        config = LlamaConfig(vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"],
                             num_hidden_layers=spec["num_layers"], num_attention_heads=spec["num_heads"],
                             num_key_value_heads=spec["num_heads"], intermediate_size=spec["intermediate_size"],
                             max_position_embeddings=spec["max_position_embeddings"], tie_word_embeddings=True,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec["seed"])
            model = LlamaForCausalLM(config)
    return save_folder(model, tokenizer, out, spec)


def save_folder(model, tokenizer, folder: Path, spec: dict) -> Path:
    """Write `model` and `tokenizer` with save_pretrained (the tokenizer's special ids in the generation
    config) and stamp the folder with the `spec` it was built from, so a later run reuses it."""
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _stamp(folder, spec)
    return folder


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def write_data(cache: Path, workloads: list[Workload]) -> Path:
    from data_modules.synthetic_preferences import arithmetic_pairs
    from models.tokenizer import build_char_tokenizer
    from tasks.arithmetic import arithmetic_task

    out = cache / "data"
    out.mkdir(parents=True, exist_ok=True)
    task = arithmetic_task(**TASK)
    if not (out / "prompts.jsonl").is_file():
        _write_jsonl(out / "prompts.jsonl", [{"prompt": ex.prompt, "answer": ex.answer} for ex in task.train])
    if not (out / "prompts_mixed.jsonl").is_file():
        _write_jsonl(out / "prompts_mixed.jsonl", mixed_prompts(task.train))
    for chars in sorted({w.prompt_prefix for w in workloads if w.prompt_prefix}):
        path = out / f"prompts_prefix{chars}.jsonl"
        if not path.is_file():
            _write_jsonl(path, [{"prompt": system_prompt(chars) + ex.prompt, "answer": ex.answer} for ex in task.train])
    tokenizer = build_char_tokenizer()
    for n in sorted({w.steps * w.batch for w in workloads if w.algorithm == "dpo"}):
        path = out / f"pairs_{n}.jsonl"
        if not path.is_file():
            train, _ = arithmetic_pairs(task, tokenizer, num_pairs=n, seed=SEED)
            _write_jsonl(path, [{"prompt": p.prompt_text, "chosen": p.chosen_text, "rejected": p.rejected_text}
                                for p in train])
    for n in sorted({w.steps * w.batch for w in workloads if w.algorithm == "sft"}):
        path = out / f"demos_{n}.jsonl"
        if not path.is_file():
            _write_jsonl(path, [{"prompt": ex.prompt, "completion": ex.answer} for ex in task.train[:n]])
    return out


def mixed_prompts(examples) -> list[dict]:
    """Each example's prompt behind a filler ("7 3 1 ... | "), the whole prompt a seeded uniform draw of
    MIXED_LENGTHS characters long (at least the question itself); the answer unchanged."""
    import random
    rng, (lo, hi), rows = random.Random(SEED), MIXED_LENGTHS, []
    for ex in examples:
        target = max(rng.randint(lo, hi), len(ex.prompt))
        filler = " ".join(str(rng.randint(0, 9)) for _ in range(hi))
        pad = target - len(ex.prompt)
        prefix = (filler[: max(pad - 3, 0)] + " | ")[-pad:] if pad else ""
        rows.append({"prompt": prefix + ex.prompt, "answer": ex.answer})
    return rows


def prepare(cache: Path, workloads: list[Workload]) -> dict[str, Path]:
    cache.mkdir(parents=True, exist_ok=True)
    models = {name: write_model(cache, name) for name in sorted({w.model for w in workloads})}
    return {"data": write_data(cache, workloads), **{f"model_{k}": v for k, v in models.items()}}


if __name__ == "__main__":
    from bench.workloads.spec import WORKLOADS

    print(prepare(Path(sys.argv[1]), list(WORKLOADS.values())))
