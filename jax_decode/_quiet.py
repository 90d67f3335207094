"""Import JAX without the CUDA plugin's "no driver" lines on a machine without a GPU.

With JAX's CUDA plugin installed (``scripts/install_cuda_lowering.sh``, or ``jax[cuda12]``
on a machine without a GPU), ``import jax`` loads the plugin's extension modules
(through ``jaxlib.gpu_solver``, ``gpu_prng``, ``gpu_linalg``, whatever ``JAX_PLATFORMS``
says), and three of them each write to file descriptor 2, from C++, when they find no
CUDA driver::

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1796401405.000797 4260 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU ...

They are logged before absl's logging is initialised, so no setting reaches them
(``TF_CPP_MIN_LOG_LEVEL`` 1 to 3, ``ABSL_MIN_LOG_LEVEL``, ``GLOG_minloglevel`` tried with
jax 0.10.2). :func:`import_jax` holds descriptor 2 while JAX imports and writes back
every line but those pairs, so any other warning still shows.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from types import ModuleType

NO_DRIVER = re.compile(r".*\bcudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\.")
ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def without_no_driver_lines(text: str) -> str:
    """``text`` less each "no CUDA driver" line and the absl preamble just before one."""
    lines = text.splitlines(keepends=True)
    kept = []
    for i, line in enumerate(lines):
        if NO_DRIVER.fullmatch(line.rstrip("\r\n")):
            continue
        following = lines[i + 1].rstrip("\r\n") if i + 1 < len(lines) else ""
        if line.rstrip("\r\n") == ABSL_PREAMBLE and NO_DRIVER.fullmatch(following):
            continue
        kept.append(line)
    return "".join(kept)


def import_jax() -> ModuleType:
    """``import jax``, less the CUDA plugin's "no driver" lines (a no-op once JAX is imported)."""
    if "jax" in sys.modules:
        return sys.modules["jax"]
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 to hold
        import jax

        return jax
    try:
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                import jax
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                captured.seek(0)
                sys.stderr.write(without_no_driver_lines(captured.read().decode(errors="replace")))
                sys.stderr.flush()
    finally:
        os.close(saved)
    return jax
