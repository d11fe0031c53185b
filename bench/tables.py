"""The Markdown tables of bench/run.py's report (pure functions of its summary and runs)."""
from __future__ import annotations

from bench.workloads.spec import WORKLOADS

GENERATION = {"gen_tiny": "tiny", "gen_big": "big"}  # generation-alone workload → model

def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def fmt(x, spec: str = "{:.4f}", none: str = "–") -> str:
    return none if x is None else spec.format(x)


def kept_cell(s: dict) -> str:
    busy = f" ({s['busy']} taken busy: --quick)" if s.get("busy") else ""
    return f"{s['kept']} / {s['rejected']}{busy}"


def speed_table(summary: dict) -> str:
    """policyshift (defaults) against TRL; with a `levers` side (bench/run.py --levers) its three columns too."""
    levers = any("levers" in s for n, s in summary.items() if n not in GENERATION)
    head = ("| workload | policyshift s/step | TRL s/step | speed-up (TRL ÷ policyshift) "
            + ("| levers s/step | speed-up (TRL ÷ levers) | levers peak RSS " if levers else "")
            + "| policyshift /s | TRL /s | unit | policyshift peak RSS | TRL peak RSS | bare s/step "
            "| policyshift over bare | pairs kept / rejected |")
    lines = [head, "|---|---:|---:|---:|" + ("---:|---:|---:|" if levers else "") + "---:|---:|---|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        if name in GENERATION:
            continue
        w, ps, trl, bare = WORKLOADS[name], s["policyshift"], s["trl"], s.get("bare")
        over = ratio(ps["s_per_step"], bare["s_per_step"]) if bare else None
        lv = s.get("levers") or {"s_per_step": None, "peak_rss_mb": None}
        lever_cells = (f"| {fmt(lv['s_per_step'])} | {fmt(ratio(trl['s_per_step'], lv['s_per_step']), '{:.2f}×')} "
                       f"| {fmt(lv['peak_rss_mb'], '{:,.0f} MB')} " if levers else "")
        lines.append(
            f"| {name} | {fmt(ps['s_per_step'])} | {fmt(trl['s_per_step'])} "
            f"| {fmt(ratio(trl['s_per_step'], ps['s_per_step']), '{:.2f}×')} {lever_cells}"
            f"| {fmt(ps['throughput'], '{:,.0f}')} | {fmt(trl['throughput'], '{:,.0f}')} | {w.unit} "
            f"| {fmt(ps['peak_rss_mb'], '{:,.0f} MB')} | {fmt(trl['peak_rss_mb'], '{:,.0f} MB')} "
            f"| {fmt(bare['s_per_step']) if bare else '–'} | {fmt(over and (over - 1) * 100, '{:+.1f} %')} "
            f"| {kept_cell(s)} |")
    return "\n".join(lines)


def grpo_parts_table(summary: dict) -> str:
    lines = ["| workload | side | s/step | of which generation | generated tokens / step |",
             "|---|---|---:|---:|---:|"]
    for name, s in summary.items():
        if name in GENERATION or WORKLOADS[name].algorithm != "grpo":
            continue
        for side in ("policyshift", "levers", "trl", "bare"):
            if side in s:
                r = s[side]
                lines.append(f"| {name} | {side} | {fmt(r['s_per_step'])} | {fmt(r['generation_s'])} "
                             f"| {fmt(s.get('tokens', {}).get(side), '{:,.0f}')} |")
    return "\n".join(lines)


def mfu_table(summary: dict, peak: dict | None) -> str:
    """The train step's model FLOP/s (bench/measure.py train_flops) per policyshift side, and as a share of
    the machine's measured fp32 GEMM throughput (bench/matmul_peak.py): the train step's MFU on this CPU."""
    if not peak:
        return ""
    lines = ["| workload | side | trained tokens / step | train step s | TFLOP/s | of the measured matmul "
             f"peak ({peak['tflops']:.3f} TFLOP/s) |", "|---|---|---:|---:|---:|---:|"]
    for name, s in summary.items():
        if name in GENERATION:
            continue
        for side in ("policyshift", "levers"):
            r = s.get(side) or {}
            if r.get("train_tflops"):
                lines.append(f"| {name} | {side} | {fmt(r.get('trained_tokens_per_step'), '{:,.0f}')} "
                             f"| {fmt(r.get('train_step_s'))} | {r['train_tflops']:.3f} "
                             f"| {r['train_tflops'] / peak['tflops']:.0%} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _generation_cells(s: dict) -> tuple[str, str, str, float | None, str]:
    """Generation alone: seam tok/s, model.generate tok/s, seam ÷ generate, vLLM tok/s (or None), peak RSS."""
    seam, gen, vllm = s["seam"], s["generate"], s.get("vllm")
    rss = " / ".join(fmt(x and x["peak_rss_mb"], "{:,.0f}") for x in (seam, gen, vllm)) + " MB"
    return (fmt(seam["throughput"], "{:,.0f}"), fmt(gen["throughput"], "{:,.0f}"),
            fmt(ratio(seam["throughput"], gen["throughput"]), "{:.2f}×"), vllm["throughput"] if vllm else None, rss)


def generation_table(summary: dict) -> str:
    lines = ["| model | seam (HFGenerator.sample) tok/s | model.generate tok/s | seam ÷ generate "
             "| generator=vllm tok/s | vllm ÷ seam | peak RSS seam / generate / vllm | pairs kept / rejected |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for name, s in summary.items():
        if name not in GENERATION:
            continue
        seam_tps, gen_tps, seam_vs_gen, v, rss = _generation_cells(s)
        lines.append(f"| {GENERATION[name]} | {seam_tps} | {gen_tps} | {seam_vs_gen} "
                     f"| {fmt(v, '{:,.0f}') if s.get('vllm') else s.get('vllm_note', 'not installed')} "
                     f"| {fmt(ratio(v, s['seam']['throughput']), '{:.2f}×')} | {rss} | {kept_cell(s)} |")
    return "\n".join(lines)


def kept_text(pair: dict, run: dict) -> str:
    if pair["why"] is None:
        return "yes"
    own = run.get("why") or "this run was fine; another in its pair was not"
    return ("kept (--quick): " if pair["kept"] else "no: ") + own


def runs_table(all_pairs: dict) -> str:
    lines = ["| workload | pair | try | side | s/step (generation: tok/s) | load1 before → after | others' CPU before (cores) "
             "| others' CPU during | peak RSS | wall s | kept |", "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---|"]
    for name, pairs in all_pairs.items():
        for p in pairs:
            for side, r in p["runs"].items():
                shown = (fmt(r["s_per_step"]) if "s_per_step" in r else
                         fmt(r.get("throughput"), "{:,.0f} tok/s"))
                lines.append(
                    f"| {name} | {p['pair']} | {p['try']} | {side} | {shown} "
                    f"| {r['load_before']:.2f} → {r['load_after']:.2f} | {r['others_before']:.2f} "
                    f"| {r['others_frac']:.0%} | {fmt(r.get('peak_rss_mb'), '{:,.0f} MB')} | {r['wall_s']:.1f} "
                    f"| {kept_text(p, r)} |")
    return "\n".join(lines)


def readme_table(summary: dict) -> str:
    """The README's summary of a run: s/step side by side, TRL ÷ policyshift (and TRL ÷ policyshift with the
    speed levers on, where bench/run.py --levers ran that side), the bare floor where it ran, peak RSS;
    generation alone as tok/s (policyshift's seam against `model.generate`, and vLLM)."""
    levers = any("levers" in s for n, s in summary.items() if n not in GENERATION)
    lines = ["| workload | policyshift s/step | TRL s/step | TRL ÷ policyshift "
             + ("| levers on s/step | TRL ÷ levers on " if levers else "")
             + "| bare loop s/step | policyshift vs bare | peak RSS policyshift / " + ("levers / " if levers else "")
             + "TRL / bare |", "|---|---:|---:|---:|" + ("---:|---:|" if levers else "") + "---:|---:|---:|"]
    for name, s in summary.items():
        if name in GENERATION:
            seam_tps, gen_tps, seam_vs_gen, v, rss = _generation_cells(s)
            lines.append(f"| {name}: generation alone, tok/s (seam / `model.generate` / vLLM) "
                         f"| {seam_tps} | {gen_tps} | {seam_vs_gen} " + ("| | " if levers else "") + "| "
                         f"| {fmt(v, 'vLLM {:,.0f}') if s.get('vllm') else s.get('vllm_note', 'vLLM not installed')} | {rss} |")
            continue
        ps, trl, bare, lv = s["policyshift"], s["trl"], s.get("bare"), s.get("levers")
        over = ratio(ps["s_per_step"], bare["s_per_step"]) if bare else None
        sides = (ps, lv, trl, bare) if levers else (ps, trl, bare)
        rss = " / ".join(fmt(x and x["peak_rss_mb"], "{:,.0f}") for x in sides) + " MB"
        lever_cells = (f"| {fmt(lv and lv['s_per_step'])} "
                       f"| **{fmt(ratio(trl['s_per_step'], lv and lv['s_per_step']), '{:.2f}×')}** " if levers else "")
        lines.append(f"| {name} | {fmt(ps['s_per_step'])} | {fmt(trl['s_per_step'])} "
                     f"| **{fmt(ratio(trl['s_per_step'], ps['s_per_step']), '{:.2f}×')}** {lever_cells}"
                     f"| {fmt(bare and bare['s_per_step'])} | {fmt(over and (over - 1) * 100, '{:+.1f} %')} | {rss} |")
    return "\n".join(lines)
