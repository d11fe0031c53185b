#!/usr/bin/env bash
# The vLLM generator's tests, in the vllm venv (built on first use by scripts/install_vllm.sh):
#   bash scripts/test_vllm.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_VENV="${VLLM_VENV:-/work/venv-vllm}"
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
bash scripts/install_vllm.sh
# -o addopts drops the default `-m 'not slow'`: every vllm test runs, slow ones included (a later `-m` in
# "$@", e.g. -m "vllm and not slow", replaces this one).
"$VLLM_VENV/bin/python" -m pytest -q -o addopts="-p no:cacheprovider" -m vllm tests/generators/test_vllm.py \
    tests/generators/test_vllm_episodes.py tests/generators/test_vllm_ranks.py tests/envs/test_tool_use_vllm.py \
    tests/generators/test_vllm_server.py "$@"
