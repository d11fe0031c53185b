#!/usr/bin/env bash
# GRPO learning on the BPE chat model (models/synthetic.py --tokenizer bpe: byte-level BPE, ChatML template,
# turn end <|im_end|> that is not the tokenizer's eos) through train.py, sampling with temperature 0.7,
# top-p 0.9 and top-k 20: a short SFT on single-digit sums (75 demonstrations, 25 held out), then GRPO
# with the exact-match verifier. Prints held-out accuracy along the way and the rounds' mean reward.
#   bash bench/bpe_chat_learning.sh [OUT_DIR] [GRPO_ROUNDS]
# 2026-12-02 (commit b026128 + this script), 200 rounds (GRPO 153 s, SFT 14 s; shared 2-core machine, 1 thread):
# held-out 0.12 after SFT → 0.20, 0.24, 0.36, 0.40, 0.60 every 40 rounds; mean reward by tenth 0.355 → 0.731;
# train/ratio_mean 1.000000 on every step.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-outputs/bpe_chat_learning}"
ROUNDS="${2:-100}"
export WANDB_MODE="${WANDB_MODE:-disabled}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
rm -rf "$OUT" && mkdir -p "$OUT"
python -m models.synthetic "$OUT/model" --tokenizer bpe --hidden-size 128 --num-layers 2 --num-heads 4 \
  --intermediate-size 256 --max-position-embeddings 128
python - "$OUT/sums.jsonl" <<'EOF'
import json, random, sys
pairs = [(a, b) for a in range(10) for b in range(10)]
random.Random(0).shuffle(pairs)
with open(sys.argv[1], "w") as f:
    f.writelines(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in pairs)
EOF
COMMON=(model=hf recipe=tiny "task=jsonl" "task.train_path=$OUT/sums.jsonl" task.chat=true task.num_heldout=25
        callbacks.evaluate.num_examples=25 callbacks.progress.refresh_rate=0 logger=csv)
python train.py algorithm=sft "model.name_or_path=$OUT/model" "${COMMON[@]}" data.batch_size=16 \
  trainer.max_steps=90 callbacks.evaluate.every_n_steps=30 "hydra.run.dir=$OUT/sft" | grep '\[eval\]'
python train.py algorithm=grpo "model.name_or_path=$OUT/sft/policy" "${COMMON[@]}" "trainer.max_steps=$ROUNDS" \
  algorithm.optimizer.lr=3e-4 data.prompts_per_round=16 algorithm.group_size=8 data.batch_size=128 \
  data.micro_batch_size=64 generator.max_new_tokens=4 generator.temperature=0.7 generator.top_p=0.9 \
  generator.top_k=20 callbacks.evaluate.every_n_steps=$((ROUNDS / 5)) "hydra.run.dir=$OUT/grpo" | grep '\[eval\]'
python - "$OUT/grpo/csv/grpo/metrics.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
reward = [float(r["rollout/reward_mean"]) for r in rows if r.get("rollout/reward_mean") and r.get("rollout/round")]
ratio = [float(r["train/ratio_mean"]) for r in rows if r.get("train/ratio_mean")]
tenth = max(1, len(reward) // 10)
print("GRPO reward mean by tenth of the run:", " ".join(f"{sum(reward[i:i + tenth]) / tenth:.3f}"
                                                        for i in range(0, len(reward) - tenth + 1, tenth)))
print(f"train/ratio_mean over {len(ratio)} steps: min {min(ratio):.6f} max {max(ratio):.6f}")
EOF
