"""How bench/run.py measures one run and judges it: step seconds after the warm-up, a run's figures,
the busy-machine rules (a pair is kept only when every run in it started on, and ran on, an idle
machine), the aggregate over kept pairs, and `measure`: one child process with its wall time, peak RSS
(wait4), load average and the CPU other processes used before and during it (/proc/stat)."""
from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.workloads.spec import Workload

ROOT = Path(__file__).resolve().parent.parent  # runs start in the repository root

def step_seconds(ends: list[float], warmup: int) -> list[float]:
    """Seconds of each optimizer step after the warm-up: step k lasts ends[k] - ends[k-1] (step 0 has
    no previous end), and the first `warmup` of those are dropped."""
    return [b - a for a, b in zip(ends, ends[1:])][warmup:]


def run_metrics(result: dict, w: Workload) -> dict:
    """One run's figures from the JSON a side wrote: median s/step over the measured steps and the
    throughput in w.unit (GRPO: the median over those steps of generated tokens / step seconds)."""
    steps = step_seconds(result["ends"], w.warmup)
    if len(steps) != w.measure:
        raise ValueError(f"{result.get('side')}: {len(steps)} measured steps, expected {w.measure} "
                         f"({len(result['ends'])} step ends)")
    out = {"s_per_step": statistics.median(steps), "steps_s": steps}
    if w.algorithm == "grpo":
        tokens = result["generated_tokens"][1 + w.warmup: 1 + w.warmup + w.measure]
        out["throughput"] = statistics.median(t / s for t, s in zip(tokens, steps))
        out["tokens_per_step"] = statistics.median(tokens)
        gen = result.get("generation", [])[1 + w.warmup: 1 + w.warmup + w.measure]
        out["generation_s"] = statistics.median(gen) if gen else None
    else:
        out["throughput"] = w.batch / out["s_per_step"]
    out |= train_flops(result, w)
    return out


def step_flops_per_token(w: Workload, parameters: int) -> float:
    """Model FLOPs a trained token costs inside the train step: 6 N (forward 2 N, backward 4 N), plus 2 N for
    DPO's frozen-reference forward, which runs in the step (GRPO's reference forward runs in annotate, outside
    it; precomputed reference log-probs cost nothing there). Attention's own FLOPs are left out (≤ 5 % at
    these lengths: 4 · layers · length · hidden against 6 N per token)."""
    reference = w.algorithm == "dpo" and not w.precompute
    return (6 + 2 * reference) * parameters


def train_flops(result: dict, w: Workload) -> dict:
    """The train step's achieved FLOP/s (median over the measured steps of model FLOPs / train-step seconds),
    from a side that reports each step's trained tokens and train-step seconds (policyshift's StepTimer)."""
    tokens, seconds, n = result.get("trained_tokens"), result.get("train_step"), result.get("parameters")
    if not (tokens and seconds and n):
        return {}
    window = slice(1 + w.warmup, 1 + w.warmup + w.measure)
    per_token = step_flops_per_token(w, n)
    rates = [t * per_token / s for t, s in zip(tokens[window], seconds[window]) if s > 0 and t > 0]
    if not rates:
        return {}
    return {"train_tflops": statistics.median(rates) / 1e12, "trained_tokens_per_step": statistics.median(tokens[window]),
            "train_step_s": statistics.median(seconds[window])}


@dataclass
class Limits:
    max_load: float           # 1-minute load average before a run
    max_others_before: float  # cores other processes used in the seconds before a run
    max_others: float         # share of all cores other processes used during a run


def verdict(run: dict, limits: Limits) -> str | None:
    """Why a run's figures are not kept (None: kept). Failures are reported separately."""
    if run.get("rc", 0) != 0:
        return f"failed (rc {run['rc']})"
    reasons = []
    if run["load_before"] > limits.max_load:
        reasons.append(f"load {run['load_before']:.2f} > {limits.max_load:.2f} before")
    if run["others_before"] > limits.max_others_before:
        reasons.append(f"others used {run['others_before']:.2f} cores before")
    if run["others_frac"] > limits.max_others:
        reasons.append(f"others used {run['others_frac']:.0%} of the cores during")
    return "; ".join(reasons) or None


def pair_verdict(runs: list[dict], limits: Limits) -> str | None:
    """A pair is kept only if every run in it is."""
    bad = [f"{r['side']}: {v}" for r in runs if (v := verdict(r, limits))]
    return "; ".join(bad) or None


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(pairs: list[dict], sides: list[str]) -> dict:
    """Per side: the median over kept pairs of each run's median s/step, throughput, peak RSS."""
    kept = [p for p in pairs if p["kept"]]
    out = {"kept": len(kept), "rejected": len(pairs) - len(kept),
           "busy": sum(p["why"] is not None for p in kept)}  # --quick keeps pairs taken on a busy machine
    for side in sides:
        runs = [p["runs"][side] for p in kept if side in p["runs"] and "throughput" in p["runs"][side]]
        out[side] = {"s_per_step": median_or_none(r.get("s_per_step") for r in runs),
                     "throughput": median_or_none(r["throughput"] for r in runs),
                     "peak_rss_mb": median_or_none(r["peak_rss_mb"] for r in runs),
                     "generation_s": median_or_none(r.get("generation_s") for r in runs),
                     "train_tflops": median_or_none(r.get("train_tflops") for r in runs),
                     "trained_tokens_per_step": median_or_none(r.get("trained_tokens_per_step") for r in runs),
                     "train_step_s": median_or_none(r.get("train_step_s") for r in runs),
                     "runs": len(runs)}
    return out


# ------------------------------------------------------------------------- measuring


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot (/proc/stat; nan elsewhere)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def others_now(seconds: float = 2.0) -> float:
    """Cores other processes keep busy right now (this runner sleeps meanwhile)."""
    busy, own, start = machine_busy_s(), sum(os.times()[:2]), time.perf_counter()
    time.sleep(seconds)
    return max(0.0, (machine_busy_s() - busy) - (sum(os.times()[:2]) - own)) / (time.perf_counter() - start)


def measure(cmd: list[str], env: dict, log: Path, timeout: float) -> dict:
    """Run `cmd` in a fresh process; its exit code, wall seconds, peak RSS (its own ru_maxrss), the load
    before/after and the CPU other processes used before and during it."""
    others_before = others_now()
    load_before = os.getloadavg()[0]
    busy, start = machine_busy_s(), time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    child_cpu = usage.ru_utime + usage.ru_stime
    others = max(0.0, (machine_busy_s() - busy) - child_cpu)
    return {"rc": proc.returncode, "wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "cpu_s": child_cpu,
            "load_before": load_before, "load_after": os.getloadavg()[0], "others_before": others_before,
            "others_frac": others / (wall * (os.cpu_count() or 1)), "log": str(log)}
