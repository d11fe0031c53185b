#!/usr/bin/env bash
# The hardware group on a GPU machine, in one go (≤ 10 minutes): SFT, DPO and GRPO through train.py for
# each strategy (hardware=gpu, ddp, fsdp, deepspeed_zero2, deepspeed_zero3) on 1 GPU, and where
# `nvidia-smi -L` lists ≥ 2 GPUs also on 2 (gpu aside: it is the one-GPU config). Per run: exit status,
# wall seconds, trained tokens/s (summary.json: cost/trained_tokens / wall_seconds), optimizer steps and
# the peak GPU memory sampled by nvidia-smi every 0.5 s. Report: $OUT/hardware_gpu.md, a log per run
# under $OUT/logs/ (run folders stay in $WORK: checkpoints and policies are not worth carrying back).
#
#   bash bench/hardware_gpu.sh                    # OUT=bench/results/hardware_gpu unless set
#   ALGOS="sft grpo" HARDWARE="ddp fsdp" BUDGET_S=300 SKIP_INSTALL=1 bash bench/hardware_gpu.sh
#
# Install first: `pip install -r requirements.txt -r requirements-deepspeed.txt` in ONE command. There the
# pinned torch==2.13.0 from PyPI is the CUDA build (Linux x86_64); a CUDA torch already installed as
# 2.13.0+cuXXX satisfies the pin and stays. A machine without network: put the wheels in $WHEELHOUSE
# (`pip download -d DIR -r requirements-deepspeed.txt` elsewhere); a failed install is reported and the
# runs go on with what is installed (a run that lacks deepspeed then shows check_hardware's one line).
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/hardware_gpu}
WORK=${WORK:-/tmp/policyshift_hardware_gpu}
BUDGET_S=${BUDGET_S:-540}          # the whole script, install included; runs that would start later are skipped
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-120}
ALGOS=${ALGOS:-"sft dpo grpo"}
HARDWARE=${HARDWARE:-"gpu ddp fsdp deepspeed_zero2 deepspeed_zero3"}
declare -A STEPS=([sft]=${STEPS_SFT:-20} [dpo]=${STEPS_DPO:-20} [grpo]=${STEPS_GRPO:-6})
# A model a little larger than the default tiny one, small held-out sets, no progress bar.
COMMON=(logger=csv model.hidden_size=512 model.num_layers=4 model.num_heads=8 model.intermediate_size=2048
        task.num_heldout=64 callbacks.evaluate.num_examples=64 callbacks.progress.refresh_rate=0)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
START=$(date +%s)
mkdir -p "$OUT/logs" "$WORK"
REPORT="$OUT/hardware_gpu.md"

elapsed() { echo $(( $(date +%s) - START )); }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU here (nvidia-smi -L fails): this script is for a GPU machine" >&2
    exit 1
fi
NGPU=$(nvidia-smi -L | grep -c '^GPU ')

# --- install -----------------------------------------------------------------------------------------
PIP=(python -m pip install -q --retries 1 --timeout 20 -r requirements.txt -r requirements-deepspeed.txt)
if [[ -n "${WHEELHOUSE:-}" ]]; then PIP+=(--no-index --find-links "$WHEELHOUSE"); fi
if [[ -n "${SKIP_INSTALL:-}" ]]; then
    INSTALL="skipped (SKIP_INSTALL set)"
elif timeout 240 "${PIP[@]}" > "$OUT/logs/install.log" 2>&1; then
    INSTALL="ok"
else
    INSTALL="FAILED (exit $?; see logs/install.log): running with what is installed"
fi
VERSIONS=$(python - 2>&1 <<'EOF'
import importlib.util, torch, lightning
ds = "not installed"
if importlib.util.find_spec("deepspeed"):
    import deepspeed
    ds = deepspeed.__version__
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}, "
      f"{torch.cuda.device_count()} GPU(s)), lightning {lightning.__version__}, deepspeed {ds}")
EOF
)

{
    echo "# Hardware group on GPUs: SFT, DPO, GRPO per strategy"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')," \
         "\`bash bench/hardware_gpu.sh\`"
    echo
    echo '```'
    nvidia-smi -L
    echo "$VERSIONS"
    echo "install: $INSTALL"
    echo '```'
    echo
    echo "Each run: \`python train.py algorithm=A hardware=H trainer.devices=N trainer.max_steps=S ${COMMON[*]}\`" \
         "(steps: sft ${STEPS[sft]}, dpo ${STEPS[dpo]}, grpo ${STEPS[grpo]}). tokens/s = cost/trained_tokens / wall_seconds of the stage" \
         "(generation and evaluation included). Peak memory: the highest nvidia-smi memory.used of one GPU" \
         "during the run (sampled every 0.5 s; whole-process memory, allocator cache included)."
    echo
    echo "| algorithm | hardware | GPUs | exit | wall s | trained tokens/s | trained tokens | steps | peak MiB/GPU | note |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
} > "$REPORT"

# --- one run -----------------------------------------------------------------------------------------
# summary.json → "wall_s tokens_per_s tokens steps" (of all stages together), or "- - - -"
summary_fields() {
    python - "$1" <<'EOF'
import json, sys
try:
    stages = json.load(open(sys.argv[1])).values()
except (OSError, ValueError):
    print("- - - -"); raise SystemExit
wall = sum(s.get("wall_seconds") or 0 for s in stages)
tokens = sum(s.get("cost/trained_tokens") or 0 for s in stages)
steps = sum(s.get("train/steps") or 0 for s in stages)
print(f"{wall:.1f}", f"{tokens / wall:,.0f}" if wall and tokens else "-", f"{tokens:,.0f}", steps)
EOF
}

run_one() {  # algorithm hardware gpus
    local algo=$1 hw=$2 n=$3 name="$1-$2-${3}gpu" left
    left=$(( BUDGET_S - $(elapsed) ))
    if (( left < 30 )); then
        echo "| $algo | $hw | $n | - | - | - | - | - | - | skipped: time budget spent |" >> "$REPORT"
        return
    fi
    local limit=$(( left < RUN_TIMEOUT_S ? left : RUN_TIMEOUT_S ))
    local dir="$WORK/$name" log="$OUT/logs/$name.log" mem="$WORK/$name.mem" visible
    visible=$(seq -s, 0 $(( n - 1 )))
    rm -rf "$dir" "$mem"
    echo "[$(elapsed) s] $name (limit $limit s)"
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -i "$visible" -lms 500 > "$mem" 2>/dev/null &
    local sampler=$! t0 rc
    t0=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=$visible timeout -k 15 "$limit" python train.py "algorithm=$algo" "hardware=$hw" \
        "trainer.devices=$n" "trainer.max_steps=${STEPS[$algo]}" "${COMMON[@]}" "hydra.run.dir=$dir" > "$log" 2>&1
    rc=$?
    local wall
    wall=$(python -c "import time; print(f'{time.time() - $t0:.0f}')")
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    local peak
    peak=$(awk -F', *' '$2 + 0 > p { p = $2 + 0 } END { print p + 0 }' "$mem" 2>/dev/null)
    read -r s_wall s_tps s_tokens s_steps <<< "$(summary_fields "$dir/summary.json")"
    local note=""
    if (( rc == 124 || rc == 137 )); then
        note="timed out after $limit s"
    elif (( rc != 0 )); then  # the project's one-line error, else the last line of the log
        note=$(grep -E '^error: ' "$log" | paste -sd' ' -)
        [[ -z "$note" ]] && note=$(grep -v '^[[:space:]]*$' "$log" | tail -1)
        note=$(printf '%s' "$note" | cut -c1-400 | sed 's/|/\\|/g')
    fi
    echo "| $algo | $hw | $n | $rc | $s_wall (process $wall) | $s_tps | $s_tokens | $s_steps | $peak | $note |" >> "$REPORT"
    tail -n 300 "$log" > "$log.tmp" && mv "$log.tmp" "$log"  # keep what comes back small
}

# Breadth first: every strategy with SFT on one GPU, then DPO, then GRPO; two GPUs after.
for algo in $ALGOS; do
    for hw in $HARDWARE; do run_one "$algo" "$hw" 1; done
done
if (( NGPU >= 2 )); then
    for algo in $ALGOS; do
        for hw in $HARDWARE; do
            [[ $hw == gpu ]] && continue  # the single-GPU config
            run_one "$algo" "$hw" 2
        done
    done
else
    echo >> "$REPORT"
    echo "Only $NGPU GPU here: no 2-GPU runs." >> "$REPORT"
fi
echo >> "$REPORT"
echo "Total $(elapsed) s." >> "$REPORT"
echo "report: $REPORT"
cat "$REPORT"
