"""Where one ``torch_bridge.decode_attention`` call's device time goes: each kernel's
mean time (torch.profiler's CUDA activity) on benchmark rows.

    python -m benchmarks.kernel_times --rows "DeepSeek-V3 DP b64 ctx4096" [--splits 1 2 4 | --fixed-splits]

A call launches two or three kernels (stage 1 and stage 2; under the device-side
schedule, the schedule, stage 1 and the merge); the table says
which of them the time is in, which ``benchmarks.bench``'s totals do not.
``--fixed-splits`` and ``--portable-multi-token`` plan with ``device_schedule=False``
and ``hopper_multi_token=False`` (the frontends' plan, as it was before those were
measured), ``--portable-schedule`` with ``portable_schedule=True``, ``--two-warpgroups``
runs the Gluon MLA stage 1's two-warpgroup kernel where
the plan has the seesaw or the narrow-group kernels over a bf16 cache (other rows are
skipped), ``--seesaw`` plans with
``hopper_narrow=False`` (the seesaw where the plan has the narrow-group kernels),
``--hopper-fp8`` with ``hopper_fp8=True`` (the Gluon fp8 GQA stage 1), ``--widener``
widens e4m3 narrow-group rows in a warpgroup of their own (``hopper_widener``),
``--schedule-programs N ...`` the device-side schedule with N
programs per head block (rows whose plan has none are refused, but for the Gluon MLA
seesaw, which takes it for several query tokens too); these launch through
torch_bridge's launcher.
"""

from __future__ import annotations

import argparse
import collections

from benchmarks.bench import _options, _problem_for, row_problem
from benchmarks.suites import SUITES

# make_launch_config's options as the frontends plan (launched through torch_bridge's API).
_FRONTEND_PLAN = dict(device_schedule=True, hopper_multi_token=True, portable_schedule=False)


def kernel_times(row, calls: int = 50, num_kv_splits: int | None = None, seesaw: bool = True,
                 schedule_programs: int | None = None, widener: bool = False, **plan_options):  # fmt: skip
    """Mean device microseconds per call of each kernel one call of ``row`` launches
    (``seesaw`` False: the Gluon MLA two-warpgroup kernel where the plan has the seesaw
    or the narrow-group kernels)."""
    import dataclasses

    import torch
    from torch.profiler import ProfilerActivity, profile

    import torch_bridge
    from benchmarks.inputs import TorchArrays
    from jax_decode.launch import make_launch_config
    from jax_decode.operands import DecodeOperands
    from torch_bridge.launcher import launch_decode
    from torch_bridge.ops import device_info

    problem = _problem_for(row, TorchArrays("cuda"))

    def call():
        return torch_bridge.decode_attention(*problem.arrays, num_kv_splits=num_kv_splits, **problem.extras,
                                             **_options(row))  # fmt: skip

    if not seesaw or widener or plan_options != _FRONTEND_PLAN or schedule_programs is not None:
        config = make_launch_config(row_problem(row), device_info(problem.q.device), num_kv_splits, **plan_options)
        if not seesaw:  # (LaunchConfig refuses it an fp8 cache)
            if config.problem.q_len > 1:  # the two-warpgroup kernel's schedule takes one token
                config = dataclasses.replace(config, schedule_programs=0)
            config = dataclasses.replace(config, hopper_seesaw=False, hopper_narrow=False)
        if widener:
            if not (config.hopper_narrow and config.problem.cache_dtype == "float8_e4m3fn"):
                raise ValueError(f"{row.label}: the widener takes the narrow-group kernels' e4m3 rows")
            config = dataclasses.replace(config, hopper_widener=True)
        if schedule_programs is not None:
            # (The Gluon MLA seesaw runs the schedule for any q_len, planned or not.)
            if not config.schedule_programs and not (config.hopper_mla and seesaw):
                raise ValueError(f"{row.label}: its plan has no device-side schedule for {schedule_programs} programs")
            config = dataclasses.replace(config, schedule_programs=schedule_programs)
        extras = problem.extras  # fp8 scales, sinks
        ops = DecodeOperands(*problem.arrays, extras.get("k_scale"), extras.get("v_scale"), extras.get("sinks"))
        out = torch.empty(config.problem.out_shape, dtype=problem.q.dtype, device="cuda")
        lse = torch.empty(config.problem.lse_shape, dtype=torch.float32, device="cuda")

        def call():  # noqa: F811
            launch_decode(config, ops, None, None, out, lse)

    for _ in range(3):  # compile and warm up
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    totals: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time  # microseconds
    return {name: total / calls for name, total in sorted(totals.items(), key=lambda kv: -kv[1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", required=True, help="rows whose label contains one of these")
    parser.add_argument("--exclude", nargs="*", default=[], help="skip rows whose label contains one of these")
    parser.add_argument(
        "--splits", type=int, nargs="+", default=[None], help="fixed num_kv_splits, one run each (default: planned)"
    )
    parser.add_argument("--fixed-splits", action="store_true", help="no device-side schedule (fixed splits)")
    parser.add_argument("--portable-multi-token", action="store_true", help="q_len > 1 on the portable stage 1")
    parser.add_argument("--portable-schedule", action="store_true", help="let the schedule take the portable stage 1")
    parser.add_argument("--two-warpgroups", action="store_true", help="the Gluon MLA two-warpgroup kernel")
    parser.add_argument(
        "--seesaw", action="store_true", help="the Gluon MLA seesaw where the plan has the narrow-group kernels"
    )
    parser.add_argument("--hopper-fp8", action="store_true", help="fp8 GQA rows on the Gluon stage 1 (hopper_fp8)")
    parser.add_argument(
        "--widener", action="store_true", help="e4m3 narrow-group rows widened by a warpgroup of their own"
    )
    parser.add_argument(
        "--schedule-programs",
        type=int,
        nargs="+",
        default=[None],
        help="programs per head block where the plan has the device-side schedule",
    )
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args(argv)
    rows = [
        row
        for suite in SUITES.values()
        for row in suite()
        if any(text in row.label for text in args.rows) and not any(text in row.label for text in args.exclude)
    ]
    seen = set()
    for row in rows:
        if row.label in seen:
            continue
        seen.add(row.label)
        options = dict(
            device_schedule=not args.fixed_splits,
            hopper_multi_token=not args.portable_multi_token,
            portable_schedule=args.portable_schedule,
        )
        if args.hopper_fp8:
            options["hopper_fp8"] = True
        if args.seesaw:
            options["hopper_narrow"] = False
        for splits in args.splits:
            for programs in args.schedule_programs:
                label = row.label + ("" if splits is None else f" ({splits} splits)")
                label += "" if programs is None else f" ({programs} programs)"
                try:
                    times = kernel_times(row, args.calls, splits, not args.two_warpgroups, programs, args.widener,
                                         **options)  # fmt: skip
                except ValueError as error:  # a kernel asked for that this row's plan cannot run
                    print(f"{label}: skipped ({error})", flush=True)
                    continue
                parts = ", ".join(f"{name[:40]} {us:.1f}" for name, us in times.items())
                print(f"{label}: {sum(times.values()):.1f} us = {parts}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
