"""`python -m jax_decode` runs, checks against the oracle and prints its table; bad input
gets one line and a non-zero exit, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from jax_decode import _quiet


def _main_job(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jax_decode", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=600,
    )


def test_main_job_quick():
    result = _main_job("--quick")
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout
    for shape in ("GQA 32/8 d128", "MHA", "MQA 8/1 d256", "MLA 16/1 576/512"):
        assert shape in table
    assert "FAILED" not in table and table.count(" ok") >= 4
    assert "[1/" in result.stderr  # progress lines
    assert "cudart_stub" not in result.stderr and "absl::InitializeLog" not in result.stderr


def test_help_answers_without_importing_jax():
    code = (
        "import sys\n"
        "from jax_decode.__main__ import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "heavy = sorted({'jax', 'jaxlib', 'triton', 'torch'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--repeats" in result.stdout and result.stderr == ""


def test_repeats_below_one_is_refused_in_one_line():
    result = _main_job("--repeats", "0")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) <= 5
    last = result.stderr.splitlines()[-1]
    assert last.endswith("argument --repeats: must be >= 1 (the time is the median of that many calls), got 0")


def test_triton_backend_without_a_gpu_is_one_line():
    result = _main_job("--backend", "triton", "--quick", JAX_PLATFORMS="cpu")  # no GPU for JAX, even on a GPU host
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("python -m jax_decode: error: --backend triton runs the Triton kernels on a CUDA")
    assert "--backend xla" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr  # no traceback, no CUDA-plugin log lines


def test_backend_choices_are_the_librarys():
    from jax_decode import BACKENDS
    from jax_decode.__main__ import BACKENDS as CLI_BACKENDS

    assert CLI_BACKENDS == BACKENDS


def test_only_the_cuda_plugins_no_driver_lines_are_dropped():
    preamble = _quiet.ABSL_PREAMBLE + "\n"
    no_driver = (
        "I0000 00:00:1796401405.000797    4260 cudart_stub.cc:31] "
        "Could not find cuda drivers on your machine, GPU will not be used.\n"
    )
    other = "W0000 00:00:1796401405.1    4260 some_file.cc:12] a real warning\n"
    text = preamble + no_driver + preamble + other + "UserWarning: kept\n" + preamble + no_driver
    assert _quiet.without_no_driver_lines(text) == preamble + other + "UserWarning: kept\n"
