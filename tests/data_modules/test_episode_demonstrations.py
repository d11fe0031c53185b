"""data=episode_demonstrations: teacher episodes played against the environment, with the rollout's tokens."""
from __future__ import annotations

from functools import partial

from data_modules.episode_demonstrations import EpisodeDemonstrationsDataModule
from envs.rollout import demonstration
from envs.tool_env import ToolEnv
from envs.tools import calculator
from models.tokenizer import build_char_tokenizer
from tasks.tool_arithmetic import tool_arithmetic_task

ENV = partial(ToolEnv, tools={"calculator": partial(calculator, max_digits=30, max_exponent=100)},
              format={"open": "[", "close": "]", "separator": ":"}, result_prefix="=", result_suffix=";",
              max_tool_calls=2, max_turns=3, max_observation_tokens=16, round_tool_seconds=60, tool_workers=1)


def test_demonstrations_hold_the_call_the_observation_without_loss_and_the_answer():
    tok = build_char_tokenizer()
    task = tool_arithmetic_task(3, 2, 10, "calculator", 0.5, 0)
    dm = EpisodeDemonstrationsDataModule(task, tok, 8, 8, 0, "teacher", 40, partial(demonstration, make_env=ENV))
    assert len(dm.records) == 40 and len(dm.heldout_records) == 10
    called = 0
    for r, ex in zip(dm.records, task.train):
        text = tok.decode(r.completion_ids)
        assert r.prompt_ids == tok(ex.prompt)["input_ids"] and r.completion_ids[-1] == tok.eos_token_id
        if ex.meta["calls"]:
            called += 1
            call, obs = f"[calculator:{ex.prompt[:-1]}]", f"={ex.answer};"
            assert text == f"{call}{obs}{ex.answer}<eos>"
            assert r.loss_mask == [1] * len(call) + [0] * len(obs) + [1] * (len(ex.answer) + 1)
            assert [t["kind"] for t in r.turns] == ["policy", "observation", "policy"]
        else:
            assert text == f"{ex.answer}<eos>" and r.loss_mask == [1] * (len(ex.answer) + 1)
    assert 0 < called < 40
