"""The round's ledger, the accounting half of RegenerateExperience (callbacks/regenerate.py): each round's
rollout metrics (reward, lengths, tool statistics, an engine's weight syncs) logged as the round is made, the
stage's running totals the callback checkpoints (`cost/*`), and summary.json's rollout and cost entries.

A mixin: the totals are the callback's own attributes (set in its __init__, listed in its STATE), so a
checkpoint holds them as it always did."""
from __future__ import annotations

from callbacks.logging import log_now
from callbacks.round_economy import GAUGES
from generators.base import finished, stop_ids
from hardware import distributed
from hardware.console import say


class RoundLedger:
    """Accounting methods of the regeneration callback (no state of its own)."""

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
        # dynamic sampling: scored, but in a tied or surplus group, never trained on (nor carried to the next round)
        t["records_filtered"] += int(self.round_extra.get("rollout/dynamic_filtered_records", 0))
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
        metrics |= mismatch | self.round_extra | self._tool_round() | self._weight_sync()
        metrics |= self.ahead.round if self.ahead else {}
        for k, v in self.round_extra.items():  # rollout/gen_batches → rollout/gen_batches_total, ...
            if k not in GAUGES:
                self.dynamic_totals[f"{k}_total"] = self.dynamic_totals.get(f"{k}_total", 0.0) + v
        metrics |= {f"rollout/{k}": v for k, v in getattr(pl_module, "last_round_stats", {}).items()}
        metrics |= getattr(trainer.datamodule, "round_stats", dict)()
        self.replay_fracs.append(metrics.get("rollout/replay_frac", 0.0))
        self.last_round = metrics  # read by callbacks/guards.py
        log_now(trainer, metrics)

    def _weight_sync(self) -> dict[str, float]:
        """An engine with its own copy of the weights (generator=vllm, vllm_server) keeps running totals of
        the seconds and bytes its weight updates took: this round's share (perf/) and the stage's (cost/).
        Nothing for an engine that samples the policy itself; the asynchronous engine's are logged by
        callbacks/async_rounds.py."""
        seconds, nbytes = getattr(self.generator, "sync_seconds", None), getattr(self.generator, "sync_bytes", None)
        if seconds is None or nbytes is None or self.ahead is not None:  # async: its ledger counts staging too
            return {}
        (last_s, last_b), self._synced = self._synced, (seconds, nbytes)
        t = self.totals  # sums of the rounds' shares: a resumed run's restored totals go on growing
        t["weight_sync_seconds"] = t.get("weight_sync_seconds", 0.0) + seconds - last_s
        t["weight_sync_bytes"] = t.get("weight_sync_bytes", 0.0) + float(nbytes - last_b)
        return {"perf/weight_sync_seconds": seconds - last_s, "perf/weight_sync_bytes": float(nbytes - last_b),
                "cost/weight_sync_seconds": t["weight_sync_seconds"], "cost/weight_sync_bytes": t["weight_sync_bytes"]}

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
                **(self.ahead.summary() if self.ahead is not None else {}),
                **{f"cost/{k}": v for k, v in self.totals.items()},
                **self._reward_stats(),
                **{k: v for k, v in self.last_round.items() if k.startswith("rollout/logp_mismatch")},
                **({"rollout/first_reward_error": self.first_error} if self.first_error else {})}
