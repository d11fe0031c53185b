"""A checkpoint's component states are checked before a resume takes them: tampered or corrupt state (NaN
evidence, a cursor far past the prompt stream, replay ids no group ever had, an RNG state of the wrong
size, the data module's state missing) is refused in one line naming the checkpoint file and the key, and
nothing trains. Through `python train.py resume=true` on data=adaptive (buffer, controller, cursor)."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from tests.helpers import TINY
from tests.test_train_e2e import train

ARGS = TINY + ["algorithm=grpo", "data=adaptive", "trainer.max_steps=4", "data.prompts_per_round=4",
               "data.batch_size=16", "generator.max_new_tokens=6", "checkpoint_every_n_rounds=1", "seed=3",
               "reward=function", "reward.fn._target_=tests.helpers.char_sum_scores"]
DM = "AdaptiveDataModule"


def nan_evidence(state):
    evidence = state[DM]["policy"]["evidence"]
    evidence[next(iter(evidence))][0] = math.nan
    return f"{DM}.policy.evidence[{next(iter(evidence))!r}].passes: NaN"


def far_cursor(state):
    state[DM]["cursor"] = 10**15
    return f"{DM}.cursor: 1000000000000000 is out of range"


def unknown_replay_ids(state):
    state[DM]["replay_ids"] = [state[DM]["next_group_id"] + 500]
    return f"{DM}.replay_ids[0]: {state[DM]['next_group_id'] + 500} is out of range"


def short_rng(state):
    state["callbacks"]["ResumeState"]["rng"]["torch"] = torch.zeros(100, dtype=torch.uint8)
    return "callbacks.ResumeState.rng.torch: not a torch RNG state (a torch.uint8 × 100"


def missing_data_state(state):
    del state[DM]
    return f"{DM}: missing: the data module's state"


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A finished run made into one killed after its last checkpoint (its end's files removed)."""
    out = tmp_path_factory.mktemp("state") / "run"
    done = train(*ARGS, f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("summary.json", "checkpoints/grpo/final.ckpt"):
        (out / name).unlink()
    shutil.rmtree(out / "policy")
    return out


@pytest.mark.parametrize("tamper", [nan_evidence, far_cursor, unknown_replay_ids, short_rng, missing_data_state])
def test_a_tampered_component_state_is_refused_naming_the_checkpoint_and_key(stopped_run, tmp_path, tamper):
    out = tmp_path / "run"
    shutil.copytree(stopped_run, out, symlinks=True)
    ckpt = out / "checkpoints" / "grpo" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    expected = tamper(state)
    ckpt.unlink()
    torch.save(state, ckpt)
    resumed = train("resume=true", f"hydra.run.dir={out}")
    assert resumed.returncode == 1, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: resume: {ckpt}: {expected}"), errors
    assert "Traceback" not in resumed.stderr and not (out / "summary.json").exists()
    assert json.loads((out / "run.json").read_text())["resumes"] == []  # no step taken: the resume left no record
