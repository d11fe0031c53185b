"""budget.generated_tokens and budget.usd end a stage at the end of the round that spends them
(callbacks/budget.py), through train.py; a resumed stage counts what it had spent; bad budgets are
refused at plan time.

Hand arithmetic of the runs below: a round is data.prompts_per_round=4 prompts × algorithm.group_size=8
samples × at most generator.max_new_tokens=6 tokens = at most 192 generated tokens, one optimizer step
(32 records, data.batch_size=32). The tiny random model may emit its stop id early, so each round's real
count is read back from the per-round `cost/generated_tokens` the run logged (metrics.csv): the stage
stops after round k, the first whose cumulative count reaches the budget. 400 tokens can take no fewer
than 3 rounds (2 × 192 = 384 < 400), so the stop is mid-run, well before trainer.max_steps=20.
"""
from __future__ import annotations

import csv
import json
import shutil

import pytest

from tests.test_train_e2e import train

GRPO = ["algorithm=grpo", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=64", "data.prompts_per_round=4", "data.batch_size=32",
        "generator.max_new_tokens=6", "task.num_heldout=20", "callbacks.evaluate.num_examples=20",
        "callbacks.evaluate.every_n_steps=0", "callbacks.progress.refresh_rate=0", "logger=csv"]


def round_totals(out, stage: str = "grpo") -> list[int]:
    """The cumulative cost/generated_tokens logged after each round, in order."""
    rows = list(csv.DictReader((out / "csv" / stage / "metrics.csv").open()))
    return [int(float(r["cost/generated_tokens"])) for r in rows
            if r.get("rollout/round") not in ("", None)]


def first_round_reaching(totals: list[int], budget: float) -> int:
    return next(i + 1 for i, t in enumerate(totals) if t >= budget)


@pytest.mark.parametrize("budget", [["budget.generated_tokens=400"],
                                    ["budget.usd=0.4", "cost.usd_per_mtok_generated=1000",
                                     "cost.usd_per_mtok_trained=0"]], ids=["tokens", "usd"])
def test_a_grpo_stage_ends_at_the_round_that_spends_its_budget(tmp_path, budget):
    """$1000 per generated Mtok and nothing for training: cost/usd = tokens / 1000, so $0.40 is the
    same stop as 400 tokens."""
    out = tmp_path / "run"
    proc = train(*GRPO, "trainer.max_steps=20", *budget, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    totals = round_totals(out)
    k = first_round_reaching(totals, 400)
    assert k >= 3 and len(totals) == k  # no round generated past the budget
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["rollout/rounds"] == k and grpo["train/steps"] == k  # one step a round: the round was trained on
    assert grpo["cost/generated_tokens"] == totals[-1]
    want = (f"budget.generated_tokens ({totals[-1]:,} ≥ 400)" if "tokens" in budget[0]
            else f"budget.usd (${totals[-1] / 1000:,.6g} ≥ $0.4)")
    assert grpo["stop_reason"] == want
    assert f"stage ends on {want}" in proc.stdout
    assert (out / "policy").is_dir() and (out / "checkpoints" / "grpo" / "final.ckpt").is_file()


def test_a_resumed_stage_counts_the_budget_spent_before(tmp_path):
    """Two rounds (T2 tokens) with a checkpoint at each round end, then made to look killed; resumed with
    budget.generated_tokens = T2 + 1 and trainer.max_steps=20, it makes exactly one more round (T2 + round
    3 ≥ T2 + 1). A resume that forgot the spent tokens would need T2 + 1 new tokens: 3 rounds at least."""
    out = tmp_path / "run"
    first = train(*GRPO, "trainer.max_steps=2", "checkpoint_every_n_rounds=1", f"hydra.run.dir={out}")
    assert first.returncode == 0, first.stderr[-3000:]
    spent = json.loads((out / "summary.json").read_text())["grpo"]["cost/generated_tokens"]
    (out / "summary.json").unlink()
    (out / "checkpoints" / "grpo" / "final.ckpt").unlink()
    shutil.rmtree(out / "policy", ignore_errors=True)
    again = train(f"hydra.run.dir={out}", "resume=true", "resume_allow_changes=true", "trainer.max_steps=20",
                  f"budget.generated_tokens={spent + 1}")
    assert again.returncode == 0, again.stderr[-3000:]
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["rollout/rounds"] == 3 and grpo["train/steps"] == 3
    assert grpo["stop_reason"] == f"budget.generated_tokens ({grpo['cost/generated_tokens']:,} ≥ {spent + 1:,})"


@pytest.mark.parametrize("override, message", [
    ("budget.generated_tokens=-5", "budget.generated_tokens=-5 must be a positive integer, or null (off)"),
    ("budget.generated_tokens=0", "budget.generated_tokens=0 must be a positive integer"),
    ("budget.usd=-1.5", "budget.usd=-1.5 must be a positive number, or null (off)"),
])
def test_a_bad_budget_is_refused_at_plan_time(hydra_conf, override, message):
    """Before any model is built: plan_stages validates every stage (run/validation/schemas/top.py)."""
    from run.errors import ConfigError
    from run.stages import plan_stages
    with pytest.raises(ConfigError) as err:
        plan_stages(hydra_conf(["algorithm=grpo", override]), ["algorithm=grpo", override])
    assert message in str(err.value)


def test_the_budget_check_comes_before_regeneration(hydra_conf):
    """StageBudget moves itself before RegenerateExperience, whose round-end hook reads should_stop."""
    from callbacks.budget import StageBudget
    from callbacks.regenerate import RegenerateExperience

    class Trainer:
        callbacks = [RegenerateExperience(None, None), object()]

    budget = StageBudget(generated_tokens=10, usd=None)
    Trainer.callbacks = [*Trainer.callbacks, budget]
    budget.setup(Trainer, None, "fit")
    assert Trainer.callbacks.index(budget) == 0
    Trainer.callbacks[1].totals["generated_tokens"] = 9
    assert budget.spent(Trainer) is None
    Trainer.callbacks[1].totals["generated_tokens"] = 10
    assert budget.spent(Trainer) == "budget.generated_tokens (10 ≥ 10)"


def test_a_budget_with_a_decaying_schedule_is_warned_about(hydra_conf):
    from run.validation.values import budget_warning
    assert budget_warning(hydra_conf(["algorithm=grpo", "budget.generated_tokens=1000"])) is None  # constant
    assert budget_warning(hydra_conf(["algorithm=grpo", "scheduler=linear"])) is None  # no budget
    note = budget_warning(hydra_conf(["algorithm=grpo", "scheduler=linear", "budget.usd=2.5", "trainer.max_steps=50"]))
    assert note.startswith("budget.usd=2.5 with a schedule that decays over trainer.max_steps=50")
    assert budget_warning(hydra_conf(["algorithm=sft", "data=demonstrations", "budget.generated_tokens=9"])) is None
