"""train.py's `train()` in process, as a user's command line composes it: the two preference experiments
and a reward model run, each a few steps on the tiny model (seconds each)."""
from __future__ import annotations

import json

from transformers import AutoModelForSequenceClassification

from rewards.base import RewardSource
from tests.helpers import TINY

FEW = TINY + ["trainer.max_steps=4", "generator.max_new_tokens=4"]


class LengthReward(RewardSource):
    """A reward that varies inside a group even for an untrained policy (the verifier gives it all 0)."""

    version = "test"

    def __init__(self, name: str, **_):  # the verifier node's other keys (timeouts...) are not needed
        self.name = name

    def score(self, prompts, completions, examples):
        return [float(len(c) % 3) for c in completions]


def run(hydra_conf, tmp_path, overrides: list[str]) -> dict:
    import train as train_py
    out = tmp_path / "run"
    out.mkdir()
    train_py.train(hydra_conf(overrides), overrides, out, "group", "name")
    assert (out / "config.yaml").is_file() and (out / "policy" / "config.json").is_file()
    return json.loads((out / "summary.json").read_text())


def test_experiment_sft_then_dpo(hydra_conf, tmp_path):
    summary = run(hydra_conf, tmp_path, ["experiment=sft_then_dpo", "++data.synthetic.num_pairs=40",
                                         "++data.batch_size=8", *FEW])
    assert list(summary) == ["sft", "dpo"]
    dpo = summary["dpo"]
    assert dpo["train/steps"] == 4 and 0.0 <= dpo["val/accuracy_after"] <= 1.0
    for key in ("val/pref_accuracy_before", "val/pref_accuracy_after", "val/logp_accuracy_after",
                "train/reward_chosen", "train/reward_rejected", "train/reward_margin", "train/reward_acc",
                "data/truncated_rows", "data/records"):
        assert key in dpo, key
    assert dpo["data/records"] == 40 and "val/pref_accuracy_before" not in summary["sft"]
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "trainers.dpo.DPOModule" in config and "losses.preference.dpo_loss" in config


def test_experiment_sft_then_online_dpo(hydra_conf, tmp_path):
    summary = run(hydra_conf, tmp_path, ["experiment=sft_then_online_dpo", "++data.prompts_per_round=8",
                                         "++data.batch_size=2", "++algorithm.group_size=4",
                                         f"reward._target_={__name__}.LengthReward", *FEW])
    assert list(summary) == ["sft", "online_dpo"]
    online = summary["online_dpo"]
    assert online["train/steps"] == 4 and online["rollout/rounds"] >= 1 and online["cost/generated_tokens"] > 0
    assert "train/reward_acc" in online and "val/accuracy_after" in online


def test_reward_model_alone_saves_a_sequence_classifier(hydra_conf, tmp_path):
    summary = run(hydra_conf, tmp_path, ["algorithm=reward_model", "data=static_preferences",
                                         "data.synthetic.num_pairs=16",
                                         "data.batch_size=4", *FEW])
    assert summary["reward_model"]["val/pref_accuracy_after"] >= 0.0
    rm = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "reward_model")
    assert rm.config.num_labels == 1
    meta = json.loads((tmp_path / "run" / "reward_model" / "reward_model.json").read_text())
    assert meta["template"] == "{prompt}{completion}"
