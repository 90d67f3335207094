"""Launch the kernels on torch tensors: CUDA tensors compiled, CPU tensors interpreted.

Every launch's kernel, grid, warps, stages and constexprs come from
:mod:`jax_decode.launch`, and its argument order from :mod:`jax_decode.operands`, as
for the JAX frontend.

Host time per call matters to serving engines, so after the first launch of a
compiled kernel, later launches call its compiled launcher directly instead of going
through ``JITFunction.run`` (which binds ~40 arguments and builds a cache key per
call).  A launcher is reused only where Triton itself would have reused the compiled
kernel: it is keyed (:func:`launch_key`) on a refinement of Triton's specialisation of
every runtime argument, and on the device.  The constexprs, warps and stages are fixed per :class:`StageLauncher`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator

import torch

from jax_decode import operands
from jax_decode.interpreter import run_interpreted
from jax_decode.kernels import KERNELS
from jax_decode.launch import KernelLaunch, KernelStrides, LaunchConfig, WriteProblem, write_cache_launch

# Distinct (config, strides) and write launches kept; beyond this the least recently used go.
MAX_CACHED_LAUNCHES = 1024
# Compiled launchers kept per launch (one per alignment / dtype pattern of its arguments).
MAX_RUNNERS = 64


def launch_key(device_index: int, args: tuple) -> tuple:
    """A key at least as fine as what Triton specialises a compiled kernel on: Triton
    looks at each tensor's dtype and whether its address is a multiple of 16, and at
    each int's width and whether it is 1 or divisible by 16; this key holds each
    tensor's dtype and address modulo 16, each other argument's type and value, and the
    device.  Equal keys therefore mean the same compiled kernel (tests/test_launcher_cache.py
    checks this against Triton's own ``native_specialize_impl``), at a fraction of the
    cost of asking Triton per call."""
    return (
        device_index,
        *[(a.dtype, a.data_ptr() & 15) if isinstance(a, torch.Tensor) else (type(a), a) for a in args],
    )


@functools.cache
def _runners_take_every_argument() -> bool:
    """Whether a compiled kernel's launcher takes the constexprs too, as the cached
    launches pass them: Triton 3.4 and later (those run here; 3.2's takes only the
    runtime arguments).  Elsewhere every launch goes through Triton's own binder."""
    import triton

    return tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 4)


# Triton versions whose compiled-kernel launch internals direct_runner was checked
# against on a GPU (the C launcher's argument order, scratch and hook handling).
DIRECT_LAUNCH_TRITON = ("3.6",)
DIRECT_LAUNCH = True  # (a switch for benchmarks comparing the two routes)


def direct_launch_here() -> bool:
    """Whether :func:`direct_runner` may call the installed Triton's C launcher."""
    import triton

    return DIRECT_LAUNCH and ".".join(triton.__version__.split(".")[:2]) in DIRECT_LAUNCH_TRITON


def direct_runner(compiled, grid: tuple):
    """``compiled[grid]`` -- a launcher taking every argument -- minus the per-call
    Python Triton's own runner spends where it has nothing to do: on the Triton
    versions in DIRECT_LAUNCH_TRITON, for a kernel without global or profile scratch,
    it calls the C launcher directly, with no launch metadata and no hooks, unless a
    launch hook (a profiler's) is installed -- or the hooks are anything but Triton's
    empty hook chains -- when Triton's runner takes the call.
    Elsewhere it is ``compiled[grid]``."""
    runner = compiled[grid]
    if not direct_launch_here():
        return runner
    from triton import knobs

    run = compiled.run
    launch = getattr(run, "launch", None)
    if launch is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return runner
    hooks, idle = knobs.runtime, knobs.HookChain
    function, metadata = compiled.function, compiled.packed_metadata
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl
    grid_x, grid_y, grid_z = grid
    current_device, current_stream = torch.cuda.current_device, torch._C._cuda_getCurrentRawStream

    def direct(*args):
        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
        if type(enter) is not idle or enter.calls or type(leave) is not idle or leave.calls:
            runner(*args)
            return
        launch(grid_x, grid_y, grid_z, current_stream(current_device()), function, cooperative, pdl, None, None,
               metadata, None, None, None, *args)  # fmt: skip

    return direct


_DATA_PTR = torch.Tensor.data_ptr


class StageLauncher:
    """One kernel launch on torch tensors, with its compiled launchers cached.

    ``pinned``: every call passes the same argument types, dtypes and non-tensor values
    (on one device) and only the tensors' addresses vary -- as in a :class:`DecodeRun`,
    whose config, device and strides fix the rest.  Then Triton's specialisation
    varies only with the addresses' alignment, and a call whose tensors are all 16-byte
    aligned (the usual case) reuses the aligned call's launcher after one test of the
    addresses, without building a key.
    """

    def __init__(self, launch: KernelLaunch, pinned: bool = False):
        self.launch = launch
        self.pinned = pinned
        self._aligned_runner = None
        self._tensor_args = None  # (pinned) the tensor arguments of a call, by position
        self.kernel = KERNELS[launch.kernel_name]
        meta = launch.meta()
        self.options = dict(num_warps=launch.num_warps, num_stages=launch.num_stages, **meta)
        # Compiled launchers take every argument in signature order, constexprs (which
        # follow the runtime arguments in every kernel of ours) included.
        names = self.kernel.arg_names
        num_runtime = len(names) - len(meta)
        assert set(names[num_runtime:]) == set(meta), "constexprs must follow the runtime arguments"
        self.constexpr_values = tuple(meta[name] for name in names[num_runtime:])
        self.runners: dict[tuple, object] = {}

    def __call__(self, args: tuple) -> None:
        """Launch on ``args`` (tensors and ints in the kernel's parameter order)."""
        device_index = args[0].get_device()
        if device_index < 0:
            run_interpreted(self.launch, args)
            return
        aligned = self._aligned_runner
        if aligned is not None and not functools.reduce(operator.or_, map(_DATA_PTR, self._tensor_args(args))) & 15:
            aligned(*args, *self.constexpr_values)
            return
        key = launch_key(device_index, args)
        runner = self.runners.get(key)
        if runner is not None:
            runner(*args, *self.constexpr_values)
            return
        compiled = self.kernel[self.launch.grid](*args, **self.options)
        if _runners_take_every_argument() and hasattr(compiled, "__getitem__"):  # a CompiledKernel
            if len(self.runners) >= MAX_RUNNERS:  # (ints that change per call would grow it)
                self.runners.clear()
            runner = self.runners[key] = direct_runner(compiled, self.launch.grid)
            positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            if self.pinned and len(positions) > 1 and all(args[i].data_ptr() % 16 == 0 for i in positions):
                self._tensor_args, self._aligned_runner = operator.itemgetter(*positions), runner


def kernel_strides(ops: operands.DecodeOperands, problem, mid_o, mid_lse, out, lse, mid=None) -> KernelStrides:
    """KernelStrides of torch tensors (their last dimensions must be contiguous); with
    several query tokens per row each of q, mid_o, mid_lse, out and lse has the token
    axis after the batch.  ``mid``: KernelStrides whose mid_o/mid_lse (and their token
    strides) stand in for absent ``mid_o``/``mid_lse``."""

    def strides(tensor, kept: int, token_axis: bool) -> tuple[int, ...]:
        """Strides of the leading ``kept`` dimensions other than the token axis."""
        stride = tensor.stride()
        return (stride[0], *stride[2 : kept + 1]) if token_axis else stride[:kept]

    v = ops.k_cache if problem.v_from_k else ops.v_cache
    rows, several = problem.token_axis, problem.q_len > 1  # which arrays have the token axis
    tokens = tuple(a.stride(1) for a in (ops.q, out, lse)) if several else (0, 0, 0)
    if mid is None:
        mid_tokens = (mid_o.stride(1), mid_lse.stride(1)) if several else (0, 0)
        mid = KernelStrides(None, None, None, None, strides(mid_o, 3, several), strides(mid_lse, 3, several), None,
                            None, (0, *mid_tokens, 0, 0))  # fmt: skip
    return KernelStrides(
        q=strides(ops.q, 2, rows),
        k=ops.k_cache.stride()[:3],
        v=v.stride()[:3],
        page_table=ops.page_table.stride(0),
        mid_o=mid.mid_o,
        mid_lse=mid.mid_lse,
        out=strides(out, 2, rows),
        lse=strides(lse, 2, rows),
        tokens=(tokens[0], mid.tokens[1], mid.tokens[2], tokens[1], tokens[2]),
    )


class GluonLauncher:
    """A Gluon launch on CUDA tensors: the kernel compiled ahead for the device
    (:func:`~jax_decode.kernels.gluon_compile.compile_launch`, the same binary the JAX
    frontend runs), its TMA descriptors built per call from the operands' addresses."""

    def __init__(self, launch: KernelLaunch, device_index: int):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from jax_decode.kernels.gluon_compile import compile_launch, tma_layout

        major, minor = torch.cuda.get_device_capability(device_index)
        self.launch = launch
        kernel = compile_launch(launch, major * 10 + minor, device_index)
        with torch.cuda.device(device_index):  # load the module on this device, not the current one
            kernel._init_handles()
        self.runner = direct_runner(kernel, launch.grid)
        self.constexpr_values = tuple(value for _, value in launch.constexprs)
        self.descriptor = TensorDescriptor
        self.views = tuple(
            (
                view.operand,
                [view.rows, view.cols],
                [view.row_stride, 1],
                list(view.block),
                tma_layout(view.block, view.dtype),
            )  # fmt: skip
            for view in launch.tma
        )

    def __call__(self, tensors: dict, args: tuple) -> None:
        """Launch with descriptors over ``tensors`` (by operand name) followed by ``args``."""
        descriptors = (self.descriptor(tensors[name], *view) for name, *view in self.views)
        self.runner(*descriptors, *args, *self.constexpr_values)


def _aligned(*tensors) -> bool:
    """Every tensor's address a multiple of 16 bytes (what TMA and the Gluon kernels' pointer
    specialisation take for granted); None (an absent operand) passes."""
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=4096)
def _scratch_layout(config: LaunchConfig) -> tuple:
    """(elements, (mid_o's shape, strides), (mid_lse's shape, strides, offset)) of
    ``config``'s scratch: mid_o, then mid_lse, contiguous."""
    mid_o_size = math.prod(config.mid_o_shape)
    mid_o = (config.mid_o_shape, _contiguous(config.mid_o_shape))
    mid_lse = (config.mid_lse_shape, _contiguous(config.mid_lse_shape), mid_o_size)
    return mid_o_size + math.prod(config.mid_lse_shape), mid_o, mid_lse


def scratch(config: LaunchConfig, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's partial results for ``config`` on ``like``'s device: (mid_o, mid_lse),
    contiguous views of one float32 buffer (one allocation and two views per call)."""
    layout = _scratch_layout(config)
    buffer, mid_lse = _launch_scratch(layout, like)
    return buffer.as_strided(*layout[1]), mid_lse


def _launch_scratch(layout: tuple, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`scratch` of a :func:`_scratch_layout` for a launch, a view cheaper: the
    kernels address mid_o by the config's strides from its base address, so the flat
    buffer itself stands for it; mid_lse (at an offset) is the one view made."""
    size, _, mid_lse = layout
    buffer = like.new_empty((size,), dtype=torch.float32)
    return buffer, buffer.as_strided(*mid_lse)


class DecodeRun:
    """The launches of one (config, operand strides): the portable stages, and where the
    config chooses them and the operands allow their TMA copies, the Gluon stage 1 (MLA
    with its device-side schedule and merge, or fp8 GQA)."""

    def __init__(self, config: LaunchConfig, strides: KernelStrides, device_index: int):
        self.config = config
        # The fixed-split config: what runs where the Gluon kernel cannot.
        self.fixed = dataclasses.replace(config, schedule_programs=0) if config.schedule_programs else config
        self.strides = strides
        self.one_pass, self.fixed_one_pass = config.one_pass, self.fixed.one_pass
        self._fixed_scratch, self._scheduled_scratch = _scratch_layout(self.fixed), _scratch_layout(config)
        self.stage1 = StageLauncher(self.fixed.stage1(strides), pinned=True)
        self.stage2 = StageLauncher(self.fixed.stage2(strides), pinned=True)
        self._stage1_partials = None
        self.gluon = self.merge = self.scheduled_stage1 = None
        if (config.hopper_mla or config.hopper_gqa) and device_index >= 0 and config.tma_ready(strides):
            self.gluon = GluonLauncher(config.hopper_stage1(strides), device_index)
        if config.portable_scheduled:
            self.scheduled_stage1 = StageLauncher(config.stage1(strides), pinned=True)
        # Whether the launches take a device-side schedule (the fixed splits stand in
        # where no scheduled stage 1 runs).
        self.scheduled = bool(config.schedule_programs) and (
            self.gluon is not None or self.scheduled_stage1 is not None
        )
        if self.scheduled:
            self.merge = StageLauncher(config.schedule_merge(strides), pinned=True)
        # The seesaw's and narrow-group scheduled stage 1 write the rows of one chunk to out themselves.
        self.direct = self.gluon is not None and self.scheduled and config.scheduled_rows_direct

    def __call__(self, ops: operands.DecodeOperands, mid_o, mid_lse, out, lse, out_given: bool = True,
                 schedule: torch.Tensor | None = None) -> None:  # fmt: skip
        """Launch on ``ops`` into ``out``/``lse``.  ``out_given``: ``out`` is the caller's
        and may share memory with an input, in which case one pass (stage 1 writing
        ``out`` while other programs still read the inputs) gives way to two stages.
        ``schedule``: the device-side schedule of ``ops.seq_lens`` already computed
        (:func:`launch_schedule`), for launches that take one; None computes it here."""
        config, p = self.config, self.config.problem
        if self.scheduled_stage1 is not None:  # (stage 1 writes partials only: out may overlap anything)
            if schedule is None:
                schedule = launch_schedule(config, ops)
            mid_o, mid_lse = _launch_scratch(self._scheduled_scratch, out)
            self.scheduled_stage1((*operands.stage1_inputs(ops, p, schedule), mid_o, mid_lse))
            self.merge((*operands.schedule_merge_inputs(ops, mid_o, mid_lse, schedule, out, lse), out, lse))
            return
        # Stage 1 writing out (one pass; rows of one chunk under the seesaw's schedule)
        # while other programs still read the inputs.  (config.one_pass implies
        # self.fixed.one_pass: the overlap test runs once, if at all.)
        direct = self.direct
        shares_memory = (self.fixed_one_pass or direct) and out_given and _may_overlap(out, ops)
        one_pass = self.one_pass and not shares_memory
        gluon = self.gluon is not None and not (direct and shares_memory)
        if gluon and _aligned(ops.q, ops.k_cache, ops.v_cache, ops.page_table, ops.seq_lens, out, lse):
            tensors = dict(q=ops.q, k_cache=ops.k_cache, v_cache=ops.v_cache)
            q = config.hopper_q_pointer
            if self.scheduled:
                if schedule is None:
                    schedule = launch_schedule(config, ops)
                mid_o, mid_lse = _launch_scratch(self._scheduled_scratch, out)
                written = (out, lse) if direct else ()
                self.gluon(tensors, (*operands.hopper_stage1_inputs(ops, p, schedule, q), mid_o, mid_lse, *written))
                self.merge((*operands.schedule_merge_inputs(ops, mid_o, mid_lse, schedule, out, lse), out, lse))
                return
            if one_pass:
                self.gluon(tensors, (*operands.hopper_stage1_inputs(ops, p, None, q), out, lse))
                return
            if not self.one_pass:  # (the one-pass launch cannot write partial results)
                if mid_o is None:
                    mid_o, mid_lse = _launch_scratch(self._fixed_scratch, out)
                if _aligned(mid_o, mid_lse):
                    self.gluon(tensors, (*operands.hopper_stage1_inputs(ops, p, None, q), mid_o, mid_lse))
                    self.stage2((*operands.stage2_inputs(ops, mid_o, mid_lse), out, lse))
                    return
        if self.fixed_one_pass and not shares_memory:
            self.stage1((*operands.stage1_inputs(ops, p), out, lse))
            return
        stage1 = self.stage1
        if shares_memory and self.fixed_one_pass:  # one split, but out shares memory with an input
            if self._stage1_partials is None:
                self._stage1_partials = StageLauncher(self.fixed.stage1(self.strides, partials=True), pinned=True)
            stage1 = self._stage1_partials
        if mid_o is None:
            mid_o, mid_lse = _launch_scratch(self._fixed_scratch, out)
        stage1((*operands.stage1_inputs(ops, p), mid_o, mid_lse))
        self.stage2((*operands.stage2_inputs(ops, mid_o, mid_lse), out, lse))


@functools.lru_cache(maxsize=MAX_CACHED_LAUNCHES)
def _schedule_launcher(config: LaunchConfig) -> StageLauncher:
    return StageLauncher(config.schedule())


def launch_schedule(config: LaunchConfig, ops: operands.DecodeOperands) -> torch.Tensor:
    """The device-side schedule of ``ops.seq_lens`` for ``config`` (which has one): a new
    int32 tensor on seq_lens' device, written by the schedule kernel."""
    schedule = ops.seq_lens.new_empty(config.schedule_shape, dtype=torch.int32)
    _schedule_launcher(config)((*operands.schedule_inputs(ops, config.problem), schedule))
    return schedule


def _may_overlap(out, ops: operands.DecodeOperands) -> bool:
    """Whether ``out`` may share memory with q or a cache (torch's own conservative test:
    same storage)."""
    overlaps = torch._C._overlaps
    return (
        overlaps(out, ops.q) or overlaps(out, ops.k_cache) or (ops.v_cache is not None and overlaps(out, ops.v_cache))
    )


_DECODE_LAUNCHERS: dict[tuple, DecodeRun] = {}


def launch_decode(config: LaunchConfig, ops: operands.DecodeOperands, mid_o, mid_lse, out, lse, out_given: bool = True,
                  schedule: torch.Tensor | None = None) -> DecodeRun | None:  # fmt: skip
    """Run the decode, writing ``out`` and ``lse`` in place; returns the :class:`DecodeRun`
    it launched (None for an empty batch), which a caller may call directly on later
    operands of the same config, device and strides.

    ``ops`` are torch tensors of the shapes and dtypes ``config`` was made for (scales
    float32 ``[1]``/``[num_kv_heads]`` and sinks float32 ``[num_heads]`` exactly where
    the config says so), on one device.  ``mid_o``/``mid_lse``: the fixed splits'
    scratch (the vLLM drop-in's ``attn_logits``), or None for scratch allocated here as
    the launch needs it.  ``out_given=False``: ``out`` was allocated for this call (it
    shares no memory with an input; see :class:`DecodeRun`).  ``schedule``: the
    device-side schedule of ``ops.seq_lens`` already computed (:func:`launch_schedule`),
    or None.

    Where the config chooses a Gluon stage 1 it runs if the operands it copies by TMA
    (MLA: q and the cache; fp8 GQA: both caches) are TMA-addressable row views and its
    pointers 16-byte aligned; otherwise the portable stage 1 takes its place with the
    config's fixed splits.
    """
    if config.problem.batch == 0:
        return None
    # Keyed on raw stride tuples: cheaper per call than building KernelStrides.
    v = ops.k_cache if config.problem.v_from_k else ops.v_cache
    # (The config fixes every dtype its callers check; out's, lse's and the scratch's are
    # keyed too, as a DecodeRun's launchers take them as fixed: see StageLauncher.pinned.)
    mid = None if mid_o is None else (mid_o.stride(), mid_lse.stride(), mid_o.dtype, mid_lse.dtype)
    key = (config, ops.q.get_device(), ops.q.stride(), ops.k_cache.stride(), v.stride(), ops.page_table.stride(), mid,
           out.stride(), lse.stride(), out.dtype, lse.dtype)  # fmt: skip
    run = _DECODE_LAUNCHERS.get(key)
    if run is None:
        if len(_DECODE_LAUNCHERS) >= MAX_CACHED_LAUNCHES:
            del _DECODE_LAUNCHERS[next(iter(_DECODE_LAUNCHERS))]  # the oldest
        # Absent scratch: what scratch() allocates for the fixed splits, contiguous.
        mid_strides = config.contiguous_strides() if mid_o is None else None
        strides = kernel_strides(ops, config.problem, mid_o, mid_lse, out, lse, mid_strides)
        run = _DECODE_LAUNCHERS[key] = DecodeRun(config, strides, ops.q.get_device())
    run(ops, mid_o, mid_lse, out, lse, out_given, schedule)
    return run


@functools.lru_cache(maxsize=MAX_CACHED_LAUNCHES)
def _write_launcher(problem: WriteProblem, new_strides: tuple, cache_strides: tuple, interpreted: bool):
    return StageLauncher(write_cache_launch(problem, new_strides, cache_strides, interpreted=interpreted))


def launch_write(problem: WriteProblem, ops: operands.WriteOperands) -> None:
    """Scatter ``ops.new``'s rows into ``ops.cache`` in place (see the write kernel)."""
    if problem.num_tokens == 0:
        return
    launcher = _write_launcher(problem, ops.new.stride()[:2], ops.cache.stride()[:3], ops.cache.get_device() < 0)
    launcher(operands.write_inputs(ops, problem, ops.cache, ops.cache))
