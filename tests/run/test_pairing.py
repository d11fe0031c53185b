"""Every algorithm × data pairing is served or refused at plan time (run/validation/pairing.py), in one line
naming both; the pairings that used to fail late (an AttributeError at the first step, a sentence inside a
traceback, a bare StopIteration after the model was built) are refused before anything is built."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from run.errors import ConfigError
from run.stages import plan_stages, run_stage, set_run_fields
from run.validation.config import validate
from run.validation.pairing import DATA_KINDS, TAKES
from tests.helpers import CHAT_MODEL, TINY

CONF = Path(__file__).resolve().parents[2] / "conf"
ALGORITHMS = sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml"))
DATA = sorted(p.stem for p in (CONF / "data").glob("*.yaml"))
NEEDS = {"checkpoint_preferences": ["data.synthetic.checkpoint=/nonexistent"],
         "episode_demonstrations": ["env=calculator", "task=tool_arithmetic"]}


def planned(hydra_conf, algorithm: str, data: str, extra=()):
    overrides = TINY + [f"algorithm={algorithm}", f"data={data}", *NEEDS.get(data, []), *extra]
    return plan_stages(hydra_conf(overrides), overrides)


def validated(hydra_conf, algorithm: str, data: str) -> None:
    """The config checks plan_stages runs first (run/validation/config.py), without the task and tokenizer."""
    cfg = hydra_conf(TINY + [f"algorithm={algorithm}", f"data={data}", *NEEDS.get(data, [])])
    set_run_fields(cfg, Path("/nonexistent/run"), "stage", "group", "name")
    validate(cfg, "stage")


def kinds(hydra_conf, algorithm: str, data: str) -> tuple[str, str]:
    cfg = hydra_conf(TINY + [f"algorithm={algorithm}", f"data={data}", *NEEDS.get(data, [])])
    return TAKES[cfg.algorithm._target_][0], DATA_KINDS[cfg.data._target_]


def test_the_table_names_every_shipped_algorithm_and_data_module(hydra_conf):
    for algorithm in ALGORITHMS:
        assert hydra_conf(TINY + [f"algorithm={algorithm}"]).algorithm._target_ in TAKES, algorithm
    for data in DATA:
        assert hydra_conf(TINY + [f"data={data}", *NEEDS.get(data, [])]).data._target_ in DATA_KINDS, data


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_pairing_is_planned_or_refused_in_one_line(hydra_conf, algorithm):
    """The whole matrix: a pairing whose kinds differ is refused by a line that names the algorithm, the data
    and what to use instead; one whose kinds agree is not refused for its pairing (it may be for a file the
    test does not give, e.g. checkpoint_preferences' checkpoint)."""
    for data in DATA:
        takes, serves = kinds(hydra_conf, algorithm, data)
        try:
            validated(hydra_conf, algorithm, data)
        except ConfigError as e:
            pairing = [p for p in e.problems if p.startswith(f"algorithm={algorithm} ") and " serves " in p]
            if takes == serves:
                assert not pairing, (algorithm, data, e.problems)
            else:
                assert len(pairing) == 1 and "use data=" in pairing[0], (algorithm, data, e.problems)
                assert "\n" not in pairing[0]
            continue
        assert takes == serves, f"algorithm={algorithm} data={data} passed the checks: {takes} from {serves}"


@pytest.mark.parametrize("algorithm,data,says", [
    ("sft", "static_preferences", "algorithm=sft imitates reference completions, and data=static_preferences "
                                  "serves preferences"),
    ("dpo", "demonstrations", "algorithm=dpo learns from chosen/rejected pairs, and data=demonstrations serves "
                              "demonstrations: use data=static_preferences or checkpoint_preferences with it, "
                              "or algorithm=sft on this data"),
    ("grpo", "filtered_rollouts", "use data=fresh_rollouts, replay_mix or adaptive"),
    ("online_dpo", "fresh_rollouts", "use data=filtered_rollouts"),
])
def test_the_pairings_that_failed_late_are_refused_at_plan_time(hydra_conf, algorithm, data, says):
    with pytest.raises(ConfigError) as info:
        planned(hydra_conf, algorithm, data)
    assert says in str(info.value)


def test_episode_demonstrations_whose_teacher_calls_a_tool_the_env_lacks_are_refused(hydra_conf, tmp_path):
    """experiment=tool_use_chat env=chat_python: the task's teacher calls `calculator`, which the python env
    does not offer (it ended in a bare StopIteration once the model was built)."""
    from models.synthetic import write_qwen_like
    model = tmp_path / "chat"
    write_qwen_like(model, seed=0, tokenizer="bpe", **CHAT_MODEL)
    overrides = ["experiment=tool_use_chat", "env=chat_python", f"model.name_or_path={model}"]
    with pytest.raises(ConfigError) as info:
        plan_stages(hydra_conf(overrides), overrides)
    assert ("data=episode_demonstrations: the task's teacher calls calculator, which env.tools does not offer "
            "(it offers python)") in str(info.value)
    plan_stages(hydra_conf(overrides[:1] + overrides[2:]), overrides[:1] + overrides[2:])  # its own env: planned


SERVED = [(a, d) for a in ("sft", "dpo", "kto", "reward_model", "grpo", "rloo", "ppo", "rejection_sampling",
                           "online_dpo", "spin")
          for d in DATA if d not in ("checkpoint_preferences", "conversations", "episode_demonstrations")]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm,data", SERVED, ids=[f"{a}-{d}" for a, d in SERVED])
def test_a_planned_pairing_trains(hydra_conf, tmp_path, algorithm, data):
    """Each pairing the plan accepts runs two optimizer steps (a refused one is skipped: the matrix test
    above pins the refusals)."""
    small = ["trainer.max_steps=2", "data.batch_size=8", "callbacks.evaluate.every_n_steps=0",
             "generator.max_new_tokens=4"]
    try:
        [stage] = planned(hydra_conf, algorithm, data, small + (["data.prompts_per_round=4", "algorithm.group_size=2"]
                                                                if "rollouts" in data or data in ("replay_mix", "adaptive") else []))
    except ConfigError as e:
        if any("serves" in p for p in e.problems):
            return
        raise
    set_run_fields(stage.cfg, tmp_path, stage.name, "test", "test")
    policy, tokenizer = instantiate(stage.cfg.model)
    _, _, metrics = run_stage(stage, policy, tokenizer)
    assert metrics["train/steps"] >= 1
