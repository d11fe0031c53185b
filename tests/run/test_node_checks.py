"""Checks around the nodes issue 31 found unchecked, beyond the one-line cases of tests/bad_inputs/nodes.py:
the python tool's sandbox names its own keys when it refuses to start."""
from __future__ import annotations

import pytest
from hydra.utils import instantiate

from rewards.sandbox import SandboxUnavailable


def test_the_python_tools_weak_sandbox_refusal_names_its_own_keys(hydra_conf):
    """It named reward.sandbox.* and reward.allow_weak_sandbox, keys env=chat_python does not have."""
    cfg = hydra_conf(["env=chat_python", "env.tools.python.sandbox.backend=rlimits"])
    with pytest.raises(Exception) as e:  # Hydra's InstantiationException, from the sandbox's refusal
        instantiate(cfg.env.tools.python.sandbox)
    assert isinstance(e.value.__cause__, SandboxUnavailable)
    message = str(e.value.__cause__)
    assert message.startswith("env.tools.python.sandbox.backend=rlimits isolates nothing.")
    assert "Set env.tools.python.sandbox.allow_weak=true to accept that" in message
    assert "reward." not in message


def test_code_exec_keeps_its_own_keys(hydra_conf):
    cfg = hydra_conf(["reward=code_exec", "reward.sandbox.backend=rlimits"])
    with pytest.raises(SandboxUnavailable, match=r"^reward\.sandbox\.backend=rlimits .*Set reward\.allow_weak_sandbox=true"):
        instantiate(cfg.reward.sandbox)(allow_weak=False)
