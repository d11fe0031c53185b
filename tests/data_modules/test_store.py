"""The experience store: exact row round-trips, Parquet rounds on disk, append numbering, tokenizer checks."""
from __future__ import annotations

import dataclasses
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import models.tokenizer as char_tokenizer
from data_modules.experience import ExperienceRecord, Provenance
from data_modules.store import (ExperienceStore, load_experience, record_to_row, round_files, row_to_record,
                                tokenizer_fingerprint)
from models.tokenizer import build_char_tokenizer
from tasks.base import encode_completion, encode_prompt


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture
def other_tok(monkeypatch):
    """Same characters, reversed ids: a different vocabulary, so ids mean different things."""
    monkeypatch.setattr(char_tokenizer, "CHARACTERS", list(reversed(char_tokenizer.CHARACTERS)))
    return build_char_tokenizer()


def make(tok, prompt="1+2=", completion="3", step=0, **kw) -> ExperienceRecord:
    c = encode_completion(tok, completion)
    prov = dict(source="policy_rollout", created_step=step, policy_version=step, generator="hf",
                sampling={"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 8},
                reward_source="exact", reward_version="1", times_used=2)
    prov.update(kw.pop("prov", {}))
    fields = dict(prompt_ids=encode_prompt(tok, prompt, chat=False), completion_ids=c,
                  provenance=Provenance(**prov), group_id=3, prompt_text=prompt, completion_text=completion,
                  answer="3", behaviour_logprobs=[-0.1 / 3] * len(c), ref_logprobs=[-1 / 7] * len(c),
                  rewards={"exact": 1.0, "length": 0.1 + 0.2, "judge": None}, reward=0.1 + 0.2,
                  advantage=-1 / 3)
    fields.update(kw)
    return ExperienceRecord(**fields)


def records(tok, step=0):
    return [make(tok, f"{i}+{step}=", str(i + step), step=step, group_id=i // 2) for i in range(4)]


def strip_origin(rs):
    return [dataclasses.replace(r, provenance=dataclasses.replace(r.provenance, origin=None)) for r in rs]


# ---------------------------------------------------------------- rows
def test_row_round_trip_exact_and_plain(tok):
    r = make(tok, prov={"origin": "arithmetic"})
    row = record_to_row(r)
    assert row_to_record(row) == r
    assert row["provenance"]["sampling"]["temperature"] == 0.7 and row["reward"] == 0.1 + 0.2
    names = {f.name for f in dataclasses.fields(ExperienceRecord)} | {"provenance"}
    assert set(row) == names and set(row["provenance"]) == {f.name for f in dataclasses.fields(Provenance)}
    row["completion_ids"].append(99)  # a copy, not an alias
    assert r.completion_ids[-1] != 99
    buf = io.BytesIO()
    torch.save([record_to_row(r)], buf)
    buf.seek(0)
    assert row_to_record(torch.load(buf, weights_only=True)[0]) == r


def test_row_rejects_non_plain_values(tok):
    with pytest.raises(TypeError, match="reward"):
        record_to_row(make(tok, reward=torch.tensor(1.0)))


# ---------------------------------------------------------------- Parquet rounds
def test_write_two_rounds_and_load(tmp_path, tok):
    store = ExperienceStore(tmp_path / "store", tok)
    r0, r1 = records(tok, 0), records(tok, 1)
    r1[0].behaviour_logprobs = None
    r1[1].provenance.origin = "kept"
    paths = [store.write_round(r0, 0), store.write_round(r1, 1)]
    assert [p.name for p in paths] == ["round_00000.parquet", "round_00001.parquet"]
    assert sorted(p.name for p in paths[0].parent.iterdir()) == [p.name for p in paths]  # no temp left
    loaded = load_experience(tmp_path / "store", tok, on_mismatch="refuse")
    assert strip_origin(loaded) == strip_origin(r0 + r1)
    assert loaded[1].provenance.origin == "round_00000.parquet:1"
    assert loaded[5].provenance.origin == "kept"
    table = pq.read_table(paths[0])
    assert table.column("prov_source").to_pylist() == ["policy_rollout"] * 4
    assert table.schema.field("completion_ids").type == pa.list_(pa.int64())
    assert table.schema.field("behaviour_logprobs").type == pa.list_(pa.float64())
    assert table.schema.metadata[b"policyshift.tokenizer_fingerprint"] == tokenizer_fingerprint(tok).encode()


def test_second_store_appends(tmp_path, tok):
    ExperienceStore(tmp_path, tok).write_round(records(tok, 0), 0)
    ExperienceStore(tmp_path, tok).write_round(records(tok, 0), 1)  # a resumed run: next free index
    second = ExperienceStore(tmp_path, tok)
    assert second.write_round(records(tok, 5), 0).name == "round_00002.parquet"
    assert second.write_round(records(tok, 6), 1).name == "round_00003.parquet"
    assert len(load_experience(tmp_path, tok, "refuse")) == 16


# ---------------------------------------------------------------- tokenizer mismatch
def test_fingerprint_is_stable(tok):
    assert tokenizer_fingerprint(tok) == tokenizer_fingerprint(build_char_tokenizer())
    assert len(tokenizer_fingerprint(tok)) == 16


def test_fingerprint_tells_vocabularies_apart(tok, other_tok):
    assert tokenizer_fingerprint(tok) != tokenizer_fingerprint(other_tok)


def test_refuse_on_mismatch(tmp_path, tok, other_tok):
    path = ExperienceStore(tmp_path, tok).write_round(records(tok), 0)
    with pytest.raises(ValueError, match="data.harvest_mismatch=retokenize") as err:
        load_experience(tmp_path, other_tok, on_mismatch="refuse")
    msg = str(err.value)
    assert path.name in msg and tokenizer_fingerprint(tok) in msg and tokenizer_fingerprint(other_tok) in msg
    with pytest.raises(ValueError, match="data.harvest_mismatch"):
        load_experience(tmp_path, tok, on_mismatch="ignore")


def test_retokenize_on_mismatch(tmp_path, tok, other_tok):
    written = records(tok)
    written[1].provenance.source = "dataset"
    ExperienceStore(tmp_path, tok).write_round(written, 0)
    loaded = load_experience(tmp_path, other_tok, on_mismatch="retokenize")
    for old, new in zip(written, loaded):
        assert new.prompt_ids == encode_prompt(other_tok, old.prompt_text, chat=False) != old.prompt_ids
        assert new.completion_ids == encode_completion(other_tok, old.completion_text) != old.completion_ids
        assert new.behaviour_logprobs is None and new.ref_logprobs is None
        assert (new.rewards, new.reward, new.group_id) == (old.rewards, old.reward, old.group_id)
    assert [r.provenance.source for r in loaded] == ["external_model", "dataset"] + ["external_model"] * 2
    assert loaded[0].provenance.sampling == written[0].provenance.sampling


# ---------------------------------------------------------------- clear errors
def test_empty_directory(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_experience(tmp_path, tok, "refuse")


def test_not_a_store_file(tmp_path, tok):
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "round_00000.parquet")
    with pytest.raises(ValueError, match="round_00000.parquet.*not a policyshift"):
        load_experience(tmp_path, tok, "refuse")
    (tmp_path / "round_00000.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="round_00000.parquet"):
        load_experience(tmp_path, tok, "refuse")


def test_wrong_format_version(tmp_path, tok):
    path = ExperienceStore(tmp_path, tok).write_round(records(tok), 0)
    table = pq.read_table(path)
    meta = {**table.schema.metadata, b"policyshift.format_version": b"999"}
    pq.write_table(table.replace_schema_metadata(meta), path)
    with pytest.raises(ValueError, match="round_00000.parquet.*version 999"):
        load_experience(tmp_path, tok, "refuse")


# ---------------------------------------------------------------- reuse counts (prov_times_used)
def counts_on_disk(store_dir) -> list[list[int]]:
    return [pq.read_table(path).column("prov_times_used").to_pylist() for _, path in round_files(store_dir)]


def test_reuse_counts_are_rewritten_as_records_are_served_and_after_a_resume(tmp_path, tok):
    """Issue 31, item 11: a round is written before it is served, so its column said 0 forever. `sync`
    rewrites the column of the files whose records were served since; a resumed store (its state_dict, the
    records found again in the restored buffer's groups) keeps doing it; a file whose records all left the
    buffer is written a last time, then forgotten."""
    store = ExperienceStore(tmp_path / "s", tok)
    r0 = [make(tok, f"{i}+0=", str(i), group_id=i // 2, prov={"times_used": 0}) for i in range(4)]
    store.write_round(r0, 0)
    assert counts_on_disk(tmp_path / "s") == [[0, 0, 0, 0]]
    for r in r0[:3]:
        r.provenance.times_used += 1
    assert store.sync(r0) == [tmp_path / "s" / "round_00000.parquet"]
    assert counts_on_disk(tmp_path / "s") == [[1, 1, 1, 0]] and store.sync(r0) == []  # unchanged: not rewritten
    assert load_experience(tmp_path / "s", tok)[0].provenance.times_used == 1  # metadata kept: still a store
    state = store.state_dict()
    assert state["rows"]["round_00000.parquet"] == [[0, 0], [0, 1], [1, 0], [1, 1]]
    groups = {0: [dataclasses.replace(r, provenance=dataclasses.replace(r.provenance)) for r in r0[:2]],
              1: [dataclasses.replace(r, provenance=dataclasses.replace(r.provenance)) for r in r0[2:]]}
    resumed = ExperienceStore(tmp_path / "s", tok)
    resumed.load_state_dict(state, groups)
    groups[1][1].provenance.times_used = 5
    resumed.sync([r for g in groups.values() for r in g])
    assert counts_on_disk(tmp_path / "s") == [[1, 1, 1, 5]]
    groups[0][0].provenance.times_used = 7  # served once more, then evicted: its last count is written
    resumed.sync([])
    assert counts_on_disk(tmp_path / "s") == [[7, 1, 1, 5]] and resumed.state_dict()["rows"] == {}
