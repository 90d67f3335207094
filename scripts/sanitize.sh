#!/usr/bin/env bash
# Every kernel variant, valid and adversarial inputs, under compute-sanitizer memcheck
# (TOOL=racecheck or synccheck for another of its tools; --hopper for the Gluon kernels).
# Needs a CUDA GPU and compute-sanitizer on PATH (CUDA toolkit).  Exit status 1 on any error.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
exec compute-sanitizer --tool "${TOOL:-memcheck}" --error-exitcode 1 --print-limit 20 python3 scripts/sanitize_kernels.py "$@"
