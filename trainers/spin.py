"""Self-play fine-tuning (SPIN, Chen et al. 2024, "Self-Play Fine-Tuning Converts Weak Language Models to
Strong Language Models"): each round the current policy answers the round's prompts
(callbacks/regenerate.py, as for online DPO), and `annotate` pairs every sample with the prompt's
demonstration: chosen = the task example's reference answer (the answer an SFT stage trains on:
data=demonstrations, or a jsonl task's `answer`), rejected = the policy's own sample. DPOModule's training
step then runs unchanged on those pairs, with the shared pure loss (losses/preference.py's `dpo_loss`:
SPIN's logistic loss is DPO's, the opponent policy as the reference).

The opponent is the reference: with `ref_update_every` = K (online DPO's refresh, default 1 here) the
frozen reference takes the policy's weights before every K-th round is sampled, so each SPIN iteration
trains the policy to tell the demonstrations from what the previous iteration's policy writes.

A sample identical to its demonstration (the same token ids, or a finished sample with the same text: a
different tokenisation of the same answer) makes no pair: chosen and rejected would be the same answer,
with no gradient (BPE aside) and only a diluted batch mean. Such samples are counted and logged per round
(`rollout/identical_frac`), and a round whose samples all matched serves the previous round again
(data_modules/filtered_rollouts.py).

Provenance: the pair's `provenance` is the rejected sample's (source policy_rollout, the policy version
that sampled it, generator and sampling settings); its chosen side has `chosen_source` (default "dataset")
and no policy version (`PreferenceRecord.chosen_provenance`).

Per round (logged as the round ends; printed for rounds 1-3 and every 20th): `train/round_reward_chosen`, `train/round_reward_rejected`,
`train/round_reward_margin`, the means over the round's optimizer steps of DPO's implicit rewards
β·log π/π_ref (each step's `train/reward_*` are logged as for DPO), and `train/round_end_reward_margin`,
`train/round_end_reward_acc`, the margin and the share ranked right on the round's pairs after its last step
(with K = 1 a round starts at π = π_ref, so its step means start at 0: these show what the round learned);
`rollout/pairs`, `rollout/identical`, `rollout/identical_frac`, `rollout/identical_total` (the stage's) and
`rollout/ref_updates` as each round is made.
"""
from __future__ import annotations

from dataclasses import replace

from data_modules.experience import ExperienceRecord
from data_modules.preferences import PreferenceRecord
from generators.base import finished, stop_ids
from hardware.console import say
from tasks.base import encode_completion
from trainers.online_dpo import OnlineDPOModule

ROUND_KEYS = ("reward_chosen", "reward_rejected", "reward_margin")  # DPO's step metrics averaged per round
SAY_FIRST, SAY_EVERY = 3, 20  # the console line of rounds 1-3, then of every 20th (the metrics log every round)


def is_identical(sample: ExperienceRecord, demonstration_ids: list[int], stops: set[int]) -> bool:
    """The sample is its demonstration: the same ids, or it finished (at a stop id) with the same text."""
    if sample.completion_ids == demonstration_ids:
        return True
    return finished(sample.completion_ids, stops) and sample.completion_text == sample.answer


def demonstration_pairs(samples: list[ExperienceRecord], demonstration_ids, stops: set[int], chosen_source: str
                        ) -> tuple[list[PreferenceRecord], int]:
    """(pairs, identical): one pair per sample, chosen = its prompt's demonstration
    (`demonstration_ids(answer)` → ids), rejected = the sample; samples identical to the demonstration
    make none and are counted. Raises on a sample whose example has no reference answer."""
    pairs, identical, encoded = [], 0, {}
    for s in samples:
        if not s.answer:
            raise ValueError(f"algorithm=spin: the prompt {s.prompt_text!r} has no reference answer to use as its "
                             f"demonstration (task examples need an `answer`)")
        chosen = encoded.setdefault(s.answer, demonstration_ids(s.answer))
        if is_identical(s, chosen, stops):
            identical += 1
            continue
        pairs.append(PreferenceRecord(
            prompt_ids=s.prompt_ids, chosen_ids=list(chosen), rejected_ids=s.completion_ids,
            provenance=replace(s.provenance, times_used=0), group_id=s.group_id, prompt_text=s.prompt_text,
            chosen_text=s.answer, rejected_text=s.completion_text, answer=s.answer,
            chosen_reward=None, rejected_reward=s.reward, chosen_source=chosen_source))
    return pairs, identical


class SPINModule(OnlineDPOModule):
    """`group_size` samples per prompt, each paired against the prompt's demonstration (provenance source
    `chosen_source`); the rest as online DPO (`epochs_per_round`, `ref_update_every`, `ref_update_alpha`)."""

    def __init__(self, chosen_source: str, **kwargs):
        super().__init__(min_reward_gap=0.0, **kwargs)  # online DPO's reward gap: SPIN ranks by source, not reward
        self.chosen_source = chosen_source
        self.identical_total = 0  # samples equal to their demonstration over the stage (checkpointed)
        self.round_sums: dict[str, float] = {}
        self.round_steps = 0
        self.serving: dict[str, float] = {}  # the stats of the round being trained on
        self.serving_pairs: list[PreferenceRecord] = []  # and its pairs

    @classmethod
    def kept_per_group(cls, algorithm) -> tuple[int, str]:
        return int(algorithm.group_size), "pairs"  # each sample against its demonstration, unless identical

    def annotate(self, records: list[ExperienceRecord]) -> list[PreferenceRecord]:
        stops = set(stop_ids(self.policy, self.tokenizer))
        pairs, identical = demonstration_pairs(records, lambda text: encode_completion(self.tokenizer, text),
                                               stops, self.chosen_source)
        if pairs:  # a round of identical samples only: nothing to cache
            self.cache_reference(pairs)
        self.identical_total += identical
        self.last_round_stats = {"pairs": float(len(pairs)), "identical": float(identical),
                                 "identical_frac": identical / max(len(records), 1),
                                 "identical_total": float(self.identical_total), "ref_updates": float(self.ref_updates)}
        return pairs

    # ---- per-round margins -----------------------------------------------------------------------
    def log_step(self, batch, loss, metrics, extra=None):
        floats = super().log_step(batch, loss, metrics, extra)
        for k in ROUND_KEYS:
            self.round_sums[k] = self.round_sums.get(k, 0.0) + floats[f"train/{k}"]
        self.round_steps += 1
        return floats

    def round_means(self) -> dict[str, float]:
        """The round's mean chosen/rejected implicit rewards and margin over its optimizer steps, then reset."""
        means = {f"train/round_{k}": v / self.round_steps for k, v in self.round_sums.items()}
        self.round_sums, self.round_steps = {}, 0
        return means

    def on_train_epoch_start(self) -> None:
        """The round this epoch serves was made just before it (by the regenerate callback)."""
        self.serving = dict(self.last_round_stats)
        self.serving_pairs = list(self.trainer.datamodule.epoch_records())

    def on_train_epoch_end(self) -> None:
        if not self.round_steps:
            return
        means = self.round_means() | self.round_end_metrics()
        self.log_dict(means)
        index = self.current_epoch + 1
        if index <= SAY_FIRST or index % SAY_EVERY == 0:
            say(self.trainer, round_line(index, means, self.serving, len(self.serving_pairs), self.ref_updates))

    def round_end_metrics(self) -> dict[str, float]:
        """After the round's last step, on the round's pairs against the reference they were made with (the
        log-probs cached as the round was made, whatever refresh came since): the implicit reward margin
        and the share of pairs it ranks right (ties ½). With a reference refreshed every round the step
        means start at 0; these say what the round's steps learned."""
        if not self.serving_pairs:
            return {}
        size = self.annotate_batch_size or self.micro_batch_size or len(self.serving_pairs)
        end = self.preference_metrics(self.serving_pairs, size)
        return {"train/round_end_reward_margin": end["reward_margin"], "train/round_end_reward_acc": end["pref_accuracy"]}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["spin"] = {"identical_total": self.identical_total}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.identical_total = checkpoint.get("spin", {}).get("identical_total", 0)


def round_line(index: int, m: dict[str, float], stats: dict[str, float], served: int, refreshes: int) -> str:
    """The console's line at a round's end."""
    made = stats.get("pairs", 0.0)
    what = (f"{served} pairs" if made else f"the previous round's {served} pairs again (every sample of this one "
                                           f"matched its demonstration)")
    end = (f"; after it {m['train/round_end_reward_margin']:+.3f}, ranked right {m['train/round_end_reward_acc']:.0%}"
           if "train/round_end_reward_margin" in m else "")
    return (f"[spin] round {index}: {what}, {stats.get('identical_frac', 0.0):.1%} of its samples identical to "
            f"their demonstration (skipped); margin {m['train/round_reward_margin']:+.3f} (chosen "
            f"{m['train/round_reward_chosen']:+.3f}, rejected {m['train/round_reward_rejected']:+.3f}){end}; "
            f"reference refreshes so far: {refreshes}")
