"""What makes a stage resumable beyond Lightning's own checkpoint: atomic writes, RNG states, and a
checkpoint on SIGTERM/SIGINT.

What checkpoints/<stage>/ holds (sizes for a policy of P bytes, Adam):
- `last.ckpt` (a link to the newest `epoch=N-step=M.ckpt`, written every `checkpoint_every_n_rounds`
  rounds, or itself on a signal): everything a resume needs: the module's trainable weights (policy,
  a PPO critic, a reward model's head), optimizer and scheduler, loops, data module with its buffer,
  callback state, RNG states; about 3·P. Not the frozen reference (trainers/base.py): it is the
  stage's starting policy, and a resumed stage builds it again exactly as the stage first did: from
  the model config (a seeded init or `model.name_or_path`, which must not change between the kill and
  the resume) for the first stage, from the previous stage's final.ckpt for a later one. With LoRA the
  reference is the base with the adapter disabled: nothing to save. Online DPO's refreshed reference
  (`algorithm.ref_update_every`) is no longer the starting policy: from its first refresh on it is
  kept in the checkpoint (`reference.*`, one P more), the simplest exact resume.
- `final.ckpt` (the stage's end): weights only (`weights_only=True`: no optimizer, scheduler or
  callback state, no reference), about P: all a resume needs of a finished stage (its policy, for the
  next stage: run/stages.py `load_finished_policy`).

- `AtomicCheckpointIO` writes every checkpoint to a temporary file beside its target, fsyncs it and
  renames it into place: a kill or a full disk mid-write leaves the previous checkpoint as it was, and
  the error names the file that could not be written.
- `ResumeState` (added to every stage's callbacks) checkpoints the Python, NumPy and torch RNG states and
  restores them when training restarts (`on_train_start`, after Lightning's restart-time dataloader
  build, which draws from the torch RNG). Resuming from a round-end checkpoint, that dataloader is
  discarded unused: its effect on the data module (epoch counter, a prefetched batch counted as
  served) is undone by re-applying the checkpointed data state, and Lightning is kept from running an
  extra step on it, so the run continues exactly as if never stopped. From a mid-round checkpoint (a
  signal) that dataloader serves the rest of the round: a fresh shuffle of the round's records, not
  the order the stopped run was in (Lightning cannot skip into a plain DataLoader).
- A resume reads every checkpoint with the safe loader (`weights_only=True`: tensors and plain types; a
  pickled object in a run folder is refused naming the file, never run), and each component checks the
  state it is handed (types, ranges, references: data_modules/state_checks.py) before taking any of it.
- `StageEndLoop`: a checkpoint of the stage's end (its last round done) resumes into the stage's end
  (the final evaluation, the ledger, stop_reason), which Lightning would skip; the checkpoint also
  records how many rows the stage's metrics.csv held (callbacks/csv_metrics.py cuts the file back to them).
- During training, SIGTERM/SIGINT end the current optimizer step (at a round's last step: the round,
  with the next one made), write last.ckpt and raise `RunInterrupted`; a second signal stops at once.
"""
from __future__ import annotations

import errno
import os
import pickle
import random
import re
import shutil
import signal
import threading
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.model_helpers import is_overridden
from data_modules.state_checks import StateError, field, integer, mapping, python_rng, sequence, within
from hardware import distributed
from hardware.console import say0

CHECKPOINT_NAME = re.compile(r"epoch=(\d+)-step=(\d+)\.ckpt$")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the previous one is untouched."""

    def __str__(self) -> str:  # the message alone, not OSError's "[Errno 28] ..."
        return str(self.strerror)


class CheckpointReadError(ValueError):
    """A checkpoint a resume reads is not what this project writes (a pickled object, a torn or foreign
    file, a component's state out of range): refused before anything from it is used."""


def load_checkpoint(path: Path) -> dict:
    """A checkpoint from a run folder, loaded with the safe loader (tensors and plain types only: a
    pickled object in the file is refused, never run), or CheckpointReadError naming the file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointReadError(unsafe_checkpoint(path, e)) from None
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointReadError(f"resume: {path} cannot be read as a checkpoint ({' '.join(str(e).split())[:200]}); "
                                  f"restore it from a copy or start a new run") from None
    if not isinstance(state, dict):
        raise CheckpointReadError(f"resume: {path} holds a {type(state).__name__}, not a checkpoint")
    return state


def unsafe_checkpoint(path, error: BaseException) -> str:
    """The one-line refusal of a checkpoint that holds more than tensors and plain types."""
    named = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = f"a call of {named.group(1)}" if named else "something other than tensors and plain types"
    return (f"resume: {path} holds a pickled object the safe loader refuses ({what}); it is not a checkpoint this project wrote (tampered, or from an untrusted source): nothing from it "
            f"was loaded or run")


class RunInterrupted(Exception):
    """Training stopped on a signal after writing `checkpoint` (None: no step had run, nothing written)."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None = None):
        super().__init__(signum, step)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint

    def __str__(self) -> str:
        where = (f"checkpoint written to {self.checkpoint}" if self.checkpoint
                 else "no checkpoint written (no step had run)")
        return f"stopped by {signal.Signals(self.signum).name} at step {self.step}; {where}"


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        atomic_save(checkpoint, Path(path))


def atomic_save(obj, path: Path) -> None:
    """torch.save to `path` via a temporary file in the same folder + fsync + rename (never half a file).
    Any write failure (an OSError, or the RuntimeError torch's zip writer turns it into, e.g. on a full
    disk) removes the temporary file and raises CheckpointWriteError naming `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per process: two writers never share one
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a last.ckpt symlink itself, never the file it points to
    except (OSError, RuntimeError) as e:
        cause = _os_error(e)  # torch's writer raises RuntimeError, the file's OSError as its context
        full = _disk_full(cause, path.parent)  # before the temporary file is removed (it frees the space)
        tmp.unlink(missing_ok=True)
        if not isinstance(e, OSError) and cause is None and not any(s in str(e) for s in WRITER_ERRORS):
            raise  # not a write failure (e.g. a tensor that could not be read): the error as it is
        reason = (cause.strerror or os.strerror(cause.errno)) if cause is not None else " ".join(str(e).split())
        raise CheckpointWriteError(errno.ENOSPC if full else getattr(cause, "errno", None),
                                   f"could not write checkpoint {path}: {reason}; the previous checkpoint in "
                                   f"{path.parent} is intact"
                                   + ("; free some disk space and resume with resume=true" if full else "")) from e


WRITER_ERRORS = ("PytorchStreamWriter", "inline_container", "file write failed", "unexpected pos")


def _os_error(e: BaseException) -> OSError | None:
    """The OSError with an errno that `e` is or was raised from (its cause or context), or None."""
    for _ in range(5):
        if e is None or (isinstance(e, OSError) and e.errno):
            return e
        e = e.__cause__ or e.__context__
    return None


def _disk_full(cause: OSError | None, folder: Path) -> bool:
    if cause is not None:
        return cause.errno == errno.ENOSPC
    try:
        return shutil.disk_usage(folder).free < 1 << 16  # no errno reached us: look at the disk itself
    except OSError:
        return False


def resume_checkpoint(folder: Path) -> Path | None:
    """The checkpoint a resumed stage continues from: last.ckpt, or (killed between ModelCheckpoint's
    unlink and relink of last.ckpt) the periodic checkpoint with the highest step; None if none."""
    last = folder / "last.ckpt"
    if last.is_file():
        return last
    saved = [(int(m.group(2)), p) for p in folder.glob("epoch=*-step=*.ckpt") if (m := CHECKPOINT_NAME.search(p.name))]
    return max(saved)[1] if saved else None


def rng_states() -> dict:
    """Plain types and tensors only: Lightning loads resume checkpoints with torch.load(weights_only=True)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {"python": random.getstate(), "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
              "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def check_rng_states(states) -> None:
    """StateError (data_modules/state_checks.py) naming `rng.<generator>` unless `states` are RNG states
    this process can take: Python's, NumPy's MT19937 (624 words), torch's (its exact byte size)."""
    mapping(states, "rng")
    python_rng(field(states, "python", "rng"), "rng.python")
    numpy = sequence(field(states, "numpy", "rng"), "rng.numpy")
    try:
        kind, keys, pos, has_gauss, gauss = numpy
        np.random.RandomState().set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
        if kind != "MT19937" or len(keys) != 624:
            raise ValueError(f"a {kind} state of {len(keys)} words, not MT19937's 624")
    except (TypeError, ValueError, OverflowError) as e:
        raise StateError("rng.numpy", f"not a NumPy random state ({e})") from None
    for key, state in [("torch", field(states, "torch", "rng"))] + [
            (f"cuda[{i}]", s) for i, s in enumerate(sequence(states.get("cuda", []), "rng.cuda"))]:
        size = torch.get_rng_state().numel() if key == "torch" else None
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or (size and state.numel() != size):
            shape = f"{state.dtype} × {state.numel()}" if isinstance(state, torch.Tensor) else type(state).__name__
            raise StateError(f"rng.{key}", f"not a torch RNG state (a {shape}; torch's is uint8 × {size or 'n'})")


def set_rng_states(states: dict) -> None:
    random.setstate(_as_tuple(states["python"]))
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list) else x


class StageEndLoop(_FitLoop):
    """Lightning's fit loop, except that a fit resumed from a checkpoint of the stage's end (its last round
    done: `trainer.max_steps` reached, or a budget spent) still runs the stage's end: `on_train_start` and
    `on_train_end` (the final evaluation, the ledger, stop_reason, plots), as the killed run was about to.
    Lightning skips the whole loop then, and a run killed after its last checkpoint lost its end."""

    @property
    def skip(self) -> bool:
        return self.trainer.limit_train_batches == 0 or (self.done and not self.restarting)


def use_stage_end_loop(trainer: L.Trainer) -> None:
    """Put StageEndLoop in place of `trainer`'s fit loop (before fit), keeping its epoch loop."""
    old = trainer.fit_loop
    loop = StageEndLoop(trainer, min_epochs=old.min_epochs, max_epochs=old.max_epochs)
    loop.epoch_loop = old.epoch_loop
    trainer.fit_loop = loop


class ResumeState(L.Callback):
    """RNG states and the last train/* values in the checkpoint; the restart's extra dataloader build
    and step undone; a checkpoint on a signal."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, last_path: Path):
        self.last_path = Path(last_path)
        self._restored: dict | None = None  # {"rng": ..., "datamodule": ...} from the checkpoint
        self._signal: int | None = None
        self._previous: dict = {}
        self._stepped = False
        self._start_step: int | None = None  # the step this fit started at (on_train_start)
        self._restarted_at_round_end = False
        self._trainer = None
        self._restored_metrics: dict[str, float] = {}

    # ---- RNG, data state and the last train/* values ---------------------------------------------
    def setup(self, trainer, pl_module, stage):
        self._trainer = trainer

    def state_dict(self) -> dict:
        return {"rng": rng_states(), "train_metrics": self._train_metrics(), "log_rows": self._log_rows()}

    def _log_rows(self) -> int | None:
        """Rows the stage's metrics file holds now (callbacks/csv_metrics.py), or None without one."""
        for logger in getattr(self._trainer, "loggers", []):
            if hasattr(logger, "rows_written"):
                return logger.rows_written()
        return None

    def _train_metrics(self) -> dict[str, float]:
        """The last value of every train/* metric so far: summary.json reports these, and a resumed
        fit's callback_metrics hold only what it logged itself."""
        metrics = self._trainer.callback_metrics if self._trainer is not None else {}
        return {k: float(v) for k, v in metrics.items() if k.startswith("train/")}

    def summary(self) -> dict[str, float]:
        """The train/* values the checkpoint carried (run_stage lays the resumed fit's own over them)."""
        return dict(self._restored_metrics)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:  # before load_state_dict
        """A data module that keeps state (a prompt cursor, a buffer) must find it: Lightning would resume
        without it, from the stream's start, without a word."""
        dm = trainer.datamodule
        key = type(dm).__qualname__ if dm is not None else None
        if key is not None and key not in checkpoint and dm.state_dict():
            raise StateError(key, "missing: the data module's state (its data position, buffer) is not in the checkpoint")
        self._restored = {"datamodule": checkpoint[key]} if key in checkpoint else {}

    def load_state_dict(self, state: dict) -> None:
        with within(f"callbacks.{self.state_key}"):
            check_rng_states(field(state, "rng"))
            if state.get("log_rows") is not None:
                integer(state["log_rows"], "log_rows")
        self._restored = (self._restored or {}) | {"rng": state["rng"]}
        self._restored_metrics = dict(state.get("train_metrics", {}))
        if state.get("log_rows") is not None:  # the metrics file back to the rows this checkpoint had seen
            for logger in getattr(self._trainer, "loggers", []):
                getattr(logger, "keep_rows", lambda rows: None)(state["log_rows"])

    def on_train_start(self, trainer, pl_module):
        self._start_step = trainer.global_step  # a resumed fit starts at its checkpoint's step
        if self._restored is not None:  # after Lightning's restart-time dataloader build
            if trainer.fit_loop.restarted_on_epoch_end:
                self._continue_at_round_end(trainer, pl_module)
            if "rng" in self._restored:  # absent in a checkpoint written before this callback existed
                set_rng_states(self._restored["rng"])
            self._restored = None
        self._install()

    def _continue_at_round_end(self, trainer, pl_module) -> None:
        """Resumed from a round-end checkpoint: the dataloader Lightning built at the restart is
        discarded unused, so undo its effect on the data module; and tell the epoch loop that the
        (absent) validation of the finished epoch is done. Lightning 2.6 otherwise runs one extra
        training step on that dataloader before ending the epoch (its `done` waits for a validation
        run while restarting), which shifts every later round by a step."""
        if "datamodule" in self._restored:
            trainer.datamodule.load_state_dict(self._restored["datamodule"])
        val_loop = trainer.fit_loop.epoch_loop.val_loop
        if not is_overridden("validation_step", pl_module) and hasattr(val_loop, "_has_run"):
            val_loop._has_run = True
            self._restarted_at_round_end = True  # cleared at the (replayed) round end, see there

    # ---- signals -----------------------------------------------------------------------------------
    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self._signal is not None:  # a second signal: stop now, without a checkpoint
            raise KeyboardInterrupt
        self._signal = signum
        if distributed.is_zero():
            print(f"\n[checkpoint] {signal.Signals(signum).name}: stopping after this step and writing "
                  f"{self.last_path} (send it again to stop at once, without a checkpoint)", flush=True)

    def _restore_handlers(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._stepped = True
        if batch_idx + 1 < trainer.num_training_batches:  # on a round's last step: stop at its end, once
            self._stop_if_signalled(trainer)              # the next round is made (an exact resume point)

    def on_train_epoch_end(self, trainer, pl_module):
        if self._restarted_at_round_end:  # the epoch loop ran no step, so Lightning never cleared its
            trainer.fit_loop.epoch_loop.restarting = False  # restart flag: every next epoch would be empty
            self._restarted_at_round_end = False
        self._stop_if_signalled(trainer)  # the round end (the next round made) is a clean point too

    def _stop_if_signalled(self, trainer) -> None:
        """Stop when this rank, or any rank, was signalled: every rank stops after the same step (one
        reduced decision), so the checkpoint they then write together is consistent."""
        signalled = self._signal is not None
        if getattr(trainer, "world_size", 1) > 1:
            signalled = trainer.strategy.reduce_boolean_decision(signalled, all=False)
        if signalled:
            raise RunInterrupted(self._signal or signal.SIGTERM, trainer.global_step)

    def on_exception(self, trainer, pl_module, exception):
        self._restore_handlers()
        if isinstance(exception, RunInterrupted):
            if self._stepped:
                trainer.save_checkpoint(self.last_path, weights_only=False)
                exception.checkpoint = self.last_path
        elif self._checkpoint_on_error(trainer, exception):
            self._save_on_error(trainer, exception)

    def _checkpoint_on_error(self, trainer, exception) -> bool:
        """An error after this fit's first optimizer step keeps its work in last.ckpt: with one process,
        or with several when every rank raised it at the same point (`on_every_rank`, e.g. a stop on
        dropped rounds; saving is a collective). Not a second signal's KeyboardInterrupt (stop at once),
        nor a checkpoint that could not be written."""
        if isinstance(exception, (KeyboardInterrupt, CheckpointWriteError)) or self._start_step is None:
            return False
        every_rank = getattr(trainer, "world_size", 1) == 1 or getattr(exception, "on_every_rank", False)
        return every_rank and trainer.global_step > self._start_step

    def _save_on_error(self, trainer, exception) -> None:
        try:
            trainer.save_checkpoint(self.last_path, weights_only=False)
        except Exception as e:  # noqa: BLE001 - the error that stopped the run is the one to report
            say0(f"[checkpoint] could not write {self.last_path} after the error below: {e}")
            return
        say0(f"[checkpoint] stopped by an error at step {trainer.global_step}; {self.last_path} written "
                 f"(resume=true continues from it once the cause is fixed)")
        exception.checkpoint = self.last_path  # train.py's one-line report adds the resume command

    def teardown(self, trainer, pl_module, stage):
        self._restore_handlers()
