#!/usr/bin/env bash
# Install JAX's CUDA plugin matching the installed jaxlib, without its 174 MB runtime
# (--no-deps): enough for jax_triton to import and to lower the kernels for sm_80/sm_90
# on a CPU-only machine.  Tests then run with JAX_PLATFORMS=cpu.  (The plugin's versions
# follow jaxlib's, which a jax patch release need not share.)
set -euo pipefail
jaxlib_version=$(python -c "import jaxlib; print(jaxlib.__version__)")
python -m pip install -q --no-deps "jax-cuda12-plugin==${jaxlib_version}"
