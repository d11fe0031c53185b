"""Stop ids (generators.base.stop_ids): a completion ends at the first id of the model's generation-config
eos list or the tokenizer's eos, on the BPE chat model whose turn end (<|im_end|>) is not the tokenizer's
eos (<|endoftext|>); everything that asks "did it finish?" or decodes it asks with the same ids."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from generators.base import completion_texts, finished, stop_ids
from generators.hf import HFGenerator
from losses.common import token_logprobs
from models.bpe import ENDOFTEXT, IM_END
from tasks.base import encode_prompt
from tests.helpers import chat_model, force_stop_after
from trainers.reward_model import drop_final_stop

MAX_NEW = 8


def fake(eos, tokenizer_eos=7, config=True):
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=eos)) if config else SimpleNamespace()
    return model, SimpleNamespace(eos_token_id=tokenizer_eos)


@pytest.mark.parametrize("eos,tokenizer_eos,config,expected", [
    (7, 7, True, [7]),                    # the char/tiny model: one id
    (5, 7, True, [5, 7]),                 # an int that is not the tokenizer's eos
    ([9, 7], 7, True, [9, 7]),            # Qwen2.5-Instruct: [<|im_end|>, <|endoftext|>], order kept
    ([3, 9, 3, 7], 7, True, [3, 9, 7]),   # duplicates once, first occurrence first
    (None, 7, True, [7]),                 # a generation config without eos
    (None, 7, False, [7]),                # no generation config at all
    ([4], None, True, [4]),               # a tokenizer without eos
    (None, None, True, []),
])
def test_stop_ids_union_of_generation_config_and_tokenizer(eos, tokenizer_eos, config, expected):
    assert stop_ids(*fake(eos, tokenizer_eos, config)) == expected


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """The BPE chat model with <|im_end|> forced after the token "The" (tests.helpers.force_stop_after);
    and since im_end then forces "The" back, a prompt ending in im_end gives [The, im_end]."""
    policy, tok = chat_model(tmp_path_factory.mktemp("chat"))
    stop, trigger = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids("The")
    force_stop_after(policy, trigger, stop)
    return policy.eval(), tok, stop, trigger


def chat_prompts(tok, stop, trigger):
    """Three rows per question: + [The] (im_end at step 1), + [im_end] (im_end at step 2), as is (free)."""
    base = [encode_prompt(tok, q, chat=True) for q in ("12+34=", "7+8=")]
    return [p + tail for p in base for tail in ([trigger], [stop], [])]


def test_the_chat_model_ends_turns_with_a_token_that_is_not_the_tokenizers_eos(chat):
    policy, tok, stop, _ = chat
    assert tok.eos_token == ENDOFTEXT and tok.eos_token_id != stop and tok.pad_token_id not in (stop, tok.eos_token_id)
    assert policy.generation_config.eos_token_id == [stop, tok.eos_token_id]
    assert stop_ids(policy, tok) == [stop, tok.eos_token_id]


def test_hf_generator_stops_at_the_turn_end_with_its_logprob(chat):
    """Sampled at T=1: the forced rows end with <|im_end|> at step 1 and 2 (the id kept, its log-prob
    recorded and equal to a plain forward's), the free rows run on and never pass a stop id."""
    policy, tok, stop, trigger = chat
    prompts = chat_prompts(tok, stop, trigger)
    torch.manual_seed(0)
    out = HFGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=8).sample(policy, tok, prompts)
    for i in (0, 3):
        assert out.completions[i] == [stop] and out.completions[i + 1] == [trigger, stop]
    stops = stop_ids(policy, tok)
    for p, c, lp in zip(prompts, out.completions, out.logprobs):
        assert len(lp) == len(c) and not any(t in stops for t in c[:-1])
        ids = torch.tensor([p + c])
        with torch.no_grad():
            ref = token_logprobs(policy(ids).logits[:, :-1], ids[:, 1:], temperature=1.0)[0, len(p) - 1:]
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-4)
    assert out.logprobs[0][-1] == pytest.approx(0.0, abs=1e-3)  # forced: probability ≈ 1
    assert [len(c) for c in out.completions[2::3]] == [MAX_NEW, MAX_NEW]  # seeded: no stop by chance
    assert completion_texts(tok, out.completions[:2], stops) == ["", "The"]


def test_hf_generator_with_ignore_eos_runs_through_every_stop_id(chat):
    policy, tok, stop, trigger = chat
    prompts = chat_prompts(tok, stop, trigger)
    out = HFGenerator(MAX_NEW, temperature=1.0, top_p=1.0, batch_size=8, ignore_eos=True).sample(
        policy, tok, prompts, greedy=True)
    assert all(len(c) == len(lp) == MAX_NEW for c, lp in zip(out.completions, out.logprobs))
    assert out.completions[0] == [stop, trigger] * (MAX_NEW // 2)  # im_end, The, im_end, ...


def test_completion_texts_drop_a_final_stop_id_even_when_not_special(chat):
    _, tok, stop, trigger = chat
    the = tok("The", add_special_tokens=False)["input_ids"]
    assert the == [trigger]
    assert completion_texts(tok, [the + [stop], the, [stop] + the], [stop]) == ["The", "The", "The"]
    assert completion_texts(tok, [the + the], [trigger]) == ["The"]  # "The" as a stop id: the last one cut
    assert finished([5, stop], {stop}) and not finished([stop, 5], {stop}) and not finished([], {stop})


def test_drop_final_stop_drops_any_stop_id():
    """A reward model reads the score at the completion's last token: a final eos or turn end goes."""
    ids = torch.tensor([[1, 2, 9, 0], [1, 2, 7, 0], [1, 2, 3, 0], [1, 9, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0]])
    out_ids, out_mask = drop_final_stop(ids, mask, torch.tensor([9, 7]), pad_id=0)
    assert out_mask.sum(-1).tolist() == [2, 2, 3, 3]
    assert out_ids[:2, 2].tolist() == [0, 0] and torch.equal(out_ids[2:], ids[2:])
