"""Run integrity in the rollout loop: held-out evaluation goes through the reward guard (a verifier that
raises costs accuracy, never the run), and rounds in which every sample is dropped are announced and,
past `callbacks.regenerate.max_dropped_rounds` in a row, stop the run instead of training on stale
data to the end."""
from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from callbacks.evaluate import evaluate
from callbacks.regenerate import DroppedRoundsError
from rewards.base import RewardSource
from run.checkpointing import ResumeState
from tests.data_modules.test_replay_mix import build_parts, stage_cfg
from tests.helpers import tiny_model


class Broken(RewardSource):
    name, version = "broken", "test"

    def score(self, prompts, completions, examples):
        raise RecursionError("a malformed answer broke the verifier")


class GoodThenSilent(RewardSource):
    """Scores the first round, abstains on every sample afterwards."""

    name, version = "flaky", "test"

    def __init__(self):
        self.calls = 0

    def score(self, prompts, completions, examples):
        self.calls += 1
        return [(sum(map(ord, c)) % 10) / 10 if self.calls == 1 else None for c in completions]


def test_evaluation_survives_a_verifier_that_raises(tmp_path):
    stage = stage_cfg(tmp_path)
    policy, tok = tiny_model()
    result = evaluate(policy, tok, stage.task, instantiate(stage.cfg.generator), Broken(), num_examples=5)
    assert result["val/accuracy"] == 0.0 and result["val/unscored"] == 5.0
    assert "RecursionError" in result["first_error"]


def test_rounds_with_every_sample_dropped_stop_the_run_after_the_limit(tmp_path):
    stage = stage_cfg(tmp_path, ["data.replay_ratio=0", "data.max_reuse=null", "data.max_staleness=null",
                                 "algorithm.epochs_per_round=1", "data.batch_size=16"])
    trainer, module, dm, regenerate = build_parts(stage, 10, reward=GoodThenSilent())
    assert regenerate.max_dropped_rounds == 3
    with pytest.raises(RuntimeError, match=r"3 rounds in a row.*max_dropped_rounds=3"):
        trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 3  # round 1, then round 1 served again twice; the third drop stops it


def test_a_stop_on_dropped_rounds_writes_last_ckpt_and_resume_continues_from_it(tmp_path):
    """The stop keeps the work of every round since the last periodic checkpoint: last.ckpt at the step
    it stopped, holding the round end as it was before the failed round (so a resume, here with a reward
    that scores again, makes that round anew and trains on)."""
    stage = stage_cfg(tmp_path, ["data.replay_ratio=0", "data.max_reuse=null", "data.max_staleness=null",
                                 "algorithm.epochs_per_round=1", "data.batch_size=16"])
    last = tmp_path / "last.ckpt"
    trainer, module, dm, regenerate = build_parts(stage, 10, [ResumeState(last)], reward=GoodThenSilent())
    with pytest.raises(DroppedRoundsError, match="3 rounds in a row"):
        trainer.fit(module, datamodule=dm)
    saved = torch.load(last, weights_only=False, map_location="cpu")
    assert saved["global_step"] == 3
    state = next(v for k, v in saved["callbacks"].items() if "RegenerateExperience" in k)
    assert state["dropped_in_a_row"] == 2 and state["last_end_step"] == 2  # the round end before the failed one

    trainer, module, dm, regenerate = build_parts(stage, 5, [ResumeState(last)])  # a reward that scores
    trainer.fit(module, datamodule=dm, ckpt_path=last)
    assert trainer.global_step == 5 and regenerate.dropped_in_a_row == 0
    assert regenerate.rounds == state["rounds"] + 2  # the failed round made again at step 3, then step 4's
