"""The Gluon Hopper MLA stage 1 (:mod:`jax_decode.kernels.mla_hopper`) on the GPU:
correctness against the float64 oracle, and time against ``torch_bridge`` and FlashMLA.

DeepSeek-V3 MLA decode (head_dim_qk 576 = 512 latent + 64 rope, V = K[..., :512],
bf16, page size 64) at 128 query heads: b1 ctx32k, b8 ctx16k, b64 ctx4k, b128 ctx1k,
plus 16 heads at b64 ctx4k.  The new stage 1 is followed by our own stage 2
(``KERNELS["stage2"]`` with the launch config's stage-2 constexprs), so the time is a
whole decode step, as for the other two.

    source .gpu/env.sh && python3 -m benchmarks.mla_hopper --out $OUT/mla_hopper.json

Times are CUDA-graph device times (:func:`benchmarks.timing.time_torch`), rotating
input sets so that L2 does not serve them; FLOPs = 2 * batch * heads * ctx * (576 + 512).

Measured 2026-12-04 on one H200 (132 SMs; torch 2.11, triton 3.6, sgl-flash-mla 1.0.0),
best variant per row (p: PIPELINE, as it then was -- p1 waited for P V and the next scores
together; s: splits, dir: one split written straight to out):

    row               ours (us, TFLOP/s)     torch_bridge   FlashMLA      ours/FlashMLA time
    b1   ctx32k h128  p0 s66      39.2  233   74.0  123     41.2  222     1.05
    b8   ctx16k h128  p1 s8       91.2  400  246.5  148     75.0  487     0.82
    b64  ctx4k  h128  p1 s1 dir  173.2  422  479.2  152    123.7  590     0.71
    b128 ctx1k  h128  p1 s1 dir  102.7  356  254.0  144     67.3  543     0.66
    b64  ctx4k  h16   p1 s2       94.7   96  118.0   77     84.1  109     0.89

(ours/FlashMLA time: FlashMLA's time over ours, i.e. our share of its TFLOP/s.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

HEAD_DIM_QK, HEAD_DIM_V, PAGE_SIZE = 576, 512, 64
SEESAW = 9  # the pipeline number that selects _mla_stage1_hopper_seesaw
ROWS = ((1, 32768, 128), (8, 16384, 128), (64, 4096, 128), (128, 1024, 128), (64, 4096, 16))


def mla_config(
    batch: int, num_heads: int, num_pages: int, max_pages: int, sm_scale: float, num_kv_splits: int, num_sms: int
):
    """Our LaunchConfig for the MLA problem (its stage-2 launch merges the new stage 1)."""
    from jax_decode.launch import DecodeProblem, DeviceInfo, make_launch_config

    problem = DecodeProblem(
        batch=batch,
        num_heads=num_heads,
        num_kv_heads=1,
        head_dim_qk=HEAD_DIM_QK,
        head_dim_v=HEAD_DIM_V,
        num_pages=num_pages,
        page_size=PAGE_SIZE,
        max_pages=max_pages,
        dtype="bfloat16",
        v_from_k=True,
        sm_scale=sm_scale,
        logit_cap=0.0,
    )
    return make_launch_config(problem, DeviceInfo("nvidia", 90, num_sms), num_kv_splits=num_kv_splits)


def default_splits(batch: int, num_heads: int, ctx: int, num_sms: int) -> int:
    """Splits so that the grid is about one full wave (at least 4 tiles a split)."""
    programs = math.ceil(num_heads / 64) * batch
    splits = max(1, num_sms // programs)
    return max(1, min(splits, ctx // (4 * 64)))


class MlaHopper:
    """Stage 1 (Gluon, sm_90) + our stage 2 for one problem shape and split count.

    ``pipeline`` 0 or 1: the two-warpgroup kernel's PIPELINE; ``SEESAW``: the seesaw kernel."""

    def __init__(
        self, batch, num_heads, num_pages, max_pages, sm_scale, num_kv_splits, pipeline, num_sms=132, direct=False
    ):
        import torch
        from triton.experimental.gluon import language as gl

        from jax_decode.kernels.mla_hopper import _mla_stage1_hopper, _mla_stage1_hopper_seesaw
        from torch_bridge.launcher import StageLauncher

        self.config = mla_config(batch, num_heads, num_pages, max_pages, sm_scale, num_kv_splits, num_sms)
        strides = self.config.contiguous_strides()
        self.stage2 = StageLauncher(self.config.stage2(strides))
        self.seesaw = pipeline == SEESAW
        self.kernel = _mla_stage1_hopper_seesaw if self.seesaw else _mla_stage1_hopper
        self.latent_block = 256 if self.seesaw else 512
        self.num_warps = 4 if self.seesaw else 8
        self.layout = gl.NVMMASharedLayout.get_default_for([64, self.latent_block], gl.bfloat16)
        self.grid = (math.ceil(num_heads / 64), batch, num_kv_splits)
        # mid_o / mid_lse strides by name from stage 2's own launch, so both agree on the layout.
        s2 = self.stage2.launch.meta()
        self.meta = dict(
            STRIDE_PTB=max_pages,
            STRIDE_MOB=s2["STRIDE_MOB"], STRIDE_MOH=s2["STRIDE_MOH"], STRIDE_MOS=s2["STRIDE_MOS"],
            STRIDE_MLB=s2["STRIDE_MLB"], STRIDE_MLH=s2["STRIDE_MLH"], STRIDE_MLS=s2["STRIDE_MLS"],
            SM_SCALE=float(sm_scale), NUM_HEADS=num_heads, PAGE_SIZE=PAGE_SIZE, CAPACITY=max_pages * PAGE_SIZE,
            NUM_KV_SPLITS=num_kv_splits, NUM_STAGES=2, PIPELINE=int(pipeline),
        )  # fmt: skip
        self.meta.update(STRIDE_MOT=0, STRIDE_MLT=0, Q_LEN=1)  # one query token: no token axis
        if self.seesaw:
            del self.meta["NUM_STAGES"], self.meta["PIPELINE"]
            self.meta.update(KV_FP8=False, K_SCALE=0, V_SCALE=0)  # a bfloat16 cache
        if direct:  # one split: stage 1 writes out and lse itself (split strides 0)
            assert num_kv_splits == 1
            self.meta.update(
                STRIDE_MOB=num_heads * HEAD_DIM_V,
                STRIDE_MOH=HEAD_DIM_V,
                STRIDE_MOS=0,
                STRIDE_MLB=num_heads,
                STRIDE_MLH=1,
                STRIDE_MLS=0,
            )
        self.direct = direct
        self.mid_o = torch.empty(self.config.mid_o_shape, dtype=torch.float32, device="cuda")
        self.mid_lse = torch.empty(self.config.mid_lse_shape, dtype=torch.float32, device="cuda")
        self.num_pages = num_pages
        self.descs = {}

    def descriptors(self, q, k_cache):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        key = (q.data_ptr(), k_cache.data_ptr())
        if key not in self.descs:
            q2 = q.view(-1, HEAD_DIM_QK)
            k2 = k_cache.view(-1, HEAD_DIM_QK)
            rope = self.layout  # a [64, 64] bf16 tile takes the same 128-byte swizzle
            # Whole 576-wide rows; the kernels read the rope part at column 512.
            q_rows, k_rows = [q2.shape[0], HEAD_DIM_QK], [k2.shape[0], HEAD_DIM_QK]
            self.descs[key] = (
                TensorDescriptor(q2, q_rows, [HEAD_DIM_QK, 1], [64, self.latent_block], self.layout),
                TensorDescriptor(q2, q_rows, [HEAD_DIM_QK, 1], [64, 64], rope),
                TensorDescriptor(k2, k_rows, [HEAD_DIM_QK, 1], [64, self.latent_block], self.layout),
                TensorDescriptor(k2, k_rows, [HEAD_DIM_QK, 1], [64, 64], rope),
            )
        return self.descs[key]

    def stage1(self, q, k_cache, page_table, seq_lens):
        descs = self.descriptors(q, k_cache)
        self.kernel[self.grid](
            *descs,
            page_table,
            seq_lens,
            seq_lens,  # the scale pointers: a bfloat16 cache has none (unread)
            seq_lens,
            self.num_pages,
            self.mid_o,
            self.mid_lse,
            num_warps=self.num_warps,
            **self.meta,
        )

    def __call__(self, q, k_cache, page_table, seq_lens, out, lse):
        if self.direct:
            descs = self.descriptors(q, k_cache)
            self.kernel[self.grid](
                *descs,
                page_table,
                seq_lens,
                seq_lens,
                seq_lens,
                self.num_pages,
                out,
                lse,
                num_warps=self.num_warps,
                **self.meta,
            )
            return
        self.stage1(q, k_cache, page_table, seq_lens)
        self.stage2((self.mid_o, self.mid_lse, self.mid_lse, out, lse))


def flash_mla_fn():
    """FlashMLA's decode as ``fn(q, k_cache, page_table, seq_lens, sm_scale) -> (out, lse)``, or None."""
    try:
        import flash_mla
    except Exception as exc:  # noqa: BLE001 - report and go on without the peer
        print(f"flash_mla unavailable: {exc!r}")
        return None
    import inspect

    try:
        params = list(inspect.signature(flash_mla.get_mla_metadata).parameters)
    except (TypeError, ValueError):
        params = []
    print(f"flash_mla.get_mla_metadata{params}")
    cache = {}

    def metadata(seq_lens, num_heads):
        key = (seq_lens.data_ptr(), tuple(seq_lens.shape), num_heads)
        if key not in cache:
            if params and params[0] in ("cache_seqlens", "seq_lens", "seqlens_k"):
                md = flash_mla.get_mla_metadata(seq_lens, num_heads, 1)
            else:
                md = flash_mla.get_mla_metadata()
            cache[key] = md
        return cache[key]

    def run(q, k_cache, page_table, seq_lens, sm_scale):
        md = metadata(seq_lens, q.shape[1])
        if params and params[0] in ("cache_seqlens", "seq_lens", "seqlens_k"):  # the older API
            return flash_mla.flash_mla_with_kvcache(
                q[:, None],
                k_cache,
                page_table,
                seq_lens,
                HEAD_DIM_V,
                md[0],
                md[1],
                softmax_scale=sm_scale,
                causal=False,
            )
        return flash_mla.flash_mla_with_kvcache(
            q[:, None],
            k_cache,
            page_table,
            seq_lens,
            HEAD_DIM_V,
            md[0] if isinstance(md, tuple) else md,
            softmax_scale=sm_scale,
            causal=False,
            is_fp8_kvcache=False,
            use_legacy=True,
        )

    return run


def oracle_check(q, k_cache, page_table, seq_lens, out, lse, sm_scale, batch_rows, heads):
    """Max |error| of ``out``/``lse`` against the float64 oracle on some rows and heads,
    and the tolerance excess (<= 0 passes).  The oracle sees only the pages those rows use."""
    from jax_decode.reference import LSE_TOLERANCE, decode_attention_reference, tolerance_excess

    pt = page_table[batch_rows].cpu().numpy().astype(np.int64)
    num_pages = k_cache.shape[0]
    used = np.unique(pt[(pt >= 0) & (pt < num_pages)])
    remap = np.full(num_pages, -1, np.int64)
    remap[used] = np.arange(len(used))
    small_pt = np.where((pt >= 0) & (pt < num_pages), remap[np.clip(pt, 0, num_pages - 1)], -1).astype(np.int32)
    small_cache = k_cache[torch_index(used, k_cache.device)].float().cpu().numpy()
    qs = q[batch_rows][:, heads].float().cpu().numpy()
    ref_out, ref_lse = decode_attention_reference(
        qs, small_cache, None, small_pt, seq_lens[batch_rows].cpu().numpy(), sm_scale=sm_scale, head_dim_v=HEAD_DIM_V
    )
    got_out = out[batch_rows][:, heads].float().cpu().numpy()
    got_lse = lse[batch_rows][:, heads].float().cpu().numpy()
    finite = np.isfinite(ref_lse)
    lse_err = float(np.abs(got_lse[finite] - ref_lse[finite]).max(initial=0.0))
    lse_ok = bool(np.array_equal(np.isneginf(got_lse), ~finite)) and bool(
        np.all(np.abs(got_lse[finite] - ref_lse[finite]) <= LSE_TOLERANCE["atol"] + LSE_TOLERANCE["rtol"] *
               np.abs(ref_lse[finite]) + 1e-3))  # fmt: skip
    return dict(
        max_abs_err=float(np.abs(got_out - ref_out).max()),
        rel_l2_err=float(np.linalg.norm(got_out - ref_out) / max(np.linalg.norm(ref_out), 1e-30)),
        tol_excess=tolerance_excess(got_out, ref_out, "bfloat16"),
        lse_max_abs_err=lse_err,
        lse_ok=lse_ok,
        nan=bool(np.isnan(got_out).any()),
    )


def torch_index(indices, device):
    import torch

    return torch.as_tensor(indices, dtype=torch.long, device=device)


def make_inputs(batch, num_heads, ctx, seed, extra_pages=0):
    """q, a shuffled-page cache of exactly the pages needed (+ extra), page table, lengths."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per_row = math.ceil(ctx / PAGE_SIZE)
    num_pages = batch * pages_per_row + extra_pages
    q = torch.randn(batch, num_heads, HEAD_DIM_QK, generator=g, device="cuda").to(torch.bfloat16)
    k_cache = torch.randn(num_pages, PAGE_SIZE, 1, HEAD_DIM_QK, generator=g, device="cuda").to(torch.bfloat16)
    perm = torch.randperm(num_pages, generator=g, device="cuda")[: batch * pages_per_row]
    page_table = perm.view(batch, pages_per_row).to(torch.int32).contiguous()
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    return q, k_cache, page_table, seq_lens


def edge_case(seed=7):
    """Awkward lengths, bad page ids and NaN in every slot no valid token uses."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    batch, num_heads, max_pages = 8, 128, 20
    num_pages = batch * max_pages + 1
    seq_lens = torch.tensor([0, 1, 63, 65, 777, 1280, 5000, -3], dtype=torch.int32, device="cuda")  # 5000 > capacity
    q = torch.randn(batch, num_heads, HEAD_DIM_QK, generator=g, device="cuda").to(torch.bfloat16)
    k_cache = torch.randn(num_pages, PAGE_SIZE, 1, HEAD_DIM_QK, generator=g, device="cuda").to(torch.bfloat16)
    perm = torch.randperm(num_pages - 1, generator=g, device="cuda") + 1  # page 0 is never valid: NaN
    page_table = perm.view(batch, max_pages).to(torch.int32).contiguous()
    page_table[4, 3] = -1  # masked (the kernel loads page 0 = NaN and must zero it)
    page_table[5, 7] = num_pages + 3  # masked
    page_table[6, 19] = 2**31 - 1  # masked
    k_cache[0] = float("nan")
    capacity = max_pages * PAGE_SIZE
    for b, n in enumerate(seq_lens.tolist()):
        n = min(max(n, 0), capacity)
        if n % PAGE_SIZE:
            k_cache[page_table[b, n // PAGE_SIZE].long(), n % PAGE_SIZE :] = float("nan")
        for p in range(math.ceil(n / PAGE_SIZE), max_pages):
            k_cache[page_table[b, p].long()] = float("nan")
    return q, k_cache, page_table, seq_lens


def main(argv=None) -> int:
    import torch
    import triton

    import torch_bridge
    from benchmarks.timing import input_sets_needed, time_torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="mla_hopper.json")
    parser.add_argument("--rows", default="all")
    parser.add_argument("--rep-ms", type=int, default=100)
    parser.add_argument("--profile", action="store_true", help="only launch b64 ctx4k stage 1 a few times (for ncu)")
    parser.add_argument(
        "--variants", default=None, help="e.g. '1:1:1,9:1:0' (pipeline:splits:direct; 9 = seesaw), rows 2,3 only"
    )
    args = parser.parse_args(argv)
    if args.profile:  # each variant's stage 1 (default: PIPELINE=1, one split) four times
        q, k_cache, page_table, seq_lens = make_inputs(64, 128, 4096, seed=1)
        for pipeline, splits, _ in parse_variants(args.variants or "1:1:0"):
            run = MlaHopper(
                64, 128, k_cache.shape[0], page_table.shape[1], 1 / math.sqrt(HEAD_DIM_QK), splits, pipeline
            )
            for _ in range(4):
                run.stage1(q, k_cache, page_table, seq_lens)
        torch.cuda.synchronize()
        return 0
    if args.variants:
        return quick(args)

    props = torch.cuda.get_device_properties(0)
    num_sms = props.multi_processor_count
    env = dict(device=props.name, torch=torch.__version__, triton=triton.__version__, num_sms=num_sms)
    print(env)
    fmla = flash_mla_fn()
    results = dict(env=env, rows=[], edge=None)
    sm_scale = 1.0 / math.sqrt(HEAD_DIM_QK)

    # Correctness on awkward input first, both schedules, several split counts.
    q, k_cache, page_table, seq_lens = edge_case()
    edge = []
    for pipeline, splits, direct in ((0, 1, False), (0, 3, False), (1, 1, False), (1, 3, False), (1, 1, True)):
        b, h = q.shape[:2]
        run = MlaHopper(b, h, k_cache.shape[0], page_table.shape[1], sm_scale, splits, pipeline, num_sms, direct)
        out = torch.full((b, h, HEAD_DIM_V), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((b, h), float("nan"), dtype=torch.float32, device="cuda")
        run.mid_o.fill_(float("nan"))
        run.mid_lse.fill_(float("nan"))
        t0 = time.time()
        run(q, k_cache, page_table, seq_lens, out, lse)
        torch.cuda.synchronize()
        err = oracle_check(q, k_cache, page_table, seq_lens, out, lse, sm_scale, list(range(b)), list(range(0, h, 9)))
        err.update(pipeline=pipeline, splits=splits, direct=direct, first_call_s=round(time.time() - t0, 2))
        print("edge", err)
        edge.append(err)
    results["edge"] = edge

    rows = ROWS if args.rows == "all" else [ROWS[int(i)] for i in args.rows.split(",")]
    for batch, ctx, num_heads in rows:
        flops = 2 * batch * num_heads * ctx * (HEAD_DIM_QK + HEAD_DIM_V)
        kv_bytes = batch * ctx * HEAD_DIM_QK * 2
        n_sets = input_sets_needed(kv_bytes)
        sets = [make_inputs(batch, num_heads, ctx, seed=100 + i) for i in range(n_sets)]
        q, k_cache, page_table, seq_lens = sets[0]
        out = torch.empty(batch, num_heads, HEAD_DIM_V, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(batch, num_heads, dtype=torch.float32, device="cuda")
        check_rows = sorted({0, batch - 1})
        check_heads = list(range(0, num_heads, max(1, num_heads // 16)))
        row = dict(batch=batch, ctx=ctx, num_heads=num_heads, flops=flops, input_sets=n_sets, ours_new=[])
        base_splits = default_splits(batch, num_heads, ctx, num_sms)
        split_choices = sorted({max(1, base_splits // 2), base_splits})
        variants = [(p, n, False) for p in (0, 1) for n in split_choices] + [(1, 1, True)] * (1 in split_choices)
        for pipeline, splits, direct in variants:
            run = MlaHopper(
                batch, num_heads, k_cache.shape[0], page_table.shape[1], sm_scale, splits, pipeline, num_sms, direct
            )
            out.fill_(float("nan"))
            run(q, k_cache, page_table, seq_lens, out, lse)
            torch.cuda.synchronize()
            err = oracle_check(q, k_cache, page_table, seq_lens, out, lse, sm_scale, check_rows, check_heads)
            ms = time_torch(lambda s, run=run, o=out, x=lse: run(s[0], s[1], s[2], s[3], o, x), sets, True, args.rep_ms)
            entry = dict(pipeline=pipeline, splits=splits, direct=direct, us=ms * 1e3, tflops=flops / ms / 1e9, **err)
            print(batch, ctx, num_heads, entry)
            row["ours_new"].append(entry)
        best = min((e for e in row["ours_new"] if not e["direct"]), key=lambda e: e["us"])
        run = MlaHopper(
            batch, num_heads, k_cache.shape[0], page_table.shape[1], sm_scale, best["splits"], best["pipeline"], num_sms
        )
        ms = time_torch(lambda s, run=run: run.stage1(s[0], s[1], s[2], s[3]), sets, True, args.rep_ms)
        row["best_stage1_only"] = dict(
            pipeline=best["pipeline"], splits=best["splits"], us=ms * 1e3, tflops=flops / ms / 1e9
        )
        print("stage 1 alone", row["best_stage1_only"])

        # torch_bridge (today's portable path) and FlashMLA, same inputs.
        tb_out = torch_bridge.decode_attention(
            q, k_cache, None, page_table, seq_lens, head_dim_v=HEAD_DIM_V, sm_scale=sm_scale, return_lse=True
        )
        row["torch_bridge_err"] = oracle_check(
            q, k_cache, page_table, seq_lens, tb_out[0], tb_out[1], sm_scale, check_rows, check_heads
        )
        ms = time_torch(
            lambda s: torch_bridge.decode_attention(
                s[0], s[1], None, s[2], s[3], head_dim_v=HEAD_DIM_V, sm_scale=sm_scale
            ),
            sets,
            True,
            args.rep_ms,
        )
        row["torch_bridge"] = dict(us=ms * 1e3, tflops=flops / ms / 1e9)
        if fmla is not None:
            try:
                f_out, f_lse = fmla(q, k_cache, page_table, seq_lens, sm_scale)
                f_lse = f_lse.reshape(batch, -1)[:, :num_heads] if f_lse.numel() == batch * num_heads else None
                f_out = f_out[:, 0]
                if f_lse is not None:
                    row["flash_mla_err"] = oracle_check(
                        q, k_cache, page_table, seq_lens, f_out, f_lse, sm_scale, check_rows, check_heads
                    )
                ms = time_torch(lambda s: fmla(s[0], s[1], s[2], s[3], sm_scale), sets, True, args.rep_ms)
                row["flash_mla"] = dict(us=ms * 1e3, tflops=flops / ms / 1e9)
            except Exception as exc:  # noqa: BLE001
                row["flash_mla"] = dict(error=repr(exc))
                print("flash_mla failed:", repr(exc))
        print(row["torch_bridge"], row.get("flash_mla"))
        results["rows"].append(row)
        del sets
        torch.cuda.empty_cache()

    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print_table(results)
    return 0


def parse_variants(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in v.split(":")) for v in text.split(",")]


def quick(args) -> int:
    """Edge-case check and b64 ctx4k / b128 ctx1k timing of the given variants only."""
    import torch

    from benchmarks.timing import input_sets_needed, time_torch

    variants = parse_variants(args.variants)
    fmla = flash_mla_fn()
    sm_scale = 1.0 / math.sqrt(HEAD_DIM_QK)
    q, k_cache, page_table, seq_lens = edge_case()
    b, h = q.shape[:2]
    results = []
    for pipeline, _, direct in variants:
        for n in sorted({1, 3} if not direct else {1}):
            run = MlaHopper(b, h, k_cache.shape[0], page_table.shape[1], sm_scale, n, pipeline, 132, bool(direct))
            out = torch.full((b, h, HEAD_DIM_V), float("nan"), dtype=torch.bfloat16, device="cuda")
            lse = torch.full((b, h), float("nan"), dtype=torch.float32, device="cuda")
            run(q, k_cache, page_table, seq_lens, out, lse)
            torch.cuda.synchronize()
            err = oracle_check(
                q, k_cache, page_table, seq_lens, out, lse, sm_scale, list(range(b)), list(range(0, h, 9))
            )
            print("edge", pipeline, n, direct, err, flush=True)
            results.append(dict(edge=True, pipeline=pipeline, splits=n, direct=direct, **err))
    for batch, ctx, num_heads in (ROWS[2], ROWS[3]):
        flops = 2 * batch * num_heads * ctx * (HEAD_DIM_QK + HEAD_DIM_V)
        sets = [make_inputs(batch, num_heads, ctx, seed=100 + i) for i in range(input_sets_needed(batch * ctx * 1152))]
        q, k_cache, page_table, seq_lens = sets[0]
        out = torch.empty(batch, num_heads, HEAD_DIM_V, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(batch, num_heads, dtype=torch.float32, device="cuda")
        for pipeline, splits, direct in variants:
            run = MlaHopper(batch, num_heads, k_cache.shape[0], page_table.shape[1], sm_scale, splits, pipeline, 132,
                            bool(direct))  # fmt: skip
            out.fill_(float("nan"))
            run(q, k_cache, page_table, seq_lens, out, lse)
            torch.cuda.synchronize()
            err = oracle_check(
                q, k_cache, page_table, seq_lens, out, lse, sm_scale, [0, batch - 1], list(range(0, 128, 8))
            )
            ms = time_torch(lambda s, run=run, o=out, x=lse: run(s[0], s[1], s[2], s[3], o, x), sets, True, args.rep_ms)
            entry = dict(batch=batch, ctx=ctx, pipeline=pipeline, splits=splits, direct=direct, us=ms * 1e3,
                         tflops=flops / ms / 1e9, **err)  # fmt: skip
            print(entry, flush=True)
            results.append(entry)
        if fmla is not None:
            ms = time_torch(lambda s: fmla(s[0], s[1], s[2], s[3], sm_scale), sets, True, args.rep_ms)
            entry = dict(batch=batch, ctx=ctx, flash_mla=True, us=ms * 1e3, tflops=flops / ms / 1e9)
            print(entry, flush=True)
            results.append(entry)
        del sets
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


def print_table(results) -> None:
    print(f"\n{results['env']}")
    print(f"{'row':>20} {'variant':>12} {'us':>8} {'TFLOP/s':>8} {'vs FMLA':>8} {'vs tb':>6} {'max err':>8}")
    for row in results["rows"]:
        label = f"b{row['batch']} ctx{row['ctx']} h{row['num_heads']}"
        fm = row.get("flash_mla", {}).get("us")
        tb = row["torch_bridge"]["us"]
        for e in row["ours_new"]:
            rel = f"{fm / e['us']:.2f}x" if fm else "-"
            name = f"p{e['pipeline']} s{e['splits']}{' dir' if e.get('direct') else ''}"
            print(
                f"{label:>20} {name:>12} {e['us']:8.1f} {e['tflops']:8.1f} "
                f"{rel:>8} {tb / e['us']:5.2f}x {e['max_abs_err']:8.1e}"
            )
        st1 = row.get("best_stage1_only")
        if st1:
            name = f"stage1 p{st1['pipeline']} s{st1['splits']}"
            print(f"{label:>20} {name:>12} {st1['us']:8.1f} {st1['tflops']:8.1f}")
        print(f"{label:>20} {'torch_bridge':>12} {tb:8.1f} {row['torch_bridge']['tflops']:8.1f}")
        if fm:
            print(f"{label:>20} {'flash_mla':>12} {fm:8.1f} {row['flash_mla']['tflops']:8.1f}")


if __name__ == "__main__":
    sys.exit(main())
