"""Preference data: records and their one-pass batches, file loading in every format and form, the
bad-input errors (each naming file and row), truncation counts, and the synthetic arithmetic pairs."""
from __future__ import annotations

import json

import pytest

from data_modules.experience import Provenance
from data_modules.preference_files import PreferenceDataError
from data_modules.preferences import PreferenceRecord, UnpairedRecord, collate_preferences, unpair
from data_modules.static_preferences import StaticPreferencesDataModule
from data_modules.synthetic_preferences import arithmetic_pairs, plausible_wrong
from models.tokenizer import build_char_tokenizer
from tasks.arithmetic import arithmetic_task
from tasks.base import encode_completion, encode_prompt

TOK = build_char_tokenizer()
TASK = arithmetic_task(digits=1, num_heldout=10, seed=0)
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
ROWS = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2), "extra": i} for i in range(6)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def data_module(path, tokenizer=TOK, **kw):
    args = dict(task=TASK, tokenizer=tokenizer, batch_size=2, micro_batch_size=2, seed=0, path=path, heldout_path=None,
                split="train", num_heldout=0, chat=False, unpaired=False, skip_bad_rows=False,
                max_length=64, synthetic=None,
                columns=dict(prompt="prompt", chosen="chosen", rejected="rejected", completion="completion",
                             label="label"))
    dm = StaticPreferencesDataModule(**(args | kw))
    dm.setup("fit")
    return dm


def chat_tokenizer():
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


# ---------------------------------------------------------------- records and batches
def pair(prompt, chosen, rejected, ref=None):
    rec = PreferenceRecord(encode_prompt(TOK, prompt, False), encode_completion(TOK, chosen),
                           encode_completion(TOK, rejected), Provenance("dataset", 0, origin="f:1"))
    if ref:
        rec.set_ref_logps(*ref)
    return rec


def test_collate_preferences_puts_chosen_then_rejected_in_one_batch():
    """B = 2 pairs → 2B = 4 rows: rows 0-1 chosen, rows 2-3 rejected; masks cover each completion."""
    recs = [pair("1+1=", "2", "3"), pair("10+10=", "20", "21", ref=(-1.0, -2.0))]
    batch = collate_preferences(recs, TOK.pad_token_id)
    seq = batch.sequences
    assert len(batch) == 2 and seq.input_ids.shape[0] == 4 and batch.desirable is None
    texts = TOK.batch_decode(seq.input_ids, skip_special_tokens=True)
    assert texts == ["1+1=2", "10+10=20", "1+1=3", "10+10=21"]
    assert seq.completion_mask.sum(-1).tolist() == [2.0, 3.0, 2.0, 3.0]  # answer + eos
    assert batch.ref_logps is None  # one record has no cached reference → computed on the fly
    recs[0].set_ref_logps(-0.5, -4.0)
    batch = collate_preferences(recs, TOK.pad_token_id)
    assert batch.ref_logps.tolist() == [-0.5, -1.0, -4.0, -2.0]
    assert batch.to("cpu").sequences.input_ids.shape == (4, seq.input_ids.shape[1])


def test_unpair_splits_pairs_and_assigns_mismatched_kl_completions():
    recs = unpair([pair("1+1=", "2", "3"), pair("2+2=", "4", "5"), pair("3+3=", "6", "7")], seed=0)
    assert [r.desirable for r in recs] == [True, False] * 3
    for r in recs:
        assert r.kl_completion_ids and any(o.completion_ids == r.kl_completion_ids and o.prompt_ids != r.prompt_ids
                                           for o in recs)
    assert recs[0].provenance is not recs[1].provenance  # reuse counts are kept per record
    batch = collate_preferences(recs, TOK.pad_token_id)
    assert batch.sequences.input_ids.shape[0] == 12 and batch.desirable.tolist() == [True, False] * 3


# ---------------------------------------------------------------- files
def test_jsonl_records_with_provenance(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    dm = data_module(path, num_heldout=2)
    assert len(dm.records) == 4 and len(dm.heldout_pairs) == 2
    r = dm.records[1]
    assert r.prompt_ids == encode_prompt(TOK, "1+1=", False) and r.chosen_ids == encode_completion(TOK, "2")
    assert r.provenance.source == "dataset" and r.provenance.origin == f"{path}:2"
    assert dm.heldout_pairs[-1].provenance.origin == f"{path}:6"
    assert dm.stats.summary()["data/rows"] == 6.0 and dm.stats.truncated_rows == 0


def test_cached_reference_logprobs_survive_a_checkpoint(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    dm = data_module(path, num_heldout=2)
    dm.records[0].set_ref_logps(-1.5, -7.0)
    dm.epochs_served = 3
    fresh = data_module(path, num_heldout=2)
    fresh.load_state_dict(dm.state_dict())
    assert fresh.records[0].ref_logps == (-1.5, -7.0) and fresh.records[1].ref_logps == (None, None)
    assert fresh.epochs_served == 3


def test_parquet_and_save_to_disk_give_the_same_records(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset, DatasetDict
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "p.parquet")
    DatasetDict({"train": Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "saved"))
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "flat"))
    ref = data_module(write_jsonl(tmp_path / "p.jsonl", ROWS)).records
    for path in ("p.parquet", "saved", "flat"):
        recs = data_module(str(tmp_path / path)).records
        assert [(r.prompt_ids, r.chosen_ids, r.rejected_ids) for r in recs] == \
               [(r.prompt_ids, r.chosen_ids, r.rejected_ids) for r in ref]
    assert data_module(str(tmp_path / "p.parquet")).records[3].provenance.origin.endswith("p.parquet row 3")
    assert "(split train) row 0" in data_module(str(tmp_path / "saved")).records[0].provenance.origin
    with pytest.raises(PreferenceDataError, match="no split 'test'"):
        data_module(str(tmp_path / "saved"), split="test")


def test_chat_form_goes_through_the_template(tmp_path):
    tok = chat_tokenizer()
    rows = [{"prompt": [{"role": "user", "content": "1+1="}], "chosen": [{"role": "assistant", "content": "2"}],
             "rejected": "3"},
            {"chosen": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}],
             "rejected": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "5"}]}]
    recs = data_module(write_jsonl(tmp_path / "c.jsonl", rows), tokenizer=tok).records
    assert tok.decode(recs[0].prompt_ids) == "<user>1+1=<eos><assistant>"
    assert tok.decode(recs[0].chosen_ids) == "2<eos>" and tok.decode(recs[0].rejected_ids) == "3<eos>"
    assert tok.decode(recs[1].prompt_ids) == "<user>2+2=<eos><assistant>"  # implicit prompt: shared turns
    assert tok.decode(recs[1].rejected_ids) == "5<eos>"


def test_kto_unpaired_rows_and_pairs_split_for_kto(tmp_path):
    rows = [{"prompt": f"{i}+0=", "completion": str(i + i % 2), "label": i % 2 == 0} for i in range(4)]
    path = write_jsonl(tmp_path / "u.jsonl", rows)
    recs = data_module(path, unpaired=True).records
    assert all(isinstance(r, UnpairedRecord) for r in recs)
    assert [r.desirable for r in recs] == [True, False, True, False]
    assert all(r.kl_completion_ids for r in recs)
    with pytest.raises(PreferenceDataError, match="only algorithm=kto"):
        data_module(path, unpaired=False)
    from_pairs = data_module(write_jsonl(tmp_path / "p.jsonl", ROWS), unpaired=True).records
    assert len(from_pairs) == 12 and sum(r.desirable for r in from_pairs) == 6


# ---------------------------------------------------------------- bad input: file and row named
@pytest.mark.parametrize("row,message", [
    ({"prompt": "1+1=", "chosen": "2"}, r"missing column\(s\) \['rejected'\]"),
    ({"prompt": "1+1=", "chosen": "", "rejected": "3"}, "'chosen' is empty"),
    ({"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "identical"),
    ({"chosen": "2", "rejected": "3"}, "missing column 'prompt'"),
    ({"prompt": "1+1=", "chosen": 2, "rejected": "3"}, "must be text or chat messages"),
    ({"prompt": [{"role": "user", "content": "1+1="}], "chosen": "2", "rejected": "3"}, "no chat template"),
])
def test_bad_paired_row_names_file_and_line(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", ROWS[:2] + [row] + ROWS[2:])
    with pytest.raises(PreferenceDataError, match=message) as err:
        data_module(path)
    assert f"bad.jsonl:3:" in str(err.value)


def test_first_row_without_known_columns_lists_both_forms(tmp_path):
    with pytest.raises(PreferenceDataError, match=r"bad.jsonl:1: a row of no dataset format.*unpaired preference {prompt, completion, label}"):
        data_module(write_jsonl(tmp_path / "bad.jsonl", [{"question": "1+1=", "good": "2"}]))


@pytest.mark.parametrize("label", ["yes", 1, None])
def test_kto_label_must_be_boolean(tmp_path, label):
    rows = [{"prompt": "1+0=", "completion": "1", "label": True}, {"prompt": "2+0=", "completion": "2", "label": label}]
    with pytest.raises(PreferenceDataError, match=r"u.jsonl:2: 'label' must be a boolean"):
        data_module(write_jsonl(tmp_path / "u.jsonl", rows), unpaired=True)


def test_bad_json_and_missing_file(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(PreferenceDataError, match="broken.jsonl:2: not valid JSON"):
        data_module(str(path))
    with pytest.raises(PreferenceDataError, match="no such file"):
        data_module(str(tmp_path / "nope.jsonl"))


def test_skip_bad_rows_counts_them(tmp_path):
    rows = ROWS[:2] + [{"prompt": "x", "chosen": "1", "rejected": "1"}, {"prompt": "y", "chosen": ""}] + ROWS[2:]
    dm = data_module(write_jsonl(tmp_path / "b.jsonl", rows), skip_bad_rows=True)
    assert len(dm.records) == 6 and dm.stats.skipped_rows == 2 and dm.stats.rows == 8
    assert "b.jsonl:3" in dm.stats.first_skips[0]


def test_prompt_longer_than_context_names_the_row(tmp_path):
    rows = ROWS[:1] + [{"prompt": "9" * 70 + "+1=", "chosen": "1", "rejected": "2"}]
    with pytest.raises(PreferenceDataError, match=r"long.jsonl:2: the prompt is 74 tokens, the model's context is 64"):
        data_module(write_jsonl(tmp_path / "long.jsonl", rows))


def test_long_completions_are_cut_and_counted(tmp_path):
    """Prompt '1+1=' is 5 tokens (bos + 4): with max_length 12, 7 tokens remain for each completion."""
    rows = [{"prompt": "1+1=", "chosen": "2" * 10, "rejected": "3" * 10}, ROWS[0],
            {"prompt": "1+1=", "chosen": "4" * 8 + "a", "rejected": "4" * 8 + "b"}]
    path = write_jsonl(tmp_path / "t.jsonl", rows[:2])
    dm = data_module(path, max_length=12)
    assert dm.stats.truncated_rows == 1 and len(dm.records[0].chosen_ids) == 7
    assert dm.stats.summary()["data/truncated_rows"] == 1.0
    with pytest.raises(PreferenceDataError, match=r"t2.jsonl:3: chosen and rejected are identical once cut"):
        data_module(write_jsonl(tmp_path / "t2.jsonl", rows), max_length=12)


# ---------------------------------------------------------------- synthetic pairs
def test_plausible_wrong_is_wrong_and_close():
    import random
    rng = random.Random(0)
    for a, b in [(0, 0), (9, 9), (45, 38), (99, 1)]:
        for _ in range(20):
            w = plausible_wrong(a, b, rng)
            assert w != a + b and w >= 0 and abs(w - (a + b)) in (1, 10)


def test_arithmetic_pairs_chosen_right_rejected_wrong_heldout_disjoint():
    task = arithmetic_task(digits=2, num_heldout=20, seed=0)
    train, held = arithmetic_pairs(task=task, tokenizer=TOK, num_pairs=50, seed=1)
    assert len(train) == 50 and len(held) == 20
    for r in train + held:
        a, b = map(int, r.prompt_text.rstrip("=").split("+"))
        assert r.chosen_text == str(a + b) and r.rejected_text != r.chosen_text
        assert r.provenance.source == "synthetic"
    assert {r.prompt_text for r in held} == {ex.prompt for ex in task.heldout}
    assert not {r.prompt_text for r in train} & {r.prompt_text for r in held}
    again, held2 = arithmetic_pairs(task=task, tokenizer=TOK, num_pairs=50, seed=2)
    assert [r.rejected_text for r in held] == [r.rejected_text for r in held2]  # same across run seeds
    assert [r.prompt_text for r in train] != [r.prompt_text for r in again]


def test_synthetic_data_module_and_non_arithmetic_task():
    from functools import partial
    dm = data_module(None, synthetic=partial(arithmetic_pairs, num_pairs=30, seed=0))
    assert len(dm.records) == 30 and len(dm.heldout_pairs) == 10 and dm.source == "synthetic"
    from tasks.base import Example, Task
    other = Task("qa", [Example("capital of France?", "Paris")], [Example("2?", "2")])
    with pytest.raises(ValueError, match="data.path"):
        data_module(None, task=other, synthetic=partial(arithmetic_pairs, num_pairs=3, seed=0))


def test_checkpoint_preferences_pair_an_older_policys_right_and_wrong_samples(hydra_conf, tmp_path):
    """data=checkpoint_preferences: a saved (untrained, so mostly wrong) policy's samples, ranked by the
    verifier; chosen falls back to the reference answer when no sample was right."""
    from hydra.utils import instantiate

    from run.stages import build
    from tests.helpers import TINY, tiny_model
    policy, tok = tiny_model()
    policy.save_pretrained(tmp_path / "old")
    cfg = hydra_conf(["algorithm=dpo", "data=checkpoint_preferences", f"data.synthetic.checkpoint={tmp_path / 'old'}",
                      "data.synthetic.num_pairs=6", "data.synthetic.samples_per_prompt=3", *TINY])
    task = instantiate(cfg.task)
    dm = build(cfg.data, task=task, tokenizer=tok)
    assert 0 < len(dm.records) <= 6 and 0 < len(dm.heldout_pairs) <= 20
    for r in dm.records + dm.heldout_pairs:
        assert r.provenance.source == "external_model" and str(tmp_path / "old") in r.provenance.origin
        assert r.provenance.sampling["top_k"] == 0 and r.provenance.reward_source == "verifier"
        assert r.rejected_text.strip() != r.answer and r.chosen_ids != r.rejected_ids
    with pytest.raises(FileNotFoundError, match="data.synthetic.checkpoint"):
        build(hydra_conf(["data=checkpoint_preferences", "data.synthetic.checkpoint=/nonexistent", *TINY]).data,
              task=task, tokenizer=tok)
