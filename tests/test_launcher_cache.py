"""The torch launcher reuses a compiled kernel only where Triton itself would.

After its first launch, a launch calls the compiled kernel's launcher directly; the
key for that must cover everything Triton specialises a kernel on.  On the CPU the key
is checked against Triton's own rules; on a GPU, calls that differ in one runtime argument
or dtype (in both orders, in one process) must each write what a fresh process would.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cases import GQA4, MHA
from torch_support import to_float64, to_tensor

import torch_bridge
from jax_decode.reference import decode_attention_reference


@pytest.fixture(scope="module")
def cuda_backend_type():
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return type(make_backend(GPUTarget("cuda", 90, 32)))


def test_key_refines_tritons_specialisation(cuda_backend_type):
    """Equal launch keys imply equal Triton specialisations (the launcher may then reuse
    the compiled kernel), over arguments that differ in everything Triton looks at."""
    from triton._C.libtriton import native_specialize_impl

    from torch_bridge.launcher import launch_key

    def tritons(device, args):
        return (device, *(native_specialize_impl(cuda_backend_type, a, False, True, True) for a in args))

    f32, bf16, i32 = torch.zeros(64), torch.zeros(64, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.int32)
    tensors = [f32, f32[4:], f32[1:], f32[2:], bf16, bf16[8:], bf16[1:], i32, i32[3:], torch.zeros(32)]
    ints = [1, 2, 8, 16, 17, 19, 32, 2**31 - 1, 2**31, 2**32 + 16, True, False, 0, -16]
    calls = [(d, (t, n)) for d in (0, 1) for t in tensors for n in ints]
    for device, args in calls:
        for device2, args2 in calls:
            if launch_key(device, args) == launch_key(device2, args2):
                assert tritons(device, args) == tritons(device2, args2), (args, args2)
    # ... and the key is no finer than it must be where calls repeat (one launcher, reused).
    assert launch_key(0, (f32, 8)) == launch_key(0, (torch.zeros(32), 8))
    assert launch_key(0, (f32, 8)) != launch_key(0, (f32[1:], 8)) != launch_key(1, (f32[1:], 8))


class _OnDevice(torch.Tensor):
    """A CPU tensor that reports CUDA device 0, so a launcher takes its compiled path."""

    def get_device(self):
        return 0


def test_pinned_launcher_reuses_the_aligned_launch_only_when_every_tensor_is_aligned(monkeypatch):
    """A pinned StageLauncher (a DecodeRun's: dtypes and ints fixed) skips the key for a
    call whose tensors are all 16-byte aligned, reusing the aligned call's launcher; a
    call with one misaligned tensor takes the keyed path and its own compilation."""
    from torch_bridge import launcher as launcher_module

    compiled_for, launched = [], []

    class Compiled:
        def __init__(self, key):
            self.key = key

        def __getitem__(self, grid):
            return lambda *args: launched.append((self.key, args[:3]))

    class Kernel:
        arg_names = ["a", "b", "n", "BLOCK"]

        def __getitem__(self, grid):
            def compile_and_launch(*args, **options):
                key = launcher_module.launch_key(0, args)
                compiled_for.append(key)
                launched.append((key, args))
                return Compiled(key)

            return compile_and_launch

    monkeypatch.setitem(launcher_module.KERNELS, "fake", Kernel())
    launch = type("Launch", (), dict(kernel_name="fake", grid=(1, 1, 1), num_warps=4, num_stages=1,
                                     meta=lambda self: {"BLOCK": 16}))()  # fmt: skip
    stage = launcher_module.StageLauncher(launch, pinned=True)

    def tensor(offset=0):
        return torch.zeros(64)[offset:].as_subclass(_OnDevice)

    a, b, shifted = tensor(), tensor(), tensor(1)
    stage((a, b, 7))
    stage((tensor(), tensor(), 7))
    assert len(compiled_for) == 1 and len(launched) == 2
    stage((a, shifted, 7))  # misaligned: Triton specialises anew
    assert len(compiled_for) == 2 and launched[-1][0] == compiled_for[1]
    stage((a, b, 7))  # aligned again: the aligned launcher, no compilation
    assert len(compiled_for) == 2 and launched[-1][0] == compiled_for[0]
    stage((shifted, b, 7))  # the other tensor misaligned
    assert len(compiled_for) == 3
    # Unpinned, every call builds the key (and still reuses launchers by it).
    unpinned = launcher_module.StageLauncher(launch)
    unpinned((a, b, 7))
    unpinned((a, b, 7))
    assert unpinned._aligned_runner is None and len(compiled_for) == 4


def test_direct_runner_passes_what_tritons_runner_passes(monkeypatch):
    """On the Triton versions direct_runner calls the C launcher for, it passes the C
    launcher what Triton's own runner passes, less the launch metadata and the (idle)
    hooks; with a launch hook installed, Triton's runner takes the call.  (CI runs this
    under the GPU image's Triton: scripts/test_image_triton.sh.)"""
    import triton
    from triton import knobs
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.driver import driver

    from torch_bridge import launcher as launcher_module

    if ".".join(triton.__version__.split(".")[:2]) not in launcher_module.DIRECT_LAUNCH_TRITON:
        pytest.skip(f"triton {triton.__version__} launches through its own runner here")
    launched = []
    run = object.__new__(CudaLauncher)  # a launcher of a kernel without scratch, recording its C call
    attributes = dict(num_ctas=1, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                      profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=True)  # fmt: skip
    for name, value in attributes.items():
        setattr(run, name, value)
    run.launch = lambda *args: launched.append(args)
    compiled = object.__new__(CompiledKernel)  # loaded already (no GPU here)
    for name, value in dict(module="loaded", function=1234, packed_metadata=(4, 1, 0), name="k", src=None,
                            _run=run).items():  # fmt: skip
        setattr(compiled, name, value)
    fake_driver = type("Driver", (), dict(get_current_device=lambda self: 3, get_current_stream=lambda self, d: 77 + d))
    monkeypatch.setattr(driver, "_active", fake_driver())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77 + device, raising=False)
    grid, args = (5, 2, 1), (torch.zeros(4), 16, 0.5)

    compiled[grid](*args)
    launcher_module.direct_runner(compiled, grid)(*args)
    tritons, direct = launched
    hooks = slice(10, 13)  # launch metadata, enter hook, exit hook
    assert direct[hooks] == (None, None, None) and tritons[hooks] != direct[hooks]
    assert direct[: hooks.start] == tritons[: hooks.start] == (5, 2, 1, 80, 1234, False, True, None, None, (4, 1, 0))
    assert direct[hooks.stop :] == tritons[hooks.stop :] == args
    # A profiler's hook installed (either hook, or a hook that is not Triton's hook
    # chain): the call goes through Triton's runner, which passes it on.
    direct_run = launcher_module.direct_runner(compiled, grid)
    for name in ("launch_enter_hook", "launch_exit_hook"):
        chain = getattr(knobs.runtime, name)
        chain.add(print)
        try:
            direct_run(*args)
        finally:
            chain.remove(print)
        assert launched[-1][11 if name == "launch_enter_hook" else 12] is chain, name  # (direct passes None)
        for hook in (print, None):
            monkeypatch.setattr(knobs.runtime, name, hook)
            direct_run(*args)
            assert launched[-1][11 if name == "launch_enter_hook" else 12] is hook, (name, hook)
            monkeypatch.setattr(knobs.runtime, name, chain)
    direct_run(*args)
    assert launched[-1] == direct


gpu = pytest.mark.gpu


def _write(cache_slots: int, new_dtype: torch.dtype, value: float, slot: int):
    cache = torch.zeros(cache_slots, 1, 2, 16, device="cuda", dtype=torch.bfloat16)
    new = torch.full((1, 2, 16), value, device="cuda", dtype=new_dtype)
    torch_bridge.write_kv(cache, None, new, None, torch.tensor([slot], device="cuda", dtype=torch.int32))
    return cache


@gpu
@pytest.mark.parametrize("order", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_write_kv_new_rows_dtype_changes_between_calls(order):
    for value, dtype in zip((1.0, 3.0), order, strict=True):
        cache = _write(8, dtype, value, slot=5)
        assert (cache[5] == value).all() and (cache[:5] == 0).all() and (cache[6:] == 0).all(), (dtype, value)


@gpu
@pytest.mark.parametrize("order", [(1, 8), (8, 1), (16, 17), (17, 16)])
def test_write_kv_slot_count_changes_between_calls(order):
    for slots in order:  # the slot count is a runtime int: 1 and multiples of 16 specialise
        slot = slots - 1 if slots > 1 else 0
        cache = _write(slots, torch.bfloat16, 2.0, slot=min(6, slot))
        assert (cache[min(6, slot)] == 2.0).all(), slots
        assert int((cache != 0).sum()) == 2 * 16, slots


def _decode(case, *, num_pages: int | None = None, dtype: str | None = None, shift_q: bool = False, scale=None):
    import dataclasses

    if dtype is not None:
        case = dataclasses.replace(case, dtype=dtype)
    problem = case.problem()
    if num_pages is not None:  # the cache's page count, a runtime int of the kernel
        pages = problem.k_cache.shape[0]
        assert num_pages >= pages
        pad = [(0, num_pages - pages)] + [(0, 0)] * 3
        problem.k_cache, problem.v_cache = np.pad(problem.k_cache, pad), np.pad(problem.v_cache, pad)
    q, k, v, pt, sl = (to_tensor(a, "cuda") for a in problem.arrays)
    if shift_q:  # same shapes, q 4 bytes into its storage
        offset = 4 // q.element_size()
        storage = torch.empty(q.numel() + offset, device="cuda", dtype=q.dtype)
        q = storage[offset:].view(q.shape).copy_(q)
        assert q.data_ptr() % 16 != 0
    out = torch_bridge.decode_attention(q, k, v, pt, sl, num_kv_splits=2, k_scale=scale, v_scale=scale)
    expected, _ = decode_attention_reference(*problem.arrays, k_scale=scale, v_scale=scale)
    tol = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}[case.dtype if dtype is None else dtype]
    np.testing.assert_allclose(to_float64(out), expected, atol=tol, rtol=tol)


@gpu
@pytest.mark.parametrize("case", [MHA, GQA4], ids=["mha", "gqa"])
@pytest.mark.parametrize(
    "variations",
    [
        [dict(num_pages=19), dict(num_pages=32), dict(num_pages=33), dict(num_pages=32)],  # %16 changes
        [dict(dtype="float16"), dict(dtype="bfloat16"), dict(dtype="float16")],  # dtypes
        [dict(), dict(shift_q=True), dict()],  # alignment, both orders
        [dict(shift_q=True), dict()],
        [dict(), dict(scale=0.5), dict()],  # a scale pointer's dtype (placeholder int32 vs float32)
    ],
    ids=["num_pages", "dtype", "alignment", "alignment_first", "scale"],
)
def test_decode_runtime_arguments_change_between_calls(case, variations):
    for variation in variations:
        _decode(case, **variation)
