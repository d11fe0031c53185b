"""RegenerateExperience: one round of on-policy experience before every epoch.

One Lightning epoch is one round. Lightning rebuilds the train dataloader before each epoch
(reload_dataloaders_every_n_epochs=1), after `on_fit_start` and after the previous epoch's
`on_train_epoch_end`: so the first round is made in `on_fit_start` and every next one in
`on_train_epoch_end`, and epoch k serves round k. A round serves `steps_per_round` optimizer steps,
unless the module ends it early (callbacks/drift.py, PPO's target KL); each round's reason is logged
as `rollout/trigger/<reason>`. The callback's totals are checkpointed, and a resumed run makes a round
at fit start only if the checkpoint holds none still to serve. Before each round the module's
`round_start(index)` (if it has one) is called with the round's index, 0 for the first.
"""
from __future__ import annotations

import copy
from dataclasses import asdict

import lightning as L
import torch

from callbacks.dynamic_sampling import GenBatch, annotate_by_rank, fill_round, merged
from callbacks.episodes import as_episode, sample
from callbacks.logging import log_now
from callbacks.round_signal import signal_metrics
from data_modules.experience import ExperienceRecord, Provenance, collate
from data_modules.state_checks import StateError, integer, mapping, number, sequence, within
from generators.base import GenerationOutput, finished, sampling_precision, stop_ids
from generators.hf import HFGenerator
from hardware import distributed
from hardware.console import say
from hardware.sharding import full_weights
from losses.kl import k3
from rewards.base import RewardSource, ScoreReport, safe_score

SHORT_EVERY = 50  # dynamic sampling's "short round" console line: the first, then at most one every N rounds


class DroppedRoundsError(RuntimeError):
    """`max_dropped_rounds` rounds in a row had every sample dropped (or the first round had, with no
    earlier one to serve again): a reward that raises or hangs on every sample. Every rank raises it at
    the same round end (the round is gathered), so the ranks may write their checkpoint on the way out
    together; the console shows its one line (run/errors.py)."""

    on_every_rank = True


class RegenerateExperience(L.Callback):
    def __init__(self, generator: HFGenerator, reward: RewardSource, max_dropped_rounds: int = 3, env=None):
        self.generator, self.reward, self.env = generator, reward, env  # env: a factory (envs/), None: one turn
        self.tool_totals = {"tool_calls": 0.0, "tool_malformed": 0.0, "tool_seconds": 0.0, "episodes": 0.0,
                            "observation_tokens": 0.0, "tool_wait_seconds": 0.0, "tool_budget_spent": 0.0,
                            "special_dropped": 0.0}  # env: the stage's tool statistics (docs/episodes.md)
        self.round_tools: dict[str, float] = {}  # the round's so far (with ranks: this rank's share)
        self.max_dropped_rounds, self.dropped_in_a_row = max_dropped_rounds, 0
        self.last_round: dict[str, float] = {}  # the latest round's rollout metrics
        self.rounds = self.epochs_ended = 0
        self.last_end_step = -1
        self.totals = {"prompt_tokens": 0, "generated_tokens": 0, "generation_seconds": 0.0,
                       "records_generated": 0, "records_dropped": 0, "records_filtered": 0, "reward_errors": 0}
        self.reward_means: list[float] = []
        self.triggers: dict[str, int] = {}  # rounds made, by reason (rollout/trigger)
        self.replay_fracs: list[float] = []  # share of each round's groups that were replayed
        self.source_means: dict[str, list[float]] = {}  # per reward source (and gold), one mean a round
        self.abstained = self.timeouts = 0
        self.short_rounds = 0  # dynamic sampling: rounds that hit algorithm.max_gen_batches short of signal
        self.first_error: str | None = None
        self.round_extra: dict[str, float] = {}  # the latest round's dynamic-sampling metrics
        self.dynamic_totals: dict[str, float] = {}  # their sums over the stage (summary.json)

    def on_fit_start(self, trainer, pl_module):
        # A run resumed from a round-end checkpoint may already hold the round its next epoch serves
        # (one more round than epochs ended); Lightning restores the loops only after on_fit_start.
        stopped = trainer.should_stop  # callbacks/budget.py: the stage's budget is already spent
        stopped = stopped or 0 < trainer.max_steps <= self.last_end_step  # resumed at the stage's last round end
        if getattr(trainer.datamodule, "online", False) and self.rounds <= self.epochs_ended and not stopped:
            self.regenerate(trainer, pl_module, "start")

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.global_step == self.last_end_step:  # Lightning replays the hook when it resumes from
            return                                     # an epoch-end checkpoint: that end was handled
        before = self.state_dict()
        self.epochs_ended, self.last_end_step = self.epochs_ended + 1, trainer.global_step
        done = trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps
        done = done or trainer.should_stop  # callbacks/budget.py (before this callback) ended the stage
        if getattr(trainer.datamodule, "online", False) and not done:
            try:
                self.regenerate(trainer, pl_module, getattr(pl_module, "round_end", lambda: None)() or "schedule")
            except DroppedRoundsError:  # the checkpoint written on the way out (run/checkpointing.py) is
                self.load_state_dict(before)  # this round's end: a resumed run makes this round again
                raise

    STATE = ("rounds", "epochs_ended", "last_end_step", "totals", "reward_means", "source_means",
             "triggers", "replay_fracs", "abstained", "timeouts", "dropped_in_a_row", "last_round",
             "dynamic_totals", "tool_totals")  # checkpointed

    def state_dict(self) -> dict:
        return copy.deepcopy({k: getattr(self, k) for k in self.STATE})

    def check_state(self, state: dict) -> None:
        """StateError (data_modules/state_checks.py) unless `state` is one this callback could have written:
        counts are integers ≥ 0, totals finite and ≥ 0, a round made at most one round end ahead."""
        mapping(state, "RegenerateExperience")
        rounds = integer(state.get("rounds", 0), "rounds")
        ended = integer(state.get("epochs_ended", 0), "epochs_ended")
        if rounds > ended + 1:  # offline data: round ends, no rounds made
            raise StateError("rounds", f"{rounds} rounds made for {ended} ended: a round is made at most one ahead")
        integer(state.get("last_end_step", -1), "last_end_step", low=-1)
        for key in ("abstained", "timeouts", "dropped_in_a_row"):
            integer(state.get(key, 0), key)
        for key in ("totals", "dynamic_totals", "tool_totals"):
            for name, v in mapping(state.get(key, {}), key).items():
                number(v, f"{key}.{name}", low=0.0 if key != "dynamic_totals" else None)
        for name, n in mapping(state.get("triggers", {}), "triggers").items():
            integer(n, f"triggers.{name}")
        for i, frac in enumerate(sequence(state.get("replay_fracs", []), "replay_fracs")):
            number(frac, f"replay_fracs[{i}]", high=1.0)
        for i, m in enumerate(sequence(state.get("reward_means", []), "reward_means")):
            number(m, f"reward_means[{i}]", low=None, nan=True)  # NaN: a round whose every sample abstained
        for name, means in mapping(state.get("source_means", {}), "source_means").items():
            for i, m in enumerate(sequence(means, f"source_means.{name}")):
                number(m, f"source_means.{name}[{i}]", low=None, nan=True)
        for name, v in mapping(state.get("last_round", {}), "last_round").items():
            number(v, f"last_round.{name}", low=None, nan=True)

    def load_state_dict(self, state: dict) -> None:
        with within(f"callbacks.{self.state_key}"):
            self.check_state(state)
        for k in self.STATE:  # a key an older checkpoint lacks keeps its fresh value
            setattr(self, k, copy.deepcopy(state.get(k, getattr(self, k))))

    def regenerate(self, trainer: L.Trainer, pl_module, trigger: str = "schedule") -> list[ExperienceRecord]:
        """Make one round; `trigger` is why (start | schedule | ess | kl | staleness | target_kl)."""
        dm = trainer.datamodule
        self.triggers[trigger] = self.triggers.get(trigger, 0) + 1
        if trigger not in ("start", "schedule"):
            say(trainer, f"[rollout] step {trainer.global_step}: round ended early ({trigger}); regenerating")
        log_now(trainer, {f"rollout/trigger/{trigger}": 1.0})
        getattr(dm, "on_trigger", lambda reason: None)(trigger)  # replay_mix: fresh round after drift
        planned = dm.next_prompts()
        mine = distributed.shard(planned)  # this rank's groups (all of them with one process)
        prompts = [p for p in mine for _ in range(dm.group_size)]
        if distributed.world_size() > 1:  # each rank its own random stream (seed_everything gave all one)
            torch.manual_seed(dm.seed * 1_000_003 + 7_919 * self.rounds + distributed.rank())
        # Before the round (online DPO refreshes its reference), outside the gathered weights: under
        # FSDP the shards are the weights, and a write to a gathered copy would be lost.
        getattr(pl_module, "round_start", lambda index: None)(self.rounds)
        self.round_extra, dynamic = {}, getattr(pl_module, "dynamic_sampling", False)
        with full_weights(pl_module):  # FSDP: gathered once for the whole round; a no-op otherwise
            if dynamic:  # DAPO: callbacks/dynamic_sampling.py
                whole, self.round_extra = self._dynamic_round(pl_module, dm, planned)
                self._say_short(trainer, len(planned))
            else:
                local = self._local_round(pl_module, dm, prompts)
        if not dynamic:
            whole = self._whole_round(*local, prompts)
        records, rewards, out, report, mismatch, prompt_tokens = whole
        if rewards and (records or not getattr(pl_module, "overlong_filter", False)):
            dm.put(records)
            self.dropped_in_a_row = 0
        else:
            self._all_dropped(trainer, dm, report, bool(rewards))
        self._account(trainer, pl_module, prompt_tokens, out, report, rewards, mismatch)
        log_now(trainer, signal_metrics(self, pl_module, records, out))  # z, tokens/informative group, ... (issue 33)
        return records

    def _dynamic_round(self, pl_module, dm, planned):
        """DAPO's dynamic sampling: batches of fresh groups until the round holds as many groups with
        signal as it planned (or algorithm.max_gen_batches): the whole round, and its rollout metrics."""
        def scored(groups):
            prompts = [p for p in distributed.shard(groups) for _ in range(dm.group_size)]
            return GenBatch(*self._whole_round(*self._scored(pl_module, dm, prompts), prompts))

        batches, chosen, metrics = fill_round(planned, dm.fresh_prompts, scored, pl_module.max_gen_batches)
        records = annotate_by_rank(pl_module.annotate, chosen)
        return (records, *merged(batches)), metrics

    def _say_short(self, trainer, planned: int) -> None:
        """A console line when dynamic sampling hit its cap with fewer groups with signal than planned: the
        first such round, then at most one every SHORT_EVERY rounds (rollout/dynamic_* log every round)."""
        m = self.round_extra
        if not (m["rollout/dynamic_kept_groups"] < planned or m["rollout/dynamic_no_signal"]):
            return
        self.short_rounds += 1
        if self.short_rounds > 1 and (self.rounds + 1) % SHORT_EVERY and not m["rollout/dynamic_no_signal"]:
            return
        say(trainer, f"[rollout] round {self.rounds + 1}: {m['rollout/gen_batches']:.0f} generation batches "
                     f"(algorithm.max_gen_batches), {m['rollout/dynamic_dropped_groups']:.0f} groups tied; "
                     f"training on {m['rollout/dynamic_kept_groups']:.0f} of {planned} groups"
                     + (" (none with signal: served as they are)" if m["rollout/dynamic_no_signal"] else "")
                     + f"; {self.short_rounds} such rounds so far (this line: at most every {SHORT_EVERY} rounds)")

    def _local_round(self, pl_module, dm, prompts):
        """Generate, score and annotate this rank's samples: (annotated records, rewards of the samples
        kept, generation output, score report, log-prob mismatch). Annotation may turn records into
        others (online DPO's pairs) or keep fewer (rejection sampling, GRPO's overlong filter)."""
        records, rewards, out, report, mismatch = self._scored(pl_module, dm, prompts)
        return (pl_module.annotate(records) if records else []), rewards, out, report, mismatch

    def _scored(self, pl_module, dm, prompts):
        """Generate and score this rank's samples: (scored records, their rewards, generation output,
        score report, log-prob mismatch); no annotation."""
        examples = [ex for ex, _, _ in prompts]
        with sampling_precision(self.generator, pl_module.precision_context()):  # the trainer's compute dtype
            sampled = sample(self.generator, pl_module.policy, dm.tokenizer, [ids for _, ids, _ in prompts],
                             examples, self.env, dm.task.chat, policy_version=pl_module.policy_version)
        out, texts, episodes = sampled.out, sampled.texts, sampled.episodes or [None] * len(prompts)
        self._add_tools(sampled.stats, len(prompts))
        getattr(self.reward, "to", lambda device: None)(pl_module.device)  # models on the policy's device
        report = safe_score(self.reward, [ex.prompt for ex in examples], texts, examples)
        records = [
            as_episode(self._record(pl_module, ex, ids, gid, comp, lp, text, score,
                                    {name: scores[i] for name, scores in report.per_source.items()}), episode,
                       dm.tokenizer)
            for i, ((ex, ids, gid), comp, lp, text, score, episode)
            in enumerate(zip(prompts, out.completions, out.logprobs, texts, report.scores, episodes))
            if score is not None  # None: abstained (or the source failed): dropped, counted
        ]
        mismatch = self._logprob_mismatch(pl_module, records) if records else {}
        return records, [r.reward for r in records], out, report, mismatch

    @staticmethod
    def _whole_round(records, rewards, out, report, mismatch, prompts):
        """Every rank's share of the round, on every rank (as it is with one process): the records in
        rank order, the completions, the slowest rank's generation time, one score report, the
        token-weighted log-prob mismatch and the prompt tokens."""
        prompt_tokens = sum(len(ids) for _, ids, _ in prompts)
        if distributed.world_size() == 1:
            return records, rewards, out, report, mismatch, prompt_tokens
        parts = distributed.gather((records, rewards, out, report, mismatch, prompt_tokens))
        records, rewards, outs, reports, mismatches, prompt_tokens = zip(*parts)
        out = GenerationOutput([c for o in outs for c in o.completions], [lp for o in outs for lp in o.logprobs],
                               max(o.seconds for o in outs))
        tokens = [sum(map(len, o.completions)) for o in outs]
        return ([r for part in records for r in part], [x for part in rewards for x in part], out,
                ScoreReport.merge(list(reports)), distributed.combine(list(zip(tokens, mismatches))),
                sum(prompt_tokens))

    def _all_dropped(self, trainer, dm, report, scored: bool = False) -> None:
        """Every sample of the round was dropped: serve the previous round again, loudly, and stop after
        `max_dropped_rounds` such rounds in a row (training on ever staler data is no longer RL)."""
        self.dropped_in_a_row += 1
        why = report.first_error or ("algorithm.overlong_filter removed every sample (all cut at the length limit)"
                                     if scored else "the reward source abstained on every sample")
        if not dm.epoch_records():
            raise DroppedRoundsError(f"round {self.rounds + 1} has no scored sample ({why}) and there is no earlier "
                               f"round to serve again; check the reward source (reward=...) and the task")
        if self.dropped_in_a_row >= self.max_dropped_rounds:
            raise DroppedRoundsError(f"{self.dropped_in_a_row} rounds in a row had every sample dropped ({why}); "
                                     f"stopping (callbacks.regenerate.max_dropped_rounds={self.max_dropped_rounds})")
        say(trainer, f"WARNING [rollout] every sample of round {self.rounds + 1} was dropped ({why}); "
                     f"serving the previous round again ({self.dropped_in_a_row} in a row, the run stops at "
                     f"{self.max_dropped_rounds})")

    def _logprob_mismatch(self, pl_module, records: list[ExperienceRecord]) -> dict[str, float]:
        """For an engine whose log-probs are not the trainer's forward (vLLM; or any engine under a mixed
        precision, whose decode rounds otherwise than the training forward): the train/inference mismatch
        of this round's sampled tokens, from one no-grad policy forward at the trainer's precision, in
        annotation batches. rollout/logp_mismatch_kl: KL(engine ‖ policy) per token (k3);
        rollout/logp_mismatch_abs: mean |Δ log-prob|. vLLM's log-probs stay the behaviour (the correction,
        truncated_is, ..., weighs the tokens by that ratio). The policy's own sampler (generator=hf) under
        bf16-mixed decodes in the same dtype but rounds otherwise (a KV-cached step, not the whole sequence:
        |Δ| ~5e-4): its records take the training forward's log-probs as behaviour (`rescore`), so that fresh
        data has ratio 1 within 1e-4 (the sampler's are the mismatch logged)."""
        exact = getattr(self.generator, "exact_logprobs", True)
        rescore = exact and getattr(pl_module, "mixed_precision", False)
        if (exact and not rescore) or not hasattr(pl_module, "annotation_batches"):
            return {}
        kl = absdiff = tokens = 0.0
        was_training = pl_module.policy.training
        pl_module.policy.eval()
        try:
            pad = pl_module.tokenizer.pad_token_id
            for chunk, batch in pl_module.annotation_batches(records, lambda rs: collate(rs, pad)):
                for r, lp in zip(chunk, pl_module.frozen_logprobs(pl_module.policy, batch)):
                    engine, policy = torch.tensor(r.behaviour_logprobs), torch.tensor(lp)
                    kl += float(k3(engine, policy).sum())
                    absdiff += float((engine - policy).abs().sum())
                    tokens += len(lp)
                    if rescore:  # an episode's observation tokens keep their 0.0 (no behaviour log-prob)
                        keep = r.loss_mask or [1] * len(lp)
                        r.behaviour_logprobs = [x if m else b for x, m, b in zip(lp, keep, r.behaviour_logprobs)]
        finally:
            pl_module.policy.train(was_training)
        return {"rollout/logp_mismatch_kl": kl / max(tokens, 1), "rollout/logp_mismatch_abs": absdiff / max(tokens, 1)}

    def _record(self, pl_module, ex, prompt_ids, gid, completion, logprobs, text, score, per_source):
        weights = pl_module.weights_identity()  # model (+ revision), run id, run-wide policy version
        prov = Provenance(source="policy_rollout", created_step=weights.policy_version, generator=self.generator.name,
                          sampling=self.generator.sampling, reward_source=self.reward.name,
                          reward_version=self.reward.version, origin=ex.meta.get("origin"), **asdict(weights))
        return ExperienceRecord(prompt_ids=prompt_ids, completion_ids=completion, provenance=prov,
                                group_id=gid, prompt_text=ex.prompt, completion_text=text,
                                answer=ex.answer, behaviour_logprobs=logprobs,
                                rewards=per_source | {self.reward.name: score}, reward=score)

    def _add_tools(self, stats: dict[str, float], episodes: int) -> None:
        """Add one sampling batch's tool statistics (envs/rollout.py) to this rank's round."""
        if not stats:
            return
        if not self.round_tools:
            self.round_tools = {k: 0.0 for k in self.tool_totals}
        for k in self.tool_totals:
            self.round_tools[k] += episodes if k == "episodes" else stats[k]

    def _gather_tools(self) -> None:
        """With ranks: the round's tool statistics summed over every rank (each played its shard), so that
        the round's metrics, the stage's totals and the generated-token count see the whole round."""
        if self.env is None or distributed.world_size() == 1:
            return
        keys = [k for k in self.tool_totals if k != "tool_wait_seconds"]  # the ranks wait at once: the slowest's
        summed = distributed.reduce_sum([(self.round_tools or {}).get(k, 0.0) for k in keys])
        waited = distributed.reduce_max([(self.round_tools or {}).get("tool_wait_seconds", 0.0)])[0]
        self.round_tools = dict(zip(keys, summed)) | {"tool_wait_seconds": waited}

    def _tool_round(self) -> dict[str, float]:
        """The round's rollout/tool_* metrics and the stage's cost/tool_* totals (env set), then reset."""
        r, self.round_tools = self.round_tools, {}
        if not r:
            return {}
        for k in self.tool_totals:
            self.tool_totals[k] += r[k]
        n, t = max(r["episodes"], 1.0), self.tool_totals
        return {"rollout/tool_calls_per_episode": r["tool_calls"] / n, "rollout/tool_malformed": r["tool_malformed"],
                "rollout/observation_tokens_per_episode": r["observation_tokens"] / n,
                "rollout/tool_budget_spent": r.get("tool_budget_spent", 0.0),  # .get: a checkpoint from before
                "rollout/special_dropped": r.get("special_dropped", 0.0),
                "cost/tool_seconds": t["tool_seconds"], "cost/tool_calls": t["tool_calls"],
                "cost/tool_wait_seconds": t.get("tool_wait_seconds", 0.0)}

    def _account(self, trainer, pl_module, prompt_tokens, out, report, rewards, mismatch):
        self._gather_tools()
        mean = sum(rewards) / len(rewards) if rewards else float("nan")
        # an episode's observation tokens were appended, not generated (their count: rollout/observation_tokens_*)
        gen_tokens = sum(len(c) for c in out.completions) - int(self.round_tools.get("observation_tokens", 0))
        t = self.totals
        t["prompt_tokens"] += prompt_tokens
        t["generated_tokens"] += gen_tokens
        t["generation_seconds"] += out.seconds
        t["records_generated"] += len(out.completions)
        t["records_dropped"] += len(out.completions) - len(rewards)  # unscored (reward abstained or failed)
        if self.round_extra:  # dynamic sampling: scored, but in a tied or surplus group, never trained on
            t["records_filtered"] += len(rewards) - self.round_extra["rollout/dynamic_kept_records"]
        t["reward_errors"] += report.errors
        self.abstained += report.abstained
        self.timeouts += report.timeouts
        if report.first_error and self.first_error is None:
            say(trainer, f"[reward] first error (the run goes on; samples dropped): {report.first_error}")
        self.first_error = self.first_error or report.first_error
        self.rounds += 1
        self.reward_means.append(mean)
        source_means = {}
        for name, scores in report.per_source.items():  # each source apart; `gold` is logged, not trained on
            finite = [x for x in scores if x is not None]
            source_means[name] = sum(finite) / len(finite) if finite else float("nan")
            self.source_means.setdefault(name, []).append(source_means[name])
        n = max(len(out.completions), 1)
        stops = set(stop_ids(pl_module.policy, pl_module.tokenizer))  # eos_frac: ended at any stop id
        ended = sum(1 for c in out.completions if finished(c, stops))
        metrics = {
            "rollout/reward_mean": mean,
            "rollout/response_len_mean": gen_tokens / n,
            "rollout/eos_frac": ended / n,
            "rollout/truncated_frac": sum(1 for c in out.completions if len(c) >= self.generator.max_new_tokens
                                          and not finished(c, stops)) / n,
            "rollout/reward_abstained": float(report.abstained),
            "rollout/reward_errors": float(report.errors),
            "rollout/reward_timeouts": float(report.timeouts),
            **{f"rollout/reward/{name}": m for name, m in source_means.items()},
            **{k: float(v) for k, v in self._reward_stats().items() if isinstance(v, (int, float))},
            "rollout/round": float(self.rounds),
            "cost/generated_tokens": float(t["generated_tokens"]),
            "cost/generation_seconds": t["generation_seconds"],
            "perf/generated_tokens_per_sec": gen_tokens / max(out.seconds, 1e-9),
        }
        metrics |= mismatch | self.round_extra | self._tool_round()
        for k, v in self.round_extra.items():  # rollout/gen_batches → rollout/gen_batches_total, ...
            self.dynamic_totals[f"{k}_total"] = self.dynamic_totals.get(f"{k}_total", 0.0) + v
        metrics |= {f"rollout/{k}": v for k, v in getattr(pl_module, "last_round_stats", {}).items()}
        metrics |= getattr(trainer.datamodule, "round_stats", dict)()
        self.replay_fracs.append(metrics.get("rollout/replay_frac", 0.0))
        self.last_round = metrics  # read by callbacks/guards.py
        log_now(trainer, metrics)

    def _tool_summary(self) -> dict:
        """summary.json's tool statistics of the stage (env set): calls and malformed calls per episode,
        and the cost ledger's tool seconds and calls."""
        t = self.tool_totals
        if not t["episodes"]:
            return {}
        return {"rollout/tool_calls_per_episode_mean": t["tool_calls"] / t["episodes"],
                "rollout/tool_malformed_total": t["tool_malformed"],
                "rollout/tool_malformed_per_episode_mean": t["tool_malformed"] / t["episodes"],
                "rollout/tool_budget_spent_total": t.get("tool_budget_spent", 0.0),
                "cost/tool_seconds": t["tool_seconds"], "cost/tool_calls": t["tool_calls"],
                "cost/tool_wait_seconds": t.get("tool_wait_seconds", 0.0)}

    def _reward_stats(self) -> dict:
        return getattr(self.reward, "stats", dict)()

    def summary(self) -> dict:
        if not self.rounds:
            return {}
        finite = [m for m in self.reward_means if m == m]
        per_source = {}
        for name, curve in self.source_means.items():
            seen = [m for m in curve if m == m]
            per_source |= {f"rollout/reward/{name}_first": seen[0] if seen else None,
                           f"rollout/reward/{name}": seen[-1] if seen else None,
                           f"rollout/reward_curve/{name}": [m if m == m else None for m in curve]}
        return {"rollout/rounds": self.rounds,
                **{f"rollout/trigger/{k}": v for k, v in self.triggers.items()},
                "rollout/replay_frac_mean": sum(self.replay_fracs) / len(self.replay_fracs),
                "rollout/reward_mean_first": finite[0] if finite else None,
                "rollout/reward_mean": finite[-1] if finite else None,
                "rollout/reward_curve": [m if m == m else None for m in self.reward_means],
                "rollout/reward_abstained": self.abstained,
                "rollout/reward_timeouts": self.timeouts,
                **per_source,
                **self.dynamic_totals,
                **self._tool_summary(),
                **{f"cost/{k}": v for k, v in self.totals.items()},
                **self._reward_stats(),
                **{k: v for k, v in self.last_round.items() if k.startswith("rollout/logp_mismatch")},
                **({"rollout/first_reward_error": self.first_error} if self.first_error else {})}
