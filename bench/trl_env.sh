#!/usr/bin/env bash
# The bench-only environment for Hugging Face TRL (bench/run.py's "TRL" side). Never a project dependency:
# nothing in requirements*.txt or pyproject.toml names trl, and the project's own tests never import it.
#
#   bash bench/trl_env.sh                 # makes /work/venv-trl (or $TRL_VENV), idempotent
#   bash bench/trl_env.sh /tmp/venv-trl   # another place
#   TRL_VENV_FORCE=1 bash bench/trl_env.sh   # delete and rebuild
#
# A clean venv (no --system-site-packages: the TRL side must not see the project's own packages), one
# pip command with torch pinned FIRST: an unpinned torch resolves to the multi-GB CUDA build, while the
# 2.13.0 CPU wheel lies on local disk (pip's find-links). transformers is pinned to the main
# environment's version so both sides run the same model code. peft is optional for TRL 1.16 (only
# for LoRA; the bench does full fine-tuning) and is not installed.
set -euo pipefail

VENV="${1:-${TRL_VENV:-/work/venv-trl}}"
TORCH_VERSION=2.13.0
TRL_VERSION=1.16.0
TRANSFORMERS_VERSION=5.25.0   # = `pip show transformers` in the project's environment
PYTHON="${PYTHON:-python3}"
MAIN_TRANSFORMERS=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("transformers"))' 2>/dev/null || true)
if [[ -n "$MAIN_TRANSFORMERS" && "$MAIN_TRANSFORMERS" != "$TRANSFORMERS_VERSION" ]]; then
    echo "warning: the main environment has transformers $MAIN_TRANSFORMERS, this script pins $TRANSFORMERS_VERSION:" \
         "update TRANSFORMERS_VERSION here so both sides run the same model code" >&2
fi

if [[ -n "${TRL_VENV_FORCE:-}" ]]; then
    rm -rf "$VENV"
fi
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m, sys
want = {"torch": "$TORCH_VERSION", "trl": "$TRL_VERSION", "transformers": "$TRANSFORMERS_VERSION"}
sys.exit(any(not m.version(k).startswith(v) for k, v in want.items()))
PY
then
    echo "$VENV: torch $TORCH_VERSION, trl $TRL_VERSION, transformers $TRANSFORMERS_VERSION already there"
    exit 0
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip 2> >(grep -v "is neither a file nor a directory" >&2)
# ONE command, torch first: the resolver then never trades it for another build
"$VENV/bin/python" -m pip install --quiet \
    "torch==$TORCH_VERSION" \
    "trl==$TRL_VERSION" \
    "transformers==$TRANSFORMERS_VERSION" \
    datasets accelerate psutil \
    2> >(grep -v "is neither a file nor a directory" >&2)   # pip's noise about the local index; its status stays
"$VENV/bin/python" - <<'PY'
import torch, transformers, trl, accelerate, datasets
print(f"torch {torch.__version__} (cuda: {torch.version.cuda}), transformers {transformers.__version__}, "
      f"trl {trl.__version__}, accelerate {accelerate.__version__}, datasets {datasets.__version__}")
from trl import GRPOConfig, GRPOTrainer, DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # noqa: F401
PY
echo "made $VENV in $(( $(date +%s) - start )) s"
