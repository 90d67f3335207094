#!/usr/bin/env bash
# The sm_90 compile and CUDA-lowering tests under the Triton of the GPU machines' image
# (3.6, TRITON_VERSION to change it), which the main environment's newer Triton hides:
# Gluon's API moves between releases, and a kernel that builds under one can fail under
# another.  That triton goes into a directory of its own, put first on PYTHONPATH, so the
# current environment (a venv or not) supplies everything else.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${TRITON_VERSION:-3.6.0}"
target="${IMAGE_TRITON_DIR:-/tmp/jax-decode-image-triton-$version}"
rm -rf "$target"
python -m pip install -q --no-deps --target "$target" "triton==$version"
export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
# Fail, not skip, where that Triton lacks Gluon's Hopper API (the compile tests would skip).
python - <<'PY'
import triton
from jax_decode.kernels.gluon_compile import gluon_hopper_missing
missing = gluon_hopper_missing()
assert missing is None, f"triton {triton.__version__}: {missing}"
print(f"image triton: {triton.__version__} ({triton.__file__})")
PY
JAX_PLATFORMS=cpu JAX_DECODE_REQUIRE_LOWERING=1 python -m pytest -q \
  tests/test_cuda_lowering.py tests/test_mla_hopper.py tests/test_gqa_hopper.py tests/test_head_dims.py \
  -k "compile or lower or sm90 or sm_90"
# torch_bridge's direct launches pass that Triton's C launcher what its own runner does.
# (Run, not skipped: that Triton is one direct_runner knows.)
direct=$(python -m pytest -q -rs tests/test_launcher_cache.py -k direct_runner) || { echo "$direct"; exit 1; }
echo "$direct"
grep -q "1 passed" <<< "$direct"
