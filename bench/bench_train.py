"""CPU cost of one optimizer step for GRPO and SFT, through the project's own code paths.

    python bench/bench_train.py                    # every case, each in its own subprocess; prints a
                                                   # markdown table, writes bench/results/latest.json
    python bench/bench_train.py --case grpo        # one case in this process (prints its JSON)
    python bench/bench_train.py --runs 30 --warmup 3 --threads 1

What runs. Each case composes the project's Hydra config (conf/, so lr, clipping, annotate batch size,
gradient clipping... are the YAML defaults) with the overrides below, builds every part the way
`run.stages.run_stage` does (models.tiny.build_tiny, generators.hf.HFGenerator, the
rewards verifier, data_modules.*, trainers.grpo.GRPOModule / trainers.sft.SFTModule) and fits a real
`lightning.Trainer` with `callbacks.regenerate.RegenerateExperience`. A real Trainer rather than a
hand-driven `training_step` + `optimizer.step()`, because the per-step cost a user pays includes what
Lightning does around it: the closure, backward, gradient clipping, the scheduler, `self.log`, and
for GRPO the epoch boundary where a round is generated and the train dataloader is rebuilt. Not
included: loggers (logger=False), the progress bar, held-out evaluation, checkpointing.

  grpo  tiny Llama (hidden 64, 2 layers, 4 heads, intermediate 256), arithmetic task, 16 prompts × 8
        samples = 128 records, 8 new tokens, β=0.04 (frozen reference), one optimizer step per round.
  sft   same model, demonstrations of the arithmetic task's exact solver, batch 64.
  grpo_real_vocab  a Qwen2-shaped model (vocabulary 151,936, hidden 256, 2 layers, random weights;
        written to a temp dir by `python -m models.synthetic` in another process, so its build is not in
        this process's peak RSS) through `model=hf`: 8 prompts × 8 samples, 128 new tokens every time
        (eos ignored), β=0.04, micro-batches of 8. `grpo_real_vocab_vllm`: the same with
        `generator=vllm` (run it with the vllm venv's python; its `other_s` includes the policy forward
        that measures the engine/policy log-prob mismatch). BENCH_BEFORE_ISSUE_9=1 drops the keys the
        code before the bounded-memory rework lacks (micro_batch_size, ignore_eos), to measure it.

What is measured. A timing callback marks every optimizer step (on_train_batch_start/_end).
`step_wall_s` is the time between the ends of two consecutive steps: for GRPO that is one whole round
(generation + reward + annotation + dataloader rebuild + train step); for SFT it is batch collation +
train step. GRPO also reports the parts: `generation_s` (HFGenerator.sample, as it times itself),
`annotate_s` (GRPOModule.annotate: advantages + reference log-probs), `train_step_s` (forward,
backward, clip, optimizer and scheduler step, logging) and `other_s` (the rest of the round: reward
scoring, record building, dataloader, hooks). `gen_tokens_per_s` = tokens actually generated (cut at
eos) / generation_s. Step 0 (no previous end to measure from) and the next `--warmup` steps are
dropped; median/min/max are over the `--runs` steps after them (each GRPO step is a fresh round).
`peak_rss_mb` is ru_maxrss of the case's own process (imports included; `rss_after_imports_mb` is
the same figure just before the model is built, so the difference is what the case itself adds).

Reading the figures. torch uses all cores by default; on a small machine any other busy process
makes its OpenMP threads wait on each other and steps get many times slower, not 2×. So each case
records `others_cpu_frac`, the share of all cores that other processes used while it trained
(/proc/stat busy time minus this process's own CPU time): well above 0 %, or a max far from the
median, means the machine was shared; rerun when it is idle, or pin `--threads 1`.
Benchmarks are never part of the test suite's pass/fail.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for key, value in {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(key, value)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.intermediate_size=256"]
CASES = {
    "grpo": ["algorithm=grpo", "data=fresh_rollouts", "data.prompts_per_round=16", "data.batch_size=128",
             "algorithm.group_size=8", "algorithm.epochs_per_round=1", "algorithm.beta=0.04",
             "generator.max_new_tokens=8", *MODEL],
    # the same rounds, 90% of each round's groups replayed from the buffer (14 of 16): less generation
    "grpo_replay90": ["algorithm=grpo", "data=replay_mix", "data.replay_ratio=0.9", "data.max_staleness=40",
                      "data.max_reuse=10", "data.prompts_per_round=16", "data.batch_size=128",
                      "algorithm.group_size=8", "algorithm.epochs_per_round=1", "algorithm.beta=0.04",
                      "generator.max_new_tokens=8", *MODEL],
    # PPO on the same rounds (μ = 1 for one step a round): adds the value head and GAE
    "ppo": ["algorithm=ppo", "data=fresh_rollouts", "data.prompts_per_round=16", "data.batch_size=128",
            "algorithm.group_size=8", "algorithm.epochs_per_round=1", "generator.max_new_tokens=8", *MODEL],
    "sft": ["algorithm=sft", "data=demonstrations", "data.batch_size=64", *MODEL],
    # a real vocabulary: Qwen2 shape (vocab 151,936, hidden 256, 2 layers, 4 heads, intermediate 1,024,
    # tied embeddings, random weights, written by models/synthetic.py), 8 prompts × 8 samples, 128 new
    # tokens every time (eos ignored), β=0.04 with a frozen reference, micro-batches of 8
    "grpo_real_vocab": ["algorithm=grpo", "data=fresh_rollouts", "data.prompts_per_round=8",
                        "data.batch_size=64", "data.micro_batch_size=8", "algorithm.group_size=8",
                        "algorithm.epochs_per_round=1", "algorithm.beta=0.04", "generator.max_new_tokens=128",
                        "generator.ignore_eos=true", "model=hf", "model.name_or_path={real_vocab_dir}"],
}
CASES["grpo_real_vocab_vllm"] = CASES["grpo_real_vocab"] + ["generator=vllm", "generator.max_new_tokens=128",
                                                            "generator.ignore_eos=true"]  # in the vllm venv
REAL_VOCAB_ONLY_NEW = ("data.micro_batch_size=", "generator.ignore_eos=")  # keys the code before #9 lacks


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (Linux /proc/stat; nan elsewhere)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


def timed(fn, sink: list):
    """`fn`, appending the wall seconds of each call to `sink`."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        sink.append(time.perf_counter() - start)
        return out
    return wrapper


def stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def step_timer():
    """A Lightning callback recording wall-clock marks around every optimizer step."""
    import lightning as L

    class StepTimer(L.Callback):
        def __init__(self):
            self.train_step_s, self.ends = [], []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            now = time.perf_counter()
            self.train_step_s.append(now - self._start)
            self.ends.append(now)

    return StepTimer()


def fit_measured(trainer, module, datamodule, steps: int) -> float:
    """trainer.fit, checking it ran `steps` steps; returns the share of all cores that other
    processes used meanwhile (/proc/stat busy time minus this process's own CPU time)."""
    busy, own, wall = machine_busy_s(), sum(os.times()[:2]), time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    others = (machine_busy_s() - busy) - (sum(os.times()[:2]) - own)
    if trainer.global_step != steps:
        raise RuntimeError(f"expected {steps} optimizer steps, ran {trainer.global_step}")
    return max(others, 0.0) / ((time.perf_counter() - wall) * os.cpu_count())


def run_in_subprocess(script: str, case: str, args) -> dict:
    """`script --case case` in a fresh process (so peak RSS is the case's own); its JSON result."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, script, "--case", case, "--warmup", str(args.warmup),
               "--runs", str(args.runs), "--json", out.name]
        cmd += ["--threads", str(args.threads)] if args.threads else []
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            sys.exit(f"case {case} failed (rc {proc.returncode}):\n"
                     f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        return json.loads(Path(out.name).read_text())


def machine_env(results: dict, script: str, started: float) -> dict:
    first = next(iter(results.values()))
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch_version": first["torch_version"], "torch_threads": first["torch_threads"],
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(["python", script, *sys.argv[1:]]),
            "total_seconds": round(time.perf_counter() - started, 1)}


# ----------------------------------------------------------------------------------------- one case


def run_case(case: str, warmup: int, runs: int, threads: int | None) -> dict:
    import lightning as L
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from callbacks.regenerate import RegenerateExperience
    from run.stages import build
    from run.validation.config import validate

    if threads:
        torch.set_num_threads(threads)
    from hardware.memory import return_large_blocks_to_os
    return_large_blocks_to_os()  # as train.py does

    class TimedRegenerate(RegenerateExperience):
        """The project's callback, recording each round's generation time and generated tokens."""

        def __init__(self, *args):
            super().__init__(*args)
            self.round_costs: list[dict] = []

        def regenerate(self, trainer, pl_module, trigger="schedule"):
            before = dict(self.totals)
            records = super().regenerate(trainer, pl_module, trigger)
            self.round_costs.append({k: self.totals[k] - before[k]
                                     for k in ("generation_seconds", "generated_tokens")})
            return records

    rss_imports = peak_rss_mb()
    steps = warmup + runs + 1  # +1: a step's wall time is measured from the previous step's end
    # no checkpoints: Lightning would add a ModelCheckpoint saving every round (~0.1 s each; not a step cost)
    overrides = ["experiment=single", "logger=none", "trainer.enable_checkpointing=false",
                 f"trainer.max_steps={steps}", *CASES[case]]
    scratch = tempfile.TemporaryDirectory()
    if case.startswith("grpo_real_vocab"):
        model_dir = Path(scratch.name) / "qwen-like"  # written by another process: not in this one's peak RSS
        subprocess.run([sys.executable, "-m", "models.synthetic", str(model_dir)], cwd=ROOT, check=True,
                       capture_output=True)
        overrides = [o.format(real_vocab_dir=model_dir) for o in overrides]
        if os.environ.get("BENCH_BEFORE_ISSUE_9"):  # measuring the old code: its config lacks these keys
            overrides = [o for o in overrides if not o.startswith(REAL_VOCAB_ONLY_NEW)]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    validate(cfg, case)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    task = instantiate(cfg.task)
    policy, tokenizer = instantiate(cfg.model)
    datamodule = build(cfg.data, task=task, tokenizer=tokenizer)
    module = build(cfg.algorithm, policy=policy, tokenizer=tokenizer)
    timer, callbacks, annotate_s = step_timer(), [], []
    if getattr(datamodule, "online", False):
        regen = TimedRegenerate(instantiate(cfg.generator), instantiate(cfg.reward))
        module.annotate = timed(module.annotate, annotate_s)  # the instance's bound method, wrapped
        callbacks.append(regen)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(**cfg.trainer, callbacks=[*callbacks, timer], logger=False,
                            enable_progress_bar=False, default_root_dir=tmp)
        others_frac = fit_measured(trainer, module, datamodule, steps)

    keep = slice(warmup + 1, steps)  # step k's wall = ends[k] - ends[k-1]; step k uses round k
    wall = [b - a for a, b in zip(timer.ends, timer.ends[1:])][warmup:]
    metrics = {"step_wall_s": stats(wall), "train_step_s": stats(timer.train_step_s[keep])}
    if callbacks:
        gen = [r["generation_seconds"] for r in regen.round_costs[keep]]
        toks = [r["generated_tokens"] for r in regen.round_costs[keep]]
        ann = annotate_s[keep]
        other = [w - g - a - t for w, g, a, t in zip(wall, gen, ann, timer.train_step_s[keep])]
        metrics |= {"generation_s": stats(gen), "annotate_s": stats(ann), "other_s": stats(other),
                    "gen_tokens_per_s": stats([n / g for n, g in zip(toks, gen)]),
                    "gen_tokens_per_round": stats([float(n) for n in toks])}
    return {
        "case": case, "overrides": overrides, "warmup": warmup, "runs": runs,
        "records_per_step": cfg.data.batch_size,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "metrics": metrics, "peak_rss_mb": peak_rss_mb(), "rss_after_imports_mb": rss_imports,
        "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
        "torch_version": torch.__version__,
        "others_cpu_frac": others_frac,  # share of all cores other processes used during fit()
    } | ({} if scratch.cleanup() else {})


# ------------------------------------------------------------------------------------- all cases

ROWS = {  # metric key → (label, unit, format)
    "step_wall_s": ("seconds / optimizer step", "s", "{:.3f}"),
    "generation_s": ("  generation (HFGenerator.sample)", "s", "{:.3f}"),
    "annotate_s": ("  annotate (advantages + ref log-probs)", "s", "{:.4f}"),
    "train_step_s": ("  train step (fwd, bwd, clip, AdamW)", "s", "{:.4f}"),
    "other_s": ("  other (reward, records, dataloader, hooks)", "s", "{:.4f}"),
    "gen_tokens_per_s": ("generated tokens / s", "tok/s", "{:.0f}"),
    "gen_tokens_per_round": ("generated tokens / round", "tok", "{:.0f}"),
}


def table(results: dict) -> str:
    lines = ["| case | metric | median | min | max | unit |", "|---|---|---:|---:|---:|---|"]
    for case, r in results.items():
        for key, (label, unit, fmt) in ROWS.items():
            if key in r["metrics"]:
                m = r["metrics"][key]
                lines.append(f"| {case} | {label} | {fmt.format(m['median'])} | {fmt.format(m['min'])} "
                             f"| {fmt.format(m['max'])} | {unit} |")
        for key, label in (("peak_rss_mb", "peak RSS (process)"),
                           ("rss_after_imports_mb", "RSS after imports")):
            lines.append(f"| {case} | {label} | {r[key]:.0f} | | | MB |")
    return "\n".join(lines)


def run_all(args) -> None:
    results, started = {}, time.perf_counter()
    for case in args.cases:
        results[case] = run_in_subprocess(__file__, case, args)
    env = machine_env(results, "bench/bench_train.py", started)
    report = table(results)
    print(f"CPU: {env['cpu_model']} ({env['cpu_count']} cores) | torch {env['torch_version']}, "
          f"{env['torch_threads']} threads | python {env['python']} | "
          f"median of {args.runs} runs after {args.warmup} warmup")
    print("CPU used by other processes during each case: " + ", ".join(
        f"{c} {r['others_cpu_frac']:.0%}" for c, r in results.items()) + "\n")
    print(report)
    print(f"\ntotal {env['total_seconds']} s")
    dest = ROOT / "bench" / "results" / "latest.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"env": env, "cases": results, "table": report}, indent=2))
    print(f"wrote {dest.relative_to(ROOT)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=list(CASES), help="run one case in this process")
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own choice)")
    p.add_argument("--json", help="with --case: write the result here instead of stdout")
    args = p.parse_args()
    if args.runs < 1 or args.warmup < 0:
        p.error("--runs must be ≥ 1 and --warmup ≥ 0")
    if args.case is None:
        return run_all(args)
    result = run_case(args.case, args.warmup, args.runs, args.threads)
    text = json.dumps(result, indent=2)
    Path(args.json).write_text(text) if args.json else print(text)


if __name__ == "__main__":
    main()
