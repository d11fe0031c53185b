"""Tasks: the arithmetic split and the jsonl loader, whose every error names file and line."""
from __future__ import annotations

import json

import pytest

from tasks.arithmetic import arithmetic_task
from tasks.jsonl import DataFileError, jsonl_task, read_examples


# ---------------------------------------------------------------- arithmetic
def test_arithmetic_split_is_disjoint_complete_and_correct():
    task = arithmetic_task(digits=1, num_heldout=10, seed=0)
    train, held = {ex.prompt for ex in task.train}, {ex.prompt for ex in task.heldout}
    assert len(task.train) == 90 and len(task.heldout) == 10
    assert not train & held
    assert train | held == {f"{a}+{b}=" for a in range(10) for b in range(10)}
    for ex in task.train + task.heldout:
        a, b = ex.prompt.rstrip("=").split("+")
        assert ex.answer == str(int(a) + int(b))
    assert task.name == "arithmetic1" and task.chat is False


def test_arithmetic_split_is_deterministic_by_seed():
    one, again = arithmetic_task(2, 50, seed=3), arithmetic_task(2, 50, seed=3)
    assert one.train == again.train and one.heldout == again.heldout
    other = arithmetic_task(2, 50, seed=4)
    assert {e.prompt for e in other.heldout} != {e.prompt for e in one.heldout}


def test_arithmetic_operands_max_and_too_many_heldout():
    task = arithmetic_task(digits=2, num_heldout=5, seed=0, operands_max=4)
    assert len(task.train) + len(task.heldout) == 16
    with pytest.raises(ValueError, match="num_heldout"):
        arithmetic_task(digits=1, num_heldout=100, seed=0)


# ---------------------------------------------------------------- jsonl
def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


GOOD = [json.dumps({"prompt": f"What is {i}+1?", "answer": str(i + 1), "level": i}) for i in range(5)]


def test_a_flawed_teacher_writes_the_demonstrations_and_the_truth_scores_them():
    """task.teacher=no_carry_at_ten (the default run's teacher): it forgets the carry exactly when the ones
    digits sum to 10 (9 of the 100 ones-digit pairs); the reference answer stays the true sum, so rewards and
    evaluation score the truth, and the SFT records hold the teacher's text."""
    from data_modules.demonstrations import DemonstrationsDataModule
    from models.tokenizer import build_char_tokenizer
    from tasks.arithmetic import teacher_answer

    assert [teacher_answer(a, b, "no_carry_at_ten") for a, b in [(37, 53), (5, 5), (19, 91), (37, 54), (12, 3)]] \
        == ["80", "0", "100", "91", "15"]
    assert teacher_answer(37, 53, "exact") == "90"
    task = arithmetic_task(digits=2, num_heldout=100, seed=0, teacher="no_carry_at_ten")
    flawed = [ex for ex in task.train if "demonstration" in ex.meta and ex.meta["demonstration"] != ex.answer]
    assert len(flawed) / len(task.train) == pytest.approx(0.09, abs=0.01)
    assert all(int(ex.meta["demonstration"]) == int(ex.answer) - 10 for ex in flawed)
    tok = build_char_tokenizer()
    dm = DemonstrationsDataModule(task, tok, batch_size=8, micro_batch_size=8, seed=0, source="teacher",
                                  max_examples=None)
    by_prompt = {r.prompt_text: r for r in dm.epoch_records()}
    for ex in flawed[:5]:
        r = by_prompt[ex.prompt]
        assert r.completion_text == ex.meta["demonstration"] and r.answer == ex.answer
        assert tok.decode(r.completion_ids[:-1]) == ex.meta["demonstration"]
    with pytest.raises(ValueError, match="task.teacher='sloppy'"):
        arithmetic_task(digits=2, num_heldout=10, seed=0, teacher="sloppy")


def test_jsonl_good_file(tmp_path):
    path = write(tmp_path / "train.jsonl", GOOD[:2] + [""] + GOOD[2:])  # a blank line 3 is skipped
    task = jsonl_task(path, None, chat=False, num_heldout=2, prompt_key="prompt", answer_key="answer")
    assert task.name == "train"
    assert [e.answer for e in task.train] == ["1", "2", "3"]
    assert [e.answer for e in task.heldout] == ["4", "5"]  # the last num_heldout lines
    assert task.train[0].prompt == "What is 0+1?"
    assert task.train[2].meta == {"level": 2, "origin": "train.jsonl:4",  # line numbers count the blank
                                  "source_file": str((tmp_path / "train.jsonl").resolve())}  # for the sandbox
    assert task.heldout[-1].meta["origin"] == "train.jsonl:6"


def test_jsonl_separate_heldout_file_and_custom_keys(tmp_path):
    rows = [json.dumps({"q": f"q{i}", "a": f"a{i}"}) for i in range(3)]
    train = write(tmp_path / "t.jsonl", rows)
    held = write(tmp_path / "h.jsonl", rows[:1])
    task = jsonl_task(train, held, chat=True, num_heldout=50, prompt_key="q", answer_key="a")
    assert len(task.train) == 3 and [e.prompt for e in task.heldout] == ["q0"] and task.chat


def test_jsonl_missing_file_names_the_path(tmp_path):
    missing = str(tmp_path / "nope" / "train.jsonl")
    with pytest.raises(DataFileError, match="not found") as e:
        jsonl_task(missing, None, chat=False, num_heldout=1, prompt_key="prompt", answer_key="answer")
    assert missing in str(e.value)
    with pytest.raises(DataFileError) as e:  # a missing held-out file is named too
        jsonl_task(write(tmp_path / "t.jsonl", GOOD), missing, False, 1, "prompt", "answer")
    assert missing in str(e.value)


@pytest.mark.parametrize("bad_line,words", [
    ('{"prompt": "1+1=", "answer": ', "JSON"),                 # truncated JSON
    ('["1+1=", "2"]', "object"),                                 # not an object
    ('{"answer": "2"}', "prompt-only {prompt}"),                  # missing prompt: fits no format
    ('{"prompt": "1+1=", "answer": "   "}', "'answer'"),         # blank answer
    ('{"prompt": "", "answer": "2"}', "'prompt'"),               # empty prompt
    ('{"prompt": "1+1=", "answer": null}', "'answer'"),          # null answer
])
def test_jsonl_bad_line_names_file_and_line(tmp_path, bad_line, words):
    path = write(tmp_path / "data.jsonl", GOOD[:2] + [bad_line] + GOOD[2:])
    with pytest.raises(DataFileError) as e:
        read_examples(path)
    assert f"{path}:3" in str(e.value) and words in str(e.value)


def test_jsonl_empty_file_and_too_many_heldout(tmp_path):
    empty = write(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DataFileError, match="no examples") as e:
        read_examples(empty)
    assert empty in str(e.value)
    small = write(tmp_path / "small.jsonl", GOOD[:3])
    with pytest.raises(DataFileError, match="num_heldout") as e:
        jsonl_task(small, None, chat=False, num_heldout=3, prompt_key="prompt", answer_key="answer")
    assert small in str(e.value)


# ---------------------------------------------------------------- through the compose path
def data_file_error(exc: BaseException) -> bool:
    """A DataFileError, possibly wrapped by Hydra's InstantiationException (which keeps the message)."""
    return isinstance(exc, DataFileError) or isinstance(exc.__cause__, DataFileError)


def test_plan_stages_reports_missing_task_file_before_any_model(hydra_conf, tmp_path, monkeypatch):
    """plan_stages composes and validates every stage and loads the task files; it builds no model."""
    import models.tiny
    from run.stages import plan_stages

    def no_model(**_):
        raise AssertionError("a model was built before the task file was checked")

    monkeypatch.setattr(models.tiny, "build_tiny", no_model)
    missing = str(tmp_path / "missing.jsonl")
    ov = ["task=jsonl", f"task.train_path={missing}"]
    with pytest.raises(Exception) as e:
        plan_stages(hydra_conf(ov), ov)
    assert data_file_error(e.value) and missing in str(e.value)


def test_plan_stages_reports_malformed_task_file_line(hydra_conf, tmp_path):
    from run.stages import plan_stages
    path = write(tmp_path / "bad.jsonl", GOOD + ["{oops"] + GOOD)
    ov = ["task=jsonl", f"task.train_path={path}", "task.num_heldout=2"]
    with pytest.raises(Exception) as e:
        plan_stages(hydra_conf(ov), ov)
    assert data_file_error(e.value) and f"{path}:6" in str(e.value)


def test_plan_stages_loads_a_good_task_file_for_every_stage(hydra_conf, tmp_path):
    from run.stages import plan_stages
    path = write(tmp_path / "good.jsonl", GOOD)
    ov = ["task=jsonl", f"task.train_path={path}", "task.num_heldout=1"]
    stages = plan_stages(hydra_conf(ov), ov)
    assert [s.name for s in stages] == ["sft", "grpo"]
    assert all(len(s.task.train) == 4 and len(s.task.heldout) == 1 for s in stages)


def test_encode_prompt_plain_and_chat():
    from models.tokenizer import build_char_tokenizer
    from tasks.base import encode_completion, encode_prompt
    tok = build_char_tokenizer()
    assert encode_prompt(tok, "1+2=", chat=False) == [tok.bos_token_id] + tok("1+2=", add_special_tokens=False)[
        "input_ids"]
    assert encode_completion(tok, "3") == tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    with pytest.raises(ValueError, match="chat template"):
        encode_prompt(tok, "1+2=", chat=True)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}A:{% endif %}")
    ids = encode_prompt(tok, "1+2=", chat=True)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == "<user>1+2=A:"
