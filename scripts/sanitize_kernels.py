"""Run every kernel variant under compute-sanitizer memcheck, on valid and adversarial inputs.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 \\
        python scripts/sanitize_kernels.py

(``scripts/sanitize.sh`` runs exactly that.)  Turning torch's caching allocator off
gives every tensor its own cudaMalloc, so a read just past a tensor is caught instead
of landing in a neighbour inside the same pooled segment.

Cases: the test suite's configuration matrix (tests/cases.py), each with adversarial
variants -- page ids negative / >= num_pages / int32 extremes, seq_lens past the page
table's capacity, 0, negative and int32 min, a page table narrower than the longest
row, NaN/inf in q and the cache, and non-contiguous torch views of every input -- all
through torch_bridge (the compiled kernels; the JAX path launches the same binaries).
Each run's output is also checked against the float64 oracle, which implements the
documented semantics for these inputs.

``--hopper`` (an sm_90 GPU): the Gluon stage 1s instead -- bf16 MLA with 64-token
pages at 16 and 128 heads, fixed splits, one pass, the device-side schedule and
(token, head) rows, an e4m3 latent with scales, fp8 GQA (``hopper_fp8``) and the
narrow-group MLA kernel (planned for 16 heads; ``hopper_narrow``; its e4m3 tiles also
widened by a warpgroup of their own, ``hopper_widener``) -- with the same adversarial
inputs.  Their
barriers are placed by hand, so run it under racecheck and synccheck too
(``TOOL=racecheck scripts/sanitize.sh --hopper``); ``--hopper --fp8`` runs the fp8
kernels only, ``--hopper --narrow`` the narrow-group kernel only.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from cases import FEATURES, MATRIX, Case  # noqa: E402
from torch_support import to_tensor  # noqa: E402

import torch_bridge  # noqa: E402
from jax_decode.reference import FP8_MMA_LSE_TOLERANCE, LSE_TOLERANCE, decode_attention_reference  # noqa: E402

# On a machine without a GPU the same script runs the kernels in Triton's interpreter
# (no sanitizer then; useful to check the script itself).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
OUT_TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def _adversarial(problem, name: str):
    """Modify a problem in place to one adversarial input; returns whether NaN is expected."""
    num_pages = problem.k_cache.shape[0]
    pt, sl = problem.page_table, problem.seq_lens
    if name == "bad_page_ids":
        pt[-1, 0], pt[-1, -1] = -1, num_pages
        pt[-2, 0] = INT32_MAX
        pt[0, :] = INT32_MIN
    elif name == "bad_lengths":
        sl[:] = [INT32_MAX, 0, -5, INT32_MIN][: len(sl)]
    elif name == "narrow_page_table":
        problem.page_table = np.ascontiguousarray(pt[:, :1])
        sl[:] = 10**6
    elif name == "nan_inf":
        problem.q[-1, 0, 0] = np.nan
        problem.k_cache[pt[-2, 0], 0, 0, 0] = np.inf
        return True
    return False


def _views(q, k, v, pt, sl):
    """The same values, as non-contiguous torch views (only the last dimension contiguous)."""

    def padded(t, dim):
        shape = list(t.shape)
        shape[dim] *= 2
        big = torch.zeros(shape, dtype=t.dtype, device=t.device)
        view = big.narrow(dim, 0, t.shape[dim])
        view.copy_(t)
        return view

    q = padded(q, 1)  # strided heads
    k = padded(k, 2)  # strided kv heads
    v = None if v is None else padded(v, 0)  # strided pages
    pt = padded(pt, 1)  # wider rows than used
    return q, k, v, pt, sl


def run_case(case: Case, variant: str, views: bool) -> None:
    problem = case.problem()
    expect_nan = _adversarial(problem, variant)
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    if views:
        q, k, v, pt, sl = _views(q, k, v, pt, sl)
    head_dim_v = problem.head_dim_v if case.mla else None
    extras = {name: to_tensor(x, DEVICE) for name, x in problem.extras.items()}  # fp8 scales, sinks
    out, lse = torch_bridge.decode_attention(
        q, k, v, pt, sl, head_dim_v=head_dim_v, return_lse=True, **extras, **case.options()
    )
    expected, expected_lse = decode_attention_reference(
        *problem.arrays, head_dim_v=head_dim_v, **problem.extras, **case.oracle_options()
    )
    got = out.float().cpu().numpy()
    if expect_nan:  # only the poisoned rows may be NaN
        rows = [0, 1][: len(got) - 2]
        got, expected = got[rows], expected[rows]
        lse, expected_lse = lse[rows], expected_lse[rows]
    tol = OUT_TOL[problem.q.dtype.name]
    np.testing.assert_allclose(got, expected, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse.cpu().numpy(), expected_lse, **LSE_TOLERANCE)


def run_planned(case: Case, variant: str, views: bool, schedule_programs: int = 0, narrow: bool = False,
                widener: bool = False, **plan_options) -> None:  # fmt: skip
    """``run_case`` through torch_bridge's launcher with a config planned with
    ``plan_options`` of ``make_launch_config`` (which the frontends do not pass);
    ``schedule_programs``: that many programs under the device-side schedule instead;
    ``narrow``: the Gluon MLA narrow-group kernel (``LaunchConfig.hopper_narrow``);
    ``widener``: its e4m3 tiles widened by a warpgroup of their own (``hopper_widener``)."""
    from jax_decode.launch import make_launch_config
    from jax_decode.operands import DecodeOperands
    from jax_decode.prepare import DecodeOptions, prepare_decode
    from torch_bridge.launcher import launch_decode
    from torch_bridge.ops import TORCH, device_info

    problem = case.problem()
    expect_nan = _adversarial(problem, variant)
    q, k, v, pt, sl = (to_tensor(a, DEVICE) for a in problem.arrays)
    if views:
        q, k, v, pt, sl = _views(q, k, v, pt, sl)
    head_dim_v = problem.head_dim_v if case.mla else None
    extras = {name: to_tensor(x, DEVICE) for name, x in problem.extras.items()}  # fp8 scales, sinks
    given = DecodeOperands(q, k, v, pt, sl, extras.get("k_scale"), extras.get("v_scale"), extras.get("sinks"))
    decode, ops = prepare_decode(given, DecodeOptions(head_dim_v, None, case.logit_cap, case.window_left), TORCH)
    config = make_launch_config(decode, device_info(q.device), case.num_kv_splits, **plan_options)
    if narrow:  # (fixed splits, unless schedule_programs)
        config = dataclasses.replace(config, hopper_narrow=True, schedule_programs=0, hopper_widener=widener)
    if schedule_programs:
        config = dataclasses.replace(config, schedule_programs=schedule_programs)
    out = torch.empty(decode.out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(decode.lse_shape, dtype=torch.float32, device=q.device)
    launch_decode(config, ops, None, None, out, lse)
    expected, expected_lse = decode_attention_reference(
        *problem.arrays, head_dim_v=head_dim_v, **problem.extras, **case.oracle_options()
    )
    got, lse = out.float().cpu().numpy(), lse.cpu().numpy()
    if expect_nan:  # only the poisoned rows may be NaN
        rows = [0, 1][: len(got) - 2]
        got, expected, lse, expected_lse = got[rows], expected[rows], lse[rows], expected_lse[rows]
    tol = OUT_TOL[problem.q.dtype.name]
    np.testing.assert_allclose(got, expected, atol=tol, rtol=tol)
    # (The fp8 GQA stage 1 adds its scores on e4m3 tensor cores.)
    lse_tol = FP8_MMA_LSE_TOLERANCE if config.hopper_gqa else LSE_TOLERANCE
    np.testing.assert_allclose(lse, expected_lse, **lse_tol)


def hopper_main() -> None:
    """The Gluon stage 1s' configurations (see the module docstring)."""
    from jax_decode.kernels.gluon_compile import hopper_kernels_usable

    if DEVICE != "cuda" or torch.cuda.get_device_capability() != (9, 0) or not hopper_kernels_usable():
        raise SystemExit("--hopper needs an sm_90 GPU and a Triton with Gluon's Hopper API")
    base = Case(num_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_v=512, page_size=64, max_pages=3,
                dtype="bfloat16", mla=True)  # fmt: skip
    cases = [
        (dataclasses.replace(base, num_heads=heads, num_kv_splits=splits), {})
        for heads in (16, 128)
        for splits in (None, 1, 3)
    ]
    cases.append((dataclasses.replace(base, page_size=128, max_pages=2, num_kv_splits=None), {}))
    cases.append((dataclasses.replace(base, num_kv_splits=None), dict(device_schedule=True)))
    # (16 heads plan the narrow-group kernel; the seesaw takes them where asked)
    cases.append((dataclasses.replace(base, num_kv_splits=None), dict(hopper_narrow=False)))
    cases.append((dataclasses.replace(base, num_heads=128, num_kv_splits=None), dict(device_schedule=True)))
    cases.append((dataclasses.replace(base, q_len=2, num_kv_splits=None), dict(hopper_multi_token=True)))
    cases.append((dataclasses.replace(base, q_len=4, num_kv_splits=1), dict(hopper_multi_token=True)))
    # The seesaw under the schedule (these short rows plan one split: four programs forced).
    cases.append((dataclasses.replace(base, num_heads=128, num_kv_splits=None), dict(schedule_programs=4)))
    # An e4m3 latent with scales on the seesaw, widened in shared memory: one pass, fixed
    # splits, the schedule (the narrow-group kernel's e4m3 cases below).
    fp8 = dataclasses.replace(base, kv_dtype="float8_e4m3fn", kv_scales="tensor")
    for splits, programs in ((None, 0), (3, 0), (None, 4)):
        cases.append((dataclasses.replace(fp8, num_heads=128, num_kv_splits=splits), dict(schedule_programs=programs)))
    # The fp8 GQA stage 1 (hopper_fp8): pages of 16 (four TMA boxes a tile) and 64, four
    # and 8 query heads a KV head.
    gqa = Case(num_heads=32, num_kv_heads=8, head_dim_qk=128, page_size=16, max_pages=9, dtype="bfloat16",
               kv_dtype="float8_e4m3fn", kv_scales="head")  # fmt: skip
    for changes in (dict(num_kv_splits=None), dict(num_kv_splits=1), dict(num_kv_splits=3, page_size=64, max_pages=3),
                    dict(num_heads=8, num_kv_heads=1, num_kv_splits=2)):  # fmt: skip
        cases.append((dataclasses.replace(gqa, **changes), dict(hopper_fp8=True)))
    # The narrow-group MLA kernels (hopper_narrow): one pass, splits, (token, head) rows
    # of two and three tokens (30 of its 32 columns), and the device-side schedule (four
    # programs: rows of one chunk and rows of several).
    for changes in (dict(num_kv_splits=1), dict(num_kv_splits=3), dict(q_len=2, num_kv_splits=2),
                    dict(num_heads=10, q_len=3, num_kv_splits=None)):  # fmt: skip
        cases.append((dataclasses.replace(base, **changes), dict(narrow=True, hopper_multi_token=True)))
    for changes in (dict(num_kv_splits=None), dict(q_len=2, num_kv_splits=None)):
        options = dict(narrow=True, hopper_multi_token=True, schedule_programs=4)
        cases.append((dataclasses.replace(base, **changes), options))
    # ... over an e4m3 latent with scales: splits and the schedule.
    for splits, programs, widener in ((3, 0, False), (None, 4, False), (3, 0, True), (None, 4, True)):
        options = dict(narrow=True, schedule_programs=programs, widener=widener)
        cases.append((dataclasses.replace(fp8, num_kv_splits=splits), options))
    if "--fp8" in sys.argv:  # the fp8 Gluon kernels only
        cases = [(case, options) for case, options in cases if case.kv_dtype]
    if "--narrow" in sys.argv:  # the narrow-group kernel only
        cases = [(case, options) for case, options in cases if options.get("narrow")]
    variants = ["valid", "bad_page_ids", "bad_lengths", "narrow_page_table", "nan_inf"]
    runs = 0
    for case, plan_options in cases:
        for variant in variants:
            # Views: MLA's strided q is not TMA-addressable (the portable stand-in runs); fp8
            # GQA reads q through a pointer and the K view (slots twice as wide as its heads) by TMA.
            for views in (False, True):
                run_planned(case, variant, views, **plan_options)
                runs += 1
        print(f"{case.id} {plan_options or ''}: ok", flush=True)
    print(f"sanitize_kernels --hopper: {runs} runs, all matched the oracle")


def main() -> None:
    if "--hopper" in sys.argv:
        hopper_main()
        return
    # The configuration matrix, then fp8 caches, windows and sinks.
    if "--quick" in sys.argv:
        cases = MATRIX[:3] + FEATURES[:3]
    elif "--features" in sys.argv:  # fp8 caches, windows and sinks only
        cases = list(FEATURES)
    else:
        cases = MATRIX + FEATURES
    variants = ["valid", "bad_page_ids", "bad_lengths", "narrow_page_table", "nan_inf"]
    runs = 0
    for index, case in enumerate(cases):
        for variant in variants:
            # Strided views change the compiled kernel (strides are constexprs): every
            # fourth configuration gets them, to bound compile time under the sanitizer.
            for views in (False, True) if index % 4 == 0 else (False,):
                run_case(case, variant, views)
                runs += 1
        print(f"{case.id}: ok", flush=True)
    # Splits beyond the tokens a row has: most splits are empty.
    for case in cases[:5]:
        run_case(dataclasses.replace(case, num_kv_splits=64), "valid", False)
        runs += 1
    # The portable stage 1 under the device-side schedule (which the planner picks for
    # large problems only), with few programs (chunks straddle rows) and with more
    # programs than tiles (most chunks empty).
    for case in cases[:: max(1, len(cases) // 8)]:
        for programs in (3, 64):
            for variant in variants:
                run_planned(case, variant, False, schedule_programs=programs)
                runs += 1
        print(f"{case.id} scheduled: ok", flush=True)
    print(f"sanitize_kernels ({DEVICE}): {runs} runs ({len(cases)} configurations x {len(variants)} inputs, "
          "contiguous and strided), all matched the oracle")  # fmt: skip


if __name__ == "__main__":
    main()
