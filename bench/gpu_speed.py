"""GPU speed of policyshift on a ~0.5B Qwen2-shaped model (random weights, bf16). NOT RUN ON A GPU YET:
only the `--dry-run` (CPU, tiny shapes) has been checked.

    bash bench/gpu_speed.sh                                  # on the GPU machine (setup, nvidia-smi, this)
    OMP_NUM_THREADS=1 python bench/gpu_speed.py --dry-run    # the plumbing on CPU, < 1 minute

The model: Qwen2Config hidden 896, 24 layers, 14 heads, 2 kv heads, intermediate 4864, vocabulary 151,936,
tied embeddings (≈ Qwen2.5-0.5B), seed 1, saved with save_pretrained (bf16) together with the character
tokenizer padded to 151,936 tokens (models/tokenizer.py), as bench/workloads/prepare.py builds `big`.

1. Generation alone (in this process; vLLM in a subprocess of the python that imports it): 64 prompts of
   the arithmetic task × 8 samples, 256 new tokens, eos ignored, temperature 1, no top-k/top-p, one
   warm-up call, then `repeats` timed calls (median). Engines: `seam` generators.hf.HFGenerator.sample
   (generator=hf), `generate` plain model.generate(do_sample=True, top_k=0), `vllm`
   generators.vllm.VLLMGenerator.sample (generator=vllm; its time includes the weight sync it does
   every call). MFU = 2 × params × (prompt + generated tokens of every sequence) / seconds / peak.
2. GRPO (16 prompts × 8, 128 new tokens, β 0.04; generator=hf and generator=vllm) and DPO (32 pairs, a
   reference copy) end to end through `python train.py` (bench/workloads/policyshift_side.py's overrides,
   + hardware=gpu trainer.precision=bf16-mixed: float32 weights, bf16 compute), timed by bench/workloads/ps_timer.py's StepTimer: 6 steps, the
   median of the last 4. s/step; GRPO generated tokens/s; MFU of the train step = 6 × params × trained
   tokens per step (summary.json cost/trained_tokens / steps) / the median train_step seconds (the
   reference forward and the GRPO annotation are not counted as work).
3. Asynchronous rounds (issue 32; the block `async rounds` below): GRPO through train.py at
   callbacks.regenerate.max_staleness 0 and 1 (correction=decoupled_ppo, engine_startup=wait), s per round
   (one step a round), generated and trained tokens/s, the trainer's and the engine's idle seconds. The engine
   process runs on the CPU only (max_staleness > 0 refuses another accelerator), so this case runs
   hardware=cpu on the machine's cores, trainer and engine ASYNC_THREADS threads each, on a small Qwen2
   (ASYNC_SIZES): its figures are the overlap's, not the GPU's; no MFU (no CPU peak).
Params count the tied embedding once (it is the LM head's matmul). Peak: --peak-tflops (H200 bf16
dense 989). Results: $OUT/gpu_speed.{json,md} when $OUT is set, else bench/results/ (dry run:
gpu_speed_dry.*); the JSON is rewritten after every part, so a timeout keeps what finished.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import run_metrics  # noqa: E402
from bench.workloads import policyshift_side  # noqa: E402
from bench.workloads.prepare import TASK, _fresh, save_folder  # noqa: E402
from bench.workloads.spec import SEED, Workload  # noqa: E402

SIZES = {  # Qwen2Config fields; vocab_size None: the character tokenizer's own (100 tokens)
    "gpu": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                intermediate_size=4864, vocab_size=151_936, max_position_embeddings=32_768),
    "dry": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=None, max_position_embeddings=512),
}
SHAPES = {
    "gpu": dict(gen_prompts=64, gen_group=8, gen_tokens=256, repeats=2, grpo_prompts=16, grpo_group=8,
                grpo_tokens=128, dpo_pairs=32, steps=6, warmup=1),
    "dry": dict(gen_prompts=2, gen_group=2, gen_tokens=8, repeats=1, grpo_prompts=2, grpo_group=2,
                grpo_tokens=8, dpo_pairs=2, steps=2, warmup=0),
}
VLLM_KV_BYTES = {"gpu": 8 << 30, "dry": 256 << 20}  # generation: 512 × 264 tokens × 12 KiB ≈ 1.7 GB


def write_model(folder: Path, size: dict, device: str) -> Path:
    """The Qwen2 folder (config, bf16 weights, tokenizer); reused when already written with `size`.
    Initialised on `device` (on the GPU: seconds instead of a CPU init of 0.5B parameters)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from models.tokenizer import build_char_tokenizer

    settings = size | {"seed": SEED, "architecture": "Qwen2ForCausalLM", "dtype": "bfloat16"}
    if _fresh(folder, settings):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer(size["vocab_size"])
    config = Qwen2Config(**(size | {"vocab_size": len(tokenizer)}), tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(SEED)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    return save_folder(model, tokenizer, folder, settings)


def generation(engine: str, folder: Path, mode: str) -> dict:
    """One engine's generation figures: warm-up call, then the median of `repeats` timed calls."""
    import torch

    from models.hf import load_hf
    from tasks.arithmetic import arithmetic_task

    s = SHAPES[mode]
    device = "cuda" if mode == "gpu" else "cpu"
    torch.manual_seed(SEED)
    model, tokenizer = load_hf(str(folder), "bfloat16", False, False)
    model = model.to(device).eval()
    batch = [tokenizer(ex.prompt)["input_ids"] for ex in arithmetic_task(**TASK).train[: s["gen_prompts"]]
             for _ in range(s["gen_group"])]  # the arithmetic task's prompts, each `gen_group` times
    n = s["gen_tokens"]
    sampling = dict(max_new_tokens=n, temperature=1.0, top_p=1.0, batch_size=512, ignore_eos=True)
    if engine == "generate":
        from transformers import GenerationConfig

        from generators.hf import left_pad

        ids, mask = (t.to(device) for t in left_pad(batch, tokenizer.pad_token_id))
        config = GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=n,
                                  eos_token_id=None, pad_token_id=tokenizer.pad_token_id)

        def call() -> int:
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            return int(out[:, ids.shape[1]:].numel())
    else:
        if engine == "seam":
            from generators.hf import HFGenerator as Generator
        else:
            from generators.vllm import VLLMGenerator as Generator

            sampling |= dict(kv_cache_memory_bytes=VLLM_KV_BYTES[mode], max_model_len=1024, seed=SEED)
        gen = Generator(**sampling)

        def call() -> int:
            return sum(map(len, gen.sample(model, tokenizer, batch).completions))

    def timed() -> tuple[int, float]:
        torch.cuda.synchronize() if device == "cuda" else None
        start = time.perf_counter()
        tokens = call()
        torch.cuda.synchronize() if device == "cuda" else None
        return tokens, time.perf_counter() - start

    warmup_s = timed()[1]  # vLLM: the engine's start-up
    calls = [timed() for _ in range(s["repeats"])]
    seconds, tokens = statistics.median(c[1] for c in calls), calls[0][0]
    return {"engine": engine, "sequences": len(batch), "generated_tokens": tokens,
            "prompt_tokens": sum(map(len, batch)), "seconds": seconds, "seconds_all": [c[1] for c in calls],
            "warmup_s": warmup_s, "tokens_per_s": tokens / seconds, "full_length": tokens == len(batch) * n,
            "parameters": sum(p.numel() for p in model.parameters())}


def vllm_python(mode: str, given: str | None) -> tuple[str | None, str]:
    """(the python that imports vllm, '') or (None, why vLLM is skipped)."""
    if mode == "dry":
        return None, "dry run: vLLM is measured on the GPU only"
    candidates = [given] if given else [sys.executable, os.environ.get("VLLM_VENV", "/work/venv-vllm") + "/bin/python"]
    for py in filter(lambda c: Path(c).exists(), candidates):
        try:
            if subprocess.run([py, "-c", "import vllm"], capture_output=True, timeout=120).returncode == 0:
                return py, ""
        except subprocess.TimeoutExpired:
            pass
    return None, f"`import vllm` fails in {', '.join(candidates)} (scripts/install_vllm.sh; no internet here)"


def train_run(name: str, w: Workload, extra: list[str], python: str, folder: Path, work: Path,
              logs: Path, timeout: float) -> dict:
    """One `python train.py ...` run timed by StepTimer: its figures, or rc and the log's tail."""
    run_dir, timer = work / "runs" / name, work / "runs" / f"{name}.timer.json"
    shutil.rmtree(run_dir, ignore_errors=True)  # train.py refuses a folder that holds a run
    timer.parent.mkdir(parents=True, exist_ok=True)
    timer.unlink(missing_ok=True)
    args = policyshift_side.overrides(w, folder, run_dir, timer)
    assert f"model.name_or_path={folder}" in args, args  # w.model "big": policyshift_side's model=hf path
    cmd = [python, str(ROOT / "train.py"), *args, *extra]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = "timeout", f"killed after {timeout:.0f} s\n{e.stdout or ''}{e.stderr or ''}"
    out = {"command": " ".join(cmd[1:]), "rc": rc, "wall_s": time.perf_counter() - start}
    if rc != 0 or not timer.is_file():
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{name}.log").write_text("\n".join(str(log).splitlines()[-300:]))
        return out | {"error": "\n".join(str(log).strip().splitlines()[-30:])}
    result = json.loads(timer.read_text())
    stages = json.loads((run_dir / "summary.json").read_text()).values()
    trained = sum(st.get("cost/trained_tokens") or 0 for st in stages)
    metrics = run_metrics(result, w)
    train_step = statistics.median(result["train_step"][1 + w.warmup:])
    return out | metrics | {"train_step_s": train_step, "parameters": result["parameters"],
                            "trained_tokens_per_step": trained / result["optimizer_steps"],
                            "optimizer_steps": result["optimizer_steps"]}


def attempt(job) -> dict:
    """job()'s figures, or the exception it raised (recorded; the other parts still run)."""
    try:
        return job()
    except Exception as e:  # noqa: BLE001
        return {"rc": "exception", "error": f"{type(e).__name__}: {e}"}


def vllm_generation(python: str, work: Path, timeout: float) -> dict:
    """generation("vllm") in a subprocess of the python that imports vllm (it may be another venv)."""
    cmd = [python, __file__, "--generation-part", "vllm", "--work", str(work)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "error": f"vLLM generation killed after {timeout:.0f} s"}
    part = [ln for ln in proc.stdout.splitlines() if ln.startswith("PART ")]
    return json.loads(part[-1][5:]) if part else {"rc": proc.returncode, "error": proc.stderr[-3000:]}


def add_mfu(row: dict, peak: float, factor: int, tokens: float, seconds_key: str) -> None:
    if "parameters" in row and row.get(seconds_key):
        row["mfu"] = factor * row["parameters"] * tokens / row[seconds_key] / (peak * 1e12)


GEN_COLS = [("engine", lambda n, r: n), ("tokens", lambda n, r: f"{r['generated_tokens']:,}"),
            ("s", lambda n, r: f"{r['seconds']:.2f}"), ("tokens/s", lambda n, r: f"{r['tokens_per_s']:,.0f}"),
            ("MFU", lambda n, r: f"{r.get('mfu', 0):.2%}"), ("warm-up s", lambda n, r: f"{r['warmup_s']:.1f}")]
TRAIN_COLS = [("run", lambda n, r: n), ("s/step", lambda n, r: f"{r['s_per_step']:.2f}"),
              ("gen tok/s", lambda n, r: f"{r['throughput']:,.0f}" if n.startswith("grpo") else ""),
              ("train step s", lambda n, r: f"{r['train_step_s']:.3f}"),
              ("trained tok/step", lambda n, r: f"{r['trained_tokens_per_step']:,.0f}"),
              ("MFU train step", lambda n, r: f"{r.get('mfu', 0):.2%}")]


def table(rows: dict, cols: list, done_key: str) -> list[str]:
    """Markdown rows: the figures, or empty cells and why (skipped, or the error's last line)."""
    lines = ["| " + " | ".join(c[0] for c in cols) + " | note |", "|---" + "|---:" * (len(cols) - 1) + "|---|"]
    for name, r in rows.items():
        note = "" if done_key in r else r.get("skipped") or f"rc {r.get('rc')}: " + \
            ((r.get("error") or "").strip().splitlines() or [""])[-1]
        cells = [f(name, r) for _, f in cols] if done_key in r else [name] + [""] * (len(cols) - 1)
        lines.append("| " + " | ".join(cells + [note.replace("|", "\\|")[:300]]) + " |")
    return lines


def report(res: dict) -> str:
    m, sh = res["meta"], res["meta"]["shape"]
    return "\n".join([
        f"# policyshift GPU speed{' (DRY RUN: CPU, tiny shapes; figures mean nothing)' if m['dry_run'] else ''}",
        "", f"{m['device']}, torch {m['torch']}, commit {m['commit']}, {m['parameters']:,} parameters, peak "
        f"{m['peak_tflops']} TFLOP/s, {res.get('elapsed_s', 0):.0f} s in all. `bash bench/gpu_speed.sh`", "",
        f"Generation: {sh['gen_prompts']} prompts × {sh['gen_group']}, {sh['gen_tokens']} new tokens, eos ignored"
        f" (median of {sh['repeats']} timed calls after a warm-up).", "", *table(res["generation"], GEN_COLS,
                                                                                   "tokens_per_s"),
        "", f"Training through train.py: {sh['steps']} steps, median of the last {sh['steps'] - 1 - sh['warmup']}.",
        "", *table(res["train"], TRAIN_COLS, "s_per_step"), *async_report(res)]) + "\n"


# ==== async rounds (issue 32) =======================================================================
ASYNC_SIZES = {  # the CPU model of the asynchronous case (the engine runs on the CPU only)
    "gpu": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=1024, vocab_size=None, max_position_embeddings=512),
    "dry": SIZES["dry"],
}
ASYNC_SHAPES = {"gpu": dict(prompts=64, group=8, tokens=16, steps=12, warmup=3),
                "dry": dict(prompts=2, group=2, tokens=8, steps=4, warmup=1)}
ASYNC_THREADS = {"gpu": 8, "dry": 1}  # torch threads of the trainer, and of the engine
ASYNC_COLS = [("run", lambda n, r: n), ("s/round", lambda n, r: f"{r['s_per_step']:.3f}"),
              ("gen tok/s", lambda n, r: f"{r['throughput']:,.0f}"),
              ("trained tok/s", lambda n, r: f"{r['trained_tokens_per_step'] / r['s_per_step']:,.0f}"),
              ("train step s", lambda n, r: f"{r['train_step_s']:.3f}"),
              ("trainer idle s", lambda n, r: f"{r.get('trainer_idle_s', 0):.2f}"),
              ("engine idle s", lambda n, r: f"{r.get('engine_idle_s', 0):.2f}")]


def async_jobs(mode: str, work: Path, out: Path, left) -> list:
    """(section, name, python, job) of the asynchronous case: the same GRPO run at max_staleness 0 and 1."""
    s, threads, py = ASYNC_SHAPES[mode], ASYNC_THREADS[mode], sys.executable
    folder = work / "model_async"
    w = Workload("grpo", "grpo", batch=s["prompts"], group=s["group"], beta=0.04, max_new_tokens=s["tokens"],
                 model="big", warmup=s["warmup"], measure=s["steps"] - 1 - s["warmup"])
    common = ["hardware=cpu", "model.dtype=float32", "trainer.precision=32-true", "callbacks.progress.refresh_rate=0",
              "generator=hf", "correction=decoupled_ppo", f"callbacks.regenerate.engine_threads={threads}",
              "callbacks.regenerate.engine_startup=wait"]

    def job(name: str, k: int):
        def run() -> dict:
            write_model(folder, ASYNC_SIZES[mode], "cpu")
            saved = os.environ.get("OMP_NUM_THREADS")
            os.environ["OMP_NUM_THREADS"] = str(threads)  # the trainer's (train.py inherits it)
            try:
                row = train_run(name, replace(w, name=name), common + [f"callbacks.regenerate.max_staleness={k}"],
                                py, folder, work, out / "gpu_speed_logs", timeout=min(240, left() - 5))
            finally:
                os.environ.pop("OMP_NUM_THREADS") if saved is None else os.environ.update(OMP_NUM_THREADS=saved)
            summary = work / "runs" / name / "summary.json"
            if summary.is_file():
                stage = list(json.loads(summary.read_text()).values())[-1]
                row |= {"trainer_idle_s": stage.get("cost/trainer_idle_seconds", 0.0),
                        "engine_idle_s": stage.get("cost/engine_idle_seconds", 0.0),
                        "weight_sync_s": stage.get("cost/weight_sync_seconds", 0.0)}
            return row
        return run

    return [("async", "grpo_cpu_sync", py, job("grpo_cpu_sync", 0)),
            ("async", "grpo_cpu_async_k1", py, job("grpo_cpu_async_k1", 1))]


def async_report(res: dict) -> list[str]:
    rows = res.get("async") or {}
    if not rows:
        return []
    sync, k1 = rows.get("grpo_cpu_sync", {}), rows.get("grpo_cpu_async_k1", {})
    ratio = (f" Async ÷ sync wall per round: {k1['s_per_step'] / sync['s_per_step']:.2f}."
             if "s_per_step" in sync and "s_per_step" in k1 else "")
    return ["", "Asynchronous rounds (hardware=cpu: the engine process runs on the CPU only; "
            f"{ASYNC_THREADS['gpu' if not res['meta']['dry_run'] else 'dry']} threads each for trainer and engine), "
            f"one step a round, median of the measured steps.{ratio}", "", *table(rows, ASYNC_COLS, "s_per_step")]
# ==== end async rounds ==============================================================================


def save(res: dict, out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
    (out / f"{stem}.md").write_text(report(res))


def main() -> None:
    p = argparse.ArgumentParser(description="policyshift GPU speed (see the module docstring)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: the plumbing only")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H200: 989)")
    p.add_argument("--budget-s", type=float, default=520.0, help="stop starting parts after this")
    p.add_argument("--out", type=Path, default=None, help="default: $OUT, else bench/results")
    p.add_argument("--work", type=Path, default=None, help="model folder and run folders")
    p.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    p.add_argument("--sections", default="generation,train,async", help="comma-separated: which parts run")
    p.add_argument("--generation-part", help=argparse.SUPPRESS)  # engine: one generation measurement, as JSON
    a = p.parse_args()
    mode = "dry" if a.dry_run else "gpu"
    work = a.work or Path(f"/tmp/policyshift_gpu_speed{'_dry' if a.dry_run else ''}")
    folder = work / "model"
    if a.generation_part:  # the vLLM subprocess
        print("PART " + json.dumps(generation(a.generation_part, folder, mode)))
        return
    import torch

    if mode == "gpu" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch: run --dry-run on CPU")
    t0 = time.perf_counter()
    deadline = t0 + a.budget_s
    out = a.out or Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    stem = "gpu_speed_dry" if a.dry_run else "gpu_speed"
    s = SHAPES[mode]
    write_model(folder, SIZES[mode], "cuda" if mode == "gpu" else "cpu")
    vpy, why = vllm_python(mode, a.vllm_python)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    res = {"meta": {"dry_run": a.dry_run, "device": torch.cuda.get_device_name() if mode == "gpu" else "cpu",
                    "torch": torch.__version__, "commit": commit.stdout.strip() or "?", "peak_tflops": a.peak_tflops,
                    "model": SIZES[mode], "shape": s, "folder": str(folder), "vllm_python": vpy, "parameters": 0},
           "generation": {}, "train": {}, "async": {}}

    def left() -> float:
        return deadline - time.perf_counter()

    base = dict(model="big", warmup=s["warmup"], measure=s["steps"] - 1 - s["warmup"])
    grpo = Workload("grpo", "grpo", batch=s["grpo_prompts"], group=s["grpo_group"], beta=0.04,
                    max_new_tokens=s["grpo_tokens"], **base)
    dpo = Workload("dpo", "dpo", batch=s["dpo_pairs"], **base)
    common = [f"hardware={'gpu' if mode == 'gpu' else 'cpu'}", "model.dtype=float32", "trainer.precision=bf16-mixed",
              "callbacks.progress.refresh_rate=0"]
    hf_gen = ["generator=hf", "generator.ignore_eos=true"]
    vllm_gen = ["generator=vllm", "generator.ignore_eos=true", f"generator.kv_cache_memory_bytes={4 << 30}",
                "generator.max_model_len=1024"]

    def train(name: str, w: Workload, extra: list[str], python: str) -> dict:
        return train_run(name, replace(w, name=name), common + extra, python, folder, work,
                         out / "gpu_speed_logs", timeout=min(300, left() - 5))

    py = sys.executable
    jobs = [("generation", "seam", py, lambda: generation("seam", folder, mode)),  # vLLM last: the riskiest
            ("generation", "generate", py, lambda: generation("generate", folder, mode)),
            ("train", "grpo_hf", py, lambda: train("grpo_hf", grpo, hf_gen, py)),
            ("train", "dpo_ref", py, lambda: train("dpo_ref", dpo, [], py)),
            ("generation", "vllm", vpy, lambda: vllm_generation(vpy, work, min(240, left() - 5))),
            ("train", "grpo_vllm", vpy, lambda: train("grpo_vllm", grpo, vllm_gen, vpy))]
    jobs[4:4] = async_jobs(mode, work, out, left)  # async rounds (issue 32): before vLLM, the riskiest
    jobs = [j for j in jobs if j[0] in a.sections.split(",")]
    for section, name, python, job in jobs:
        print(f"[{time.perf_counter() - t0:.0f} s] {section} {name}", flush=True)
        row = res[section][name] = ({"skipped": why} if python is None else
                                    {"skipped": "time budget spent"} if left() < 45 else attempt(job))
        if section == "generation":
            add_mfu(row, a.peak_tflops, 2, row.get("prompt_tokens", 0) + row.get("generated_tokens", 0), "seconds")
        elif section == "train":
            add_mfu(row, a.peak_tflops, 6, row.get("trained_tokens_per_step", 0), "train_step_s")
        res["meta"]["parameters"] = res["meta"]["parameters"] or row.get("parameters", 0)
        res["elapsed_s"] = time.perf_counter() - t0
        save(res, out, stem)
    print(report(res))
    print(f"wrote {out / stem}.json and .md")


if __name__ == "__main__":
    main()
