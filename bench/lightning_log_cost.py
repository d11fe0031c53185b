"""What Lightning's `self.log` costs per key on this machine (why trainers/step_log.py exists).

    python bench/lightning_log_cost.py 40 tensor     # 40 keys a step through self.log_dict
    python bench/lightning_log_cost.py 40 float
    python bench/lightning_log_cost.py 0 none        # the loop alone

A one-parameter model, 300 steps of batch 1, CSV logger, logging every step; prints the median
milliseconds per step after 50 steps. 2026-12-01, 2-core AMD EPYC, torch 2.13.0 CPU, lightning 2.6.6:
none 0.85 ms, 8 float keys 3.6 ms, 40 tensor keys 13.4 ms, 40 float keys 13.7 ms (the logger off:
13.9 ms: the cost is self.log itself).
"""
import sys
import tempfile
import time

import lightning as L
import torch
from torch.utils.data import DataLoader


class Logs(L.LightningModule):
    def __init__(self, keys: int, mode: str):
        super().__init__()
        self.layer, self.keys, self.mode, self.starts = torch.nn.Linear(2, 1), keys, mode, []

    def training_step(self, batch, batch_idx):
        self.starts.append(time.perf_counter())
        values = {f"train/k{j}": torch.tensor(float(j)) for j in range(self.keys)}
        if self.mode == "tensor":
            self.log_dict(values)
        elif self.mode == "float":
            self.log_dict({k: float(v) for k, v in values.items()})
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.1)


def main() -> None:
    keys, mode = int(sys.argv[1]), sys.argv[2]
    module = Logs(keys, mode)
    trainer = L.Trainer(max_steps=300, logger=L.pytorch.loggers.CSVLogger(tempfile.mkdtemp()), log_every_n_steps=1,
                        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(torch.randn(300, 2), batch_size=1))
    steps = sorted(b - a for a, b in zip(module.starts[50:], module.starts[51:]))
    print(f"{keys} keys, {mode}: {steps[len(steps) // 2] * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
