"""SPIN (algorithm=spin): a hand-made round's pairs (chosen = the demonstration, rejected = the sample,
identical samples skipped and counted, provenance versions), the loss on a hand-made pair against DPO's
formula computed by hand, and a fit through the regenerate callback (rounds, refreshes, per-round margins)."""
from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from data_modules.experience import ExperienceRecord, Provenance
from data_modules.preferences import PreferenceRecord, collate_preferences
from run.stages import build, set_run_fields
from tests.helpers import TINY, tiny_model
from trainers.spin import SPINModule, demonstration_pairs

EOS = 2
SMALL = TINY + ["data=filtered_rollouts", "data.prompts_per_round=4", "algorithm.group_size=2", "data.batch_size=4",
                "generator.max_new_tokens=4", "algorithm.scheduler.num_warmup_steps=0", "algorithm.epochs_per_round=1"]


def sample(gid: int, answer: str, completion: list[int], text: str, version: int) -> ExperienceRecord:
    prov = Provenance("policy_rollout", created_step=version, policy_version=version, generator="hf",
                      sampling={"temperature": 1.0}, reward_source="verifier", reward_version="1")
    return ExperienceRecord([1, 5 + gid], completion, prov, group_id=gid, prompt_text=f"p{gid}",
                            completion_text=text, answer=answer, reward=float(text == answer))


def demo_ids(text: str) -> list[int]:
    """A hand-made tokenizer: one id per character ('a' = 10), then eos."""
    return [10 + ord(c) - ord("a") for c in text] + [EOS]


ROUND = [sample(0, "ab", [10, 11, EOS], "ab", 7),   # the demonstration's very ids: skipped
         sample(0, "ab", [10, 12, EOS], "ac", 7),   # a wrong answer: a pair
         sample(1, "cd", [30, EOS], "cd", 9),       # the same text in other ids, finished: skipped
         sample(1, "cd", [12, 13], "cd", 9),        # the right text cut at the token limit (no eos): a pair
         sample(2, "e", [15, 15, EOS], "ff", 9)]    # a pair


def test_demonstration_pairs_by_hand():
    pairs, identical = demonstration_pairs(ROUND, demo_ids, {EOS}, "dataset")
    assert identical == 2
    assert [(p.group_id, p.chosen_ids, p.rejected_ids) for p in pairs] == [
        (0, [10, 11, EOS], [10, 12, EOS]), (1, [12, 13, EOS], [12, 13]), (2, [14, EOS], [15, 15, EOS])]
    assert [(p.chosen_text, p.rejected_text, p.rejected_reward, p.chosen_reward) for p in pairs] == [
        ("ab", "ac", 0.0, None), ("cd", "cd", 1.0, None), ("e", "ff", 0.0, None)]
    assert [p.prompt_ids for p in pairs] == [[1, 5], [1, 6], [1, 7]]
    # provenance: the pair's (and its rejected side's) is the sample's, with the policy version that sampled
    # it; the chosen side is the dataset's, no policy version
    assert [p.provenance.policy_version for p in pairs] == [7, 9, 9]
    assert all(p.provenance.source == "policy_rollout" and p.provenance is not ROUND[1].provenance for p in pairs)
    chosen, rejected = pairs[0].sequences()
    assert (chosen.provenance.source, chosen.provenance.policy_version, chosen.provenance.generator) == (
        "dataset", None, None)
    assert (rejected.provenance.source, rejected.provenance.policy_version) == ("policy_rollout", 7)
    assert chosen.completion_ids == [10, 11, EOS] and rejected.completion_ids == [10, 12, EOS]
    batch = collate_preferences(pairs, pad_id=0)  # chosen rows first: -1 = no policy version
    assert batch.sequences.policy_versions.tolist() == [-1, -1, -1, 7, 9, 9]


def test_a_sample_without_a_reference_answer_is_refused():
    bad = sample(0, "", [10, EOS], "a", 1)
    try:
        demonstration_pairs([bad], demo_ids, {EOS}, "dataset")
    except ValueError as e:
        assert "no reference answer" in str(e) and "'p0'" in str(e)
    else:
        raise AssertionError("accepted a sample with no demonstration")


def module_and_tokenizer(hydra_conf, *overrides: str) -> tuple[SPINModule, object]:
    cfg = hydra_conf(["algorithm=spin", *SMALL, *overrides])
    policy, tok = tiny_model()
    return build(cfg.algorithm, policy=policy, tokenizer=tok), tok


def test_annotate_pairs_a_real_round_and_reports_it(hydra_conf):
    module, tok = module_and_tokenizer(hydra_conf)
    answer = "46"
    right = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    wrong = tok("47", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    prompt = tok("12+34=")["input_ids"]
    records = [ExperienceRecord(prompt, ids, Provenance("policy_rollout", 3, policy_version=3), group_id=0,
                                prompt_text="12+34=", completion_text=text, answer=answer)
               for ids, text in ((right, "46"), (wrong, "47"), (wrong, "47"))]
    pairs = module.annotate(records)
    assert len(pairs) == 2 and all(p.chosen_ids == right and p.rejected_ids == wrong for p in pairs)
    assert all(None not in p.ref_logps for p in pairs)  # cached as the round is made
    assert module.last_round_stats == {"pairs": 2.0, "identical": 1.0, "identical_frac": 1 / 3,
                                       "identical_total": 1.0, "ref_updates": 0.0}
    assert pairs[0].chosen_provenance().source == "dataset"
    module.annotate(records[:1])  # a round whose only sample is right: no pair, the stage's total grows
    assert module.last_round_stats["pairs"] == 0.0 and module.last_round_stats["identical_total"] == 2.0


def sequence_logp_by_hand(model, prompt: list[int], completion: list[int]) -> float:
    """Σ over the completion's tokens of log softmax(logits at the previous position)[token]."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = F.log_softmax(model(ids).logits[0].float(), dim=-1)
    return sum(float(logp[len(prompt) + i - 1, tok]) for i, tok in enumerate(completion))


def test_loss_on_a_hand_made_pair_is_dpo_by_hand(hydra_conf):
    """L = -log σ(β h), h = [log π(y_w) - log π_ref(y_w)] - [log π(y_l) - log π_ref(y_l)], y_w = the
    demonstration, y_l = the sample; with π moved off π_ref so h ≠ 0; after a refresh π_ref = π: L = log 2."""
    module, tok = module_and_tokenizer(hydra_conf, "algorithm.beta=0.7")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    module.policy.eval()
    prompt = tok("12+34=")["input_ids"]
    chosen = tok("46", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rejected = tok("4", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    pair = PreferenceRecord(prompt, chosen, rejected, Provenance("policy_rollout", 0, policy_version=0),
                            chosen_source="dataset")
    lc, lr = (sequence_logp_by_hand(module.policy, prompt, c) for c in (chosen, rejected))
    rc, rr = (sequence_logp_by_hand(module.reference, prompt, c) for c in (chosen, rejected))
    h = (lc - rc) - (lr - rr)
    expected = math.log1p(math.exp(-0.7 * h))
    assert abs(h) > 1e-3
    batch = collate_preferences([pair], tok.pad_token_id)
    loss, metrics = module.micro_loss(batch)
    assert math.isclose(loss.item(), expected, rel_tol=1e-4), (loss.item(), expected)
    assert math.isclose(metrics["reward_margin"].item(), 0.7 * h, rel_tol=1e-4, abs_tol=1e-6)
    assert math.isclose(metrics["reward_chosen"].item(), 0.7 * (lc - rc), rel_tol=1e-4, abs_tol=1e-6)
    module.round_start(1)  # K = 1: the reference becomes the policy before round 1
    assert module.ref_updates == 1
    loss, metrics = module.micro_loss(batch)
    assert math.isclose(loss.item(), math.log(2), rel_tol=1e-5) and metrics["reward_margin"].item() == 0.0


def test_spin_fits_on_its_rounds(hydra_conf, tmp_path):
    cfg = hydra_conf(["algorithm=spin", *SMALL])
    set_run_fields(cfg, tmp_path, "spin", "g", "n")
    L.seed_everything(cfg.seed, verbose=False)
    policy, tok = instantiate(cfg.model)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    dm = build(cfg.data, task=instantiate(cfg.task), tokenizer=tok)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    regenerate = build(cfg.callbacks.regenerate, generator=instantiate(cfg.generator), reward=instantiate(cfg.reward))
    rounds, put = [], dm.put
    dm.put = lambda records: (rounds.append((module.global_step, list(records))), put(records))
    trainer = L.Trainer(**(dict(cfg.trainer) | {"max_steps": 6}), callbacks=[regenerate], logger=False,
                        enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    assert any(not torch.equal(policy.state_dict()[k], v) for k, v in before.items())
    assert regenerate.rounds >= 3 and module.ref_updates == regenerate.rounds - 1  # K = 1: before every round but the first
    for step, pairs in rounds:
        assert pairs and all(isinstance(p, PreferenceRecord) for p in pairs)
        assert {p.provenance.policy_version for p in pairs} == {step}  # the weights that sampled the round
        for p in pairs:
            assert p.chosen_ids == tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            assert p.chosen_provenance().source == "dataset" and p.chosen_provenance().policy_version is None
    assert len({step for step, _ in rounds}) == len(rounds)
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/reward_margin", "train/ref_updates", "train/round_reward_chosen",
                "train/round_reward_rejected", "train/round_reward_margin", "train/round_end_reward_margin"):
        assert key in metrics, key
    # the last round's pairs after its steps, against the reference they were cached with: a trained margin
    assert metrics["train/round_end_reward_margin"] > 0 and metrics["train/round_end_reward_acc"] > 0.5
    stats = regenerate.last_round
    assert stats["rollout/identical_frac"] == 0.0 and stats["rollout/pairs"] == 8.0  # untrained: no right answer
    assert stats["rollout/ref_updates"] == module.ref_updates


def test_a_checkpointed_pair_keeps_its_chosen_source():
    """The buffer checkpoints records as rows (data_modules/store.py): a SPIN pair comes back with its chosen
    side still the dataset's and its rejected side the sampling policy's."""
    from data_modules.store import record_to_row, row_to_record
    pair = demonstration_pairs(ROUND, demo_ids, {EOS}, "human")[0][0]
    back = row_to_record(record_to_row(pair), PreferenceRecord)
    assert back == pair and back.chosen_provenance().source == "human"
    assert back.sequences()[1].provenance.policy_version == 7
