"""Online DPO's reference refresh under FSDP2, as one rank of two (`torchrun --nproc-per-node 2
tests/hardware/ref_refresh.py OUT`): a real Trainer (ModelParallelStrategy), rounds from the regeneration
callback, `algorithm.ref_update_every=1`. At every round start, just after the refresh, each rank's
shards of the reference must equal its shards of the policy; at the end the reference must still hold
the last refresh (a write to a gathered copy instead of the shards would be lost at the next reshard).
Each rank compares its own shards (no collective of the script's own: ranks take uneven shares of a
round) and writes its findings to OUT.<rank>; tests/hardware/test_equivalence.py reads them."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.utils import instantiate  # noqa: E402

from hardware import distributed  # noqa: E402
from hardware.sharding import is_sharded, local_shard  # noqa: E402
from run.stages import build, set_run_fields, trainer_arguments  # noqa: E402
from rewards.base import RewardSource  # noqa: E402
from tests.helpers import char_sum_scores, end_rank_process  # noqa: E402
from tests.trainers.test_online_preferences import SMALL  # noqa: E402

CONF = str(Path(__file__).resolve().parents[2] / "conf")


class CharSum(RewardSource):
    """Varies between any model's samples: most groups give a pair on both ranks."""

    name, version = "char_sum", "test"

    def score(self, prompts, completions, examples):
        return char_sum_scores(prompts, completions, examples)


def shards(model) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {k: local_shard(v).detach().clone() for k, v in model.named_parameters()}


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main(out: str) -> None:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=["algorithm=online_dpo", "data=filtered_rollouts", *SMALL,
                                          "hardware=fsdp", "algorithm.ref_update_every=1",
                                          "data.prompts_per_round=8"])
    set_run_fields(cfg, Path(out).parent, "online_dpo", "g", "n")
    L.seed_everything(0, verbose=False)
    policy, tok = instantiate(cfg.model)
    dm = build(cfg.data, task=instantiate(cfg.task), tokenizer=tok)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    found = {"rounds": [], "sharded": None}
    round_start = module.round_start

    def checked(index):
        round_start(index)
        ref, pol = shards(module.reference), shards(module.policy)
        found["sharded"] = is_sharded(module.reference) and is_sharded(module.policy)
        found["rounds"].append({"index": index, "updates": module.ref_updates, "equal": equal(ref, pol)})
        found["last_policy"] = pol

    module.round_start = checked
    regenerate = build(cfg.callbacks.regenerate, generator=instantiate(cfg.generator), reward=CharSum())
    kwargs = trainer_arguments(cfg.trainer) | dict(
        max_steps=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu", callbacks=[regenerate])
    L.Trainer(**kwargs).fit(module, datamodule=dm)
    last = found.pop("last_policy")
    found["end_reference_is_last_refresh"] = equal(shards(module.reference), last)
    found["end_policy_moved_on"] = not equal(shards(module.policy), last)
    found["numel"] = sum(v.numel() for v in last.values())  # this rank's share of the weights
    torch.save(found, f"{out}.{distributed.rank()}")


if __name__ == "__main__":
    main(*sys.argv[1:])
    distributed.close()  # the process group, then no interpreter finalization (tests/helpers.py)
    end_rank_process()
