"""envs/chat_tools.py: tool calls in the chat template's own format (env=chat_calculator).

The trained ids of a chat tool episode must be exactly what the model's chat template renders for the same
conversation (tools listed in the system turn, the call, the `tool` message, the answer): a separator
dropped or repeated between turns silently trains the policy on text it never sees at serving time."""
from __future__ import annotations

import functools

import pytest

from envs.chat_tools import ChatRendering, ChatToolEnv, call_text, parse_call, tool_schema
from envs.rollout import play, run_episodes
from envs.tools import calculator
from generators.base import GenerationOutput
from models.bpe import IM_END, build_bpe_tokenizer, chat_stop_ids
from tasks.base import Example

CALC = functools.partial(calculator, max_digits=30, max_exponent=100)
EXAMPLE = Example("123*45=", "5535", {"calls": [["calculator", "123*45"]]})


@pytest.fixture(scope="module")
def tok():
    return build_bpe_tokenizer()


def make_env(max_observation_tokens: int = 64):
    return ChatToolEnv({"calculator": CALC}, max_tool_calls=2, max_turns=3,
                       max_observation_tokens=max_observation_tokens, round_tool_seconds=60, tool_workers=1)


def rendered(tok, env, messages) -> list[int]:
    text = tok.apply_chat_template(messages, tools=env.tool_schemas, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def conversation(result: str = "5535"):
    call = {"name": "calculator", "arguments": {"expression": "123*45"}}
    return [{"role": "user", "content": "123*45="}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": result}, {"role": "assistant", "content": "5535"}]


def test_schema_lists_only_the_arguments_the_config_did_not_bind():
    schema = tool_schema("calculator", CALC)["function"]
    assert schema["name"] == "calculator" and schema["description"].startswith("Evaluate an arithmetic expression")
    assert schema["parameters"] == {"type": "object", "properties": {"expression": {"type": "string"}},
                                    "required": ["expression"]}


def test_a_demonstration_is_exactly_the_templates_rendering_of_the_conversation(tok):
    env = make_env()
    ep = play(env, tok, EXAMPLE, env.demonstration(EXAMPLE))
    full = rendered(tok, env, conversation())
    newline = tok("\n", add_special_tokens=False)["input_ids"]  # the template closes the last turn with "\n"
    assert ep.prompt_ids + ep.completion_ids + newline == full
    kinds = [(t.kind, t.tool) for t in ep.turns]
    assert kinds == [("policy", None), ("observation", "calculator"), ("policy", None)]
    obs = ep.turns[1]
    assert set(ep.loss_mask[obs.start: obs.start + obs.length]) == {0}
    im_end = tok.convert_tokens_to_ids(IM_END)
    call = ep.completion_ids[: ep.turns[0].length]
    assert call[-1] == im_end and im_end not in ep.completion_ids[obs.start: obs.start + 1]  # no doubled turn end
    assert tok.decode(call[:-1]) == call_text("calculator", {"expression": "123*45"})


def test_parse_and_refuse(tok):
    assert parse_call("5535") is None
    assert parse_call(call_text("calculator", {"expression": "2*3"})) == ("calculator", {"expression": "2*3"})
    assert parse_call('<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}\n</tool_call>') \
        == ("calculator", {"expression": "1"})
    assert parse_call("<tool_call>{").startswith("no closing")
    assert "not JSON" in parse_call("<tool_call>{nope}</tool_call>")
    env = make_env()
    env.reset(EXAMPLE)
    assert env.step(call_text("calculator", {"expression": "2*3"})).observation == "6"
    bypass = env.step(call_text("calculator", {"expression": "9**9**9", "max_exponent": 10**9}))
    assert bypass.malformed and "unknown arguments ['max_exponent']" in bypass.observation  # bound keys stay bound
    assert env.step(call_text("search", {"q": "x"})).malformed
    assert env.step("5535").done


class Scripted:
    """A generator that returns the given turns (ids) in order, one per call, for a single episode."""

    max_new_tokens = 200

    def __init__(self, turns):
        self.turns, self.contexts = list(turns), []

    def sample(self, model, tokenizer, prompts, greedy=False, stop_sequences=None, max_new_tokens=None):
        self.contexts.append(list(prompts[0]))
        ids = self.turns.pop(0)
        return GenerationOutput([ids], [[-0.5] * len(ids)], 0.0)


class ChatModelStub:
    class generation_config:  # noqa: N801 - the attribute shape of a transformers GenerationConfig
        eos_token_id = None

    class config:  # noqa: N801
        max_position_embeddings = 4096


def test_rollout_continues_after_a_call_that_ended_its_turn_and_appends_the_rendered_tool_message(tok):
    ChatModelStub.generation_config.eos_token_id = chat_stop_ids(tok)
    im_end = tok.convert_tokens_to_ids(IM_END)
    call = tok(call_text("calculator", {"expression": "123*45"}), add_special_tokens=False)["input_ids"] + [im_end]
    answer = tok("5535", add_special_tokens=False)["input_ids"] + [im_end]
    gen = Scripted([call, answer])
    played = run_episodes(gen, ChatModelStub, tok, make_env, [EXAMPLE])
    ep = played.episodes[0]
    env = make_env()
    assert ep.prompt_ids + ep.completion_ids + tok("\n", add_special_tokens=False)["input_ids"] == \
        rendered(tok, env, conversation())
    assert gen.contexts[1] == ep.prompt_ids + ep.completion_ids[: len(ep.completion_ids) - len(answer)]
    assert ep.final_text == "5535" and ep.tool_calls == 1 and ep.malformed == 0
    assert ep.logprobs == [-0.5] * len(call) + [0.0] * ep.turns[1].length + [-0.5] * len(answer)


def test_a_call_cut_by_the_length_limit_ends_the_episode(tok):
    ChatModelStub.generation_config.eos_token_id = chat_stop_ids(tok)
    call = tok(call_text("calculator", {"expression": "123*45"}), add_special_tokens=False)["input_ids"]
    played = run_episodes(Scripted([call]), ChatModelStub, tok, make_env, [EXAMPLE])  # no turn-end id
    assert [t.kind for t in played.episodes[0].turns] == ["policy"]


def test_a_long_tool_result_is_cut_before_the_template_wraps_it(tok):
    rendering = ChatRendering(tok)
    env = make_env(max_observation_tokens=2)
    ChatModelStub.generation_config.eos_token_id = chat_stop_ids(tok)
    im_end = tok.convert_tokens_to_ids(IM_END)
    call = tok(call_text("calculator", {"expression": "2**90"}), add_special_tokens=False)["input_ids"] + [im_end]
    played = run_episodes(Scripted([call, [im_end]]), ChatModelStub, tok, lambda: env, [EXAMPLE])
    obs = played.episodes[0].turns[1]
    ids = played.episodes[0].completion_ids[obs.start: obs.start + obs.length]
    cut = tok.decode(tok(str(2**90), add_special_tokens=False)["input_ids"][:2])
    assert ids == rendering.observation_ids(cut, turn_closed=True)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")  # the next turn's header is never cut


def test_the_python_tool_runs_model_code_only_in_the_sandbox(hydra_conf):
    """env=chat_python: the config builds the sandbox (never an in-process exec); the schema offers `code`
    only; a program's output, its failure and an escape attempt all come back as observations."""
    from hydra.utils import instantiate

    cfg = hydra_conf(["env=chat_python"])
    env = instantiate(cfg.env)()
    sandbox = env.tools["python"].keywords["sandbox"]
    assert sandbox.backend in ("bwrap", "unshare")  # isolation, never rlimits alone (allow_weak is false)
    assert env.tool_schemas[0]["function"]["parameters"]["properties"] == {"code": {"type": "string"}}
    env.reset(EXAMPLE)
    run = env.step(call_text("python", {"code": "print(123 * 45)"}))
    assert (run.observation, run.tool, run.malformed) == ("5535", "python", False) and run.seconds > 0
    failed = env.step(call_text("python", {"code": "1 / 0"}))
    assert failed.malformed and failed.observation.startswith("error: ZeroDivisionError")
    seen = env.step(call_text("python", {"code": "import os; print(os.path.exists('/work'), os.environ.get('HOME'))"}))
    assert seen.observation == "False None"  # the host's files and environment are out of reach
    assert "error: tool call limit (3)" in env.step(call_text("python", {"code": "print(1)"})).observation
