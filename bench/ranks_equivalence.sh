#!/usr/bin/env bash
# Learning equivalence of 2 ranks and 1 process (issue 10): the same global batches, prompts and steps,
# 3 seeds, SFT → GRPO and SFT → DPO on the embedded arithmetic task, shortened (conf/experiment/short_*).
# `hardware=cpu,ddp` is one more sweep axis: each job starts its own ranks. Then
# bench/ranks_equivalence.py writes bench/results_ranks.md (held-out greedy accuracy after each stage).
#   OMP_NUM_THREADS=1 bash bench/ranks_equivalence.sh       # ~25 min on a 2-core CPU
# SWEEP: where the jobs go; SEEDS (default 1,2,3); EXTRA: more overrides for every job (a smoke run's
# shortened steps); RESULTS: the table's file (default bench/results_ranks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
SWEEP=${SWEEP:-multirun/ranks-equivalence-$(date +%Y%m%d-%H%M%S)}
for exp in short_sft_grpo short_sft_dpo; do
  python train.py -m experiment=$exp seed=${SEEDS:-1,2,3} hardware=cpu,ddp logger=csv callbacks.progress.refresh_rate=0 ${EXTRA:-} \
    hydra.sweep.dir="$SWEEP/$exp" 'hydra.sweep.subdir=${hydra.job.override_dirname}' > "$SWEEP.$exp.log" 2>&1
done
python bench/ranks_equivalence.py "$SWEEP" "${RESULTS:-bench/results_ranks.md}"
