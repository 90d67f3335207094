#!/usr/bin/env bash
# The sm_90 compile and CUDA-lowering tests under the Triton of the GPU machines' image
# (3.6, TRITON_VERSION to change it), which the main environment's newer Triton hides:
# Gluon's API moves between releases, and a kernel that builds under one can fail under
# another.  A virtual environment over the current one's packages with only triton
# replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${IMAGE_TRITON_VENV:-/tmp/jax-decode-image-triton}"
python -m venv --clear --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q "triton==${TRITON_VERSION:-3.6.0}"
"$venv/bin/python" -c "import triton; print(f'image triton: {triton.__version__}')"
JAX_PLATFORMS=cpu JAX_DECODE_REQUIRE_LOWERING=1 "$venv/bin/python" -m pytest -q \
  tests/test_cuda_lowering.py tests/test_mla_hopper.py tests/test_gqa_hopper.py tests/test_head_dims.py \
  -k "compile or lower or sm90 or sm_90"
