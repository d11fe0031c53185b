"""policyshift's side of a workload: the `python train.py ...` command line a user would type, plus the
bench's timing callback (bench/workloads/ps_timer.py) added as one more entry of the `callbacks` group.

What is switched off, because the TRL side does not do it either (the settings table in
bench/README_speed.md): held-out evaluation (`callbacks.evaluate`, `callbacks.preference_eval`),
checkpoints (`callbacks.checkpoint`, `trainer.enable_checkpointing`), the per-run plots
(`callbacks.plots`), W&B (`logger=csv` instead: the CSV logger writes every step, as TRL's
logging_steps=1 logs every step). The rest is train.py as it runs: the progress bar, the learning
guards, the cost ledger, the drift trigger (no thresholds set), the regeneration callback.
"""
from __future__ import annotations

from pathlib import Path

from bench.workloads.spec import DPO_BETA, SEED, Workload, MODELS

ROOT = Path(__file__).resolve().parents[2]


def model_overrides(w: Workload, model_dir: Path) -> list[str]:
    spec = MODELS[w.model]
    if spec["vocab_size"] is None:  # the embedded tiny Llama, built in code (model=tiny) as users run it
        return [f"model.hidden_size={spec['hidden_size']}", f"model.num_layers={spec['num_layers']}",
                f"model.num_heads={spec['num_heads']}", f"model.intermediate_size={spec['intermediate_size']}",
                f"model.max_position_embeddings={spec['max_position_embeddings']}"]
    return ["model=hf", f"model.name_or_path={model_dir}"]


def prompt_overrides(w: Workload, data_dir: Path) -> list[str]:
    """The arithmetic task as users run it, or (another prompt file) the prepared file through task=jsonl."""
    if w.prompts == "prompts.jsonl":
        return []
    return ["task=jsonl", f"task.train_path={data_dir / w.prompts}", "task.num_heldout=50"]


def algorithm_overrides(w: Workload, data_dir: Path) -> list[str]:
    if w.algorithm == "grpo":
        return ["algorithm=grpo", "data=fresh_rollouts", f"data.prompts_per_round={w.batch}",
                f"data.batch_size={w.records_per_step}", f"algorithm.group_size={w.group}",
                "algorithm.epochs_per_round=1", f"algorithm.beta={w.beta}",
                f"generator.max_new_tokens={w.max_new_tokens}", *prompt_overrides(w, data_dir)]
    if w.algorithm == "dpo":  # num_pairs: exactly one epoch of pairs (no dataloader rebuild mid-run)
        return ["algorithm=dpo", "data=static_preferences", f"data.batch_size={w.batch}",
                f"algorithm.beta={DPO_BETA}", f"algorithm.precompute_reference={str(w.precompute).lower()}",
                f"data.synthetic.num_pairs={w.steps * w.batch}"]
    if w.algorithm == "sft":
        return ["algorithm=sft", "data=demonstrations", f"data.batch_size={w.batch}",
                f"data.max_examples={w.steps * w.batch}"]
    raise ValueError(w.algorithm)


def task_overrides(w: Workload, data_dir: Path | None) -> list[str]:
    """A long-prompt workload reads the prepared prompts (system prompt + sum) as a JSONL task; the rest run
    the arithmetic task policyshift builds itself (the same prompts prepare.py wrote)."""
    if not w.prompt_prefix:
        return []
    if data_dir is None:
        raise ValueError(f"{w.name}: its prompts are a prepared file (bench/workloads/prepare.py): pass data_dir")
    return ["task=jsonl", f"task.train_path={data_dir / f'prompts_prefix{w.prompt_prefix}.jsonl'}",
            "task.num_heldout=50"]


# The `levers` side (bench/run.py --levers): the speed settings issue 35 built, off by default, as a user switches
# them on. Packing in every trainer; a group's prompt computed once where there are groups (GRPO). TRL's own
# padding-free mode stays off on its side: under SDPA/eager attention it lets packed rows attend to each other
# (only flash-attention's varlen kernels keep them apart), so on a CPU it would not be the same maths.
LEVERS = {"grpo": ("model.packing=true", "algorithm.shared_prefix=true"),
          "dpo": ("model.packing=true",), "sft": ("model.packing=true",)}


def overrides(w: Workload, model_dir: Path, run_dir: Path, timer_json: Path, data_dir: Path | None = None,
              levers: bool = False) -> list[str]:
    """(model_dir is <cache>/models/<name>: the prepared data sits in <cache>/data, unless data_dir says.)"""
    data = data_dir if data_dir is not None else model_dir.parents[1] / "data"
    return [
        "experiment=single", f"seed={SEED}", f"trainer.max_steps={w.steps}", "logger=csv",
        "callbacks.evaluate=null", "callbacks.preference_eval=null", "callbacks.checkpoint=null",
        "callbacks.plots=null", "trainer.enable_checkpointing=false",
        *algorithm_overrides(w, data), *model_overrides(w, model_dir), *task_overrides(w, data),
        *(LEVERS[w.algorithm] if levers else ()),
        "+callbacks.bench_timer._target_=bench.workloads.ps_timer.StepTimer",
        f"+callbacks.bench_timer.out={timer_json}",
        f"hydra.run.dir={run_dir}",
    ]


def command(python: str, w: Workload, model_dir: Path, run_dir: Path, timer_json: Path,
            data_dir: Path | None = None, levers: bool = False) -> list[str]:
    return [python, str(ROOT / "train.py"), *overrides(w, model_dir, run_dir, timer_json, data_dir, levers)]
