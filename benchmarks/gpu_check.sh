#!/usr/bin/env bash
# oom-bisect's GPU check (issue 6, item 9): one script, a few minutes on a machine with an
# NVIDIA GPU. It makes a venv, installs oom-sentinel and a CUDA build of torch (from local
# wheels when there are some), then runs benchmarks/gpu_check.py (NVML's per-process peak vs
# torch's max_memory_reserved within 5 %, a real CUDA OOM forced with --vram-budget, a real
# bisect on the GPU) and the @pytest.mark.gpu tests.
#
#   benchmarks/gpu_check.sh                 # from the repository root or anywhere
#   TORCH_SPEC='torch==2.14.1' WHEELS=/path/to/wheels VENV=.venv-gpu benchmarks/gpu_check.sh
#
# Exit status: 0 when every check passes.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-gpu}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1}"   # a CUDA build on the GPU machine's index
PY="${PYTHON:-python3}"
start=$(date +%s)

echo "== GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
else
  echo "nvidia-smi not found: the NVML checks will say why they fail"
fi

echo "== venv $VENV"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip_args=(-q)
# local wheels first, when a wheel folder exists (WHEELS, or ./wheels, or ~/wheels)
for dir in "${WHEELS:-}" ./wheels "$HOME/wheels"; do
  if [ -n "$dir" ] && [ -d "$dir" ]; then pip_args+=(--find-links "$dir"); fi
done
"$VENV/bin/pip" install "${pip_args[@]}" -e '.[test]'
if "$VENV/bin/python" - <<'EOF'
import sys
try:
    import torch
except ImportError:
    sys.exit(1)
sys.exit(0 if torch.cuda.is_available() else 1)
EOF
then
  echo "torch with CUDA already installed"
else
  "$VENV/bin/pip" install "${pip_args[@]}" "$TORCH_SPEC"
fi
"$VENV/bin/python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "available:", torch.cuda.is_available())'
echo "== setup took $(( $(date +%s) - start )) s"

status=0
echo "== benchmarks/gpu_check.py"
"$VENV/bin/python" benchmarks/gpu_check.py || status=1
echo "== pytest -m gpu"
"$VENV/bin/python" -m pytest -q -m gpu -p no:cacheprovider tests/test_bisect_gpu.py || status=1
echo "== done in $(( $(date +%s) - start )) s, status $status"
exit "$status"
