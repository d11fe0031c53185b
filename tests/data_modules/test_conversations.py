"""data=conversations (data_modules/conversations.py): multi-turn chats rendered with the chat template, only
assistant tokens carry loss (ExperienceRecord.loss_mask → collate's completion_mask → SFT's NLL)."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from data_modules.conversations import conversation_record, renderer
from data_modules.experience import ExperienceRecord, Provenance, collate
from data_modules.store import record_to_row, records_to_table, row_to_record
from models.bpe import build_bpe_tokenizer
from models.tokenizer import build_char_tokenizer
from run.stages import build
from tasks.jsonl import DataFileError

CHAT = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "The answer is 5."},
        {"role": "user", "content": "And 4+4?"}, {"role": "assistant", "content": "8"}]


@pytest.fixture(scope="module")
def bpe():
    return build_bpe_tokenizer()


def turns_by_hand(tok):
    """Each ChatML turn tokenised on its own: (user 1 + assistant header, assistant 1, user 2 + header,
    assistant 2 with its <|im_end|>\\n)."""
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    head = enc("<|im_start|>assistant\n")
    return (enc("<|im_start|>user\nWhat is 2+3?<|im_end|>\n") + head, enc("The answer is 5.<|im_end|>\n"),
            enc("<|im_start|>user\nAnd 4+4?<|im_end|>\n") + head, enc("8<|im_end|>\n"))


def replied(reply: list[int]) -> list[int]:
    """A ChatML reply's mask: its content and <|im_end|> train, the template's "\\n" after it does not."""
    return [1] * (len(reply) - 1) + [0]


def test_loss_mask_marks_exactly_the_assistant_turns(bpe):
    user1, reply1, user2, reply2 = turns_by_hand(bpe)
    r = conversation_record("c.jsonl:1", CHAT, renderer(bpe), False, 0, "dataset")
    assert r.prompt_ids == user1
    assert r.completion_ids == reply1 + user2 + reply2
    assert r.loss_mask == replied(reply1) + [0] * len(user2) + replied(reply2)
    assert bpe.convert_ids_to_tokens(reply2)[-2:] == ["<|im_end|>", "Ċ"]  # the end-of-turn token trains


def test_the_newline_after_the_end_of_turn_token_does_not_train(bpe):
    """Issue 31, item 12: the "\\n" ChatML writes after <|im_end|> is the template's, not the policy's: a
    policy stops sampling at <|im_end|> (a stop id) and the next turn's header follows. It used to train
    (mask 1 on every "\\n" that follows an <|im_end|> of a reply); now each reply's trained tokens end at
    <|im_end|>, as a sampled reply does, and the "\\n" stays in the record, untrained."""
    r = conversation_record("c.jsonl:1", CHAT, renderer(bpe), False, 0, "dataset")
    tokens = bpe.convert_ids_to_tokens(r.completion_ids)
    trained = [t for t, m in zip(tokens, r.loss_mask) if m]
    assert trained.count("<|im_end|>") == 2 and trained[-1] == "<|im_end|>"
    after_end = [m for i, m in enumerate(r.loss_mask) if i and tokens[i - 1] == "<|im_end|>"]
    assert after_end == [0, 0, 0] and [tokens[i] for i in range(1, len(tokens)) if tokens[i - 1] == "<|im_end|>"] \
        == ["Ċ"] * 3  # reply 1's, user 2's and reply 2's


def test_last_turn_only_masks_earlier_assistant_turns(bpe):
    user1, reply1, user2, reply2 = turns_by_hand(bpe)
    r = conversation_record("c.jsonl:1", CHAT, renderer(bpe), True, 0, "dataset")
    assert r.prompt_ids == user1 + reply1 + user2 and r.completion_ids == reply2 and r.loss_mask == replied(reply2)
    tail = CHAT + [{"role": "user", "content": "Thanks"}]  # a turn after the last reply trains nothing: dropped
    assert conversation_record("c.jsonl:1", tail, renderer(bpe), False, 0, "dataset").completion_ids == \
        reply1 + user2 + reply2


TOOL_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3 and 4+4?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
                 {"type": "function", "function": {"name": "add", "arguments": {"a": 4, "b": 4}}}]},
             {"role": "tool", "content": "5"}, {"role": "tool", "content": "8"},  # two results in a row
             {"role": "assistant", "content": "5 and 8."}]


def tool_turns_by_hand(tok):
    """TOOL_CHAT in Qwen2.5's ChatML tool format, written out by hand: (system + user + assistant header, the
    calling turn, the two tool results as ONE user turn + the next header, the final reply)."""
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    head = enc("<|im_start|>assistant\n")
    calls = "".join(f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>' + ("\n" if a == 2 else "")
                    for a, b in ((2, 3), (4, 4)))
    return (enc("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3 and 4+4?<|im_end|>\n") + head,
            enc(calls + "<|im_end|>\n"),
            enc("<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n8\n</tool_response>"
                "<|im_end|>\n") + head,
            enc("5 and 8.<|im_end|>\n"))


def test_tool_calls_and_tool_results_through_the_chat_template_train_only_the_assistant(bpe):
    """The assistant's tool calls are trained (they are its output), the tool results are context; a run of
    two tool results (one user turn in the template, closed only after the second) no longer reads as a
    template that rewrites earlier turns."""
    prompt, calls, results, reply = tool_turns_by_hand(bpe)
    r = conversation_record("c.jsonl:3", TOOL_CHAT, renderer(bpe), False, 0, "dataset")
    assert r.prompt_ids == prompt
    assert r.completion_ids == calls + results + reply
    assert r.loss_mask == replied(calls) + [0] * len(results) + replied(reply)
    assert r.prompt_ids + r.completion_ids == bpe.apply_chat_template(TOOL_CHAT, tokenize=True)["input_ids"]
    trained = bpe.decode([t for t, m in zip(r.completion_ids, r.loss_mask) if m])
    assert '"arguments": {"a": 4, "b": 4}' in trained and "tool_response" not in trained and "8" not in trained.split("5 and")[0]


def test_the_plain_template_of_a_tokenizer_without_one():
    tok = build_char_tokenizer()
    r = conversation_record("c.jsonl:1", CHAT, renderer(tok), False, 0, "dataset")
    assert tok.decode(r.prompt_ids) == "<bos>user: What is 2+3?\nassistant: "
    trained = [t for t, m in zip(r.completion_ids, r.loss_mask) if m]
    assert tok.decode(trained) == "The answer is 5.<eos>8<eos>"


def test_sft_loss_is_the_nll_of_assistant_tokens_alone(bpe, hydra_conf):
    """SFT's token-mean loss = mean over assistant tokens of -log p(token), computed here from the logits;
    the user turn between the replies adds nothing (and the unmasked loss differs)."""
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(bpe), hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
                                          pad_token_id=bpe.pad_token_id, tie_word_embeddings=True))
    cfg = hydra_conf(["algorithm=sft", "data=demonstrations", "algorithm.loss_agg_mode=token_mean"])
    module = build(cfg.algorithm, policy=policy, tokenizer=bpe)
    r = conversation_record("c.jsonl:1", CHAT, renderer(bpe), False, 0, "dataset")
    batch = collate([r], bpe.pad_token_id)
    loss, _ = module.micro_loss(batch)
    ids = torch.tensor([r.prompt_ids + r.completion_ids])
    logp = torch.log_softmax(policy(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    p = len(r.prompt_ids)
    trained = [p - 1 + i for i, m in enumerate(r.loss_mask) if m]  # target position of completion token i
    loss = loss.detach()
    assert float(loss) == pytest.approx(float(-logp[trained].mean().detach()), rel=1e-5)
    everything = collate([ExperienceRecord(r.prompt_ids, r.completion_ids, r.provenance)], bpe.pad_token_id)
    assert float(module.micro_loss(everything)[0]) != pytest.approx(float(loss), rel=1e-3)


def test_collate_without_loss_masks_is_unchanged_and_checks_lengths():
    prov = Provenance(source="dataset", created_step=0)
    plain = ExperienceRecord([1, 2], [3, 4, 5], prov)
    masked = ExperienceRecord([1], [3, 4, 5], prov, loss_mask=[1, 0, 1])
    assert collate([plain], 0).completion_mask.tolist() == [[0, 1, 1, 1]]
    both = collate([plain, masked], 0).completion_mask.tolist()
    assert both == [[0, 1, 1, 1], [1, 0, 1, 0]]
    with pytest.raises(ValueError, match="record 0: 2 loss_mask entries for 3 completion tokens"):
        collate([ExperienceRecord([1], [3, 4, 5], prov, loss_mask=[1, 0])], 0)


def test_the_store_keeps_loss_mask_and_an_old_row_reads_as_none():
    prov = Provenance(source="dataset", created_step=0)
    r = ExperienceRecord([1], [3, 4, 5], prov, loss_mask=[1, 0, 1])
    table = records_to_table([r, ExperienceRecord([1], [3], prov)], "fp")
    assert table.column("loss_mask").to_pylist() == [[1, 0, 1], None]
    old = record_to_row(r)
    del old["loss_mask"]  # a store written before the field existed
    assert row_to_record(old).loss_mask is None


def test_a_template_that_rewrites_earlier_turns_is_refused():
    def render(messages, add_generation_prompt):  # drops past replies, as reasoning templates drop thoughts
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        kept = [m for i, m in enumerate(messages) if m["role"] != "assistant" or i == last]
        return [ord(c) for m in kept for c in json.dumps(m)]
    with pytest.raises(DataFileError, match=r"c.jsonl:7: the chat template's rendering of messages 0-3 does not start with its rendering of messages 0-2 \+ the generation prompt"):
        conversation_record("c.jsonl:7", CHAT, render, False, 0, "dataset")
