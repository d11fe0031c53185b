"""The `reward` group (conf/reward): reward=code_exec and its sandbox are closed (the sandbox's limits
are what keeps a model's code in its box: a zero limit fails every run, silently scored 0); other sources
are open, with the keys every source shares typed."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rewards.sandbox import BACKENDS
from run.validation.schemas import generator as generators, model as models
from run.validation.schemas.base import (Bool, Mapping, Node, OpenNode, OptionalPath, PositiveInt, PositiveNumber,
                                          Text, choice, must, node, optional)


class Sandbox(Node):
    """rewards.sandbox.Sandbox (`_partial_`): the OS-level limits of one run of a model's code."""
    backend: choice("auto", *BACKENDS) = None
    python: OptionalPath = None
    cpu_seconds: PositiveNumber = None
    memory_mb: PositiveInt = None
    max_processes: PositiveInt = None
    max_file_mb: PositiveInt = None
    tmpfs_mb: PositiveInt = None
    wall_seconds: PositiveNumber = None
    max_output_kb: PositiveInt = None
    protect: must(list[str | None] | None, "a list of paths the code may not read") = None
    key: Text = None
    weak_key: Text = None


class AnySource(OpenNode):
    """Any reward source: its name and time limits."""
    name: Text = None
    timeout_s: PositiveNumber = None
    per_sample_timeout_s: optional(PositiveNumber, "for none") = None
    workers: PositiveInt = None


class CodeExec(Node):
    """rewards.code_exec.CodeExecReward: a completion's unit tests run in the sandbox."""
    name: Text = None
    allow_weak_sandbox: Bool = None
    per_test_seconds: PositiveNumber = None
    workers: PositiveInt = None
    timeout_s: PositiveNumber = None
    sandbox: Sandbox = None


class Verifier(Node):
    """rewards.verifier.ExactMatchVerifier and rewards.math_answer.MathAnswerVerifier."""
    name: Text = None
    timeout_s: PositiveNumber = None


class Function(Node):
    """rewards.verifier.FunctionReward: a user's scoring function."""
    name: Text = None
    version: Text = None
    fn: Mapping = None
    per_sample_timeout_s: optional(PositiveNumber, "for none") = None
    timeout_s: PositiveNumber = None


class RmBuild(OpenNode):
    """rewards.rm_builder.build_pairwise_rm: trains a small reward model where none is saved yet."""
    task: must(dict | str, "a task node") = None
    steps: PositiveInt = None
    batch_size: PositiveInt = None
    lr: PositiveNumber = None
    hidden_size: PositiveInt = None
    num_layers: PositiveInt = None
    num_heads: PositiveInt = None
    intermediate_size: PositiveInt = None
    seed: must(Annotated[int, Field(ge=0)], "an integer ≥ 0") = None


class RewardModel(Node):
    """rewards.reward_model.RewardModelSource: a trained reward model's score."""
    name: Text = None
    path: OptionalPath = None
    template: Text = None
    batch_size: PositiveInt = None
    max_length: PositiveInt = None
    device: optional(Text, "(the policy's device)") = None
    timeout_s: PositiveNumber = None
    build: node({}, RmBuild, "null or a builder node ({_target_: ..., _partial_: true})") = None


class JudgeParser(OpenNode):
    """rewards.judge.parse_score: the first number matching `pattern`, in [low, high]."""
    pattern: Text = None
    low: must(float, "a number") = None
    high: must(float, "a number") = None


class Judge(Node):
    """rewards.judge.JudgeReward: an LLM judge through the generator seam."""
    name: Text = None
    model: node(models.SCHEMAS, models.FALLBACK, "a model node (${model}: the policy's)") = None
    generator: node(generators.SCHEMAS, generators.FALLBACK, "a generator node ({_target_: generators.hf.HFGenerator})") = None
    template: Text = None
    parser: node({}, JudgeParser, "a parser node ({_target_: ..., _partial_: true})") = None
    chat: Bool = None
    cache_size: PositiveInt = None
    device: optional(Text, "(the policy's device)") = None
    timeout_s: PositiveNumber = None


SOURCES: dict = {}  # filled below: a weighted reward's sources are reward nodes too


class WeightedEntry(Node):
    """One source of a weighted reward: its weight and its node."""
    weight: must(float, "a number") = None
    source: node(SOURCES, AnySource, "a reward node ({_target_: ...})", nullable=False) = None


class Weighted(AnySource):
    """rewards.weighted.WeightedReward: several sources, each with a weight."""
    model_config = Node.model_config
    missing: choice("abstain", "renormalize") = None
    sources: node({}, WeightedEntry, "a mapping of source names to {weight, source}", each=True,
                  nullable=False, non_empty=True) = None
    gold: node(SOURCES, AnySource, "null or a reward node ({_target_: ...}): logged, never trained on") = None


SCHEMAS = {"rewards.code_exec.CodeExecReward": CodeExec, "rewards.weighted.WeightedReward": Weighted,
           "rewards.verifier.ExactMatchVerifier": Verifier, "rewards.math_answer.MathAnswerVerifier": Verifier,
           "rewards.verifier.FunctionReward": Function, "rewards.reward_model.RewardModelSource": RewardModel,
           "rewards.judge.JudgeReward": Judge}
SOURCES.update(SCHEMAS)
FALLBACK = AnySource
