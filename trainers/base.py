"""Shared by every algorithm: the optimizer step over micro-batches, the policy forward and token
log-probs in bounded memory, the reference policy (kept out of checkpoints), optimizer/scheduler from
config, batch transfer, and the non-finite-loss guard.

One `training_step` is one optimizer step on `data.batch_size` records, computed in micro-batches of
`data.micro_batch_size` with gradient accumulation (Lightning's manual optimization, so the progress
bar, `trainer.max_steps`, rounds and schedulers all count optimizer steps). Each micro-batch's loss is
weighted by its share of the batch's `loss_weight` (completion tokens for a token mean, records for a
per-sequence mean), so the accumulated gradient is exactly that of the full-batch loss.
"""
from __future__ import annotations

import copy
import itertools
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable

import lightning as L
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from data_modules.experience import ExperienceBatch, ExperienceRecord, WeightsIdentity, hub_revision
from hardware import distributed
from hardware.sharding import fully_shard_module, is_sharded, local_shard, reshard, shard_model
from models.forward import sequence_token_logprobs
from trainers import step_log


REFERENCE = "reference."  # the frozen reference's keys in the module's state dict


class NonFiniteLossError(RuntimeError):
    pass


class PolicyModule(L.LightningModule):
    """Holds the policy; subclasses implement `micro_loss` (and `annotate` for online data)."""

    automatic_optimization = False  # training_step runs the micro-batches and steps the optimizer
    prog_bar_metrics: tuple[str, ...] = ()  # metric names shown in the progress bar beside train/loss

    def __init__(self, name: str, default_data: str, policy: PreTrainedModel,
                 tokenizer: PreTrainedTokenizerBase, optimizer: Callable, scheduler: Callable | None,
                 temperature: float, max_nonfinite: int, max_grad_norm: float | None,
                 top_k: int = 0, top_p: float = 1.0):
        super().__init__()
        self.algorithm_name, self.default_data = name, default_data
        self.policy, self.tokenizer = policy, tokenizer
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.temperature = temperature
        self.top_k, self.top_p = top_k, top_p  # rollout algorithms: the sampler's, so that log-probs are of
                                               # the distribution sampled from (losses/sampling.py)
        self.max_nonfinite, self.nonfinite = max_nonfinite, 0
        self.max_grad_norm = max_grad_norm  # clipped in training_step (Lightning's own clipping needs
                                            # automatic optimization)
        policy.train()  # dropout on while training; generation and evaluation switch to eval themselves
        self.model_id: str | None = None  # set_identity: what the records' provenance names
        self.model_revision = hub_revision(getattr(getattr(policy, "config", None), "_name_or_path", None))
        self.run_id: str | None = None
        self.version_offset = 0

    @classmethod
    def kept_per_group(cls, algorithm) -> tuple[int, str] | None:
        """(at most how many training items a round keeps per prompt group, what they are: "pairs" |
        "records") for an algorithm that filters its rollouts in `annotate` (online DPO, SPIN, rejection
        sampling), from its `algorithm` config node; None: every sample is served (GRPO, PPO). The batch
        line (run/stages.py batch_arithmetic) counts a round's optimizer steps with it."""
        return None

    def set_identity(self, model: str | None, run_id: str | None, version_offset: int) -> None:
        """Called by the stage runner (run/stages.py): the model the run started from (model.name_or_path,
        or the code that built it), the run's id, and the optimizer steps the run's earlier stages took."""
        self.model_id, self.run_id, self.version_offset = model, run_id, version_offset

    def setup(self, stage: str) -> None:
        """With ranks: rank 0's run id on every rank (rank 0 alone reads the run's record)."""
        self.run_id = distributed.gather(self.run_id)[0]

    @property
    def policy_version(self) -> int:
        """The run-wide optimizer step of the current weights (the run's earlier stages' steps + this
        stage's): what rollouts record as their policy_version, and what staleness is measured against."""
        return self.version_offset + (self.trainer.global_step if self._trainer is not None else 0)

    def weights_identity(self) -> WeightsIdentity:
        """The current weights, as a record's provenance names them (data_modules/experience.py)."""
        return WeightsIdentity(self.model_id, self.model_revision, self.run_id, self.policy_version)

    # ---- the optimizer step over micro-batches ---------------------------------------------------
    def micro_loss(self, batch) -> tuple[torch.Tensor, dict]:
        """(scalar loss of this micro-batch, reduced as the algorithm reduces a batch; detached metrics)."""
        raise NotImplementedError

    def loss_weight(self, batch) -> float:
        """This micro-batch's weight in the optimizer batch's loss: records (a per-record mean)."""
        return float(len(batch))

    @property
    def micro_batch_size(self) -> int | None:
        """data.micro_batch_size of the data module being fit (None: the whole batch in one pass)."""
        return getattr(self._trainer.datamodule, "micro_batch_size", None) if self._trainer is not None else None

    def on_train_start(self) -> None:
        self.policy.train()

    def configure_model(self) -> None:
        """hardware=fsdp (ModelParallelStrategy gives a device mesh): FSDP2 over the data-parallel ranks for
        the policy, the frozen reference, and any other module with trainable weights (a value head); under
        trainer.precision=bf16-mixed with bf16 compute over float32 shards (hardware/sharding.py)."""
        mesh = getattr(self, "device_mesh", None)
        if mesh is None:
            return
        dp, precision = mesh["data_parallel"], self._trainer.precision if self._trainer is not None else None
        for model in (self.policy, getattr(self, "reference", None)):
            if model is not None:
                shard_model(model, dp, precision)
        for name, child in self.named_children():
            if child is not self.policy and any(p.requires_grad and not hasattr(p, "placements")
                                                for p in child.parameters()):
                fully_shard_module(child, dp, precision)

    def training_step(self, batch, batch_idx: int):
        micros = batch.split(self.micro_batch_size or len(batch))
        weights = [self.loss_weight(m) for m in micros]
        # With W ranks the gradient is averaged over ranks: weigh by the whole step's total, times W.
        total, ranks = distributed.reduce_sum([sum(weights)])[0] or 1.0, distributed.world_size()
        opt, step = self.optimizers(), StepMetrics()
        for i, (micro, weight) in enumerate(zip(micros, weights)):
            with self.no_backward_sync(last=i == len(micros) - 1):
                loss, metrics = self.micro_loss(micro)
                if ranks == 1 and self.check_finite(loss) is None:  # skip the whole optimizer step (with
                    opt.zero_grad(set_to_none=True)                 # ranks: the gradient check below, on
                    return None                                     # every rank alike)
                self.manual_backward(loss * (weight * ranks / total))
            step.add(loss.detach(), metrics, weight)
        loss, metrics = step.result()
        if ranks > 1:  # the logged values are the whole step's, as with one process
            metrics = distributed.weighted_means({"loss": loss, **metrics}, step.weight)
            loss = torch.tensor(metrics.pop("loss"))
        self.log_step(batch, loss, metrics)  # before the step: the weights are still those the loss saw
        if not self.gradients_finite():
            self.skip_nonfinite("gradient")
            opt.zero_grad(set_to_none=True)
            return None
        if self.max_grad_norm:
            self.clip_gradients(opt, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
        opt.step()
        opt.zero_grad(set_to_none=True)
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        return loss

    def no_backward_sync(self, last: bool):
        """Gradient all-reduce only on the last micro-batch's backward (DDP; a no-op elsewhere)."""
        block = getattr(self._trainer.strategy, "block_backward_sync", None) if self._trainer else None
        return nullcontext() if last or block is None else block()

    def log_step(self, batch, loss: torch.Tensor, metrics: dict, extra: dict | None = None) -> dict[str, float]:
        """train/loss and train/<metric> of the optimizer step, plus `extra` (full names), in one row
        (trainers/step_log.py); the loss and `prog_bar_metrics` also in the progress bar."""
        row = {"train/loss": loss, **{f"train/{k}": v for k, v in metrics.items()}, **(extra or {})}
        return step_log.emit(self, row, prog_bar=("train/loss", *self.prog_bar_metrics))

    # ---- forward passes -------------------------------------------------------------------------
    def sequence_logprobs(self, model: PreTrainedModel, batch: ExperienceBatch) -> torch.Tensor:
        """Per-token log-probs [B, T] of batch.input_ids[:, 1:] under `model` at the sampling temperature,
        top-k and top-p (float32; the [B, T, vocab] logits are never held at once: models/forward.py)."""
        return sequence_token_logprobs(model, batch.input_ids, batch.attention_mask, self.temperature,
                                       first_target=first_target(batch.completion_mask),
                                       top_k=self.top_k, top_p=self.top_p)

    @contextmanager
    def reference_model(self):
        """The reference policy for a no-grad forward, in eval mode: the frozen copy if there is one;
        else the policy itself with its LoRA adapter disabled (no copy of the weights), or as it is
        (only valid before training moves it: precomputed reference log-probs at fit start)."""
        if getattr(self, "reference", None) is not None:
            if not is_sharded(self.reference):  # FSDP2's `.to` reshards: inside full_weights every reference
                self.reference.to(self.device)  # forward would all-gather, and ranks with uneven shares hang
            yield self.reference
            return
        was_training = self.policy.training
        self.policy.eval()
        try:
            with self.policy.disable_adapter() if is_lora(self.policy) else nullcontext():
                yield self.policy
        finally:
            self.policy.train(was_training)

    def annotation_batches(self, records: list, collate_fn):
        """Records in chunks of `annotate_batch_size` (default: the micro-batch size), collated, on device."""
        size = getattr(self, "annotate_batch_size", None) or self.micro_batch_size or len(records)
        for lo in range(0, len(records), size):
            yield records[lo: lo + size], collate_fn(records[lo: lo + size]).to(self.device)

    def precision_context(self):
        """The trainer's forward precision (bf16-mixed: autocast) for forwards outside training_step, so
        that annotated log-probs are computed as the training forward computes them."""
        return self.trainer.precision_plugin.forward_context() if self._trainer is not None else nullcontext()

    @property
    def mixed_precision(self) -> bool:
        """Whether the training forward computes below float32 (trainer.precision=bf16-mixed | 16-mixed)."""
        return self._trainer is not None and "mixed" in str(self.trainer.precision)

    @torch.no_grad()
    def frozen_logprobs(self, model: PreTrainedModel, batch: ExperienceBatch) -> list[list[float]]:
        """Completion-token log-probs of a frozen model, one list per record (for annotation), at the
        trainer's precision (`precision_context`): one per completion token, those a record's loss_mask
        masks included (an episode's observation tokens), so the list aligns with its completion ids."""
        batch = batch.to(self.device)
        with self.precision_context():
            lp = self.sequence_logprobs(model, batch)
        if any(r.loss_mask is not None for r in batch.records):
            rows = lp.float().cpu()  # one device-to-host copy
            return [rows[i, len(r.prompt_ids) - 1: len(r.prompt_ids) - 1 + len(r.completion_ids)].tolist()
                    for i, r in enumerate(batch.records)]
        mask = batch.completion_mask.bool()
        flat, counts = lp[mask].tolist(), mask.sum(-1).tolist()  # one device-to-host copy of the values
        ends = list(itertools.accumulate(counts))
        return [flat[end - n: end] for end, n in zip(ends, counts)]

    def annotate(self, records: list[ExperienceRecord]) -> list[ExperienceRecord]:
        """Add what the loss needs beyond the rollout (reference log-probs, advantages). Default: nothing."""
        return records

    def check_finite(self, loss: torch.Tensor) -> torch.Tensor | None:
        """Return the loss, or None (skip the step) if it is NaN/inf; stop past `max_nonfinite` of them."""
        if torch.isfinite(loss):
            return loss
        self.skip_nonfinite("loss")
        return None

    def gradients_finite(self) -> bool:
        """Whether the accumulated gradients are all finite (one reduction, one host sync). Under fp16
        mixed precision the grad scaler owns this (it skips steps with inf gradients itself)."""
        if self._trainer is not None and str(self.trainer.precision).startswith("16"):
            return True
        grads = [p.grad for p in self.trainable_parameters() if p.grad is not None]
        if not grads:
            return True
        norm = torch.nn.utils.get_total_norm(grads)
        return bool(torch.isfinite(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))  # FSDP: all shards

    def skip_nonfinite(self, what: str) -> None:
        """Count a skipped step (a NaN/inf loss or gradient); past `max_nonfinite` save a checkpoint of the
        weights before the bad step and stop, naming the first bad step."""
        step = self.trainer.global_step if self._trainer is not None else 0
        self.nonfinite += 1
        self.first_nonfinite = getattr(self, "first_nonfinite", None) or f"a non-finite {what} at step {step}"
        self.log("train/nonfinite_losses", float(self.nonfinite))
        if self.nonfinite > self.max_nonfinite:
            saved = self.save_emergency_checkpoint("nonfinite.ckpt")
            raise NonFiniteLossError(
                f"{self.nonfinite} optimizer steps skipped for non-finite losses or gradients (limit "
                f"algorithm.max_nonfinite={self.max_nonfinite}); the first was {self.first_nonfinite}"
                + (f"; the weights before it are in {saved}" if saved else ""))

    def save_emergency_checkpoint(self, name: str):
        """Save the trainer's state next to the stage's checkpoints (None without a trainer)."""
        if self._trainer is None:
            return None
        ckpt = self.trainer.checkpoint_callback
        folder = Path(getattr(ckpt, "dirpath", None) or self.trainer.default_root_dir)
        self.trainer.save_checkpoint(folder / name, weights_only=False)
        return folder / name

    # ---- checkpoints: the frozen reference stays out ----------------------------------------------
    def reference_in_checkpoint(self) -> bool:
        """Whether resume checkpoints carry the frozen reference (`reference.*`). No by default: it is
        the stage's starting policy, built again with the module on resume (from the model config, or
        the previous stage's final weights), so it would only double every checkpoint."""
        return False

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Drop `reference.*` from the checkpoint's weights, unless `reference_in_checkpoint`; a
        weights-only checkpoint (no optimizer state: final.ckpt) never resumes training, so never keeps it."""
        resumable = "optimizer_states" in checkpoint
        if not (resumable and self.reference_in_checkpoint()):
            state = checkpoint["state_dict"]
            for key in [k for k in state if k.startswith(REFERENCE)]:
                del state[key]

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As nn.Module's, except that a state without `reference.*` keeps the reference as built (the
        stage's starting policy); any other key missing or unexpected still fails when `strict`."""
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        missing = [k for k in result.missing_keys if not k.startswith(REFERENCE)]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(f"loading {type(self).__name__}'s weights: missing keys {missing[:5]}"
                               f"{' …' if len(missing) > 5 else ''}, unexpected keys {result.unexpected_keys[:5]}")
        return result

    @property
    def strict_loading(self) -> bool:
        """Under FSDP2 Lightning loads a resume checkpoint parameter by parameter before any hook, strictly
        only if this is true, and never through `load_state_dict`: false there, so that a reference absent
        from the checkpoint keeps the weights it was built with (a missing policy key goes unnoticed there)."""
        return not is_sharded(self.policy)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch.to(device) if isinstance(batch, ExperienceBatch) else super().transfer_batch_to_device(
            batch, device, dataloader_idx)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer updates: the policy's trainable weights (a reward model trains its own)."""
        return [p for p in self.policy.parameters() if p.requires_grad]

    def configure_optimizers(self):
        opt = self.optimizer_factory(self.trainable_parameters())
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.scheduler_factory(opt), "interval": "step"}}


def first_target(completion_mask: torch.Tensor) -> int:
    """The first target position any row's completion occupies (0 for an empty mask)."""
    used = completion_mask.any(0)
    return int(used.int().argmax()) if bool(used.any()) else 0


class StepMetrics:
    """Combines the micro-batches of one optimizer step: the loss and each metric as the weighted mean
    (the full-batch value for a linear reduction), `*_max` metrics as their maximum."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.weight = 0.0

    def add(self, loss: torch.Tensor, metrics: dict, weight: float) -> None:
        self.weight += weight
        for k, v in {"loss": loss, **metrics}.items():
            v = torch.as_tensor(v, dtype=torch.float32, device=loss.device).detach()
            if k.endswith("_max"):
                self.sums[k] = torch.maximum(self.sums[k], v) if k in self.sums else v
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * weight

    def result(self) -> tuple[torch.Tensor, dict]:
        w = self.weight or 1.0
        out = {k: (v if k.endswith("_max") else v / w) for k, v in self.sums.items()}
        return out.pop("loss"), out


def is_lora(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a requirement
        return False
    return isinstance(model, PeftModel)


def frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A frozen, eval-mode copy of `model` (the reference policy)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


@torch.no_grad()
def blend_weights(source: torch.nn.Module, target: torch.nn.Module, alpha: float) -> None:
    """target ← α·source + (1 − α)·target for every parameter, in place (α = 1: an exact copy); buffers
    (rotary frequencies) are left alone. `target` is a `frozen_copy` of `source`, so their parameters
    pair up by name. Under FSDP2 both are sharded alike (configure_model): each rank blends its own
    shards, with no gather and no new tensor."""
    reshard(source, target)
    ours, theirs = list(target.named_parameters()), list(source.named_parameters())
    if [n for n, _ in ours] != [n for n, _ in theirs]:
        raise RuntimeError("the reference's parameters do not match the policy's: it is not a copy of it")
    for (name, t), (_, s) in zip(ours, theirs):
        t, s = local_shard(t), local_shard(s)
        if t.shape != s.shape:
            raise RuntimeError(f"{name}: the reference's shard {tuple(t.shape)} is not the policy's "
                               f"{tuple(s.shape)} (sharded one way and not the other)")
        if alpha == 1:
            t.copy_(s)
        else:
            t.mul_(1 - alpha).add_(s.to(t.dtype), alpha=alpha)
