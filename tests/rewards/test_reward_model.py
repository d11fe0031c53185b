"""reward_model: a local sequence-classification checkpoint, re-tokenized with its own tokenizer, batched,
on the policy's device; a missing or malformed checkpoint fails at start naming reward.path."""
from __future__ import annotations

import functools
import json

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

from models.tokenizer import CHARACTERS, SPECIAL_TOKENS, build_char_tokenizer
from rewards.base import safe_score
from rewards.reward_model import RewardModelSource
from rewards.rm_builder import build_pairwise_rm
from tasks.arithmetic import arithmetic_task
from tasks.base import Example

TEXTS = [("12+30=", "42"), ("1+1=", "2"), ("7+8=", "a much longer completion"), ("99+1=", "")]


def reversed_char_tokenizer() -> PreTrainedTokenizerFast:
    """Same characters as the policy's tokenizer, different ids: feeding it the policy's ids would be wrong."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + CHARACTERS[::-1])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")


def save_rm(path, tok, num_labels=1):
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, num_labels=num_labels,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model.eval()


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    return path, save_rm(path, reversed_char_tokenizer())


def source(path, batch_size=8, **kw):
    return RewardModelSource("rm", str(path), "{prompt}{completion}", batch_size, 128, None, 60, **kw)


def test_scores_with_its_own_tokenizer_batched_like_one_by_one(rm_dir):
    path, model = rm_dir
    rm = source(path)
    prompts, completions = [p for p, _ in TEXTS], [c for _, c in TEXTS]
    scores = rm.score(prompts, completions, [Example(p, "") for p in prompts])
    own, policy_tok = reversed_char_tokenizer(), build_char_tokenizer()
    with torch.no_grad():
        expected = [model(**own(p + c, return_tensors="pt")).logits[0, 0].item() for p, c in TEXTS]
        wrong = [model(**policy_tok(p + c, return_tensors="pt")).logits[0, 0].item() for p, c in TEXTS]
    assert scores == pytest.approx(expected, abs=1e-5)  # batched + padded == one at a time
    assert scores != pytest.approx(wrong, abs=1e-3)  # and not the policy's ids
    assert source(path, batch_size=1).score(prompts, completions, [None] * 4) == pytest.approx(scores, abs=1e-5)
    assert rm.version.startswith(path.name + "@") and not any(p.requires_grad for p in rm.model.parameters())


def test_follows_the_policy_device_unless_pinned(rm_dir):
    path, _ = rm_dir
    rm = source(path)
    assert rm.to(torch.device("cpu")) is rm and next(rm.model.parameters()).device.type == "cpu"
    pinned = RewardModelSource("rm", str(path), "{prompt}{completion}", 8, 128, "cpu", 60)
    pinned.to("meta")  # ignored: the config pinned cpu
    assert next(pinned.model.parameters()).device.type == "cpu"
    if torch.cuda.is_available():
        rm.to(torch.device("cuda"))
        assert next(rm.model.parameters()).is_cuda and len(rm.score(["1+1="], ["2"], [None])) == 1


def test_missing_or_wrong_checkpoint_fails_naming_reward_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"reward\.path=.*no model there"):
        source(tmp_path / "nothing")
    with pytest.raises(ValueError, match=r"reward\.path is null"):
        RewardModelSource("rm", None, "{prompt}{completion}", 8, 128, None, 60)
    save_rm(tmp_path / "two", build_char_tokenizer(), num_labels=2)
    with pytest.raises(ValueError, match="num_labels=2"):
        source(tmp_path / "two")
    with pytest.raises(KeyError):
        RewardModelSource("rm", str(tmp_path / "two"), "{prompt}{answer}", 8, 128, None, 60)


def test_build_trains_a_pairwise_rm_when_the_path_is_empty(tmp_path):
    task = arithmetic_task(digits=1, num_heldout=20, seed=0)
    build = functools.partial(build_pairwise_rm, task=task, steps=3, batch_size=8, lr=1e-3, hidden_size=16,
                              num_layers=1, num_heads=2, intermediate_size=32, seed=0)
    rm = source(tmp_path / "built", build=build)
    metrics = json.loads((tmp_path / "built" / "rm_metrics.json").read_text())
    assert metrics["steps"] == 3 and 0.0 <= metrics["pair_accuracy_heldout"] <= 1.0
    assert rm.stats()["reward_model/steps"] == 3
    report = safe_score(rm, ["1+1=", "2+2="], ["2", "x"], [Example("1+1=", "2"), Example("2+2=", "4")])
    assert len(report.scores) == 2 and all(isinstance(s, float) for s in report.scores)
    source(tmp_path / "built", build=lambda p: pytest.fail("rebuilt an existing RM"))  # reused, not rebuilt
