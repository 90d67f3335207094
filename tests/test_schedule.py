"""The device-side work schedule of the Gluon MLA stage 1 (jax_decode.kernels.schedule),
in Triton's interpreter: the schedule kernel against a plain-Python statement of its
rule, the rule's guarantees (every tile once, equal work, unique slots), and the merge
of chunk partials -- cut exactly as the scheduled stage 1 cuts them -- against the
float64 oracle."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from conftest import INTERPRETER_FAILURE

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(INTERPRETER_FAILURE is not None, reason=f"interpreter: {INTERPRETER_FAILURE}")

TILE = 64


def _config(batch, num_heads=16, max_pages=8, page_size=64, num_sms=12):
    import dataclasses

    from jax_decode.launch import DecodeProblem, DeviceInfo, make_launch_config
    from jax_decode.launch.planner import hopper_mla_schedule_programs

    problem = DecodeProblem(
        batch=batch, num_heads=num_heads, num_kv_heads=1, head_dim_qk=576, head_dim_v=512,
        num_pages=batch * max_pages, page_size=page_size, max_pages=max_pages, dtype="bfloat16", v_from_k=True,
        sm_scale=1 / math.sqrt(576), logit_cap=0.0,
    )  # fmt: skip
    device = DeviceInfo("nvidia", 90, num_sms, hopper_kernels=True)
    config = make_launch_config(problem, device)
    assert config.schedule_programs in (0, hopper_mla_schedule_programs(problem, device))  # 0: one fixed split
    # The schedule whatever the fixed splits (the planner skips it where one split does).
    config = dataclasses.replace(config, schedule_programs=hopper_mla_schedule_programs(problem, device))
    wave = num_sms // math.ceil(num_heads / 64)
    # (a wave, or the most programs within it that divide the batch or are a multiple of it)
    aligned = [d for d in range(wave, 0, -1) if batch % d == 0 or d % batch == 0][:1]
    assert config.schedule_programs in (wave, *aligned)
    return config


def expected_schedule(seq_lens, capacity, programs, chunk_cost):
    """The rule of jax_decode.kernels.schedule, in plain Python: (total, first rows,
    end rows, row starts, each row's first program) and each program's chunks (row,
    first tile, end tile)."""
    tiles = [math.ceil(min(max(n, 0), capacity) / TILE) for n in seq_lens]
    costs = [chunk_cost + t for t in tiles]
    starts = [sum(costs[:b]) for b in range(len(costs))]
    total = sum(costs)
    active = min(programs, total)  # programs past the positions take none
    bounds = [min(p, active) * total // active for p in range(programs + 1)]  # program p: [bounds[p], bounds[p + 1])

    def program_of(position):
        return next(p for p in range(programs) if bounds[p] <= position < bounds[p + 1])

    # A row goes to the programs from the one holding its first tile (its last position
    # if it has none) to the one holding its last position.
    first_p = [program_of(starts[b] + min(chunk_cost, costs[b] - 1)) for b in range(len(costs))]
    last_p = [program_of(starts[b] + costs[b] - 1) for b in range(len(costs))]
    first_rows, end_rows, chunks = [], [], []
    for p in range(programs):
        first_rows.append(sum(last < p for last in last_p))
        end_rows.append(sum(first <= p for first in first_p))
        mine = []
        for b in range(len(costs)):
            if first_p[b] <= p <= last_p[b]:
                lo = min(max(bounds[p] - starts[b] - chunk_cost, 0), tiles[b])
                hi = min(max(bounds[p + 1] - starts[b] - chunk_cost, 0), tiles[b])
                mine.append((b, lo, hi))
        chunks.append(mine)
        # A program's chunks are exactly its rows first_row .. end_row - 1.
        assert [b for b, _, _ in mine] == list(range(first_rows[-1], max(end_rows[-1], first_rows[-1])))
    return total, first_rows, end_rows, starts, first_p, chunks


def _run_schedule(config, seq_lens):
    from jax_decode.interpreter import run_interpreted
    from jax_decode.operands import DecodeOperands, schedule_inputs

    lens = torch.tensor(seq_lens, dtype=torch.int32)
    ops = DecodeOperands(None, None, None, None, lens)
    schedule = torch.full(config.schedule_shape, -7, dtype=torch.int32)
    run_interpreted(config.schedule(), (*schedule_inputs(ops, config.problem), schedule))
    return schedule.tolist()


LENGTH_SETS = {
    "uniform": [512] * 6,
    "long tail": [3, 0, 511, 64, 65, 1, 0, 500],
    "empty rows": [0, 0, 0],
    "out of range": [-5, 10**6, 130, 2**31 - 1],
    "one long": [1, 1, 1, 1, 1, 512, 1, 1, 1],
    # More rows than one step of the kernel takes (1024): the prefix sums carry over.
    "many rows": [int(n) for n in np.random.default_rng(3).integers(-10, 600, 1100)],
}


@pytest.mark.parametrize("name", list(LENGTH_SETS))
@pytest.mark.parametrize("num_sms", [12, 5, 1, 64])  # 64: more programs than positions, for some
def test_schedule_kernel_follows_the_rule(name, num_sms):
    from jax_decode.launch.config import HOPPER_MLA_CHUNK_COST

    seq_lens = LENGTH_SETS[name]
    config = _config(len(seq_lens), num_sms=num_sms)
    programs, capacity = config.schedule_programs, config.problem.capacity
    got = _run_schedule(config, seq_lens)
    total, first_rows, end_rows, starts, first_p, chunks = expected_schedule(seq_lens, capacity, programs,
                                                                            HOPPER_MLA_CHUNK_COST)  # fmt: skip
    counts = [sum(b == row for mine in chunks for row, _, _ in mine) for b in range(len(seq_lens))]
    triples = zip(starts, counts, first_p, strict=True)
    assert got == [total, *first_rows, *end_rows, *(x for triple in triples for x in triple)]

    # What the rule guarantees: every tile of every row in exactly one chunk; no program
    # over its share of the positions; no empty chunk but a row's with no tile; every
    # row in at least one chunk; one slot per chunk.
    tiles = [math.ceil(min(max(n, 0), capacity) / TILE) for n in seq_lens]
    covered = {b: [] for b in range(len(seq_lens))}
    slots = set()
    for p, mine in enumerate(chunks):
        assert sum(hi - lo for _, lo, hi in mine) <= math.ceil(total / programs)
        for b, lo, hi in mine:
            assert hi > lo or tiles[b] == 0, (p, b)
            covered[b].extend(range(lo, hi))
            assert b + p not in slots
            slots.add(b + p)
            assert b + p < len(seq_lens) + programs
    for b, t in enumerate(tiles):
        assert sorted(covered[b]) == list(range(t)), b
        assert any(b == row for mine in chunks for row, _, _ in mine), b


def test_schedule_balances_a_long_tail():
    """One long row among short ones is cut across programs, so no program does much more
    than the average -- what fixed splits cannot do without knowing the lengths."""
    from jax_decode.launch.config import HOPPER_MLA_CHUNK_COST

    seq_lens = [64] * 30 + [64 * 300]
    config = _config(len(seq_lens), max_pages=300, num_sms=16)
    total, *_, chunks = expected_schedule(seq_lens, config.problem.capacity, config.schedule_programs,
                                          HOPPER_MLA_CHUNK_COST)  # fmt: skip
    work = [sum(HOPPER_MLA_CHUNK_COST + hi - lo for _, lo, hi in mine) for mine in chunks]
    assert total == sum(HOPPER_MLA_CHUNK_COST + math.ceil(n / TILE) for n in seq_lens)
    # A program pays a start-up its share does not count only for its first chunk.
    assert max(work) <= math.ceil(total / len(chunks)) + HOPPER_MLA_CHUNK_COST
    long_row = len(seq_lens) - 1
    assert sum(any(b == long_row for b, _, _ in mine) for mine in chunks) >= 8


@pytest.mark.parametrize("rows, per_row", [(6, 2), (4, 3), (8, 1), (3, 5)])
def test_schedule_cuts_a_uniform_batch_like_fixed_splits(rows, per_row):
    """With ``per_row`` programs to each row of a uniform batch, every program attends to
    one chunk of one row, as fixed splits would (a second chunk, or an empty one, would
    cost a start-up more), and the chunks of a row differ by at most the start-up."""
    from jax_decode.launch.config import HOPPER_MLA_CHUNK_COST

    seq_lens = [64 * 37] * rows
    *_, chunks = expected_schedule(seq_lens, 64 * 40, rows * per_row, HOPPER_MLA_CHUNK_COST)
    assert all(len(mine) == 1 for mine in chunks)
    for b in range(rows):
        sizes = [hi - lo for mine in chunks for row, lo, hi in mine if row == b]
        assert len(sizes) == per_row and max(sizes) - min(sizes) <= HOPPER_MLA_CHUNK_COST + 1


def _partials(q, latent, lo, hi, sm_scale):
    """One chunk's normalised output and LSE over tokens [lo, hi) of one row (float64)."""
    if hi <= lo:
        return np.zeros((q.shape[0], 512)), np.full(q.shape[0], -np.inf)
    s = q @ latent[lo:hi].T * sm_scale
    m = s.max(1, keepdims=True)
    w = np.exp(s - m)
    return (w @ latent[lo:hi, :512]) / w.sum(1, keepdims=True), (m[:, 0] + np.log(w.sum(1)))


@pytest.mark.parametrize("seesaw", [True, False], ids=["seesaw", "two_warpgroups"])
@pytest.mark.parametrize("name", ["long tail", "one long", "empty rows", "uniform"])
@pytest.mark.parametrize("heads", [4, 18], ids=["4heads", "18heads"])  # one block of heads; a partial last one
@pytest.mark.parametrize("num_sms", [5, 32])  # 32: rows of more chunks than the merge loads at once
def test_merge_of_scheduled_chunks_matches_the_oracle(name, seesaw, heads, num_sms):
    """The merge after stage 1 as the Gluon kernel cuts it: every chunk's partial, or
    under the seesaw a row of one chunk written to out by stage 1 itself (which the
    merge must leave alone)."""
    import dataclasses

    from jax_decode.interpreter import run_interpreted
    from jax_decode.launch.config import HOPPER_MLA_CHUNK_COST, SCHEDULE_MERGE_CHUNKS
    from jax_decode.operands import DecodeOperands, schedule_merge_inputs

    seq_lens = LENGTH_SETS[name]
    batch = len(seq_lens)
    config = _config(batch, num_heads=heads, num_sms=num_sms)
    # (the planned narrow-group kernel writes rows of one chunk itself, as the seesaw does)
    config = dataclasses.replace(config, hopper_seesaw=seesaw, hopper_narrow=config.hopper_narrow and seesaw)
    p = config.problem
    programs = config.schedule_programs
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, heads, 576))
    rows = rng.standard_normal((batch, p.capacity, 576))
    schedule = _run_schedule(config, seq_lens)
    *_, chunks = expected_schedule(seq_lens, p.capacity, programs, HOPPER_MLA_CHUNK_COST)

    # Stage 1, as the scheduled Gluon kernel cuts it; unwritten slots hold NaN, which
    # the merge must never read.
    mid_o = torch.full(config.mid_o_shape, float("nan"))
    mid_lse = torch.full(config.mid_lse_shape, float("nan"))
    out = torch.full(p.out_shape, float("nan"), dtype=torch.bfloat16)
    lse = torch.full(p.lse_shape, float("nan"))
    owners = collections.Counter(b for mine in chunks for b, _, _ in mine)
    if num_sms == 32 and name in ("long tail", "one long"):
        assert max(owners.values()) > SCHEDULE_MERGE_CHUNKS  # the merge's chunk loop runs twice
    direct = sentinel = -7.0  # what stage 1 wrote itself: the merge must keep it
    for program, mine in enumerate(chunks):
        for b, lo, hi in mine:
            end = min(hi * TILE, max(min(seq_lens[b], p.capacity), 0))
            o, chunk_lse = _partials(q[b], rows[b], lo * TILE, end, p.sm_scale)
            if seesaw and owners[b] == 1:
                out[b], lse[b] = direct, direct
                continue
            mid_o[b + program] = torch.from_numpy(o).float()
            mid_lse[b + program] = torch.from_numpy(chunk_lse).float()

    ops = DecodeOperands(None, None, None, None, torch.tensor(seq_lens, dtype=torch.int32))
    inputs = schedule_merge_inputs(ops, mid_o, mid_lse, torch.tensor(schedule, dtype=torch.int32), out, lse)
    run_interpreted(config.schedule_merge(config.contiguous_strides()), (*inputs, out, lse))

    whole = 0
    for b, n in enumerate(seq_lens):
        if seesaw and owners[b] == 1:
            whole += 1
            assert (out[b] == sentinel).all() and (lse[b] == sentinel).all(), b
            continue
        n = min(max(n, 0), p.capacity)
        want_o, want_lse = _partials(q[b], rows[b], 0, n, p.sm_scale)
        np.testing.assert_allclose(out[b].float().numpy(), want_o, rtol=1e-2, atol=1e-2)
        np.testing.assert_allclose(lse[b].numpy(), want_lse, rtol=1e-5, atol=1e-5)
    # (at 32 SMs every row of these has several chunks)
    assert whole > 0 or not seesaw or num_sms == 32


@pytest.mark.parametrize(
    "batch, heads, block_hm",
    # DeepSeek-V3 on 132 SMs: TP8 b16 and b64 merge with one and two heads a program
    # (256 and 512 programs); TP8 b128 and DP b16/b64 keep four (512, 512, 2048).
    [(16, 16, 1), (64, 16, 2), (128, 16, 4), (16, 128, 4), (64, 128, 4), (3, 4, 1)],
)
def test_merge_takes_fewer_heads_a_program_on_small_grids(batch, heads, block_hm):
    """The merge's heads per program: at most SCHEDULE_MERGE_HEADS, fewer while the grid
    stays within SCHEDULE_MERGE_PROGRAMS_PER_SM programs an SM (a program's chunk loads
    are one SM's)."""
    import dataclasses

    from jax_decode.launch.config import SCHEDULE_MERGE_HEADS, SCHEDULE_MERGE_PROGRAMS_PER_SM

    config = _config(batch, num_heads=heads, num_sms=132)
    config = dataclasses.replace(config, schedule_programs=max(config.schedule_programs, 2))
    launch = config.schedule_merge(config.contiguous_strides())
    assert launch.meta()["BLOCK_HM"] == block_hm <= SCHEDULE_MERGE_HEADS
    assert launch.grid == (batch, math.ceil(heads / block_hm), 1)
    most = SCHEDULE_MERGE_PROGRAMS_PER_SM * 132
    assert block_hm == SCHEDULE_MERGE_HEADS or math.prod(launch.grid) <= most
    assert block_hm == 1 or batch * math.ceil(heads / (block_hm // 2)) > most  # no fewer heads would fit
