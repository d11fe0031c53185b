"""policyshift.train takes a model, a dataset and a reward as TRL's trainers do (policyshift/inputs.py): a
PreTrainedModel object or a model folder, a datasets.Dataset in any of TRL's formats, a reward callable; each
through the real train path, at tiny size."""
from __future__ import annotations

import json

import pytest
from datasets import Dataset

import policyshift
from run.errors import ConfigError
from tests.helpers import CHAT_MODEL, TINY

QUIET = ["callbacks.progress.refresh_rate=0", "logger=none"]
SUMS = [f"{a}+{b}=" for a in range(1, 7) for b in range(1, 5)]  # 24 prompts


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    from models.synthetic import write_qwen_like
    return write_qwen_like(tmp_path_factory.mktemp("chat"), tokenizer="bpe", **CHAT_MODEL)


def test_a_model_object_and_a_text_dataset_train_sft_on_every_token(tmp_path, chat_folder):
    """A loaded PreTrainedModel is saved to the run folder and trained from there; {"text"} rows choose
    data=conversations (language modeling: every token trains)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(chat_folder)
    rows = Dataset.from_list([{"text": f"{s}{eval(s[:-1])}"} for s in SUMS])
    out = tmp_path / "run"
    summary = policyshift.train(["algorithm=sft", "trainer.max_steps=2", "data.batch_size=4"] + QUIET,
                                output_dir=out, model=model, train_dataset=rows)
    assert summary["sft"]["train/steps"] == 2
    assert (out / "inputs" / "model" / "config.json").is_file() and (out / "inputs" / "model" / "tokenizer.json").is_file()
    written = [json.loads(line) for line in (out / "inputs" / "train.jsonl").read_text().splitlines()]
    assert written == rows.to_list()
    config = (out / "config.yaml").read_text()
    assert "data_modules.conversations.ConversationsDataModule" in config and str(out / "inputs" / "model") in config


SEEN: list[str] = []


def test_conversational_prompts_and_a_reward_callable_train_grpo(tmp_path, chat_folder, capsys):
    """TRL's conversational prompt-only rows (which used to fail: prompts had to be strings) are RL prompts,
    rendered with the model's chat template; the reward callable scores them. Prompt-only rows have no
    reference answer: no held-out accuracy (exact match would score every answer wrong)."""
    SEEN.clear()

    def reward(prompts, completions, examples):
        SEEN.extend(prompts)
        return [len(c) % 3 / 2 for c in completions]

    rows = Dataset.from_list([{"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": s}]}
                              for s in SUMS])
    summary = policyshift.train(["algorithm=grpo", "trainer.max_steps=1", "data.prompts_per_round=4",
                                 "data.batch_size=8", "algorithm.group_size=2", "generator.max_new_tokens=4",
                                 "task.num_heldout=4", "callbacks.evaluate.num_examples=4"] + QUIET,
                                output_dir=tmp_path / "run", model=str(chat_folder), train_dataset=rows,
                                reward_fn=reward)
    assert summary["grpo"]["train/steps"] == 1
    assert SEEN and all(p.startswith("system: Add.\nuser: ") for p in SEEN)
    assert "val/accuracy" not in summary["grpo"]
    assert "[eval] no held-out accuracy on task 'train': its held-out rows are prompt-only" in capsys.readouterr().out


def test_conversational_preferences_train_dpo(tmp_path, chat_folder):
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": s}],
                               "chosen": [{"role": "assistant", "content": str(eval(s[:-1]))}],
                               "rejected": [{"role": "assistant", "content": str(eval(s[:-1]) + 1)}]} for s in SUMS])
    summary = policyshift.train(["algorithm=dpo", "trainer.max_steps=2", "data.batch_size=4", "data.num_heldout=4"]
                                + QUIET, output_dir=tmp_path / "run", model=str(chat_folder), train_dataset=rows)
    assert summary["dpo"]["train/steps"] == 2


def test_a_dataset_without_a_chat_template_is_refused_at_plan_time(tmp_path):
    """Conversational prompts for model=tiny (a character tokenizer, no chat template): one line, before
    any model is built, naming the row."""
    rows = [{"prompt": [{"role": "user", "content": s}]} for s in SUMS]
    with pytest.raises(ConfigError, match=r"train.jsonl:1 is a conversational row but model=tiny's character "
                                          r"tokenizer has no chat template"):
        policyshift.train(TINY + ["algorithm=grpo"], output_dir=tmp_path / "run", train_dataset=rows)


def test_conflicting_inputs_are_refused(tmp_path, chat_folder):
    with pytest.raises(ConfigError, match="model.name_or_path"):
        policyshift.train(["model=tiny"], output_dir=tmp_path / "a", model=str(chat_folder))
    with pytest.raises(ConfigError, match="task.train_path"):
        policyshift.train(["task=jsonl", "task.train_path=x.jsonl"], output_dir=tmp_path / "b",
                          train_dataset=[{"prompt": "1+1="}])
    with pytest.raises(ConfigError, match="one split"):
        from datasets import DatasetDict
        policyshift.train([], output_dir=tmp_path / "c",
                          train_dataset=DatasetDict({"train": Dataset.from_list([{"prompt": "1+1="}])}))
