"""bench/run.py's pure parts: step timing after the warm-up, the busy-machine rules, aggregation over
kept pairs, the tables; and that every side is given the workload's shape (no benchmark runs here)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench import run
from bench.workloads import policyshift_side, trl_side
from bench.workloads.spec import BARE, WORKLOADS, quick

LIMITS = run.Limits(max_load=1.5, max_others_before=0.25, max_others=0.10)


def quiet_run(**kw):
    return {"side": "policyshift", "rc": 0, "load_before": 0.3, "load_after": 0.9, "others_before": 0.02,
            "others_frac": 0.01} | kw


def test_step_seconds_drop_step_zero_and_the_warmup():
    ends = [10.0, 11.0, 11.5, 13.5, 14.0, 14.25]
    assert run.step_seconds(ends, warmup=0) == [1.0, 0.5, 2.0, 0.5, 0.25]
    assert run.step_seconds(ends, warmup=2) == [2.0, 0.5, 0.25]


def test_run_metrics_grpo_aligns_tokens_with_the_measured_steps():
    w = WORKLOADS["tiny_grpo_b0.04"]  # warmup 3, measure 20
    ends = [float(k) for k in range(w.steps)]  # 1 s a step
    tokens = [0] * (1 + w.warmup) + [1000 + k for k in range(w.measure)]
    m = run.run_metrics({"side": "trl", "ends": ends, "generated_tokens": tokens,
                         "generation": [0.5] * w.steps}, w)
    assert m["s_per_step"] == 1.0 and len(m["steps_s"]) == w.measure
    assert m["throughput"] == pytest.approx(1000 + (w.measure - 1) / 2)
    assert m["generation_s"] == 0.5


def test_run_metrics_dpo_throughput_is_pairs_over_the_median_step():
    w = quick(WORKLOADS["tiny_dpo_ref"])  # 1 + 1 warm-up + 2 measured
    m = run.run_metrics({"ends": [0.0, 5.0, 5.5, 5.75]}, w)
    assert m["steps_s"] == [0.5, 0.25] and m["s_per_step"] == 0.375
    assert m["throughput"] == pytest.approx(32 / 0.375)


def test_run_metrics_refuses_a_run_with_missing_steps():
    with pytest.raises(ValueError, match="measured steps"):
        run.run_metrics({"ends": [0.0, 1.0]}, quick(WORKLOADS["tiny_sft"]))


def test_verdict_rules():
    assert run.verdict(quiet_run(), LIMITS) is None
    assert "load 2.10" in run.verdict(quiet_run(load_before=2.1), LIMITS)
    assert "cores before" in run.verdict(quiet_run(others_before=0.6), LIMITS)
    assert "during" in run.verdict(quiet_run(others_frac=0.3), LIMITS)
    assert run.verdict(quiet_run(rc=1), LIMITS).startswith("failed")
    # a pair is only as good as its worst run
    assert run.pair_verdict([quiet_run(), quiet_run(side="trl")], LIMITS) is None
    assert run.pair_verdict([quiet_run(), quiet_run(side="trl", others_frac=0.5)], LIMITS).startswith("trl:")


def test_aggregate_takes_medians_over_kept_pairs_only():
    def pair(kept, ps, trl):
        runs = {"policyshift": {"s_per_step": ps, "throughput": 1 / ps, "peak_rss_mb": 500.0},
                "trl": {"s_per_step": trl, "throughput": 1 / trl, "peak_rss_mb": 600.0}}
        return {"kept": kept, "why": None if kept else "busy", "runs": runs}

    pairs = [pair(True, 1.0, 2.0), pair(False, 100.0, 100.0), pair(True, 3.0, 4.0), pair(True, 2.0, 3.0)]
    agg = run.aggregate(pairs, ["policyshift", "trl"])
    assert (agg["kept"], agg["rejected"]) == (3, 1)
    assert agg["policyshift"]["s_per_step"] == 2.0 and agg["trl"]["s_per_step"] == 3.0
    assert agg["policyshift"]["peak_rss_mb"] == 500.0
    table = run.speed_table({"tiny_dpo_ref": agg | {"tokens": {}}})
    assert "| tiny_dpo_ref | 2.0000 | 3.0000 | 1.50× |" in table and "3 / 1" in table


def test_speed_table_reports_the_overhead_over_the_bare_floor():
    side = {"s_per_step": 1.1, "throughput": 10.0, "peak_rss_mb": 1.0, "generation_s": None, "runs": 1}
    summary = {"big_sft": {"kept": 1, "rejected": 0, "policyshift": side, "trl": side | {"s_per_step": 2.2},
                           "bare": side | {"s_per_step": 1.0}, "tokens": {}}}
    assert "+10.0 %" in run.speed_table(summary)


def test_select_workloads():
    assert run.select(None) == run.ALL
    assert run.select("tiny_grpo*,gen_big") == ["tiny_grpo_b0.04", "tiny_grpo_b0", "gen_big"]
    with pytest.raises(SystemExit, match="matches none"):
        run.select("nope")


def test_the_bare_floor_and_vllm_rules():
    assert BARE and all(WORKLOADS[n].model == "big" for n in BARE)
    assert run.vllm_unsupported("tiny") and run.vllm_unsupported("big") is None


def test_policyshift_side_runs_train_py_with_the_workload_shape(tmp_path: Path):
    w = WORKLOADS["tiny_grpo_b0.04"]
    cmd = policyshift_side.command("python", w, tmp_path, tmp_path / "run", tmp_path / "t.json")
    assert cmd[1].endswith("train.py")
    for o in ("data.prompts_per_round=16", "data.batch_size=128", "algorithm.group_size=8", "algorithm.beta=0.04",
              "generator.max_new_tokens=8", f"trainer.max_steps={w.steps}", "model.hidden_size=64", "logger=csv",
              "+callbacks.bench_timer._target_=bench.workloads.ps_timer.StepTimer"):
        assert o in cmd, o
    big = policyshift_side.overrides(WORKLOADS["big_dpo_precomputed"], tmp_path, tmp_path, tmp_path / "t.json")
    assert "model=hf" in big and "algorithm.precompute_reference=true" in big
    assert f"data.synthetic.num_pairs={WORKLOADS['big_dpo_precomputed'].steps * 32}" in big


def test_trl_side_matches_the_settings_that_change_the_work(tmp_path: Path):
    args = trl_side.common_args(WORKLOADS["tiny_grpo_b0.04"], str(tmp_path))
    assert args["per_device_train_batch_size"] == 128  # TRL counts completions: 16 prompts × 8
    assert args["bf16"] is False and args["activation_checkpointing"] is False
    assert args["gradient_checkpointing"] is False
    assert args["lr_scheduler_type"] == "constant_with_warmup" and args["warmup_steps"] == 10
    assert args["max_steps"] == WORKLOADS["tiny_grpo_b0.04"].steps
    assert trl_side.common_args(WORKLOADS["tiny_sft"], str(tmp_path))["lr_scheduler_type"] == "cosine"
    assert trl_side.exact_match([], [" 12\nx", "13", "1"], ["12", "12", "12"]) == [1.0, 0.0, 0.0]


def test_the_levers_side_switches_packing_and_the_shared_prefix_on(tmp_path):
    """--levers: a third side, the policyshift command with issue 35's settings (shared prefix only where there
    are groups), and its columns in both tables."""
    from bench.workloads import policyshift_side
    grpo, dpo = run.WORKLOADS["grpo_long_prompt"], run.WORKLOADS["tiny_dpo_ref"]
    plain = policyshift_side.overrides(grpo, tmp_path / "models" / "tiny", tmp_path / "r", tmp_path / "t.json")
    on = policyshift_side.overrides(grpo, tmp_path / "models" / "tiny", tmp_path / "r", tmp_path / "t.json",
                                    levers=True)
    assert set(on) - set(plain) == {"model.packing=true", "algorithm.shared_prefix=true"}
    on_dpo = policyshift_side.overrides(dpo, tmp_path / "models" / "tiny", tmp_path / "r", tmp_path / "t.json",
                                        levers=True)
    assert "model.packing=true" in on_dpo and "algorithm.shared_prefix=true" not in on_dpo
    side = {"s_per_step": 0.2, "throughput": 10.0, "peak_rss_mb": 100.0, "generation_s": None, "runs": 1}
    summary = {"grpo_long_prompt": {"kept": 1, "rejected": 0, "policyshift": side, "levers": side | {"s_per_step": 0.1},
                                    "trl": side | {"s_per_step": 0.3}, "tokens": {}}}
    assert "| 0.2000 | 0.3000 | 1.50× | 0.1000 | 3.00× |" in run.speed_table(summary)
    from bench.tables import readme_table
    assert "| **1.50×** | 0.1000 | **3.00×** |" in readme_table(summary)


def test_step_flops_are_six_n_a_token_plus_two_n_for_dpos_reference_forward():
    n = 1_000_000
    assert run.step_flops_per_token(WORKLOADS["big_sft"], n) == 6e6
    assert run.step_flops_per_token(WORKLOADS["big_dpo_ref"], n) == 8e6        # the frozen reference in the step
    assert run.step_flops_per_token(WORKLOADS["big_dpo_precomputed"], n) == 6e6
    assert run.step_flops_per_token(WORKLOADS["tiny_grpo_b0.04"], n) == 6e6   # its reference runs in annotate


def test_train_flops_is_the_median_over_the_measured_steps():
    w = quick(WORKLOADS["big_dpo_ref"])  # step 0, 1 warm-up, 2 measured
    result = {"parameters": 1_000_000, "trained_tokens": [999, 999, 1000, 3000], "train_step": [9.0, 9.0, 0.5, 2.0]}
    m = run.run_metrics(result | {"ends": [0.0, 1.0, 2.0, 4.0]}, w)
    # measured steps: 1000 tokens in 0.5 s and 3000 in 2.0 s at 8e6 FLOPs a token: 16 and 12 GFLOP/s
    assert m["train_tflops"] == pytest.approx(0.014)
    assert m["trained_tokens_per_step"] == 2000 and m["train_step_s"] == 1.25
    # a side that reports no per-step tokens (TRL, bare) gets no FLOP figures rather than wrong ones
    assert "train_tflops" not in run.run_metrics({"ends": [0.0, 1.0, 2.0, 4.0]}, w)


def test_mfu_table_is_the_share_of_the_measured_matmul_peak():
    side = {"train_tflops": 0.09, "trained_tokens_per_step": 4096, "train_step_s": 2.0}
    summary = {"big_sft": {"policyshift": side, "levers": side | {"train_tflops": 0.12}, "trl": {}},
               "gen_big": {"seam": {}, "generate": {}}}
    table = run.mfu_table(summary, {"tflops": 0.18})
    assert "| big_sft | policyshift | 4,096 | 2.0000 | 0.090 | 50% |" in table
    assert "| big_sft | levers | 4,096 | 2.0000 | 0.120 | 67% |" in table and "gen_big" not in table
    assert run.mfu_table(summary, None) == ""
