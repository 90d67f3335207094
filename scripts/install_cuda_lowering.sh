#!/usr/bin/env bash
# Install JAX's CUDA plugin matching the installed jax, without its 174 MB runtime
# (--no-deps): enough for jax_triton to import and to lower the kernels for sm_80/sm_90
# on a CPU-only machine.  Tests then run with JAX_PLATFORMS=cpu.
set -euo pipefail
jax_version=$(python -c "import jax; print(jax.__version__)")
python -m pip install -q --no-deps "jax-cuda12-plugin==${jax_version}"
