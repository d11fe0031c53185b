"""What a resumed stage reports: the held-out accuracy it started from (checkpointed, never re-measured),
the console line for it, and the W&B run it continues (in-process, no training)."""
from __future__ import annotations

from types import SimpleNamespace

from lightning.pytorch.callbacks import TQDMProgressBar

import callbacks.evaluate as evaluate_module
from callbacks.evaluate import HeldOutEvaluation
from hardware.console import say
from run.stages import build_loggers, set_run_fields
from tests.helpers import TINY


def fake_trainer(step: int = 0):
    bar = TQDMProgressBar(refresh_rate=5)  # enabled, but no bar is open yet (as at fit start)
    return SimpleNamespace(is_global_zero=True, progress_bar_callback=bar, global_step=step, loggers=[],
                           callbacks=[], max_steps=100)


def evaluation() -> HeldOutEvaluation:
    task = SimpleNamespace(heldout=[object()] * 20)
    return HeldOutEvaluation(generator=None, verifier="exact", task=task, every_n_steps=5, num_examples=None)


def test_say_prints_before_any_progress_bar_is_open(capsys):
    say(fake_trainer(), "[eval] step 0: held-out greedy accuracy 0.250 on 20")
    assert "[eval] step 0: held-out greedy accuracy 0.250 on 20" in capsys.readouterr().out


def test_a_resumed_stage_keeps_its_start_accuracy_and_prints_it(monkeypatch, capsys):
    accuracies = iter([0.25, 0.5, 0.75])
    monkeypatch.setattr(evaluate_module, "evaluate", lambda *a, **k: {"val/accuracy": next(accuracies),
                                                                     "val/unscored": 0.0,
                                                                     "val/response_len_mean": 3.0})
    first = evaluation()
    first.on_fit_start(fake_trainer(0), SimpleNamespace(policy=None, tokenizer=None))
    first.on_train_batch_end(fake_trainer(5), SimpleNamespace(policy=None, tokenizer=None), None, None, 0)
    state = first.state_dict()

    resumed = evaluation()
    resumed.load_state_dict(state)
    capsys.readouterr()
    resumed.on_fit_start(fake_trainer(7), SimpleNamespace(policy=None, tokenizer=None))  # not measured again
    assert "held-out greedy accuracy before the stage (from the checkpoint): 0.250" in capsys.readouterr().out
    resumed.on_train_end(fake_trainer(10), SimpleNamespace(policy=None, tokenizer=None))
    summary = resumed.summary()
    assert summary["val/accuracy_before"] == 0.25 and summary["val/accuracy_after"] == 0.75
    assert [p["step"] for p in summary["val/curve"]] == [0, 5, 10]
    seconds = [p["seconds"] for p in summary["val/curve"]]
    assert seconds == sorted(seconds)  # the resumed stage's clock continues from its checkpoint's last point


def test_the_wandb_logger_continues_the_run_id_kept_in_run_json(hydra_conf, tmp_path):
    cfg = hydra_conf([o for o in TINY if not o.startswith("logger=")] + ["logger=wandb"])
    set_run_fields(cfg, tmp_path, "grpo", "group", "name", wandb_id="abc12345")
    [wandb] = build_loggers(cfg)
    assert wandb._wandb_init["id"] == "abc12345" and wandb._wandb_init["resume"] == "allow"
