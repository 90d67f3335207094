"""``@triton.jit`` helpers the kernels share: score maths, the page walk, the online softmax.

Imports only ``triton``.  Each helper is a piece the decode kernel would otherwise
write once per head layout; ``BLOCK_H == 1`` (one query head per program, products by
multiply-and-reduce) keeps its rows as scalars and 1-D vectors, ``BLOCK_H > 1`` (a
block of query heads sharing a KV head, products by ``tl.dot``) as ``[BLOCK_H, ...]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _tanh(x):
    """tanh in float32 within about 3 ulp of the exact value everywhere, from operations
    every Triton version and the interpreter have.  (``2 sigmoid(2x) - 1`` cancels for
    small |x|: with a large soft-cap, x = score / cap is small, and it lost every
    score's digits -- all of them for caps near 1e7.)"""
    ax = tl.abs(x)
    # |x| < 0.625: tanh(x) / x as a polynomial in x^2 (a Chebyshev fit on [0, 0.625^2],
    # relative error < 1e-8); its square may overflow for large |x|, which takes the
    # other branch.
    t = x * x
    p = -0.005660660486289449
    p = p * t + 0.020580577240099464
    p = p * t - 0.05371261414615462
    p = p * t + 0.13330908893297938
    p = p * t - 0.33333240444228823
    p = p * t + 0.9999999914787479
    # Elsewhere (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.29: no cancellation, and no
    # overflow (e -> 0 gives exactly 1).
    e = tl.exp(-2.0 * ax)
    large = (1.0 - e) / (1.0 + e)
    return tl.where(ax < 0.625, x * p, tl.where(x < 0, -large, large))


@triton.jit
def scores_log2(qk, SM_SCALE: tl.constexpr, LOGIT_CAP: tl.constexpr):
    """Scale (and soft-cap) raw q.k products; return them in log2 units for exp2."""
    qk = qk * SM_SCALE
    if LOGIT_CAP > 0:
        qk = LOGIT_CAP * _tanh(qk / LOGIT_CAP)
    return qk * LOG2E


@triton.jit
def cast_rne(x, DTYPE: tl.constexpr, BY_BITS: tl.constexpr):
    """``x.to(DTYPE)`` rounded to nearest even, as a GPU's ``cvt.rn`` rounds.

    Triton's interpreter truncates float32 -> bfloat16 (and float16 -> bfloat16, which
    it does through float32), and mangles subnormals; ``fp_downcast_rounding="rtne"``
    is already the default and changes neither.  With BY_BITS such an ``x`` becomes
    bfloat16 by integer arithmetic instead (ties to even, overflow to inf, NaN stays
    NaN), the same bits everywhere.  Other casts round to nearest even in the
    interpreter too (NumPy's), and are left alone.
    """
    if BY_BITS and DTYPE == tl.bfloat16 and (x.dtype == tl.float32 or x.dtype == tl.float16):
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        # Round off the low 16 bits: add just under half their range, plus 1 when the
        # kept part is odd, so exact ties go to even (a carry into the exponent is right).
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
        # A NaN keeps its sign and top bits, made quiet so that it stays a NaN.
        rounded = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, (bits >> 16) | 0x40, rounded)
        y = rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(DTYPE)
    return y


@triton.jit
def store_merged(acc, denom, m_safe, out_ptrs, lse_ptr, mask_dv, ROUND_BY_BITS: tl.constexpr, row_mask=None):
    """Finish a log-sum-exp merge: ``acc / denom`` to ``out_ptrs`` (rounded to nearest
    even in the output's dtype) and the LSE ``m_safe + log(denom)`` to ``lse_ptr``; with
    nothing merged (``denom`` 0) zeros and -inf.  ``row_mask``: store only where true."""
    has_tokens = denom > 0
    out = cast_rne(acc / tl.where(has_tokens, denom, 1.0), out_ptrs.dtype.element_ty, ROUND_BY_BITS)
    lse = tl.where(has_tokens, m_safe + tl.log(tl.where(has_tokens, denom, 1.0)), float("-inf"))
    if row_mask is None:
        tl.store(out_ptrs, out, mask=mask_dv)
        tl.store(lse_ptr, lse)
    else:
        tl.store(out_ptrs, out, mask=row_mask & mask_dv)
        tl.store(lse_ptr, lse, mask=row_mask)


@triton.jit
def to_f16_clamped(x):
    """float16 of x, saturated to +-65504 (only values beyond that change beyond rounding).

    Rounded to nearest even: the interpreter's float32 -> float16 cast is NumPy's.
    """
    return tl.minimum(tl.maximum(x.to(tl.float32), -65504.0), 65504.0).to(tl.float16)


@triton.jit
def dot(a, b, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """tl.dot with fp32 accumulation.

    DOT_UPCAST multiplies in fp32 instead: products of 16-bit floats are exact in fp32,
    so the result matches a tensor-core dot up to summation order.  The launch config
    sets it for Triton's interpreter, whose tl.dot multiplies bfloat16 bit patterns
    as integers.
    """
    if DOT_UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=DOT_PRECISION)
    return out


@triton.jit
def kv_scale(scale_ptr, kv_head, MODE: tl.constexpr):
    """A cache's dequantisation scale: MODE 1 one per tensor, 2 one per KV head."""
    if MODE == 2:
        scale = tl.load(scale_ptr + kv_head)
    else:
        scale = tl.load(scale_ptr)
    return scale


@triton.jit
def row_length(seq_lens_ptr, batch_idx, CAPACITY: tl.constexpr):
    """A row's length, clamped to ``[0, CAPACITY]`` (no row reads past its page-table row)."""
    seq_len = tl.load(seq_lens_ptr + batch_idx)
    return tl.minimum(tl.maximum(seq_len, 0), CAPACITY)


@triton.jit
def split_bounds(
    seq_len,
    split_idx,
    NUM_KV_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WINDOW_LEFT: tl.constexpr,
    Q_LEN: tl.constexpr,
):
    """Token range [start, end) of one KV split of a row of ``seq_len`` tokens; splits
    are whole BLOCK_N blocks.

    With a sliding window (WINDOW_LEFT >= 0) the splits share only the positions some
    query token's window holds -- from the first query token's (``Q_LEN`` tokens from
    the end) -- so tokens (and pages) before them are never read.
    """
    first = seq_len * 0
    if WINDOW_LEFT >= 0:
        # max(seq_len - Q_LEN - WINDOW_LEFT, 0), without the int32 overflow of a window
        # near INT32_MAX over a row shorter than Q_LEN.
        first = tl.where(seq_len - Q_LEN > WINDOW_LEFT, seq_len - Q_LEN - WINDOW_LEFT, 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - first, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split_idx * per_split
    end = tl.minimum(start + per_split, seq_len)
    return start, end


@triton.jit
def causal_rows(offs_n, seq_len, tok, Q_LEN: tl.constexpr, WINDOW_LEFT: tl.constexpr):
    """[rows, BLOCK_N] mask of the positions each query row attends to: query token
    ``tok`` (of the row's last ``Q_LEN`` positions) sees those before its own and
    itself, and with a window only its last WINDOW_LEFT + 1 of them."""
    limit = seq_len - Q_LEN + 1 + tok
    keep = offs_n[None, :] < limit[:, None]
    if WINDOW_LEFT >= 0:  # (limit - 1 - offs_n cannot overflow int32; limit - 1 - WINDOW_LEFT could)
        keep = keep & ((limit[:, None] - 1 - offs_n[None, :]) <= WINDOW_LEFT)
    return keep


@triton.jit
def token_pages(page_row_ptr, offs_n, end, num_pages, PAGE_SIZE: tl.constexpr):
    """Page (int64, clamped to 0 where invalid), slot and validity of tokens offs_n.

    A token whose page id lies outside ``[0, num_pages)`` is invalid: masked out of
    the softmax, and its address (page 0) is never loaded.
    """
    in_range = offs_n < end
    page = tl.load(page_row_ptr + offs_n // PAGE_SIZE, mask=in_range, other=0)
    valid = in_range & (page >= 0) & (page < num_pages)
    page = tl.where(valid, page, 0).to(tl.int64)
    return page, offs_n % PAGE_SIZE, valid


@triton.jit
def load_rows(row_ptrs, offs, mask_rows, mask_cols):
    """A [rows, cols] tile: rows at ``row_ptrs``, columns ``offs``; masked entries are 0."""
    return tl.load(row_ptrs[:, None] + offs[None, :], mask=mask_rows[:, None] & mask_cols[None, :], other=0.0)


@triton.jit
def online_softmax(m_i, s, BLOCK_H: tl.constexpr):
    """One block of the online softmax over scores ``s`` (log2 units, -inf = masked).

    ``s`` is ``[BLOCK_N]`` (one head) or ``[BLOCK_H, BLOCK_N]``; returns the new running
    max, the rescale ``alpha`` of what came before and the weights ``p``.
    """
    if BLOCK_H == 1:
        m_new = tl.maximum(m_i, tl.max(s, 0))
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
    # A block whose tokens are all masked leaves m at -inf: subtract 0 instead so
    # exp2 gives 0, not exp2(-inf - -inf) = NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    if BLOCK_H == 1:
        p = tl.exp2(s - m_safe)
    else:
        p = tl.exp2(s - m_safe[:, None])
    return m_new, alpha, p


@triton.jit
def row_sum(p, BLOCK_H: tl.constexpr):
    """Sum over the tokens of ``p`` (``[BLOCK_N]`` or ``[BLOCK_H, BLOCK_N]``)."""
    if BLOCK_H == 1:
        total = tl.sum(p, 0)
    else:
        total = tl.sum(p, 1)
    return total


@triton.jit
def softmax_result(acc, m_i, l_i, BLOCK_H: tl.constexpr):
    """The normalised output and natural LSE of a finished walk; a walk over no valid
    token gives zeros and LSE -inf (never 0/0)."""
    has_tokens = l_i > 0
    l_safe = tl.where(has_tokens, l_i, 1.0)
    lse = tl.where(has_tokens, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
    if BLOCK_H == 1:
        o = acc / l_safe
    else:
        o = acc / l_safe[:, None]
    return o, lse
