"""A harvest store is checked when it is read (issue 31, item 13): the file type before it is opened, then
token ids against the model's vocabulary, one per-token value per completion token, finite numbers. Each
refusal is one line naming the file and the row, whether the store is read when the run is planned
(check_store: tests/bad_inputs/stores.py runs the same tampered stores through plan_stages) or when the
data module harvests it (load_experience)."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_modules.store import ExperienceStore, check_store, load_experience
from data_modules.store_checks import StoreDataError
from models.tokenizer import build_char_tokenizer
from tests.bad_inputs import ROOT
from tests.bad_inputs.stores import CASES, store, store_records
from tests.helpers import TINY

PREFIX = "error: stage grpo: data.harvest=DIR/store: "


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def refusal(tmp_path, tok, **kw) -> str:
    """load_experience's message (DIR for tmp_path); check_store must refuse with the same one."""
    with pytest.raises(StoreDataError) as loaded:
        load_experience(tmp_path / "store", tok, "refuse", vocab_size=len(tok), **kw)
    with pytest.raises(StoreDataError) as checked:
        check_store(tmp_path / "store", tok, "refuse", vocab_size=len(tok), **kw)
    assert str(loaded.value) == str(checked.value)
    assert "\n" not in str(loaded.value)
    return str(loaded.value).replace(str(tmp_path), "DIR")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_tampered_store_is_refused_when_harvested(case, tmp_path, tok):
    case.setup(tmp_path)
    assert PREFIX + refusal(tmp_path, tok) == case.message


def full_records() -> list:
    """store_records with PPO's per-token fields, an episode's loss mask and turns, an abstained score."""
    records = store_records()
    for r in records:
        n = len(r.completion_ids)
        r.ref_logprobs, r.values, r.returns, r.token_advantages = [-1.0] * n, [0.5] * n, [0.25] * n, [0.0] * n
        r.loss_mask, r.turns = [1] * (n - 1) + [0], [{"kind": "policy", "start": 0, "length": n}]
        r.rewards = {"exact": 1.0, "judge": None}
    return records


def test_an_untouched_store_passes_with_every_per_token_field(tmp_path, tok):
    records = full_records()
    records[3].behaviour_logprobs = None  # a retokenized record: recomputed when harvested
    ExperienceStore(tmp_path / "store", tok).write_round(records, 0)
    assert check_store(tmp_path / "store", tok, "refuse", len(tok)) == 4
    assert len(load_experience(tmp_path / "store", tok, "refuse", len(tok))) == 4


def edit(tmp_path, tok, column: str, value) -> None:
    """A store of full_records with row 2's `column` set to `value` (pyarrow, the store's metadata kept)."""
    path = ExperienceStore(tmp_path / "store", tok).write_round(full_records(), 0)
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[2][column] = value
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


FIELDS = [
    ("loss_mask", [1, 2], "loss_mask[1] is 2 (each must be 0 or 1)"),
    ("ref_logprobs", [-1.0, math.inf], "ref_logprobs[1] is inf (each must be finite)"),
    ("values", [0.5], "values has 1 values for 2 completion tokens (one per completion token)"),
    ("token_advantages", [0.0, None], "token_advantages[1] is None (each must be finite)"),
    ("prompt_ids", [3, -1], "prompt_ids holds token id -1, outside the model's vocabulary of 100 ids (0..99)"),
    ("completion_ids", None, "completion_ids is missing (null)"),
    ("group_id", None, "group_id is missing (null) (must be a whole number)"),
    ("rewards", '{"exact": NaN}', "rewards['exact'] is nan (must be a finite number or null)"),
    ("turns", "[" * 5000 + "]" * 5000, "turns is not readable JSON (nested deeper than the parser's limit"),
]


@pytest.mark.parametrize("column, value, expected", FIELDS, ids=[f[0] for f in FIELDS])
def test_each_field_is_checked_by_what_it_holds(tmp_path, tok, column, value, expected):
    edit(tmp_path, tok, column, value)
    assert refusal(tmp_path, tok).startswith(f"DIR/store/round_00000.parquet row 2: {expected}")


def test_retokenized_stores_keep_the_other_checks_but_not_the_vocabulary(tmp_path, tok, monkeypatch):
    """Another tokenizer's ids are re-encoded from the texts, so they are not bounded by this vocabulary;
    a NaN reward is still refused (retokenizing keeps the rewards)."""
    import data_modules.store as store_mod
    store(lambda row: row.__setitem__("prompt_ids", [150, 3]))(tmp_path)
    monkeypatch.setattr(store_mod, "tokenizer_fingerprint", lambda t: "another-tokenizer")
    assert len(load_experience(tmp_path / "store", tok, "retokenize", vocab_size=len(tok))) == 4
    for f in (tmp_path / "store").iterdir():
        f.unlink()
    store(lambda row: row.__setitem__("reward", math.nan))(tmp_path)
    with pytest.raises(StoreDataError, match=r"row 2: reward is nan"):
        check_store(tmp_path / "store", tok, "retokenize", vocab_size=len(tok))


def test_a_file_missing_a_column_or_of_another_type(tmp_path, tok):
    path = ExperienceStore(tmp_path / "store", tok).write_round(store_records(), 0)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["completion_ids"]), path)
    with pytest.raises(StoreDataError, match=r"round_00000.parquet: no column\(s\) \['completion_ids'\]"):
        check_store(tmp_path / "store", tok)
    strings = table.set_column(table.column_names.index("reward"), "reward", pa.array(["1"] * 4))
    pq.write_table(strings, path)
    with pytest.raises(StoreDataError, match="column reward holds string, not numbers"):
        check_store(tmp_path / "store", tok)


def test_train_py_refuses_a_tampered_store_in_one_line_before_any_model(tmp_path):
    """As a user runs it (≈7 s): exit 1, the one line on stderr, nothing on stdout about a stage starting."""
    [case] = [c for c in CASES if c.id == "store-token-id"]
    case.setup(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WANDB_API_KEY")}
    env |= {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    argv = [a.replace("DIR", str(tmp_path)) for a in case.argv] + TINY + [f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, "train.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [case.message.replace("DIR", str(tmp_path))], proc.stderr[-3000:]
    assert "=== stage" not in proc.stdout
