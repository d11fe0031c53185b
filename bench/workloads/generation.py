"""Generation alone: tokens per second of one engine on one model folder, GRPO-shaped (16 prompts × 8
completions), every completion exactly `max_new_tokens` long (eos ignored, so every engine makes the
same number of tokens), temperature 1, no top-k, no top-p.

    python bench/workloads/generation.py --engine seam --model tiny --model-dir DIR --data-dir DIR --out r.json

  seam      generators.hf.HFGenerator.sample (generator=hf: the KV-cached sampling loop), ignore_eos
  generate  transformers' model.generate(do_sample=True, top_k=0, top_p=1, temperature=1,
            max_new_tokens=N, eos_token_id=None): the plain reference
  vllm      generators.vllm.VLLMGenerator.sample (generator=vllm), ignore_eos; needs the vllm venv's
            python (/work/venv-vllm, scripts/install_vllm.sh); its seconds include the per-call weight
            sync the seam does every round; engine start-up is kept out (first call, a warm-up)

One warm-up call, then `repeats` timed calls; tokens/s = generated tokens / seconds of each call.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.workloads.spec import SEED  # noqa: E402

SHAPES = {"tiny": {"prompts": 16, "group": 8, "max_new_tokens": 8, "repeats": 10},
          "big": {"prompts": 16, "group": 8, "max_new_tokens": 64, "repeats": 3}}
QUICK = {"tiny": {"repeats": 2}, "big": {"prompts": 2, "max_new_tokens": 16, "repeats": 1}}


def shape(model: str, quick: bool) -> dict:
    return SHAPES[model] | (QUICK[model] if quick else {})


def run(engine: str, model_name: str, model_dir: Path, data_dir: Path, quick: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    s = shape(model_name, quick)
    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = [json.loads(line) for line in (data_dir / "prompts.jsonl").read_text().splitlines()]
    random.Random(SEED).shuffle(rows)
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in rows[: s["prompts"]] for _ in range(s["group"])]
    n = s["max_new_tokens"]

    if engine == "seam":
        from generators.hf import HFGenerator

        gen = HFGenerator(max_new_tokens=n, temperature=1.0, top_p=1.0, batch_size=512, ignore_eos=True)

        def call():
            return sum(map(len, gen.sample(model, tokenizer, prompts).completions))
    elif engine == "generate":
        from generators.hf import left_pad

        ids, mask = left_pad(prompts, tokenizer.pad_token_id)
        config = GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=n,
                                  eos_token_id=None, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.bos_token_id)

        def call():
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            return int(out[:, ids.shape[1]:].numel())
    elif engine == "vllm":
        from generators.vllm import VLLMGenerator

        gen = VLLMGenerator(max_new_tokens=n, temperature=1.0, top_p=1.0, batch_size=512, ignore_eos=True,
                            kv_cache_memory_bytes=(1 << 30) if model_name == "big" else (1 << 28), seed=SEED)

        def call():
            return sum(map(len, gen.sample(model, tokenizer, prompts).completions))
    else:
        raise ValueError(engine)

    start = time.perf_counter()
    call()  # warm-up (vLLM: the engine's start-up)
    warmup_s = time.perf_counter() - start
    seconds, tokens = [], []
    for _ in range(s["repeats"]):
        start = time.perf_counter()
        tokens.append(call())
        seconds.append(time.perf_counter() - start)
    return {"side": engine, "model": model_name, "shape": s, "seconds": seconds, "tokens": tokens,
            "tokens_per_s": [t / x for t, x in zip(tokens, seconds)], "warmup_s": warmup_s,
            "torch_threads": torch.get_num_threads(), "parameters": sum(p.numel() for p in model.parameters())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", required=True, choices=["seam", "generate", "vllm"])
    p.add_argument("--model", required=True, choices=list(SHAPES))
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a.out.write_text(json.dumps(run(a.engine, a.model, a.model_dir, a.data_dir, a.quick)))


if __name__ == "__main__":
    main()
