"""The `reward` group (conf/reward): reward=code_exec and its sandbox are closed (the sandbox's limits
are what keeps a model's code in its box: a zero limit fails every run, silently scored 0); other sources
are open, with the keys every source shares typed."""
from __future__ import annotations

from rewards.sandbox import BACKENDS
from run.validation.schemas.base import (Bool, Node, OpenNode, OptionalPath, PositiveInt,
                                          PositiveNumber, Text, choice, must, optional)


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


class Weighted(AnySource):
    """rewards.weighted.WeightedReward: several sources, each with a weight."""
    missing: choice("abstain", "renormalize") = None


SCHEMAS = {"rewards.code_exec.CodeExecReward": CodeExec, "rewards.weighted.WeightedReward": Weighted}
FALLBACK = AnySource
