#!/usr/bin/env bash
# The CUDA-lowering and interpreter tests on the newest stack the registry offers: a fresh
# virtual environment on Python >= 3.12 (PYTHON, default the newest pyenv 3.12.x, else
# python3.12 on PATH) with this repo's test extras, which resolve to jax-triton 0.4.x,
# the newest jax and the triton that torch pins.  Needs network access to PyPI; on a
# CPU-only machine torch comes as a CUDA build from PyPI (about 6 GB in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if command -v pyenv >/dev/null && version=$(pyenv versions --bare | grep -E '^3\.12(\.|$)' | sort -V | tail -n 1) \
     && [ -n "$version" ]; then
    PYTHON="$(pyenv root)/versions/$version/bin/python"
  else
    PYTHON=python3.12
  fi
fi
venv="${NEWEST_STACK_VENV:-/tmp/jax-decode-newest-stack}"
"$PYTHON" -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[test]"
# JAX's CUDA plugin is published after jax and jaxlib (jax 0.12.1 came without one): where
# the newest jaxlib has none yet, take the newest jax and jaxlib that have.
plugin=$("$venv/bin/python" -m pip index versions jax-cuda12-plugin 2>/dev/null \
  | sed -n 's/^jax-cuda12-plugin (\(.*\))$/\1/p' || true)
jaxlib_version=$("$venv/bin/python" -c "import jaxlib; print(jaxlib.__version__)")
if [ -n "$plugin" ] && [ "$plugin" != "$jaxlib_version" ]; then
  echo "no jax-cuda12-plugin $jaxlib_version yet: jaxlib $plugin"
  "$venv/bin/python" -m pip install -q "jaxlib==$plugin" "jax<=$plugin"
fi
PATH="$venv/bin:$PATH" bash scripts/install_cuda_lowering.sh
"$venv/bin/python" - <<'PY'
import jax, jax_triton, triton, torch, sys
print(f"newest stack: Python {sys.version.split()[0]}, jax {jax.__version__}, jax-triton {jax_triton.__version__}, "
      f"triton {triton.__version__}, torch {torch.__version__}")
PY
JAX_PLATFORMS=cpu JAX_DECODE_REQUIRE_LOWERING=1 "$venv/bin/python" -m pytest -q \
  tests/test_cuda_lowering.py tests/test_kernels.py tests/test_torch_bridge.py tests/test_features.py \
  tests/test_write_kv.py tests/test_vmap_and_merge.py tests/test_fp8_rounding.py tests/test_head_dims.py \
  tests/test_mla_hopper.py tests/test_gqa_hopper.py tests/test_schedule.py
