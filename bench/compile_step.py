"""`model.compile` measured: the training forward + backward of GRPO's policy pass (models.forward.
sequence_token_logprobs on a right-padded batch, a masked log-prob sum backward) eager against compiled
(models/compiled.py), on the bench's tiny model at the shapes of tiny_grpo (128 rows × 14 tokens) and
grpo_long_prompt (128 × 270), with lengths that vary between calls (the dynamic shapes a round makes).
Prints the compile time (the first calls) and the steady seconds per pass, alternating eager and compiled
call by call. One process, `OMP_NUM_THREADS` as set: on a shared machine say so when quoting it.

    OMP_NUM_THREADS=1 python bench/compile_step.py --repeats 20
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

from models import compiled  # noqa: E402
from models.forward import sequence_token_logprobs  # noqa: E402
from models.tiny import build_tiny  # noqa: E402

SHAPES = {"tiny_grpo": (128, 14), "grpo_long_prompt": (128, 270)}


def batch(rows: int, length: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (rows, length), generator=g)
    lengths = torch.randint(length - 4, length + 1, (rows,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length) < lengths[:, None]).long()
    return ids * mask, mask


def one_pass(model, ids, mask) -> float:
    start = time.perf_counter()
    lp = sequence_token_logprobs(model, ids, mask, 1.0)
    (lp * mask[:, 1:]).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--shapes", default=",".join(SHAPES))
    a = p.parse_args()
    eager, _ = build_tiny(64, 2, 4, 256, 512, 1)
    twin, _ = build_tiny(64, 2, 4, 256, 512, 1)
    compiled.enable(twin)
    vocab = eager.config.vocab_size
    out = {"threads": torch.get_num_threads()}
    for name in a.shapes.split(","):
        rows, length = SHAPES[name]
        start = time.perf_counter()
        for seed, L in enumerate((length, length - 2, length + 2)):  # first shape, then two more lengths
            one_pass(twin, *batch(rows, L, vocab, seed))
        compile_s = time.perf_counter() - start
        times = {"eager": [], "compiled": []}
        for i in range(a.repeats):
            ids, mask = batch(rows, length - (i % 3), vocab, 100 + i)
            times["eager"].append(one_pass(eager, ids, mask))
            times["compiled"].append(one_pass(twin, ids, mask))
        e, c = statistics.median(times["eager"]), statistics.median(times["compiled"])
        out[name] = {"compile_s_first_3_calls": compile_s, "eager_s": e, "compiled_s": c, "speedup": e / c}
        print(f"{name} [{rows} x ~{length}]: compile (3 first calls) {compile_s:.1f} s; eager {e * 1e3:.1f} ms, "
              f"compiled {c * 1e3:.1f} ms a forward+backward: {e / c:.2f}x", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
