"""The README's example runs, and its test command is the one CI runs."""

from __future__ import annotations

import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "the README has a Python example"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    np.testing.assert_array_equal(np.asarray(namespace["seq_lens"]), [4, 20, 43, 103])
    assert namespace["attn"].shape == (4, 512)
    assert np.isfinite(np.asarray(namespace["attn"], np.float32)).all()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()
