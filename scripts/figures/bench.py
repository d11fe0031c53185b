"""The benchmark figures: speed against TRL (bench/run.py, its tables from bench/tables.py) and the
learning equivalence of 1 process and 2 ranks (bench/ranks_equivalence.sh, its table from
bench/ranks_equivalence.py)."""
from __future__ import annotations

import json
from pathlib import Path

from bench.ranks_equivalence import table_lines
from bench.tables import grpo_parts_table, mfu_table, readme_table
from scripts.figures.registry import Figure, Rendered, register

# --smoke: keys both stages of short_sft_grpo and short_sft_dpo have (a key no stage has is an error)
RANKS_SMOKE = ["trainer.max_steps=4", "data.batch_size=32", "task.num_heldout=20", "callbacks.evaluate.num_examples=20"]


def speed_commands(name: str, workloads: str, extra: list[str], report: str):
    """bench/run.py on `workloads`; its full report (every run, its load) to `report` (smoke: the temp dir)."""
    def commands(out: Path, smoke: bool) -> list[list[str]]:
        dest = f"{out}/{name}.md" if smoke else report
        return [["python", "bench/run.py", "--workloads", workloads, *(["--quick"] if smoke else extra),
                 "--out", dest, "--raw", f"{out}/{name}.json"]]
    return commands


def speed_render(name: str, report: str):
    def render(out: Path, smoke: bool) -> Rendered:
        raw = json.loads((out / f"{name}.json").read_text())
        summary = raw["summary"]
        where = str(out / f"{name}.md") if smoke else f"[{report}](../../{report})"
        notes = (f"Median over kept pairs of each run's median seconds per optimizer step, fresh processes "
                 f"alternating A B A B; every run with its load and why a pair was rejected: {where}. "
                 f"Settings matched on both sides: bench/README_speed.md.")
        parts = grpo_parts_table(summary)
        if parts.count("\n") > 1:  # a row beyond the head: some GRPO workload ran
            notes += f"\n\nGRPO steps, parts:\n\n{parts}"
        mfu = mfu_table(summary, raw.get("matmul_peak"))
        if mfu:
            notes += ("\n\nThe train step's MFU: model FLOPs (6 N a trained token, + 2 N for DPO's reference "
                      "forward; attention's own left out) over train-step seconds, against this machine's measured "
                      f"fp32 GEMM throughput (bench/matmul_peak.py):\n\n{mfu}")
        return Rendered(readme_table(summary), notes)
    return render


for _name, _title, _workloads, _extra, _report, _duration in (
        ("speed_tiny", "Speed against TRL, tiny model", "tiny_*,gen_tiny", [], "bench/results.md",
         "~11 min on an idle 2-core machine (needs `bash bench/trl_env.sh` once)"),
        ("speed_big", "Speed against TRL and a bare-PyTorch loop, compute-bound model, with and without the speed "
         "levers", "big_*,gen_big", ["--levers", "--pairs", "2"], "bench/results_big.md",
         "~1 h on an idle 2-core machine (needs `bash bench/trl_env.sh` once)"),
        ("speed_levers", "Speed against TRL, with and without the speed levers (model.packing, "
         "algorithm.shared_prefix)", "tiny_*,grpo_mixed_lengths,grpo_long_prompt", ["--levers", "--pairs", "3"],
         "bench/results_levers.md", "~15 min on an idle 2-core machine (needs `bash bench/trl_env.sh` once)")):
    register(Figure(_name, _title, _duration, speed_commands(_name, _workloads, _extra, _report),
                    speed_render(_name, _report)))


def ranks_commands(out: Path, smoke: bool) -> list[list[str]]:
    env = [f"SWEEP={out}/ranks", f"RESULTS={out}/ranks.md"]
    if smoke:
        env += ["SEEDS=1", f"EXTRA={' '.join(RANKS_SMOKE)}"]
    return [["env", *env, "bash", "bench/ranks_equivalence.sh"]]


def ranks_render(out: Path, smoke: bool) -> Rendered:
    notes = ("The same seed on 1 process and on 2 ranks is not the same trajectory: each step's gradient "
             "matches to float precision (tests/hardware/), the summation order does not, and the small-data "
             "SFT stage amplifies it. Compare the gains over each run's own SFT start, not one seed's accuracy.")
    return Rendered("\n".join(table_lines(out / "ranks")), notes)


register(Figure("ranks_equivalence", "Learning with 1 process and with 2 ranks (`hardware=cpu` vs `hardware=ddp`)",
                "~25 min on 2 cores", ranks_commands, ranks_render))
