"""trainer.max_epochs on a static-data stage (run/epochs.py): N passes over its training records, the
stage's trainer.max_steps set from them at plan time, so the schedule decays to 0 at its last step;
rollout stages keep an epoch = a round. Step counts worked by hand in each docstring."""
from __future__ import annotations

import json

import lightning as L
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from run.errors import ConfigError
from run.stages import plan_stages, run_stage, set_run_fields
from tests.conftest import CONF
from tests.helpers import TINY

# task.digits=1: 100 sums, 10 held out, 90 to train on
SMALL = TINY + ["task.digits=1", "task.num_heldout=10", "callbacks.evaluate.every_n_steps=0",
                "+callbacks.lr_probe={_target_: tests.run.test_epochs.LrProbe}"]


class LrProbe(L.Callback):
    """Records, after every optimizer step, the learning rate the next step would take."""
    seen: list = []

    def __init__(self):
        LrProbe.seen = self.lrs = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_end(self, trainer, pl_module) -> None:
        self.lrs.append(("epochs", trainer.current_epoch, "steps", trainer.global_step))


def pairs_file(tmp_path, n: int) -> str:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)}) + "\n"
                            for i in range(n)))
    return str(path)


def plan(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return plan_stages(compose("train", overrides=overrides), overrides)


def test_steps_per_epoch():
    """ceil(records / batch) with the last batch short; ranks first cut the records to their multiple."""
    from run.epochs import steps_per_epoch
    assert [steps_per_epoch(50, 16), steps_per_epoch(48, 16), steps_per_epoch(51, 16, world=2)] == [4, 3, 4]


def test_sft_runs_its_epochs_and_the_cosine_reaches_zero_at_the_last_step(tmp_path):
    """50 demonstrations at batch 16 = batches of 16, 16, 16, 2: 4 steps an epoch, × 3 epochs = 12 steps.
    Cosine with 2 warmup steps over 12: after step k ≥ 2 the lr is lr·½(1 + cos(π(k−2)/10)): ½·lr after
    step 7, 0 after step 12."""
    [stage] = plan(SMALL + ["algorithm=sft", "data=demonstrations", "data.max_examples=50", "data.batch_size=16", "trainer.max_epochs=3",
                            "algorithm.scheduler.num_warmup_steps=2"])
    assert (stage.cfg.trainer.max_steps, stage.cfg.algorithm.scheduler.num_training_steps) == (12, 12)
    set_run_fields(stage.cfg, tmp_path, stage.name, "group", "name")
    _, _, metrics = run_stage(stage)
    lrs = LrProbe.seen
    assert metrics["train/steps"] == 12 and lrs[-1] == ("epochs", 3, "steps", 12)
    assert lrs[6] == pytest.approx(0.5 * 1e-3) and lrs[11] == pytest.approx(0.0, abs=1e-12)


def test_dpo_epochs_over_a_file_with_held_out_rows(tmp_path):
    """45 pairs, the last 5 held out: 40 at batch 16 = 16, 16, 8: 3 steps an epoch, × 2 = 6 steps; the linear
    schedule (no warmup) ends at 0. No `++`: trainer.max_epochs is every stage's key."""
    overrides = SMALL + ["algorithm=dpo", "data=static_preferences", f"data.path={pairs_file(tmp_path, 45)}",
                         "data.num_heldout=5", "data.batch_size=16", "trainer.max_epochs=2", "scheduler=linear",
                         "algorithm.scheduler.num_warmup_steps=0", "callbacks.preference_eval.every_n_steps=0"]
    [stage] = plan(overrides)
    assert stage.cfg.trainer.max_steps == 6
    set_run_fields(stage.cfg, tmp_path / "run", stage.name, "group", "name")
    run_stage(stage)
    assert LrProbe.seen[-1] == ("epochs", 2, "steps", 6)
    assert LrProbe.seen[:6] == pytest.approx([1e-4 * (6 - k) / 6 for k in range(1, 7)])


def test_kto_counts_two_records_a_pair(tmp_path):
    """40 training pairs → 80 unpaired records at batch 16: 5 steps an epoch."""
    [stage] = plan(TINY + ["algorithm=kto", "data=static_preferences", f"data.path={pairs_file(tmp_path, 45)}",
                           "data.num_heldout=5", "data.batch_size=16", "trainer.max_epochs=1"])
    assert stage.cfg.trainer.max_steps == 5


def test_synthetic_pairs_are_counted_too():
    """The arithmetic task's 90 training sums → 90 synthetic pairs at batch 32: 3 steps an epoch, × 2 = 6."""
    [stage] = plan(TINY + ["task.digits=1", "task.num_heldout=10", "algorithm=reward_model",
                           "data=static_preferences", "trainer.max_epochs=2"])
    assert stage.cfg.trainer.max_steps == 6


def test_which_limit_wins():
    """Epochs replace a config's step count (the quickstart's sft: 2,000); a command-line max_steps alone turns
    the epochs off; both on the command line: the first limit reached. 1,500 demonstrations at 64: 24 an epoch
    (the last batch short)."""
    sft, grpo = plan(TINY + ["++trainer.max_epochs=2"])
    assert (sft.cfg.trainer.max_steps, grpo.cfg.trainer.max_steps, grpo.cfg.trainer.max_epochs) == (48, 600, 2)
    [sft] = plan(TINY + ["algorithm=sft", "data=demonstrations", "data.max_examples=1000", "trainer.max_steps=7", "recipe.epochs.sft=3"])
    assert (sft.cfg.trainer.max_steps, sft.cfg.trainer.max_epochs) == (7, -1)
    [sft] = plan(TINY + ["algorithm=sft", "data=demonstrations", "data.max_examples=1000", "trainer.max_steps=20", "trainer.max_epochs=3"])
    assert sft.cfg.trainer.max_steps == 20


def test_epochs_over_pairs_not_known_before_the_stage_are_refused():
    with pytest.raises(ConfigError, match="does not know its training records before the stage runs"):
        plan(TINY + ["algorithm=dpo", "data=checkpoint_preferences", "data.synthetic.checkpoint=/nowhere",
                     "trainer.max_epochs=1"])
