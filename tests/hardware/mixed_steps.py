"""Two AdamW steps of GRPO at lr 1e-6 under trainer.precision=bf16-mixed on fixed records, with 1 process
or as one rank of several (`torchrun --nproc-per-node 2 tests/hardware/mixed_steps.py OUT fsdp`). Rank 0
writes to OUT: the fraction of the policy's weights the steps moved, the dtypes of the (sharded) parameters
and of AdamW's state, and the dtype of q_proj's weight as its forward saw it (bfloat16 when FSDP2 gathers
it under its MixedPrecisionPolicy). tests/hardware/test_mixed_precision_ranks.py reads it."""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from hardware.distributed import close  # noqa: E402
from hardware.sharding import full_state_dict, is_sharded  # noqa: E402
from run.stages import build, trainer_arguments  # noqa: E402
from tests.hardware.one_step import CONF, FixedRecords  # noqa: E402
from tests.helpers import TINY, end_rank_process, tiny_model  # noqa: E402
from tests.trainers.test_micro_batches import experience  # noqa: E402


class Probe(L.Callback):
    """The dtypes q_proj's forward computes with, and the optimizer's parameters and state at the end."""

    def on_train_start(self, trainer, pl_module):
        self.weights = set()
        attention = next(m for n, m in pl_module.policy.named_modules() if n.endswith("self_attn"))
        attention.q_proj.register_forward_pre_hook(self.record)

    def record(self, module, args):
        if torch.is_grad_enabled():  # a training forward
            self.weights.add(module.weight.dtype)

    def on_train_end(self, trainer, pl_module):
        opt = trainer.optimizers[0]
        self.params = {p.dtype for group in opt.param_groups for p in group["params"]}
        self.state = {v.dtype for s in opt.state.values() for k, v in s.items() if k != "step"}


def main(out: str, hardware: str) -> None:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=TINY + ["algorithm=grpo", f"hardware={hardware}", "trainer.devices=2",
                                                 "trainer.precision=bf16-mixed", "algorithm.optimizer.lr=1e-6",
                                                 "algorithm.scheduler=null"])
    L.seed_everything(0, verbose=False)
    policy, tok = tiny_model(seed=2)
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    records = experience(16)
    for r in records:  # a reference that differs from the behaviour policy: the KL term is live
        r.ref_logprobs = [lp - 0.1 for lp in r.behaviour_logprobs]
    probe = Probe()
    kwargs = trainer_arguments(cfg.trainer) | dict(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[probe],
        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu")
    if hardware == "cpu":
        kwargs["devices"] = 1
    L.Trainer(**kwargs).fit(module, datamodule=FixedRecords(records, tok))
    state = full_state_dict(module.policy) if is_sharded(module.policy) else module.policy.state_dict()
    if int(os.environ.get("RANK", "0")) == 0:
        moved = sum(int((state[k].float() != v).sum()) for k, v in before.items())
        torch.save({"changed": moved / sum(v.numel() for v in before.values()), "sharded": is_sharded(module.policy),
                    "weights": probe.weights, "params": probe.params, "state": probe.state}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
    close()  # the process group, then no interpreter finalization (tests/helpers.py)
    end_rank_process()
