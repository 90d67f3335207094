"""Does a race checker follow ordering through mbarrier arrive/wait across
warp-specialised partitions?  The Gluon MLA seesaw's exchange protocol (its ``s_m0`` /
``s_m1`` row maxima, docs/performance.md) on a 64-float buffer in a minimal kernel: the
writer partition stores, passes a warpgroup barrier and arrives on A; the reader waits
on A, loads, passes a warpgroup barrier and arrives on B; the writer waits on B before
its next store.  Correct by construction: a checker should report nothing.

``--broken``: the reader arrives on B before it loads, a real write-after-read race (the
positive control: a checker must report it).  ``--quad``: the vector's layout is a row
slice of a 2D layout, four lanes of one warp per element, as the seesaw's rows are.

Needs an sm_90 GPU and a Triton with Gluon's Hopper API::

    compute-sanitizer --tool racecheck --racecheck-report hazard \\
        python scripts/mbarrier_race_probe.py [--broken] [--quad]
    TRITON_INSTRUMENTATION_MODE=consan python scripts/mbarrier_race_probe.py [--broken]
"""

import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from jax_decode.kernels.mla_hopper import _barrier, _cta_barrier

ROUNDS = gl.constexpr(8)  # handoffs per run


@gluon.jit
def _writer(args, consts: gl.constexpr):
    buf, bar_a, bar_b, out_ptr = args
    layout: gl.constexpr = consts[1]
    offs = gl.arange(0, 64, layout=layout)
    for j in range(ROUNDS):
        mbarrier.wait(bar_b, (j - 1) & 1, pred=j > 0)
        buf.store(offs.to(gl.float32) + j)
        _cta_barrier()
        mbarrier.arrive(bar_a)


@gluon.jit
def _reader(args, consts: gl.constexpr):
    buf, bar_a, bar_b, out_ptr = args
    BROKEN: gl.constexpr = consts[0]
    layout: gl.constexpr = consts[1]
    offs = gl.arange(0, 64, layout=layout)
    acc = gl.zeros([64], gl.float32, layout=layout)
    for j in range(ROUNDS):
        mbarrier.wait(bar_a, j & 1)
        if BROKEN:  # releases the buffer before reading it
            _cta_barrier()
            mbarrier.arrive(bar_b)
            acc += buf.load(layout)
        else:
            acc += buf.load(layout)
            _cta_barrier()
            mbarrier.arrive(bar_b)
    gl.store(out_ptr + offs, acc)


@gluon.jit
def _probe(out_ptr, BROKEN: gl.constexpr, QUAD: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bar_a = _barrier(1)
    bar_b = _barrier(1)
    args = (buf, bar_a, bar_b, out_ptr)
    if QUAD:
        layout: gl.constexpr = gl.SliceLayout(1, gl.BlockedLayout([1, 1], [8, 4], [4, 1], [1, 0]))
    else:
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    consts: gl.constexpr = (BROKEN, layout)
    gl.warp_specialize([(_writer, (args, consts)), (_reader, (args, consts))], [4], [96])


def main() -> None:
    # ConSan (TRITON_INSTRUMENTATION_MODE=consan) keeps its state in global scratch memory.
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    broken, quad = "--broken" in sys.argv, "--quad" in sys.argv
    out = torch.zeros(64, device="cuda")
    _probe[(1,)](out, broken, quad, num_warps=4)
    torch.cuda.synchronize()
    expected = torch.arange(64, device="cuda", dtype=torch.float32) * ROUNDS.value + sum(range(ROUNDS.value))
    matches = "matches" if torch.equal(out, expected) else "DIFFERS"
    print(f"{'broken' if broken else 'correct'} protocol{' (quad rows)' if quad else ''}: output {matches}")


if __name__ == "__main__":
    main()
