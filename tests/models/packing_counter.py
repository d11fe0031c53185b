"""A callback for tests/models/test_packing_e2e.py: counts, in a train.py run, the forwards that went
through packs (models.packing.packed_token_logprobs returning a result) and those that fell back, and
writes the counts as JSON when training ends."""
from __future__ import annotations

import json
from pathlib import Path

import lightning as L

from models import packing


class PackedCounter(L.Callback):
    def __init__(self, out: str):
        self.out, self.counts = Path(out), {"packed": 0, "fallback": 0}

    def setup(self, trainer, pl_module, stage: str) -> None:
        inner, counts = packing.packed_token_logprobs, self.counts

        def counted(*args, **kwargs):
            out = inner(*args, **kwargs)
            counts["packed" if out is not None else "fallback"] += 1
            return out

        packing.packed_token_logprobs = counted  # models/forward.py calls it through the module

    def on_train_end(self, trainer, pl_module) -> None:
        self.out.write_text(json.dumps(self.counts))
