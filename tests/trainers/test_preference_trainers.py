"""DPO, IPO, KTO and the reward model fitted for a few steps with a real Trainer and train.py's wiring:
parameters change, metrics exist, the reference is a frozen copy / cached log-probs / the LoRA base."""
from __future__ import annotations

import functools
import json

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from callbacks.preference_eval import PreferenceEvaluation
from data_modules.preferences import PreferenceRecord, UnpairedRecord
from losses.preference import dpo_loss, ipo_loss
from run.stages import build, set_run_fields
from tests.helpers import TINY

SMALL = TINY + ["data.synthetic.num_pairs=24", "data.batch_size=4", "trainer.max_steps=3",
                "algorithm.scheduler.num_warmup_steps=0", "algorithm.optimizer.lr=1e-2", "task.num_heldout=8"]
PAIR_METRICS = ("train/loss", "train/reward_chosen", "train/reward_rejected", "train/reward_margin",
                "train/reward_acc")


def fit(hydra_conf, tmp_path, algorithm: str, *extra: str):
    cfg = hydra_conf([f"algorithm={algorithm}", "data=static_preferences", *SMALL, *extra])
    set_run_fields(cfg, tmp_path, algorithm, "g", "n")
    L.seed_everything(cfg.seed, verbose=False)
    task = instantiate(cfg.task)
    policy, tok = instantiate(cfg.model)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    dm = build(cfg.data, task=task, tokenizer=tok)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    evaluation = PreferenceEvaluation(every_n_steps=0, batch_size=16)
    trainer = L.Trainer(**cfg.trainer, callbacks=[evaluation], logger=False, enable_progress_bar=False,
                        default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    return dict(module=module, dm=dm, trainer=trainer, before=before, policy=policy, tok=tok,
                evaluation=evaluation, cfg=cfg)


def changed(before: dict, model) -> bool:
    after = model.state_dict()
    return any(not torch.equal(after[k], v) for k, v in before.items() if k in after)


def test_dpo_trains_with_a_frozen_reference_copy(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path, "dpo")
    module, metrics = run["module"], run["trainer"].callback_metrics
    assert changed(run["before"], run["policy"])
    ref = module.reference.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in run["before"].items())  # the copy never moves
    assert not any(p.requires_grad for p in module.reference.parameters())
    for key in PAIR_METRICS + ("train/logps_chosen", "train/nll_chosen"):
        assert key in metrics and torch.isfinite(metrics[key]), key
    assert isinstance(module.loss_fn, functools.partial) and module.loss_fn.func is dpo_loss
    assert module.loss_fn.keywords == {"beta": 0.5, "label_smoothing": 0.0}
    summary = run["evaluation"].summary()
    assert {"val/pref_accuracy_before", "val/pref_accuracy_after", "val/logp_accuracy_after",
            "data/truncated_rows", "data/records"} <= set(summary)
    assert summary["data/records"] == 24.0 and summary["data/heldout_records"] == 8.0
    assert summary["val/pref_accuracy_before"] == 0.5  # π = π_ref: every implicit reward ties
    assert sum(r.provenance.times_used for r in run["dm"].records) == 3 * 4  # steps × pairs per batch


def test_precomputed_reference_matches_the_frozen_copy(hydra_conf, tmp_path):
    """Cached log-probs of the initial policy are the frozen copy's log-probs: same training, no copy."""
    copy = fit(hydra_conf, tmp_path / "a", "dpo")
    cached = fit(hydra_conf, tmp_path / "b", "dpo", "algorithm.precompute_reference=true")
    assert cached["module"].reference is None
    assert all(None not in r.ref_logps for r in cached["dm"].records)
    a, b = copy["policy"].state_dict(), cached["policy"].state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    # and the cached value is the initial policy's sequence log-prob
    record = cached["dm"].records[0]
    from data_modules.preferences import collate_preferences
    lp = copy["module"].batch_logps(copy["module"].reference, collate_preferences([record], 0))
    assert torch.allclose(lp, torch.tensor(record.ref_logps), atol=1e-4)


def test_ipo_is_the_dpo_module_with_another_loss_target(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path, "ipo")
    assert type(run["module"]).__name__ == "DPOModule" and run["module"].loss_fn.func is ipo_loss
    assert changed(run["before"], run["policy"])
    assert all(k in run["trainer"].callback_metrics for k in PAIR_METRICS)


def test_dpo_with_lora_uses_the_base_as_reference(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path, "dpo", "model.lora={r: 4, lora_alpha: 8, target_modules: all-linear}")
    module, policy = run["module"], run["policy"]
    assert module.reference is None  # no copy of the weights
    after = policy.state_dict()
    lora_keys = [k for k in after if "lora_" in k]
    base_keys = [k for k in after if "lora_" not in k]
    assert any(not torch.equal(after[k], run["before"][k]) for k in lora_keys)
    assert all(torch.equal(after[k], run["before"][k]) for k in base_keys)  # only the adapter trained
    from data_modules.preferences import collate_preferences
    batch = collate_preferences(run["dm"].records[:2], run["tok"].pad_token_id)
    with policy.disable_adapter():
        base = module.batch_logps(policy, batch)
    assert torch.allclose(module.reference_forward(batch), base)
    assert not torch.allclose(module.batch_logps(policy, batch), base)


def test_kto_trains_on_unpaired_records(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path, "kto")
    assert all(isinstance(r, UnpairedRecord) for r in run["dm"].records) and len(run["dm"].records) == 48
    assert all(isinstance(r, PreferenceRecord) for r in run["dm"].heldout_pairs)
    assert changed(run["before"], run["policy"])
    metrics = run["trainer"].callback_metrics
    assert "train/kl" in metrics and metrics["train/kl"] >= 0 and "train/loss" in metrics
    assert "val/pref_accuracy_after" in run["evaluation"].summary()


def test_reward_model_trains_a_head_and_saves_a_loadable_model(hydra_conf, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    run = fit(hydra_conf, tmp_path, "reward_model")
    module = run["module"]
    assert not changed(run["before"], run["policy"])  # the policy is not trained here
    assert all(k in run["trainer"].callback_metrics for k in PAIR_METRICS)
    out = tmp_path / "reward_model"
    rm = AutoModelForSequenceClassification.from_pretrained(out, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert rm.config.num_labels == 1
    assert json.loads((out / "rm_metrics.json").read_text())["heldout_pairs"] == 8
    pair = run["dm"].heldout_pairs[0]
    texts = [pair.prompt_text + pair.chosen_text, pair.prompt_text + pair.rejected_text]
    enc = tok(texts, return_tensors="pt", padding=True)
    if tok.padding_side == "left":  # the scorer's convention: right padding
        tok.padding_side = "right"
        enc = tok(texts, return_tensors="pt", padding=True)
    loaded = rm(**enc).logits[:, 0]
    from data_modules.preferences import collate_preferences
    mine = module.scores(collate_preferences([pair], tok.pad_token_id))
    assert torch.allclose(loaded, mine, atol=1e-4)


def test_preference_algorithms_refuse_rollout_data(hydra_conf, tmp_path):
    cfg = hydra_conf(["algorithm=dpo", "data=demonstrations", *TINY])
    set_run_fields(cfg, tmp_path, "dpo", "g", "n")
    policy, tok = instantiate(cfg.model)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    dm = build(cfg.data, task=instantiate(cfg.task), tokenizer=tok)
    with pytest.raises(TypeError, match="data=static_preferences"):
        module.check_data(dm)
