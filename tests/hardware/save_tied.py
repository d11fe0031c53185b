"""Save a tiny (tied-embedding) policy sharded by FSDP2 over the ranks of `torchrun --nproc-per-node 2
tests/hardware/save_tied.py OUT` through models.lora.save_policy, as train.py saves <run>/policy.
tests/hardware/test_tied_weights.py reads OUT/model.safetensors."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

from hardware.sharding import shard_model  # noqa: E402
from models.lora import save_policy  # noqa: E402
from tests.helpers import end_rank_process, tiny_model  # noqa: E402


def main(out: str) -> None:
    dist.init_process_group("gloo")
    try:
        policy, tokenizer = tiny_model(seed=2)
        shard_model(policy, init_device_mesh("cpu", (dist.get_world_size(),)))
        save_policy(policy, tokenizer, Path(out), save_merged=False)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_rank_process()  # no interpreter finalization (tests/helpers.py)
