"""One optimizer step of an algorithm on fixed records, with 1 process or as one rank of several
(`torchrun --nproc-per-node 2 tests/hardware/one_step.py OUT HARDWARE ALGORITHM [OVERRIDE ...]`): rank 0 writes the
policy's weights after the step to OUT. tests/hardware/test_equivalence.py compares the runs.

Every rank builds the same records (fixed seed) and the same model; the data module serves each rank
its share of the global batch, as in training (data_modules/base.py)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from data_modules.base import ExperienceDataModule  # noqa: E402
from data_modules.preferences import PreferenceDataModule, PreferenceRecord  # noqa: E402
from hardware.distributed import close  # noqa: E402
from hardware.sharding import full_state_dict, is_sharded  # noqa: E402
from run.stages import build, trainer_arguments  # noqa: E402
from tests.helpers import TINY, end_rank_process, tiny_model  # noqa: E402
from tests.trainers.test_micro_batches import experience  # noqa: E402

CONF = str(Path(__file__).resolve().parents[2] / "conf")
BATCH = 16  # records (pairs for DPO) per optimizer step; 2 ranks take 8 each, in micro-batches of 4


class FixedRecords(ExperienceDataModule):
    def __init__(self, records, tokenizer):
        super().__init__(None, tokenizer, BATCH, 4, seed=0)
        self.records = records

    def epoch_records(self):
        return self.records


class FixedPairs(PreferenceDataModule):
    def __init__(self, records, tokenizer):
        super().__init__(None, tokenizer, BATCH, 4, seed=0)
        self.records = records


def pairs(n: int) -> list[PreferenceRecord]:
    """n preference pairs of different lengths, reference log-probs precomputed (as DPO's data is)."""
    seqs = experience(2 * n, seed=3)
    out = []
    for i in range(n):
        chosen, rejected = seqs[2 * i], seqs[2 * i + 1]
        out.append(PreferenceRecord(chosen.prompt_ids, chosen.completion_ids, rejected.completion_ids,
                                    chosen.provenance, group_id=i, ref_chosen_logp=-5.0 - 0.1 * i,
                                    ref_rejected_logp=-5.5 + 0.05 * i))
    return out


def main(out: str, hardware: str, algorithm: str, *overrides: str) -> None:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=TINY + [f"algorithm={algorithm}", f"hardware={hardware}",
                                                 "algorithm.optimizer._target_=torch.optim.SGD", "algorithm.optimizer.lr=1.0", "trainer.devices=2", "algorithm.scheduler=null", *overrides])
    L.seed_everything(0, verbose=False)
    policy, tok = tiny_model(seed=2)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    records = experience(BATCH)
    for r in records:  # a reference that differs from the behaviour policy: the KL term is live
        r.ref_logprobs = [lp - 0.1 for lp in r.behaviour_logprobs]
    data = FixedPairs(pairs(BATCH), tok) if algorithm == "dpo" else FixedRecords(records, tok)
    kwargs = trainer_arguments(cfg.trainer) | dict(
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu")
    if hardware == "cpu":
        kwargs["devices"] = 1
    L.Trainer(**kwargs).fit(module, datamodule=data)
    state = full_state_dict(module.policy) if is_sharded(module.policy) else module.policy.state_dict()
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
    close()  # the process group, then no interpreter finalization (tests/helpers.py)
    end_rank_process()
