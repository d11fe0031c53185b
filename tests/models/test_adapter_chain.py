"""A LoRA run's `policy/` (adapter_config.json + adapter weights + tokenizer) as the next run's
`model.name_or_path` (models/adapters.py): `model.adapter=continue` keeps training that adapter from its
weights, with the ORIGINAL base (adapter disabled) as reference; `model.adapter=merge` merges it into the
base (the previous run's policy), which trains whole or under a fresh `model.lora`, and is the reference.
In process on an adapter moved away from zero, then through `python train.py` (a LoRA SFT run, then a
run from its policy/ in each mode, then a run from a merge run's adapter, whose base is an adapter)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from data_modules.experience import ExperienceRecord, Provenance, collate
from models.hf import load_hf
from models.hf_checks import ModelFolderError, check_folder
from models.lora import save_policy
from models.synthetic import write_qwen_like
from run.stages import build
from tests.helpers import TINY
from tests.test_train_e2e import train

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
SIZES = dict(vocab_size=128, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(base folder, adapter folder): a small Qwen2-shaped model and a LoRA policy on it saved as train.py
    saves one, its lora_B drawn at random so that the policy differs from the base."""
    root = tmp_path_factory.mktemp("chain")
    base = write_qwen_like(root / "base", **SIZES)
    policy, tok = load_hf(str(base), "float32", False, False, LORA)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.2)
    save_policy(policy, tok, root / "policy", save_merged=False)
    return base, root / "policy"


def records() -> list[ExperienceRecord]:
    return [ExperienceRecord([1, 5, 6], [9, 10, 11, 12], Provenance("policy_rollout", 0, 0),
                             behaviour_logprobs=[-1.0] * 4)]


def logprobs(module, model) -> torch.Tensor:
    return torch.tensor(module.frozen_logprobs(model, collate(records(), module.tokenizer.pad_token_id))[0])


def reference_logprobs(hydra_conf, policy, tok):
    """(the GRPO module on `policy`, its reference's log-probs of records())."""
    module = build(hydra_conf(TINY + ["algorithm=grpo", "algorithm.beta=0.04"]).algorithm, policy=policy,
                   tokenizer=tok)
    recs = records()
    module.annotate_reference(recs)
    return module, torch.tensor(recs[0].ref_logprobs)


def previous_policy(base, adapter):
    """The previous run's policy as plain transformers + peft load it (no project code)."""
    from peft import PeftModel
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    return PeftModel.from_pretrained(model, str(adapter)).eval()


# ---------------------------------------------------------------- plan-time checks
def test_check_folder_accepts_an_adapter_folder_and_names_a_missing_base(folders, tmp_path):
    base, adapter = folders
    assert check_folder(adapter)["hidden_size"] == 32  # the base's config.json
    moved = tmp_path / "adapter"
    moved.mkdir()
    config = json.loads((adapter / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(ModelFolderError) as e:
        check_folder(moved)
    for part in ("model.name_or_path", str(moved), str(tmp_path / "gone"), "base_model_name_or_path"):
        assert part in str(e.value)


def test_a_bad_mode_and_a_second_adapter_on_continue_are_refused(folders):
    _, adapter = folders
    with pytest.raises(ValueError, match="model.adapter='copy'"):
        load_hf(str(adapter), "float32", False, False, None, "copy")
    with pytest.raises(ValueError, match="one adapter trains at a time"):
        load_hf(str(adapter), "float32", False, False, LORA, "continue")


# ---------------------------------------------------------------- continue
def test_continue_loads_the_adapter_trainable_and_refers_to_the_original_base(folders, hydra_conf):
    base, adapter = folders
    policy, tok = load_hf(str(adapter), "float32", False, False, None, "continue")
    saved = load_file(adapter / "adapter_model.safetensors")
    trainable = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable) and len(trainable) == len(saved)
    from peft import get_peft_model_state_dict
    state = get_peft_model_state_dict(policy)
    assert state.keys() == saved.keys() and all(torch.equal(state[k], saved[k]) for k in saved)  # its weights
    module, ref = reference_logprobs(hydra_conf, policy, tok)
    assert module.reference is None  # no copy: the base with the adapter disabled
    plain_base = AutoModelForCausalLM.from_pretrained(base, local_files_only=True).eval()
    assert torch.allclose(ref, logprobs(module, plain_base), atol=1e-5)  # the ORIGINAL base
    assert not torch.allclose(ref, logprobs(module, previous_policy(base, adapter)), atol=1e-3)
    assert torch.allclose(logprobs(module, policy), logprobs(module, previous_policy(base, adapter)), atol=1e-5)


# ---------------------------------------------------------------- merge
def test_merge_is_the_previous_policy_trained_whole_and_its_reference(folders, hydra_conf):
    base, adapter = folders
    policy, tok = load_hf(str(adapter), "float32", False, False, None, "merge")
    assert not hasattr(policy, "peft_config") and all(p.requires_grad for p in policy.parameters())
    module, ref = reference_logprobs(hydra_conf, policy, tok)
    before = previous_policy(base, adapter)
    assert module.reference is not None  # a frozen copy of the merged model
    assert torch.allclose(ref, logprobs(module, before), atol=1e-5)  # the previous run's policy
    plain_base = AutoModelForCausalLM.from_pretrained(base, local_files_only=True).eval()
    assert not torch.allclose(ref, logprobs(module, plain_base), atol=1e-3)


def test_merge_with_a_fresh_adapter_refers_to_the_previous_policy_and_chains(folders, hydra_conf, tmp_path):
    base, adapter = folders
    policy, tok = load_hf(str(adapter), "float32", False, False, LORA, "merge")
    module, ref = reference_logprobs(hydra_conf, policy, tok)
    assert module.reference is None  # the merged model with the new adapter disabled
    assert torch.allclose(ref, logprobs(module, previous_policy(base, adapter)), atol=1e-5)
    for name, p in policy.named_parameters():  # train the new adapter a little
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    save_policy(policy, tok, tmp_path / "policy", save_merged=False)
    config = json.loads((tmp_path / "policy" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(adapter)  # the merged weights exist only as that chain
    again, _ = load_hf(str(tmp_path / "policy"), "float32", False, False, None, "continue")
    assert torch.allclose(logprobs(module, again.eval()), logprobs(module, policy.eval()), atol=1e-5)


# ---------------------------------------------------------------- through train.py
SFT = ["algorithm=sft", "data.batch_size=8", "algorithm.scheduler.num_warmup_steps=0",
       "algorithm.optimizer.lr=1e-2", "task.num_heldout=4", "callbacks.evaluate.num_examples=4",
       "generator.max_new_tokens=4", "callbacks.progress.refresh_rate=0", "logger=none"]


def run(tmp_path, name: str, model: str, *extra: str) -> dict:
    out = tmp_path / name
    proc = train("model=hf", f"model.name_or_path={model}", *SFT, *extra, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())["sft"]


def lora_weights(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "adapter_model.safetensors")


@pytest.mark.slow
def test_train_py_chains_a_lora_run_in_each_mode(tmp_path):
    """Four short runs (~10 s each): LoRA SFT; continued from its policy/ (same adapter, moved on); merged
    with a fresh adapter; that run's policy/ continued (its base is the first run's adapter folder)."""
    base = write_qwen_like(tmp_path / "base", **SIZES)
    lora = "model.lora={r: 4, target_modules: all-linear}"
    assert run(tmp_path, "run1", base, lora, "trainer.max_steps=3")["train/steps"] == 3
    first = lora_weights(tmp_path / "run1" / "policy")

    assert run(tmp_path, "run2", tmp_path / "run1" / "policy", "trainer.max_steps=2")["train/steps"] == 2
    second = lora_weights(tmp_path / "run2" / "policy")
    assert second.keys() == first.keys()
    assert json.loads((tmp_path / "run2" / "policy" / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == str(base)
    for key in first:
        assert not torch.equal(first[key], second[key])  # it trained…
        if "lora_A" in key:  # …from the first run's A (a fresh adapter would draw a new random A)
            assert (second[key] - first[key]).norm() < 0.5 * first[key].norm()

    run(tmp_path, "run3", tmp_path / "run1" / "policy", "model.adapter=merge", lora, "trainer.max_steps=2")
    assert json.loads((tmp_path / "run3" / "policy" / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == str(tmp_path / "run1" / "policy")
    assert run(tmp_path, "run4", tmp_path / "run3" / "policy", "trainer.max_steps=1")["train/steps"] == 1


@pytest.mark.slow
def test_train_py_merge_without_lora_trains_the_whole_model(tmp_path):
    base = write_qwen_like(tmp_path / "base", **SIZES)
    run(tmp_path, "run1", base, "model.lora={r: 4, target_modules: all-linear}", "trainer.max_steps=2")
    run(tmp_path, "run2", tmp_path / "run1" / "policy", "model.adapter=merge", "trainer.max_steps=2")
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "run2" / "policy", local_files_only=True)
    start = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    changed = [k for k, v in saved.state_dict().items() if not torch.equal(v, start.state_dict()[k])]
    assert any("embed_tokens" in k for k in changed)  # beyond the adapter's linear layers: all of it trained
