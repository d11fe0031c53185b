"""Learning-nothing guards through the real stage runner: GRPO from an untrained model under the exact
verifier scores 0 everywhere, so every group has zero reward variance, the loss is exactly 0 and the
weights never move: the run must say so, in the console and in the stage's summary (`warnings`)."""
from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from run.stages import plan_stages, run_stage, set_run_fields
from tests.conftest import CONF
from tests.helpers import TINY

OVERRIDES = TINY + ["algorithm=grpo", "data.prompts_per_round=2", "algorithm.group_size=4", "data.batch_size=8",
                    "trainer.max_steps=5", "generator.max_new_tokens=4", "callbacks.guards.patience_rounds=3",
                    "callbacks.guards.patience_steps=4", "callbacks.evaluate.every_n_steps=0"]


def test_untrained_grpo_under_the_exact_verifier_is_flagged(tmp_path, capsys):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        [stage] = plan_stages(compose("train", overrides=OVERRIDES), OVERRIDES)
    GlobalHydra.instance().clear()
    set_run_fields(stage.cfg, tmp_path, stage.name, "group", "name")
    _, _, metrics = run_stage(stage)
    assert metrics["rollout/reward_mean"] == 0.0
    warnings = metrics["warnings"]
    assert any("zero reward variance" in w for w in warnings), warnings
    assert any("loss of exactly 0" in w for w in warnings), warnings
    assert "WARNING [guard]" in capsys.readouterr().out
