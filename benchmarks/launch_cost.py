"""Host time of one Triton kernel launch on a CUDA GPU, by launch route.

An empty kernel (five runtime arguments, two constexprs) launched back to back: through
``JITFunction`` (``kernel[grid](...)``: binds the arguments and builds a cache key per
call), through the compiled kernel's runner (``compiled[grid]``: launch metadata and
hook chains per call), through its ``run`` and, where the installed Triton's launcher has
one, through its C ``launch`` itself -- what ``torch_bridge.launcher.direct_runner``
calls -- with ``torch.add`` for reference.  Timed as :mod:`benchmarks.host_overhead` times calls.

    python -m benchmarks.launch_cost
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from benchmarks.host_overhead import per_call_us
from torch_bridge.launcher import direct_launch_here


@triton.jit
def _empty(x_ptr, y_ptr, z_ptr, w_ptr, n, A: tl.constexpr, B: tl.constexpr):
    if tl.program_id(0) < 0:  # never: the launch is the whole cost
        tl.store(x_ptr, tl.load(y_ptr) + tl.load(z_ptr) + tl.load(w_ptr) + n + A + B)


def main() -> None:
    xs = [torch.zeros(64, device="cuda") for _ in range(4)]
    args, grid = (*xs, 64), (4, 1, 1)
    compiled = _empty[grid](*args, A=1, B=2)
    runner, run = compiled[grid], compiled.run
    function, metadata = compiled.function, compiled.packed_metadata
    device, stream = torch.cuda.current_device(), torch._C._cuda_getCurrentRawStream
    routes = {
        "JITFunction kernel[grid](...)": lambda: _empty[grid](*args, A=1, B=2),
        "compiled[grid] runner": lambda: runner(*args, 1, 2),
        "compiled.run(...)": lambda: run(*grid, stream(device), function, metadata, None, None, None, *args, 1, 2),
    }
    launch = getattr(run, "launch", None)
    if launch is not None and direct_launch_here():  # (a Triton whose C launcher's argument order is known)
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl
        routes["C launcher (direct_runner's)"] = lambda: launch(
            *grid, stream(device), function, coop, pdl, None, None, metadata, None, None, None, *args, 1, 2
        )
    routes["torch.add (reference)"] = lambda: torch.add(xs[0], 1, out=xs[1])
    print(f"triton {triton.__version__}, {torch.cuda.get_device_name()}")
    for name, fn in routes.items():
        print(f"{name:<32} {per_call_us(fn):6.2f} us per call", flush=True)


if __name__ == "__main__":
    main()
