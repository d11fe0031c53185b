"""algorithm.shared_prefix measured pass by pass: the policy's forward + backward and the reference's no-grad
forward of one GRPO batch (16 prompts × G = 8 completions of 8 tokens), padded rows (models.forward.
sequence_token_logprobs) against each prompt computed once (trainers/shared_prefix.py), alternating call by
call in one process (so a machine's load drifts alike on both), on the bench's tiny model at the shapes of
tiny_grpo (7-token prompts) and grpo_long_prompt (263-token prompts). `OMP_NUM_THREADS` as set: on a shared
machine say so when quoting it.

    OMP_NUM_THREADS=1 python bench/shared_prefix_pass.py --repeats 10
    python bench/shared_prefix_pass.py --gpu          # bench/gpu_speed.sh's block: a ~0.5B Qwen2 (bench/
                                                      # gpu_speed.py's), bf16 autocast, 512- and 16-token
                                                      # prompts, 128 new tokens, on cuda
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from data_modules.experience import ExperienceRecord, Provenance, collate  # noqa: E402
from models.forward import sequence_token_logprobs  # noqa: E402
from models.tiny import build_tiny  # noqa: E402
from trainers import shared_prefix  # noqa: E402

SHAPES = {"tiny_grpo": 7, "grpo_long_prompt": 263}  # prompt tokens
GPU_SHAPES = {"short_prompt": 16, "long_prompt": 512}
PROMPTS, GROUP = 16, 8


def records(prompt_len: int, vocab: int, new: int) -> list[ExperienceRecord]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(PROMPTS):
        prompt = torch.randint(4, vocab, (prompt_len,), generator=g).tolist()
        for _ in range(GROUP):
            n = int(torch.randint(max(2, new // 2), new + 1, (1,), generator=g))
            out.append(ExperienceRecord(prompt, torch.randint(4, vocab, (n,), generator=g).tolist(),
                                        Provenance("policy_rollout", 0), group_id=i))
    return out


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def alternated_medians(passes: dict, repeats: int) -> dict[str, float]:
    """Each pass's median seconds over `repeats` rounds of calling every pass once in turn (so a machine's load
    drifts alike on all), after one round that warms up."""
    times = {k: [] for k in passes}
    for _ in range(repeats + 1):
        for k, fn in passes.items():
            times[k].append(timed(fn))
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_model():
    """bench/gpu_speed.py's ~0.5B Qwen2 (random weights, float32 master weights) on cuda."""
    import transformers

    from bench.gpu_speed import SIZES

    torch.manual_seed(1)
    config = transformers.Qwen2Config(**SIZES["gpu"], tie_word_embeddings=True)
    return transformers.AutoModelForCausalLM.from_config(config).cuda()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--gpu", action="store_true", help="the ~0.5B Qwen2 on cuda, bf16 autocast, 128 new tokens")
    p.add_argument("--json", type=Path, help="write the figures here too")
    a = p.parse_args()
    if a.gpu:
        model, shapes, new = gpu_model(), GPU_SHAPES, 128
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        model, shapes, new = build_tiny(64, 2, 4, 256, 512, 1)[0], SHAPES, 8
        autocast = contextlib.nullcontext()
    device = next(model.parameters()).device
    out = {"threads": torch.get_num_threads(), "device": str(device), "new_tokens": new}
    for name, prompt_len in shapes.items():
        batch = collate(records(prompt_len, model.config.vocab_size, new), 0).to(device)

        def padded():
            with autocast:
                return sequence_token_logprobs(model, batch.input_ids, batch.attention_mask, 1.0)

        def shared():
            with autocast:
                return shared_prefix.sequence_logprobs(model, batch, 1.0, 0, 1.0)

        def train(fn):
            return lambda: ((fn() * batch.completion_mask).sum().backward(), model.zero_grad(set_to_none=True))

        def nograd(fn):
            return lambda: torch.no_grad()(fn)()

        passes = {"train_padded": train(padded), "train_shared": train(shared),
                  "ref_padded": nograd(padded), "ref_shared": nograd(shared)}
        med = alternated_medians(passes, a.repeats)
        out[name] = {"prompt_tokens": prompt_len} | {f"{k}_ms": v * 1e3 for k, v in med.items()}
        print(f"{name}: forward+backward padded {med['train_padded'] * 1e3:.1f} ms, shared "
              f"{med['train_shared'] * 1e3:.1f} ms ({med['train_padded'] / med['train_shared']:.2f}x); no-grad "
              f"forward padded {med['ref_padded'] * 1e3:.1f} ms, shared {med['ref_shared'] * 1e3:.1f} ms "
              f"({med['ref_padded'] / med['ref_shared']:.2f}x)", flush=True)
    print(json.dumps(out))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
