"""`python -m jax_decode` runs, checks against the oracle and prints its table."""

from __future__ import annotations

import os
import subprocess
import sys


def test_main_job_quick():
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-m", "jax_decode", "--quick"], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout
    for shape in ("GQA 32/8 d128", "MHA", "MQA 8/1 d256", "MLA 16/1 576/512"):
        assert shape in table
    assert "FAILED" not in table and table.count(" ok") >= 4
    assert "[1/" in result.stderr  # progress lines
