"""A run killed with SIGKILL at a random point and resumed ends exactly where an uninterrupted run with
the same seed ends: the same summary.json metrics (timings aside) and bit-identical final weights.
GRPO with replay (buffer, replay sampling, off-policy correction), GRPO on data=adaptive (its controller's
posteriors, value EMAs, reuse limit and RNG), DPO (cached reference log-probs) and
online DPO refreshing its reference every 2 rounds, SPIN, and GRPO on multi-turn tool episodes (after a short
SFT stage: the kill lands in the second stage), on CPU with the tiny model and a checkpoint every round.
Slow: three `python train.py` per case.

The kill point is drawn at random (the seed is printed; RESUME_KILL_SEED=<n> replays it): after the
checkpoint of a random round, plus a random delay, so the kill may land mid-round, mid-generation or
mid-save (a save is a temp file renamed into place: never a torn checkpoint)."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from run.checkpointing import resume_checkpoint
from tests.helpers import TINY_MODEL, TOOL_EPISODES
from tests.test_resume import start_train, wait_for
from tests.test_train_e2e import train

COMMON = TINY_MODEL + ["task.num_heldout=20", "callbacks.evaluate.num_examples=20", "logger=none",
                       "callbacks.progress.refresh_rate=0", "generator.max_new_tokens=6",
                       "checkpoint_every_n_rounds=1", "seed=3"]
CASES = {  # name: (overrides, rounds, steps a round or None)
    "grpo_replay": (["algorithm=grpo", "data=replay_mix", "trainer.max_steps=30", "data.prompts_per_round=4",
                     "data.batch_size=16", "reward=function",  # a reward that varies even for a random model
                     "reward.fn._target_=tests.helpers.char_sum_scores"], 15, 2),
    "grpo_adaptive": (["algorithm=grpo", "data=adaptive", "trainer.max_steps=30", "data.prompts_per_round=4",
                       "data.batch_size=16", "reward=function",  # the controller: posteriors, EMAs, limit, RNG
                       "reward.fn._target_=tests.helpers.char_sum_scores"], 15, 2),
    # issue 33's round economy: carried surplus groups and the stored-success bank in the data module's state;
    # rounds of varying size (screens, refills), so their steps vary (None)
    "grpo_economy": (["algorithm=grpo", "trainer.max_steps=16", "data.prompts_per_round=4", "algorithm.group_size=4",
                      "data.batch_size=8", "task.operands_max=6", "reward=function",
                      "reward.fn._target_=tests.helpers.char_sum_scores", "algorithm.pass_threshold=0.7",
                      "algorithm.dynamic_sampling=true", "algorithm.refill=measured", "algorithm.carry_surplus=true",
                      "algorithm.screen.size=2", "algorithm.stored_success.enabled=true"], 8, None),
    "dpo": (["algorithm=dpo", "trainer.max_steps=24", "++data.synthetic.num_pairs=64", "data.batch_size=16"], 6, 4),
    # A round's steps vary with its pairs (None: wait for the round's checkpoint, whatever its step); the
    # reference is refreshed every 2 rounds, so a resume must restore the refreshed reference too.
    "online_dpo_refresh": (["algorithm=online_dpo", "algorithm.ref_update_every=2", "trainer.max_steps=16",
                            "data.prompts_per_round=4", "algorithm.group_size=4", "algorithm.epochs_per_round=1",
                            "data.batch_size=2", "reward=function",
                            "reward.fn._target_=tests.helpers.char_sum_scores"], 8, None),
    # SPIN: the reference refreshed before every round, its pairs (chosen_source) in the buffer, its counters
    "spin": (["algorithm=spin", "trainer.max_steps=16", "data.prompts_per_round=4", "algorithm.group_size=2",
              "algorithm.epochs_per_round=1", "data.batch_size=4"], 8, None),
    # Multi-turn episodes (env=calculator task=tool_arithmetic, tests/helpers.py): GRPO with replay killed
    # mid-stage after a short SFT: the episodes' masks and per-turn provenance in the buffer, the tool totals.
    "grpo_episodes": (TOOL_EPISODES, 16, 2),
}
STAGE = {"grpo_replay": "grpo", "grpo_adaptive": "grpo", "grpo_economy": "grpo", "dpo": "dpo", "online_dpo_refresh": "online_dpo", "spin": "spin",
         "grpo_episodes": "grpo"}
KNOWN: dict[str, set[str]] = {}  # what a resumed stage may still report differently (nothing, now)


def comparable(summary: dict) -> dict:
    return {stage: {k: timeless(v) for k, v in m.items() if "seconds" not in k and not k.startswith("perf/")}
            for stage, m in summary.items()}


def timeless(value):
    """A curve's points without their wall seconds (val/curve: a killed stage's seconds before the kill
    since its last point are lost, as any timing is)."""
    if isinstance(value, list) and value and all(isinstance(p, dict) for p in value):
        return [{k: v for k, v in p.items() if "seconds" not in k} for p in value]
    return value


def stages_done(out: Path) -> list[str]:
    """The stages summary.json holds (it is written after each stage: a two-stage run killed in its second
    stage has the first's)."""
    summary = out / "summary.json"
    return list(json.loads(summary.read_text())) if summary.exists() else []


def weights_digest(out: Path) -> str:
    tensors = load_file(out / "policy" / "model.safetensors")
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode() + tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def round_checkpoint(folder: Path, round_: int, steps: int | None, proc, timeout: float = 120) -> Path:
    """The periodic checkpoint of round `round_` (1-based): its step known, or the first file that appears."""
    if steps is not None:
        return folder / f"epoch={round_ - 1}-step={round_ * steps}.ckpt"
    deadline = time.monotonic() + timeout
    while not (found := sorted(folder.glob(f"epoch={round_ - 1}-step=*.ckpt"))):
        assert proc.poll() is None and time.monotonic() < deadline, f"no checkpoint of round {round_} in {folder}"
        time.sleep(0.02)
    return found[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_killed_run_resumes_bit_identically(tmp_path, case):
    overrides, rounds, steps = CASES[case]
    seed = int(os.environ.get("RESUME_KILL_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    kill_round, delay = rng.randrange(1, rounds - 2), rng.uniform(0.0, 0.3)
    args = [*COMMON, *overrides]
    uninterrupted = tmp_path / "uninterrupted"
    done = train(*args, f"hydra.run.dir={uninterrupted}")
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    proc = start_train(*args, f"hydra.run.dir={killed}")
    stage = STAGE[case]
    wait_for(round_checkpoint(killed / "checkpoints" / stage, kill_round, steps, proc), proc)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and stage not in stages_done(killed)
    ckpt = resume_checkpoint(killed / "checkpoints" / stage)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    start = state["global_step"]
    resumed = train("resume=true", f"hydra.run.dir={killed}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(resuming from {ckpt})" in resumed.stdout

    a = comparable(json.loads((uninterrupted / "summary.json").read_text()))
    b = comparable(json.loads((killed / "summary.json").read_text()))
    differ = sorted(k for k in a[stage].keys() | b[stage].keys() if a[stage].get(k) != b[stage].get(k))
    print(f"\n[{case}] kill seed {seed}: SIGKILL {delay:.2f} s after round {kill_round}'s checkpoint; "
          f"resumed from {ckpt.name} at step {start}"
          f"\n[{case}] {len(a[stage])} metrics compared; differing: "
          + (", ".join(f"{k}: {a[stage].get(k)} vs {b[stage].get(k)}" for k in differ) or "none")
          + f"\n[{case}] weights sha256 {weights_digest(uninterrupted)[:16]} vs {weights_digest(killed)[:16]}")
    assert set(differ) <= KNOWN.get(case, set()), differ
    if case == "grpo_episodes":  # the resumed buffer held episodes with observation turns (a fixed seed: it does)
        rows = [row for group in state["ReplayMixDataModule"]["buffer"]["groups"] for row in group]
        assert any(0 in (row["loss_mask"] or []) for row in rows), "no observation turn in the resumed buffer"
    if case == "grpo_economy":  # the resumed data module held stored successes (a fixed seed: it does)
        assert state["FreshRolloutsDataModule"]["successes"], "no stored success in the resumed state"
    assert weights_digest(killed) == weights_digest(uninterrupted)
