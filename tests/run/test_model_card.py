"""The model card (run/model_card.py) of a tiny fake run: its sections, its numbers, its command."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from run.model_card import model_card, write_model_card

OVERRIDES = ["algorithm.beta=0.0", "seed=3", "task.train_path=my prompts.jsonl", "model.lora={r: 8}"]
SUMMARY = {
    "sft": {"val/accuracy_before": 0.0, "val/accuracy_after": 0.638, "train/steps": 3000, "wall_seconds": 106.25,
            "cost/records_used": 1000.0, "cost/mean_reuse": 192.0, "cost/usd": 0.0123,
            "val/curve": [{"step": 0, "generated_tokens": 0, "accuracy": 0.0}]},
    "grpo": {"val/accuracy_before": 0.638, "val/accuracy_after": 0.824, "train/steps": 400, "wall_seconds": 240.5,
             "rollout/reward_mean_first": 0.61, "rollout/reward_mean": 0.83, "rollout/replay_frac_mean": 0.25,
             "cost/generated_tokens": 1070000, "cost/records_generated": 204800, "cost/records_dropped": 12,
             "cost/records_used": 153600.0, "cost/mean_reuse": 1.5, "train/staleness_mean": 0.75,
             "cost/usd": 1.234, "cost/accuracy_gain_per_mtok": 0.17},
}


def stage(algorithm: dict, data: dict, model: dict | None = None) -> OmegaConf:
    return OmegaConf.create({
        "seed": 3, "trainer": {"max_steps": 10},
        "model": model or {"_target_": "models.tiny.build_tiny", "hidden_size": 128, "num_layers": 2,
                           "num_heads": 4, "intermediate_size": 512, "max_position_embeddings": 64,
                           "seed": "${seed}", "dtype": "float32", "lora": None},
        "algorithm": algorithm, "data": data,
        "task": {"_target_": "tasks.arithmetic.arithmetic_task", "digits": 2, "num_heldout": 500},
        "reward": {"_target_": "rewards.verifier.ExactMatchVerifier", "name": "verifier"},
        "correction": {"_target_": "losses.correction.ppo_clip", "clip_low": 0.2, "level": "token"}})


def fake_stages(model: dict | None = None) -> dict:
    sft = stage({"name": "sft", "optimizer": {"_target_": "torch.optim.AdamW", "lr": 3e-3}},
                {"_target_": "data_modules.demonstrations.DemonstrationsDataModule", "source": "teacher",
                 "batch_size": 64, "max_examples": 1000}, model)
    grpo = stage({"name": "grpo", "group_size": 8, "beta": 0.0, "correction": "${correction}",
                  "optimizer": {"_target_": "torch.optim.AdamW", "lr": 3e-4}},
                 {"_target_": "data_modules.replay_mix.ReplayMixDataModule", "prompts_per_round": 64,
                  "batch_size": 128, "replay_ratio": 0.5, "harvest": None}, model)
    return {"sft": sft, "grpo": grpo}


def fake_run(tmp_path: Path, overrides=OVERRIDES, adapter: bool = False, merged: bool = False) -> tuple[Path, Path]:
    run = tmp_path / "outputs" / "2026-12-01" / "12-00-00"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / "run.json").write_text(json.dumps({"wandb_id": "abcd", "resumes": []}))
    policy = run / "policy"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    if adapter:
        (policy / "adapter_config.json").write_text("{}")
        (policy / "README.md").write_text("---\nlibrary_name: peft\n---\nPEFT's own card\n")
    if merged:
        (run / "policy_merged").mkdir()
    return run, policy


def section(card: str, title: str) -> str:
    """The text of `## title` up to the next section."""
    assert f"\n## {title}\n" in card, title
    return card.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def row(text: str, first_cell: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {first_cell} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_card_has_every_section_with_the_runs_numbers(tmp_path):
    run, policy = fake_run(tmp_path)
    path = write_model_card(policy, run, fake_stages(), SUMMARY)
    assert path == policy / "README.md"
    card = path.read_text()

    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta == {"library_name": "transformers", "tags": ["policyshift", "sft", "grpo"]}
    assert "sft → grpo" in card

    base = section(card, "Base model")
    assert "models.tiny.build_tiny" in base and "hidden size 128" in base and "layers 2" in base
    assert "attention heads 4" in base and "intermediate size 512" in base and "init seed 3" in base
    assert "LlamaForCausalLM" in base  # from the saved folder's config.json

    stages = section(card, "Stages")
    sft, grpo = row(stages, "1"), row(stages, "2")
    assert sft[1:3] == ["sft", "sft"] and "lr=0.003" in sft[3] and "DemonstrationsDataModule" in sft[4]
    assert sft[-1] == "3,000"  # train/steps from summary.json, not trainer.max_steps (10)
    assert grpo[1:3] == ["grpo", "grpo"] and "group_size=8" in grpo[3] and "beta=0" in grpo[3]
    assert "correction=ppo_clip(clip_low=0.2, level=token)" in grpo[3]
    assert "ReplayMixDataModule" in grpo[4] and "replay_ratio=0.5" in grpo[4]
    assert "arithmetic_task" in grpo[5] and "ExactMatchVerifier (verifier)" in grpo[6].replace("`", "")

    prov = section(card, "Experience provenance")
    assert row(prov, "sft") == ["sft", "teacher (demonstrations of the task)", "-", "-", "-", "1,000", "192.000", "-", "-"]
    assert row(prov, "grpo") == ["grpo", "policy_rollout (generated by this run's policy) + replayed from the buffer",
                                 "204,800", "12", "-", "153,600", "1.500", "0.250", "0.750"]

    metrics = section(card, "Metrics")
    assert row(metrics, "metric") == ["metric", "sft", "grpo"]
    assert row(metrics, "`val/accuracy_before`") == ["`val/accuracy_before`", "0.000", "0.638"]
    assert row(metrics, "`val/accuracy_after`") == ["`val/accuracy_after`", "0.638", "0.824"]
    assert row(metrics, "`rollout/reward_mean`") == ["`rollout/reward_mean`", "-", "0.830"]
    assert row(metrics, "`cost/generated_tokens`") == ["`cost/generated_tokens`", "-", "1070000"]
    assert row(metrics, "`train/steps`") == ["`train/steps`", "3000", "400"]
    assert row(metrics, "`wall_seconds`") == ["`wall_seconds`", "106.250", "240.500"]
    assert "pref_accuracy" not in metrics  # rows no stage has are left out

    command = section(card, "Reproduce").split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert command == ("python train.py algorithm.beta=0.0 seed=3 'task.train_path=my prompts.jsonl' "
                       "'model.lora={r: 8}'")
    assert shlex.split(command)[2:] == OVERRIDES  # pastes back into a shell as the run's overrides


def test_no_number_is_made_up(tmp_path):
    """Every number in the provenance and metrics sections is one of summary.json's (or a table heading)."""
    run, policy = fake_run(tmp_path)
    empty = {"sft": {"train/steps": 5}, "grpo": {"train/steps": 7}}
    card = model_card(policy, run, fake_stages(), empty)
    prov = section(card, "Experience provenance")
    assert row(prov, "sft")[2:] == ["-"] * 7 and row(prov, "grpo")[2:] == ["-"] * 7
    metrics = section(card, "Metrics")
    assert [ln.split("|")[1].strip() for ln in metrics.splitlines() if ln.startswith("| `")] == ["`train/steps`"]


def test_a_lora_adapter_card_replaces_peft_s_and_points_to_the_merged_model(tmp_path):
    run, policy = fake_run(tmp_path, adapter=True, merged=True)
    lora_model = {"_target_": "models.hf.load_hf", "name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16",
                  "lora": {"r": 8, "lora_alpha": 16, "target_modules": "all-linear", "save_merged": True}}
    stages = fake_stages(lora_model)
    card = write_model_card(policy, run, stages, SUMMARY).read_text()
    assert "PEFT's own card" not in card
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "peft" and meta["base_model"] == "Qwen/Qwen2.5-0.5B"
    assert "LoRA adapter of the final policy" in card and "`policy_merged/`" in card
    base = section(card, "Base model")
    assert "`Qwen/Qwen2.5-0.5B`" in base and "bfloat16" in base
    assert "r=8, lora_alpha=16, target_modules=all-linear, save_merged=True" in base

    merged_dir = run / "policy_merged"
    merged = write_model_card(merged_dir, run, stages, SUMMARY).read_text()
    assert yaml.safe_load(merged.split("---\n")[1])["library_name"] == "transformers"
    assert "merged into the base weights" in merged
    assert section(merged, "Reproduce") == section(card, "Reproduce")


def test_a_local_model_path_is_named_but_not_a_hub_base_model(tmp_path):
    run, policy = fake_run(tmp_path)
    local = tmp_path / "models" / "qwen"
    local.mkdir(parents=True)
    card = model_card(policy, run, fake_stages({"_target_": "models.hf.load_hf", "name_or_path": str(local),
                                                "dtype": "float32", "lora": None}), SUMMARY)
    assert "base_model" not in yaml.safe_load(card.split("---\n")[1])
    assert f"`{local}`" in section(card, "Base model")


def test_resume_changes_are_listed_and_a_run_without_a_record_says_so(tmp_path):
    run, policy = fake_run(tmp_path, overrides=[])
    (run / "run.json").write_text(json.dumps({"resumes": [
        {"started": "t", "overrides": [], "changes": [{"key": "trainer.max_steps", "was": 400, "now": 600}]}]}))
    reproduce = section(model_card(policy, run, fake_stages(), SUMMARY), "Reproduce")
    assert "```bash\npython train.py\n```" in reproduce
    assert "`trainer.max_steps`: 400 → 600" in reproduce

    (run / ".hydra" / "overrides.yaml").unlink()
    assert "not recorded" in section(model_card(policy, run, fake_stages(), SUMMARY), "Reproduce")


def test_real_stage_configs_as_composed_from_conf(hydra_conf, tmp_path):
    """Configs composed from conf/ (interpolations, run fields and all), as train.py passes them."""
    from omegaconf import open_dict

    from tests.helpers import TINY

    stages = {"sft": hydra_conf(TINY + ["experiment=single", "algorithm=sft", "data=demonstrations"]),
              "grpo": hydra_conf(TINY + ["experiment=single", "algorithm=grpo", "data=replay_mix"])}
    run, policy = fake_run(tmp_path, overrides=TINY)
    for name, cfg in stages.items():  # what run/stages.set_run_fields adds (without importing Lightning)
        with open_dict(cfg):
            cfg.run = {"output_dir": str(run), "stage": name, "group": "g", "name": "n", "wandb_id": None}
    card = model_card(policy, run, stages, SUMMARY)
    assert row(section(card, "Stages"), "1")[1:3] == ["sft", "sft"]
    assert "replay_ratio=0.5" in row(section(card, "Stages"), "2")[4]
    assert "hidden size 32" in section(card, "Base model")
    assert row(section(card, "Experience provenance"), "sft")[1] == "teacher (demonstrations of the task)"
    assert row(section(card, "Experience provenance"), "grpo")[1].startswith("policy_rollout")
    assert shlex.split(section(card, "Reproduce").split("```bash\n")[1].split("\n```")[0])[2:] == TINY


@pytest.mark.parametrize("value,shown", [(0.5, "0.500"), (1234.0, "1,234"), (float("nan"), "-"), (None, "-")])
def test_numbers_are_formatted_like_the_summary_table(value, shown):
    from run.model_card import _num
    assert _num(value) == shown
