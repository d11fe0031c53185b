"""TRL's dataset formats (tasks/formats.py, docs/datasets.md), standard and conversational, each through the
data source that takes it, with the token and loss-mask counts worked out by hand:

    text                 data=conversations           every token trains (bos is the prompt)
    messages             data=conversations           assistant turns train
    prompt-only          task=jsonl → RL prompts       the conversational one through the chat template
    prompt-completion    data=conversations, task=jsonl → data=demonstrations: the completion alone trains
    preference           data=static_preferences       (implicit prompt too)
    unpaired preference  data=static_preferences       (KTO)

and a row that fits no format is refused naming file:row and the formats expected."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_modules.conversations import conversation_record, conversation_split, renderer
from data_modules.demonstrations import DemonstrationsDataModule
from data_modules.fresh_rollouts import FreshRolloutsDataModule
from data_modules.preference_files import Columns, PreferenceDataError, load_records
from models.bpe import build_bpe_tokenizer
from models.tokenizer import build_char_tokenizer
from tasks.formats import LANGUAGE_MODELING, PREFERENCE, PROMPT_COMPLETION, PROMPT_ONLY, UNPAIRED, detect
from tasks.jsonl import DataFileError, jsonl_task

USER = [{"role": "user", "content": "1+2="}]
REPLY = [{"role": "assistant", "content": "3"}]


@pytest.fixture(scope="module")
def bpe():
    return build_bpe_tokenizer()


@pytest.fixture(scope="module")
def char():
    return build_char_tokenizer()


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def sft_records(path, tok):
    train, _ = conversation_split(path, None, 0, "train", "messages", None)
    return [conversation_record(loc, row, renderer(tok), False, i, "dataset") for i, (loc, row) in enumerate(train)]


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_detect_names_each_format():
    assert detect({"text": "a"}) == detect({"messages": USER + REPLY}) == LANGUAGE_MODELING
    assert detect({"prompt": USER}) == PROMPT_ONLY and detect({"prompt": "a", "completion": "b"}) == PROMPT_COMPLETION
    assert detect({"prompt": "a", "chosen": "b", "rejected": "c"}) == detect({"chosen": [], "rejected": []}) == PREFERENCE
    assert detect({"prompt": "a", "completion": "b", "label": True}) == UNPAIRED
    assert detect({"question": "a"}) is None


def test_text_rows_train_every_token(tmp_path, char):
    """{"text": "1+2=3"}: bos 1+2=3 eos with the character tokenizer = 7 tokens; bos is the prompt, the 6
    others (5 characters + eos) all carry loss."""
    [r] = sft_records(write(tmp_path / "t.jsonl", [{"text": "1+2=3"}]), char)
    assert r.prompt_ids == [char.bos_token_id]
    assert r.completion_ids == enc(char, "1+2=3") + [char.eos_token_id] and len(r.completion_ids) == 6
    assert r.loss_mask == [1] * 6


def test_standard_prompt_completion_trains_the_completion_only(tmp_path, char):
    """{"prompt": "1+2=", "completion": "3"}: prompt bos + 4 characters = 5 tokens with no loss, completion
    "3" + eos = 2 tokens with loss; data=demonstrations (task=jsonl) makes the same record."""
    path = write(tmp_path / "pc.jsonl", [{"prompt": "1+2=", "completion": "3"}] * 3)
    [r, *_] = sft_records(path, char)
    assert r.prompt_ids == [char.bos_token_id] + enc(char, "1+2=") and len(r.prompt_ids) == 5
    assert r.completion_ids == enc(char, "3") + [char.eos_token_id] and r.loss_mask == [1, 1]
    task = jsonl_task(path, None, False, 1, "prompt", "answer")
    assert task.train[0].answer == "3" and not task.chat
    demo = DemonstrationsDataModule(task, char, 2, 2, 0, "dataset").records[0]
    assert (demo.prompt_ids, demo.completion_ids, sum(demo.loss_mask or [1] * len(demo.completion_ids))) == \
        (r.prompt_ids, r.completion_ids, 2)


def test_conversational_prompt_completion_trains_the_assistant_reply(tmp_path, bpe):
    """Prompt messages through the ChatML template with the generation prompt (no loss); the completion is
    its continuation, "3<|im_end|>\\n", trained up to its end-of-turn token (the "\\n" after it is the
    template's, never sampled: docs/conversations.md), in data=conversations and data=demonstrations."""
    path = write(tmp_path / "pc.jsonl", [{"prompt": USER, "completion": REPLY}] * 3)
    [r, *_] = sft_records(path, bpe)
    assert r.prompt_ids == enc(bpe, "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n")
    assert r.completion_ids == enc(bpe, "3<|im_end|>\n") and r.loss_mask == turn_mask(bpe, "3")
    task = jsonl_task(path, None, False, 1, "prompt", "answer")
    assert task.chat and task.train[0].answer == "3" and task.train[0].prompt == "1+2="
    demo = DemonstrationsDataModule(task, bpe, 2, 2, 0, "dataset").records[0]
    assert demo.prompt_ids == r.prompt_ids and demo.completion_ids == r.completion_ids
    assert demo.loss_mask == r.loss_mask  # the "\\n" after <|im_end|> trains in neither


def test_conversational_prompt_with_an_assistant_turn_trains_only_the_completion(tmp_path, bpe):
    """A multi-turn prompt's own assistant turn is context: only the completion's turn carries loss."""
    prompt = USER + REPLY + [{"role": "user", "content": "2+2="}]
    [r] = sft_records(write(tmp_path / "pc.jsonl", [{"prompt": prompt, "completion": "4"}]), bpe)
    assert r.prompt_ids == enc(bpe, "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n"
                                    "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n")
    assert r.completion_ids == enc(bpe, "4<|im_end|>\n") and r.loss_mask == turn_mask(bpe, "4")


def test_messages_rows_train_assistant_turns(tmp_path, bpe):
    [r] = sft_records(write(tmp_path / "m.jsonl", [{"messages": USER + REPLY}]), bpe)
    assert r.completion_ids == enc(bpe, "3<|im_end|>\n") and r.loss_mask == turn_mask(bpe, "3")


def turn_mask(bpe, content: str) -> list[int]:
    """An assistant turn's loss mask: its content and <|im_end|> train, the template's "\\n" after it does not."""
    return [1] * len(enc(bpe, content + "<|im_end|>")) + [0] * (len(enc(bpe, content + "<|im_end|>\n"))
                                                              - len(enc(bpe, content + "<|im_end|>")))


def rollout_prompts(task, tok):
    dm = FreshRolloutsDataModule(task, tok, batch_size=2, micro_batch_size=2, seed=0, prompts_per_round=len(task.train),
                                 group_size=1, epochs_per_round=1, buffer_capacity=8)
    return {ex.prompt: ids for ex, ids, _ in dm.next_prompts()}


def test_prompt_only_rows_are_rl_prompts(tmp_path, bpe, char):
    """Standard prompt-only rows are prompts as before (no answer); conversational ones (which failed to
    load: prompts had to be strings) go through the chat template with the generation prompt."""
    task = jsonl_task(write(tmp_path / "p.jsonl", [{"prompt": "1+2="}, {"prompt": "2+2="}]), None, False, 1,
                      "prompt", "answer")
    assert rollout_prompts(task, char) == {"1+2=": char("1+2=")["input_ids"]} and task.train[0].answer == ""
    rows = [{"prompt": [{"role": "system", "content": "Add."}] + USER}, {"prompt": USER}]
    task = jsonl_task(write(tmp_path / "c.jsonl", rows), None, False, 1, "prompt", "answer")
    assert rollout_prompts(task, bpe) == {"system: Add.\nuser: 1+2=": enc(
        bpe, "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n")}
    assert task.chat and task.chat_why == f"{tmp_path / 'c.jsonl'}:1 is a conversational row"
    with pytest.raises(DataFileError, match=r"p.jsonl:1: a prompt-only row: data=demonstrations trains on a completion"):
        DemonstrationsDataModule(jsonl_task(str(tmp_path / "p.jsonl"), None, False, 1, "prompt", "answer"),
                                 char, 2, 2, 0, "dataset")


class Stats:
    rows = 0

    def skip(self, why):  # pragma: no cover - skip_bad_rows is off
        raise AssertionError(why)


COLUMNS = Columns("prompt", "chosen", "rejected", "completion", "label")


@pytest.mark.parametrize("row", [
    {"prompt": "1+2=", "chosen": "3", "rejected": "4"},
    {"prompt": USER, "chosen": REPLY, "rejected": [{"role": "assistant", "content": "4"}]},
    {"chosen": USER + REPLY, "rejected": USER + [{"role": "assistant", "content": "4"}]},  # implicit prompt
])
def test_preference_rows_in_each_form(tmp_path, bpe, row):
    [r] = load_records(write(tmp_path / "p.jsonl", [row]), bpe, COLUMNS, False, "train", False, Stats())
    conversational = isinstance(row["chosen"], list)
    assert r.chosen_ids == enc(bpe, "3<|im_end|>\n" if conversational else "3") + ([] if conversational else [bpe.eos_token_id])
    assert r.prompt_ids == (enc(bpe, "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n") if conversational
                            else bpe("1+2=")["input_ids"])


@pytest.mark.parametrize("prompt,completion", [("1+2=", "3"), (USER, REPLY)])
def test_unpaired_preference_rows(tmp_path, bpe, prompt, completion):
    [r] = load_records(write(tmp_path / "u.jsonl", [{"prompt": prompt, "completion": completion, "label": False}]),
                       bpe, COLUMNS, False, "train", False, Stats())
    assert r.desirable is False and bpe.decode(r.completion_ids).startswith("3")


def test_a_row_of_no_format_is_refused_naming_file_and_row(tmp_path):
    good, bad = {"prompt": "1+2=", "completion": "3"}, {"question": "1+2=", "response": "3"}
    path = write(tmp_path / "x.jsonl", [good, bad])
    with pytest.raises(DataFileError, match=r"x.jsonl:2: a row of no dataset format \(columns \['question', "
                                            r"'response'\]\); task=jsonl takes prompt-only \{prompt\} or "
                                            r"prompt-completion \{prompt, completion\} rows \(see docs/datasets.md\)"):
        jsonl_task(path, None, False, 1, "prompt", "answer")
    with pytest.raises(DataFileError, match=r"x.jsonl:2: a row of no dataset format .*data=conversations takes "
                                            r"language modeling \{text\} or \{messages\} or prompt-completion"):
        conversation_split(path, None, 0, "train", "messages", None)
    with pytest.raises(PreferenceDataError, match=r"x.jsonl:1: a prompt-completion row; data=static_preferences "
                                                  r"takes preference \{prompt, chosen, rejected\} or unpaired"):
        load_records(path, None, COLUMNS, False, "train", False, Stats())
    table = tmp_path / "x.parquet"  # a table's rows are named `file row i`
    pq.write_table(pa.Table.from_pylist([{"text": "a", "question": None}, {"text": None, "question": "b"}]), table)
    with pytest.raises(DataFileError, match=r"x.parquet row 1: 'text' must be a non-empty string, got null"):
        conversation_split(str(table), None, 0, "train", "messages", None)
    with pytest.raises(DataFileError, match=r"t.jsonl:1: a preference row; task=jsonl takes"):
        jsonl_task(write(tmp_path / "t.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"}] * 2), None, False,
                   1, "prompt", "answer")


def test_one_docs_table_lists_every_format_and_the_other_docs_link_to_it():
    from pathlib import Path
    from tasks.formats import SHAPES
    docs = Path(__file__).resolve().parents[2] / "docs"
    rows = [line for line in (docs / "datasets.md").read_text().splitlines() if line.startswith("| ")]
    assert {line.split("|")[1].strip() for line in rows[1:]} >= set(SHAPES)
    for page in ("conversations.md", "preferences.md", "../README.md"):
        assert "datasets.md" in (docs / page).read_text(), page
