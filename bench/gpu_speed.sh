#!/usr/bin/env bash
# policyshift GPU speed in one go (≤ 10 minutes, setup included): generation tokens/s and MFU of the
# generator seam vs model.generate (and vLLM where it imports), then GRPO (generator=hf, =vllm) and DPO
# through train.py, on a ~0.5B Qwen2-shaped model with random weights in bf16. What is measured and how:
# the docstring of bench/gpu_speed.py.
# --- async rounds (issue 32) ---
# Also sync vs async rounds (callbacks.regenerate.max_staleness 0 vs 1): s/round, tokens/s, idle seconds, on
# the CPU cores (the engine process is CPU-only): bench/gpu_speed.py's `async rounds` block.
# --- end async rounds ---
# NOT RUN ON A GPU YET (only `python bench/gpu_speed.py --dry-run`
# on CPU has been checked).
#
#   bash bench/gpu_speed.sh                     # results: $OUT/gpu_speed.{json,md}, else bench/results/
#   SKIP_INSTALL=1 PEAK_TFLOPS=989 VLLM_PYTHON=/path/to/venv/bin/python bash bench/gpu_speed.sh
#
# Setup as bench/hardware_gpu.sh: `pip install -r requirements.txt` (already satisfied: a no-op); a machine
# without network installs from $WHEELHOUSE (`pip download -d DIR -r requirements.txt` elsewhere) or not at
# all: a failed install is reported and the run goes on with what is installed. vLLM is never installed
# here (requirements-vllm.txt is the CPU build): it is used where `import vllm` works, else skipped.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
export OUT
TOTAL_S=${TOTAL_S:-590}                 # the whole script; the python gets what is left, at most 540 s
INSTALL_TIMEOUT_S=${INSTALL_TIMEOUT_S:-60}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
START=$(date +%s)
mkdir -p "$OUT"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU here (nvidia-smi -L fails): this script is for a GPU machine;" \
         "on CPU check the plumbing with: OMP_NUM_THREADS=1 python bench/gpu_speed.py --dry-run" >&2
    exit 1
fi

# --- setup -------------------------------------------------------------------------------------------
PIP=(python -m pip install -q --retries 1 --timeout 20 -r requirements.txt)
if [[ -n "${WHEELHOUSE:-}" ]]; then PIP+=(--no-index --find-links "$WHEELHOUSE"); fi
if [[ -n "${SKIP_INSTALL:-}" ]]; then
    echo "install: skipped (SKIP_INSTALL set)"
elif timeout "$INSTALL_TIMEOUT_S" "${PIP[@]}" > "$OUT/gpu_speed_install.log" 2>&1; then
    echo "install: ok"
else
    echo "install: FAILED (exit $?; see $OUT/gpu_speed_install.log): running with what is installed"
fi

nvidia-smi | tee "$OUT/gpu_speed_nvidia_smi.txt"
python -c "import torch, transformers, lightning; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}, \
available: {torch.cuda.is_available()}), transformers {transformers.__version__}, lightning {lightning.__version__}')"

# --- the measurements ------------------------------------------------------------------------------
LEFT=$(( TOTAL_S - ($(date +%s) - START) ))
LIMIT=$(( LEFT < 540 ? LEFT : 540 ))
echo "[$(( $(date +%s) - START )) s] python bench/gpu_speed.py (limit $LIMIT s)"
timeout -k 10 "$LIMIT" python bench/gpu_speed.py --budget-s $(( LIMIT - 20 )) \
    --peak-tflops "${PEAK_TFLOPS:-989}" ${VLLM_PYTHON:+--vllm-python "$VLLM_PYTHON"} 2>&1 \
    | tee "$OUT/gpu_speed.log" | grep -v -E 'it/s\]|Loading weights|Writing model'
RC=${PIPESTATUS[0]}
tail -n 400 "$OUT/gpu_speed.log" > "$OUT/gpu_speed.log.tmp" && mv "$OUT/gpu_speed.log.tmp" "$OUT/gpu_speed.log"
# === generator=vllm_server case (issue 32 item 2) ====================================================
# Opt-in (SERVER_CASE=1; VLLM_PYTHON: a venv with a CUDA vLLM): the same GRPO workload as grpo_vllm, with
# generation in one vLLM server of its own (generator=vllm_server; on GPU 1 when there are two GPUs, else
# sharing GPU 0 at 0.3 of its memory), timed the same way: s/step, generated tokens/s, MFU of the train step,
# and the weight pushes (cost/weight_sync_*); then the same at callbacks.regenerate.max_staleness=1 (the server's
# asynchronous rounds: sync vs async s/step). Results: $OUT/gpu_speed_server.json. Not run on a GPU yet.
if [[ -n "${SERVER_CASE:-}" && -n "${VLLM_PYTHON:-}" && -d /tmp/policyshift_gpu_speed/model ]]; then
    NGPU=$(nvidia-smi -L | wc -l)
    if (( NGPU >= 2 )); then SERVER_GPU=1 SERVER_MEM=0.9; else SERVER_GPU=0 SERVER_MEM=0.3; fi
    echo "[$(( $(date +%s) - START )) s] train grpo_vllm_server (engine on GPU $SERVER_GPU)"
    SERVER_GPU=$SERVER_GPU SERVER_MEM=$SERVER_MEM timeout -k 10 "${SERVER_TIMEOUT_S:-480}" "$VLLM_PYTHON" - <<'PYEOF' 2>&1 | tail -n 40
import json, os, sys
from dataclasses import replace
from pathlib import Path
sys.argv = ["gpu_speed"]
sys.path.insert(0, os.getcwd())
from bench.gpu_speed import SHAPES, Workload, add_mfu, train_run
s, work, out = SHAPES["gpu"], Path("/tmp/policyshift_gpu_speed"), Path(os.environ["OUT"])
grpo = Workload("grpo_vllm_server", "grpo", batch=s["grpo_prompts"], group=s["grpo_group"], beta=0.04,
                max_new_tokens=s["grpo_tokens"], model="big", warmup=s["warmup"], measure=s["steps"] - 1 - s["warmup"])
extra = ["hardware=gpu", "model.dtype=float32", "trainer.precision=bf16-mixed", "callbacks.progress.refresh_rate=0",
         "generator=vllm_server", "generator.ignore_eos=true", f"generator.gpus=['{os.environ['SERVER_GPU']}']",
         f"generator.gpu_memory_utilization={os.environ['SERVER_MEM']}", "generator.max_model_len=1024"]
rows = {}
for name, more in (("grpo_vllm_server", []),  # synchronous, then rounds overlapping training at staleness 1
                   ("grpo_vllm_server_async_k1", ["callbacks.regenerate.max_staleness=1", "correction=decoupled_ppo"])):
    row = train_run(name, replace(grpo, name=name), extra + more, sys.executable, work / "model", work,
                    out / "gpu_speed_logs", 210)
    add_mfu(row, float(os.environ.get("PEAK_TFLOPS", 989)), 6, row.get("trained_tokens_per_step", 0), "train_step_s")
    rows[name] = row
    (out / "gpu_speed_server.json").write_text(json.dumps(rows, indent=1, default=str))
print(json.dumps(rows, indent=1, default=str))
PYEOF
fi
# === end of the generator=vllm_server case ===========================================================

echo "exit $RC after $(( $(date +%s) - START )) s; report: $OUT/gpu_speed.md (run folders: /tmp/policyshift_gpu_speed/runs)"
[[ -f "$OUT/gpu_speed.md" ]] && cat "$OUT/gpu_speed.md"

# --- the pass-by-pass blocks (issue 35) --------------------------------------------------------------------
# Each in what is left of TOTAL_S, capped; alone: python bench/<script> --gpu
#   shared prefix (bench/shared_prefix_pass.py): the GRPO policy forward+backward and the reference forward, padded
#     rows vs each prompt computed once (algorithm.shared_prefix), the same ~0.5B Qwen2 in bf16 autocast, 16 prompts
#     × 8 of 16 and 512 tokens, 128 new tokens (SHARED_PREFIX_S caps it)
#   packing (bench/packing_pass.py): the log-prob forward+backward and no-grad forward, padded rows vs packed ones
#     (model.packing), the same model, 64 rows of 64-1,024 tokens (PACKING_S caps it)
pass_block() {  # name, cap in seconds, script, json
    local left=$(( TOTAL_S - ($(date +%s) - START) ))
    local limit=$(( left < $2 ? left : $2 ))
    if (( limit < 30 )); then
        echo "$1: skipped ($left s left); run it alone: python bench/$3 --gpu"
        return
    fi
    echo "[$(( $(date +%s) - START )) s] python bench/$3 --gpu (limit $limit s)"
    timeout -k 10 "$limit" python "bench/$3" --gpu --repeats 5 --json "$OUT/$4.json" 2>&1 | tee "$OUT/$4.log"
}
pass_block "shared prefix" "${SHARED_PREFIX_S:-300}" shared_prefix_pass.py gpu_shared_prefix
pass_block packing "${PACKING_S:-240}" packing_pass.py gpu_packing
exit "$RC"
