"""Old `_target_` paths (before run/, generators/, tasks/, hardware/) are refused with the new one."""
from __future__ import annotations

import importlib
import importlib.util

from omegaconf import OmegaConf

from run.validation.moved import MOVED, check_moved_targets, moved_target


def test_every_new_path_imports_and_no_old_one_does():
    for old, new in MOVED.items():
        importlib.import_module(new)
        assert importlib.util.find_spec(old) is None, old


def test_old_paths_map_to_new_ones_and_others_are_left_alone():
    assert moved_target("models.generation.HFGenerator") == "generators.hf.HFGenerator"
    assert moved_target("data_modules.tasks.arithmetic.arithmetic_task") == "tasks.arithmetic.arithmetic_task"
    assert moved_target("trainers.run_record.RefuseUsedSweepDir") == "run.run_record.RefuseUsedSweepDir"
    assert moved_target("models.generation_extra.X") is None  # a prefix of a name is not the module
    assert moved_target("trainers.grpo.GRPOModule") is None and moved_target("generators.hf.HFGenerator") is None


def test_every_old_target_in_a_config_is_named_with_its_key_unresolved():
    cfg = OmegaConf.create({
        "generator": {"_target_": "models.generation.HFGenerator", "batch_size": "${oc.env:NOT_SET}"},
        "reward": {"_target_": "rewards.weighted.WeightedReward",
                   "sources": [{"_target_": "rewards.verifier.ExactMatchVerifier"},
                               {"_target_": "data_modules.tasks.code.code_task"}]},
        "judge": "${generator}", "missing": "???"})
    errors: list[str] = []
    check_moved_targets(cfg, errors)
    assert errors == [
        "generator._target_=models.generation.HFGenerator: that path moved to generators.hf.HFGenerator "
        "(set generator._target_=generators.hf.HFGenerator)",
        "reward.sources.1._target_=data_modules.tasks.code.code_task: that path moved to tasks.code.code_task "
        "(set reward.sources.1._target_=tasks.code.code_task)"]
