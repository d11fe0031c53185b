"""The staleness trigger measures on the run-wide policy version (issue 31, item 11): after a stage of
100 SFT steps a GRPO stage's records say version 100 + k, and its own trainer counts from 0. Comparing the
trainer's step (3) with the oldest served version (100) gave -97: the trigger could never fire."""
from __future__ import annotations

from types import SimpleNamespace

from callbacks.drift import DriftTrigger


def test_staleness_is_measured_in_run_wide_versions():
    trigger = DriftTrigger(min_ess_frac=None, max_kl=None, max_staleness=1)
    trainer = SimpleNamespace(global_step=3, datamodule=SimpleNamespace(round_oldest_version=lambda: 100))
    assert trigger.reason(trainer, SimpleNamespace(policy_version=103, last_diagnostics={})) == "staleness"  # 3 > 1
    assert trigger.reason(trainer, SimpleNamespace(policy_version=101, last_diagnostics={})) is None  # 1, not > 1
