"""The end-of-run table (callbacks/summary.py): rows no stage has are left out, and dollars are labelled
as the estimate they are."""
from __future__ import annotations

import io
import logging

from rich.console import Console

from callbacks.summary import RunSummary


def rendered(summary: RunSummary) -> str:
    out = Console(width=160, file=io.StringIO(), color_system=None, record=True)
    out.print(summary.table())
    return out.export_text() + (summary.footnote() or "")


def test_rows_that_no_stage_has_are_left_out_and_dollars_say_they_are_an_estimate(tmp_path):
    summary = RunSummary(tmp_path / "summary.json")
    summary.add("sft", {"val/accuracy_before": 0.1, "val/accuracy_after": 0.8, "cost/usd": 0.002,
                        "train/steps": 3, "wall_seconds": 3.5})
    summary.add("grpo", {"val/accuracy_before": 0.8, "val/accuracy_after": 0.9, "rollout/reward_mean": 0.7,
                         "train/steps": 4, "wall_seconds": 9.0})
    text = rendered(summary)
    assert "val/pref_accuracy_before" not in text and "rollout/replay_frac_mean" not in text
    assert "rollout/reward_mean " in text  # one stage has it: its row stays, "-" for the other
    assert "cost/usd*" in text and "an estimate at the configured prices" in text


def test_a_run_without_prices_has_no_dollar_caption(tmp_path):
    summary = RunSummary(tmp_path / "summary.json")
    summary.add("sft", {"val/accuracy_after": 0.8, "train/steps": 3})
    assert "estimate" not in rendered(summary)


def test_lightnings_advert_and_device_lines_are_dropped_and_its_other_lines_kept():
    from callbacks.progress import QuietLightning
    quiet = QuietLightning()

    def passes(msg: str, level: int = logging.INFO) -> bool:
        return quiet.filter(logging.LogRecord("lightning", level, __file__, 1, msg, None, None))

    for noise in ("GPU available: False, used: False", "TPU available: False, using: 0 TPU cores",
                  "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]",
                  "`Trainer.fit` stopped: `max_steps=3` reached."):
        assert not passes(noise), noise
    assert passes("Restoring states from the checkpoint path at x.ckpt")
    assert passes("GPU available: True (cuda), used: False", level=logging.WARNING)  # a warning is never dropped


def test_sfts_held_out_loss_is_in_the_table(tmp_path):
    """A conversations run's SFT stage has no verifier accuracy to show; its held-out loss before and after
    (callbacks/heldout_loss.py's summary) was missing from the table."""
    summary = RunSummary(tmp_path / "summary.json")
    summary.add("sft", {"val/loss_before": 4.61, "val/loss_after": 0.23, "train/steps": 3})
    text = rendered(summary)
    assert "val/loss_before" in text and "4.610" in text and "val/loss_after" in text and "0.230" in text
