"""Issue 35 item 4: could the sampler's prefill reuse the trainer's prompt work? This measures the upper bound:
the seconds of each model pass of one grpo_long_prompt round (16 prompts of a 256-token system prompt + a sum,
8 completions of 8 tokens each, the bench's tiny model at 512 positions): the sampler's shared-prompt prefill
(models.lean_llama.prefill, no gradient), its 8 decode steps, the reference's no-grad forward and the policy's
forward + backward, both with each prompt computed once (models/shared_prefix.py). Whatever reuse is possible
saves at most the prefill's share. Passes alternate, median of `--repeats`; one process, `OMP_NUM_THREADS`
as set: on a shared machine say so when quoting it.

    OMP_NUM_THREADS=1 python bench/prefill_reuse.py --repeats 10
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from models import lean_llama  # noqa: E402
from models.shared_prefix import SharedPrefixInputs, shared_prefix_logprobs  # noqa: E402
from models.tiny import build_tiny  # noqa: E402

PROMPTS, GROUP, PROMPT_LEN, NEW = 16, 8, 263, 8


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()
    model, _ = build_tiny(64, 2, 4, 256, 512, 1)
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, model.config.vocab_size, (PROMPTS, PROMPT_LEN), generator=g)
    prompt_mask = torch.ones_like(prompts)
    rows = torch.arange(PROMPTS).repeat_interleave(GROUP)
    completions = torch.randint(4, model.config.vocab_size, (PROMPTS * GROUP, NEW), generator=g)
    inputs = SharedPrefixInputs(prompts, prompt_mask, rows, torch.full((PROMPTS * GROUP,), PROMPT_LEN),
                                completions, torch.ones_like(completions), PROMPT_LEN + NEW)

    @torch.no_grad()
    def prefill():
        return lean_llama.prefill(decoder, head, prompts, prompt_mask, NEW, rows)

    @torch.no_grad()
    def decode():
        _, state = prefill_state
        for t in range(NEW):
            lean_llama.step(decoder, head, state, completions[:, t: t + 1])

    @torch.no_grad()
    def reference():
        shared_prefix_logprobs(model, inputs, 1.0)

    def train():
        shared_prefix_logprobs(model, inputs, 1.0).sum().backward()
        model.zero_grad(set_to_none=True)

    times = {"prefill": [], "decode": [], "reference": [], "train": []}
    for _ in range(a.repeats + 1):
        times["prefill"].append(timed(prefill))
        prefill_state = prefill()
        times["decode"].append(timed(decode))
        times["reference"].append(timed(reference))
        times["train"].append(timed(train))
    med = {k: statistics.median(v[1:]) for k, v in times.items()}  # the first repeat warms up
    total = sum(med.values())
    for k, v in med.items():
        print(f"{k:10s} {v * 1e3:8.1f} ms  {100 * v / total:5.1f} % of the round's model passes")
    print(json.dumps({"threads": torch.get_num_threads(), "ms": {k: v * 1e3 for k, v in med.items()}}))


if __name__ == "__main__":
    main()
