"""model.packing measured pass by pass: the training forward + backward of a batch's log-probs (models.forward.
sequence_token_logprobs, a masked log-prob sum backward) and its no-grad forward (a reference's annotation),
padded rows against packed ones (models/packing.py), alternating call by call in one process (so a machine's
load drifts alike on both). The rows are of mixed lengths, where padding costs most: on the CPU the bench's
tiny model with 512 positions, 128 rows of 24-264 tokens; with --gpu bench/gpu_speed.py's ~0.5B Qwen2 in bf16
autocast, 64 rows of 64-1,024 tokens. Prints the milliseconds of each pass and the packed speed-up; the
positions each side computes are printed too (the saving packing can reach is their ratio).

    OMP_NUM_THREADS=1 python bench/packing_pass.py --repeats 7
    python bench/packing_pass.py --gpu --repeats 5      # bench/gpu_speed.sh's block
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.shared_prefix_pass import alternated_medians, gpu_model  # noqa: E402
from models import packing  # noqa: E402
from models.forward import sequence_token_logprobs  # noqa: E402
from models.tiny import build_tiny  # noqa: E402

CPU_SHAPE = {"rows": 128, "lengths": (24, 264)}
GPU_SHAPE = {"rows": 64, "lengths": (64, 1024)}


def mixed_batch(rows: int, lengths: tuple[int, int], vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids and their mask: `rows` rows of uniformly drawn lengths (seeded)."""
    g = torch.Generator().manual_seed(0)
    n = torch.randint(lengths[0], lengths[1] + 1, (rows,), generator=g)
    width = int(n.max())
    ids = torch.randint(4, vocab, (rows, width), generator=g)
    mask = (torch.arange(width)[None, :] < n[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--gpu", action="store_true", help="the ~0.5B Qwen2 on cuda, bf16 autocast, 64 rows of 64-1,024")
    p.add_argument("--json", type=Path, help="write the figures here too")
    a = p.parse_args()
    if a.gpu:
        model, shape = gpu_model(), GPU_SHAPE
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        model, shape = build_tiny(64, 2, 4, 256, 512, 1)[0], CPU_SHAPE
        autocast = contextlib.nullcontext()
    device = next(model.parameters()).device
    ids, mask = mixed_batch(shape["rows"], shape["lengths"], model.config.vocab_size, device)
    lay = packing.layout(mask.cpu())
    positions = {"padded": mask.numel(), "packed": lay.packs * lay.width if lay is not None else mask.numel()}

    def logprobs(packed: bool):
        packing.enable(model, packed)
        with autocast:
            return sequence_token_logprobs(model, ids, mask, 1.0)

    def train(packed: bool):
        return lambda: ((logprobs(packed) * mask[:, 1:]).sum().backward(), model.zero_grad(set_to_none=True))

    def nograd(packed: bool):
        return lambda: torch.no_grad()(logprobs)(packed)

    passes = {"train_padded": train(False), "train_packed": train(True),
              "ref_padded": nograd(False), "ref_packed": nograd(True)}
    med = alternated_medians(passes, a.repeats)
    out = {"threads": torch.get_num_threads(), "device": str(device), **shape, "positions": positions,
           **{f"{k}_ms": v * 1e3 for k, v in med.items()}}
    print(f"{shape['rows']} rows of {shape['lengths'][0]}-{shape['lengths'][1]} tokens, {positions['padded']:,} padded "
          f"positions, {positions['packed']:,} packed: forward+backward padded {med['train_padded'] * 1e3:.1f} ms, "
          f"packed {med['train_packed'] * 1e3:.1f} ms ({med['train_padded'] / med['train_packed']:.2f}x); no-grad "
          f"forward padded {med['ref_padded'] * 1e3:.1f} ms, packed {med['ref_packed'] * 1e3:.1f} ms "
          f"({med['ref_padded'] / med['ref_packed']:.2f}x)", flush=True)
    print(json.dumps(out))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
