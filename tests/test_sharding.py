"""decode_attention and write_kv partition themselves under jax.sharding (host devices).

Each mode (heads, heads with replicated KV heads, batch, pages; write_kv on KV heads
and on pages) on 2, 4 and 8 devices: results against the float64 oracle (LSE, windows
and sinks included on the pages path), the output sharding, and a compiled program
that moves no cache (no all-gather or all-to-all at all).  The kernels themselves run
on each device's shard in the interpreter through jax.shard_map (JAX cannot place the
interpreter's host callback in a partitioned custom call), and the triton backend
lowers for CUDA with sharded inputs.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import needs_interpreter
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support import LSE_TOL, OUT_TOL

import jax_decode
from jax_decode.reference import decode_attention_reference
from jax_decode.sharding import merge_over
from jax_decode.synthetic import make_paged_problem

pytestmark = pytest.mark.skipif(
    len(jax.devices("cpu")) < 8, reason="needs 8 host devices (tests/conftest.py sets them)"
)

NAMES = ("q", "k_cache", "v_cache", "page_table", "seq_lens")


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    return Mesh(np.array(jax.devices("cpu")[: int(np.prod(shape))]).reshape(shape), names)


def _problem(num_heads=16, num_kv_heads=8, pages_multiple=8, mla=False, sinks=True, q_len=None):
    # Lengths 0, 1, across pages and full; num_pages divisible by every mesh size.
    lengths = [0, 1, 13, 29, 32, 7, 20, 3]
    problem = make_paged_problem(
        batch=8, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim_qk=16, page_size=4, seq_lens=lengths,
        max_pages=8, spare_pages=pages_multiple, mla=mla, sinks=sinks, seed=5, q_len=q_len,
    )  # fmt: skip
    assert problem.k_cache.shape[0] % 8 == 0
    return problem


def _moved(compiled: str) -> list[str]:
    """The compiled program's all-gathers and all-to-alls (each line)."""
    return [line for line in compiled.splitlines() if " all-gather(" in line or " all-to-all(" in line]


def _run(mesh, specs: dict, problem, backend="xla", *, may_gather=(), **options):
    arrays = {n: a for n, a in zip(NAMES, problem.arrays, strict=True) if a is not None}
    placed = {n: jax.device_put(jnp.asarray(a), NamedSharding(mesh, specs.get(n, P()))) for n, a in arrays.items()}
    extras = {n: jax.device_put(jnp.asarray(a), NamedSharding(mesh, specs.get(n, P())))
              for n, a in problem.extras.items()}  # fmt: skip
    head_dim_v = problem.head_dim_v if problem.v_cache is None else None

    def call(placed, extras):
        return jax_decode.decode_attention(
            placed["q"], placed["k_cache"], placed.get("v_cache"), placed["page_table"], placed["seq_lens"],
            head_dim_v=head_dim_v, return_lse=True, backend=backend, **extras, **options,
        )  # fmt: skip

    step = jax.jit(call)
    out, lse = step(placed, extras)
    compiled = step.lower(placed, extras).compile().as_text()
    expected_out, expected_lse = decode_attention_reference(*problem.arrays, head_dim_v=head_dim_v, **problem.extras,
                                                            **options)  # fmt: skip
    np.testing.assert_allclose(np.asarray(out, np.float64), expected_out, **OUT_TOL["float32"])
    np.testing.assert_allclose(np.asarray(lse, np.float64), expected_lse, **LSE_TOL)
    moved = [line for line in _moved(compiled) if not any(shape in line for shape in may_gather)]
    assert not moved, f"an operand moved between devices: {moved}"
    return out, lse, compiled


SIZES = [2, 4, 8]


@pytest.mark.parametrize("n", SIZES)
def test_heads(n):
    mesh = _mesh((n,), ("tp",))
    heads = dict(q=P(None, "tp"), k_cache=P(None, None, "tp"), v_cache=P(None, None, "tp"), sinks=P("tp"))
    out, lse, compiled = _run(mesh, heads, _problem())
    assert out.sharding.spec == P(None, "tp") and lse.sharding.spec == P(None, "tp")
    assert "all-reduce" not in compiled


@pytest.mark.parametrize("n", [4, 8])
def test_heads_beyond_the_kv_heads(n):
    """More devices than KV heads: each KV head on n/2 devices, its query heads split among them."""
    mesh = _mesh((2, n // 2), ("kv", "rep"))
    specs = dict(q=P(None, ("kv", "rep")), k_cache=P(None, None, "kv"), v_cache=P(None, None, "kv"),
                 sinks=P(("kv", "rep")))  # fmt: skip
    out, _, _ = _run(mesh, specs, _problem(num_heads=16, num_kv_heads=2))
    assert out.sharding.spec == P(None, ("kv", "rep"))


@pytest.mark.parametrize("n", SIZES)
def test_mqa_and_mla_heads_over_a_replicated_cache(n):
    mesh = _mesh((n,), ("tp",))
    for problem in (_problem(num_heads=16, num_kv_heads=1), _problem(num_heads=16, num_kv_heads=1, mla=True)):
        out, _, _ = _run(mesh, dict(q=P(None, "tp"), sinks=P("tp")), problem)
        assert out.sharding.spec == P(None, "tp")


@pytest.mark.parametrize("n", SIZES)
def test_batch(n):
    mesh = _mesh((n,), ("dp",))
    rows = dict(q=P("dp"), page_table=P("dp"), seq_lens=P("dp"))
    out, lse, compiled = _run(mesh, rows, _problem())
    assert out.sharding.spec == P("dp") and lse.sharding.spec == P("dp")
    assert "all-reduce" not in compiled


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("window_left", [None, 9])
def test_pages(n, window_left):
    """Sequence parallel: each device holds a block of pages; partial results merge by LSE."""
    mesh = _mesh((n,), ("sp",))
    caches = dict(k_cache=P("sp"), v_cache=P("sp"))
    out, lse, compiled = _run(mesh, caches, _problem(), window_left=window_left)
    # out and lse merged: a max, then the sums (which XLA combines into one all-reduce)
    reduces = [line for line in compiled.splitlines() if " all-reduce(" in line or " all-reduce-start(" in line]
    assert 1 <= len(reduces) <= 2, reduces
    assert out.sharding.is_fully_replicated


def test_pages_and_heads_and_batch_together():
    mesh = _mesh((2, 2, 2), ("dp", "tp", "sp"))
    specs = dict(q=P("dp", "tp"), k_cache=P("sp", None, "tp"), v_cache=P("sp", None, "tp"), page_table=P("dp"),
                 seq_lens=P("dp"), sinks=P("tp"))  # fmt: skip
    out, _, _ = _run(mesh, specs, _problem(), window_left=20)
    assert out.sharding.spec == P("dp", "tp")


def test_a_cache_split_the_kernels_cannot_use_is_refused():
    mesh = _mesh((2,), ("x",))
    with pytest.raises(Exception, match="k_cache is sharded on its head_dim dimension .* would move the cache"):
        _run(mesh, dict(k_cache=P(None, None, None, "x"), v_cache=P(None, None, None, "x")), _problem())


def test_a_refusal_found_by_the_partitioner_names_sharding_error():
    """Found while XLA partitions (not while tracing), the refusal arrives inside
    JaxRuntimeError, whose message carries ShardingError's (as the README says)."""
    mesh = _mesh((2,), ("x",))
    with pytest.raises(jax.errors.JaxRuntimeError, match="ShardingError: k_cache is sharded on its head_dim"):
        _run(mesh, dict(k_cache=P(None, None, None, "x"), v_cache=P(None, None, None, "x")), _problem())


@pytest.mark.skipif(not hasattr(jax.sharding, "AxisType"), reason="this JAX has no Explicit mesh axes")
@pytest.mark.parametrize("mode", ["heads", "pages", "write_kv"])
def test_explicit_mesh_axes_are_refused_with_the_auto_recipe(mode):
    """jax.make_mesh makes Explicit axes; the rules partition over Auto ones and say how."""
    from jax.sharding import AxisType

    mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,), devices=jax.devices("cpu")[:2])
    problem = _problem()
    q, k, v, pt, sl = (jnp.asarray(a) for a in problem.arrays)
    spec = dict(heads=P(None, None, "x"), pages=P("x"), write_kv=P("x"))[mode]
    k, v = (jax.device_put(c, NamedSharding(mesh, spec)) for c in (k, v))
    if mode == "heads":
        q = jax.device_put(q, NamedSharding(mesh, P(None, "x")))
    with pytest.raises(jax_decode.ShardingError, match=r"Explicit mesh axes \['x'\].*AxisType.Auto"):
        if mode == "write_kv":
            rows = jnp.ones((2, *k.shape[2:]), k.dtype)
            jax.jit(jax_decode.write_kv)(k, v, rows, rows, jnp.array([0, 5], jnp.int32))
        else:
            jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla"))(q, k, v, pt, sl)


def test_the_readme_mesh_recipe_partitions_on_heads():
    """README: jax.make_mesh with Auto axes, q on heads, caches on KV heads."""
    from jax.sharding import AxisType

    mesh = jax.make_mesh((4,), ("tp",), axis_types=(AxisType.Auto,), devices=jax.devices("cpu")[:4])
    problem = _problem()
    q, k, v, pt, sl = (jnp.asarray(a) for a in problem.arrays)
    q = jax.device_put(q, NamedSharding(mesh, P(None, "tp", None)))
    k, v = (jax.device_put(c, NamedSharding(mesh, P(None, None, "tp", None))) for c in (k, v))
    out = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla"))(q, k, v, pt, sl)
    assert tuple(out.sharding.spec)[:2] == (None, "tp")
    expected, _ = decode_attention_reference(*problem.arrays)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, **OUT_TOL[str(problem.q.dtype)])


def test_a_small_operand_split_the_kernels_cannot_use_is_resharded_with_a_warning():
    mesh = _mesh((2,), ("x",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, compiled = _run(
            mesh, dict(q=P(None, None, "x")), _problem(), may_gather=("f32[8,16,16]",)
        )  # q's head dim
    assert any("q's 'd' dimension is sharded over ('x',)" in str(w.message) for w in caught)
    assert _moved(compiled), "q was gathered, and only q"


def test_a_head_dim_split_of_q_is_resharded_when_xla_places_the_caches():
    """Caches the user did not place (XLA chooses their sharding): q's head-dim split is
    resharded with a warning, as with replicated caches, and does not reach the caches
    through the partitioner's propagation (where it would be refused as moving them)."""
    problem = _problem(sinks=False)
    mesh = _mesh((4,), ("tp",))
    q = jax.device_put(jnp.asarray(problem.q), NamedSharding(mesh, P(None, None, "tp")))
    rest = tuple(jnp.asarray(a) for a in problem.arrays[1:])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="xla"))(q, *rest)
    assert any("q's 'd' dimension is sharded over ('tp',)" in str(w.message) for w in caught)
    expected, _ = decode_attention_reference(*problem.arrays)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, **OUT_TOL["float32"])


def test_a_head_dim_split_of_the_new_rows_is_resharded_when_xla_places_the_cache():
    """write_kv's new rows split on their head dim, the caches placed by XLA: the rows
    are resharded, the caches written whole."""
    cache, new, slots = _write_problem()
    mesh = _mesh((4,), ("x",))
    new = jax.device_put(jnp.asarray(new), NamedSharding(mesh, P(None, None, "x")))
    step = jax.jit(lambda *a: jax_decode.write_kv(*a, backend="xla"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k_out, _ = step(jnp.asarray(cache), jnp.asarray(cache), new, new, jnp.asarray(slots))
    assert any("new's 'd' dimension is sharded over ('x',)" in str(w.message) for w in caught)
    expected = cache.reshape(64, 4, 8).copy()
    for token, slot in enumerate(slots):
        if 0 <= slot < 64:
            expected[slot] = np.asarray(new)[token]
    np.testing.assert_array_equal(np.asarray(k_out), expected.reshape(cache.shape))


def test_the_interpreter_under_partitioning_says_what_to_do():
    mesh = _mesh((2,), ("tp",))
    heads = dict(q=P(None, "tp"), k_cache=P(None, None, "tp"), v_cache=P(None, None, "tp"))
    with pytest.raises(Exception, match="backend='interpret' runs the kernels in a host callback"):
        _run(mesh, heads, _problem(), backend="interpret")


def _shard_map_decode(mesh, in_specs, problem, page_axes=()):
    """The kernels (interpreter) on each device's shard through jax.shard_map."""

    def on_shard(q, k, v, pt, sl, sinks):
        if page_axes:  # global page ids -> this shard's, then an LSE merge across devices
            pt = pt - jax.lax.axis_index(page_axes) * k.shape[0]
            out, lse = jax_decode.decode_attention(q, k, v, pt, sl, return_lse=True, backend="interpret")
            return merge_over(page_axes, out, lse, sinks)
        return jax_decode.decode_attention(q, k, v, pt, sl, sinks=sinks, return_lse=True, backend="interpret")

    out_spec = P(in_specs[0][0] if len(in_specs[0]) else None, in_specs[0][1] if len(in_specs[0]) > 1 else None)
    mapped = jax.shard_map(on_shard, mesh=mesh, in_specs=in_specs, out_specs=(out_spec, out_spec), check_vma=False)
    arrays = [jnp.asarray(a) for a in (*problem.arrays, problem.sinks)]
    return jax.jit(mapped)(*arrays)


@needs_interpreter
@pytest.mark.parametrize("mode", ["heads", "batch", "pages"])
def test_the_kernels_on_each_shard_through_shard_map(mode):
    """Inside shard_map the calls see local shapes and run the kernels directly."""
    problem = _problem()
    mesh = _mesh((2,), ("x",))
    specs = {
        "heads": (P(None, "x"), P(None, None, "x"), P(None, None, "x"), P(), P(), P("x")),
        "batch": (P("x"), P(), P(), P("x"), P("x"), P()),
        "pages": (P(), P("x"), P("x"), P(), P(), P()),
    }[mode]
    out, lse = _shard_map_decode(mesh, specs, problem, page_axes=("x",) if mode == "pages" else ())
    expected_out, expected_lse = decode_attention_reference(*problem.arrays, sinks=problem.sinks)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected_out, **OUT_TOL["float32"])
    np.testing.assert_allclose(np.asarray(lse, np.float64), expected_lse, **LSE_TOL)


def test_the_triton_backend_lowers_for_cuda_with_sharded_inputs():
    pytest.importorskip("jax_triton")
    mesh = _mesh((4,), ("tp",))
    problem = _problem()
    shard = {"q": P(None, "tp"), "k_cache": P(None, None, "tp"), "v_cache": P(None, None, "tp")}
    arrays = [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype), sharding=NamedSharding(mesh, shard.get(n, P())))
              for n, a in zip(NAMES, problem.arrays, strict=True)]  # fmt: skip
    with jax_decode.compile_target(jax_decode.DeviceInfo("nvidia", 90, 132)):
        lowered = jax.jit(lambda *a: jax_decode.decode_attention(*a, backend="triton")).trace(*arrays)
        text = lowered.lower(lowering_platforms=("cuda",)).as_text()
    assert "CustomSPMDPartitioning" in text  # partitioned by its rule when compiled


# --------------------------------------------------------------------------- write_kv


def _write_problem(mla=False):
    rng = np.random.default_rng(2)
    cache = rng.standard_normal((16, 4, 4, 8)).astype(np.float32)
    new = rng.standard_normal((5, 4, 8)).astype(np.float32)
    slots = np.array([3, 40, -1, 63, 17], np.int32)
    return cache, new, slots


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("split", ["kv_heads", "pages"])
def test_write_kv_writes_each_shard_in_place(n, split):
    if split == "kv_heads" and n > 4:
        n = 4  # 4 KV heads
    mesh = _mesh((n,), ("x",))
    cache, new, slots = _write_problem()
    cache_spec = P(None, None, "x") if split == "kv_heads" else P("x")
    new_spec = P(None, "x") if split == "kv_heads" else P()
    layout = ((cache, cache_spec), (cache, cache_spec), (new, new_spec), (new, new_spec), (slots, P()))
    placed = [jax.device_put(jnp.asarray(a), NamedSharding(mesh, s)) for a, s in layout]
    step = jax.jit(lambda *a: jax_decode.write_kv(*a, backend="xla"), donate_argnums=(0, 1))
    compiled = step.lower(*placed).compile().as_text()
    assert "input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, may-alias) }" in compiled  # in place
    assert not _moved(compiled)
    k_out, v_out = step(*placed)
    assert k_out.sharding.spec == cache_spec
    expected = cache.reshape(64, 4, 8).copy()
    for token, slot in enumerate(slots):
        if 0 <= slot < 64:
            expected[slot] = new[token]
    np.testing.assert_array_equal(np.asarray(k_out), expected.reshape(cache.shape))
    np.testing.assert_array_equal(np.asarray(v_out), expected.reshape(cache.shape))


# --------------------------------------------------------------------------- several query tokens per row


@pytest.mark.parametrize("mode", ["heads", "batch", "pages"])
def test_multi_token_rows_partition_like_one_token_rows(mode):
    """q [batch, q_len, num_heads, d]: the token axis is never split; heads, batch and
    pages partition as for one token, against the oracle, moving no cache."""
    mesh = _mesh((4,), ("x",))
    specs = {
        "heads": dict(q=P(None, None, "x"), k_cache=P(None, None, "x"), v_cache=P(None, None, "x"), sinks=P("x")),
        "batch": dict(q=P("x"), page_table=P("x"), seq_lens=P("x")),
        "pages": dict(k_cache=P("x"), v_cache=P("x")),
    }[mode]
    out, lse, _ = _run(mesh, specs, _problem(q_len=3), window_left=9 if mode == "pages" else None)
    assert out.shape == (8, 3, 16, 16) and lse.shape == (8, 3, 16)
    expected = {"heads": P(None, None, "x"), "batch": P("x")}.get(mode)
    if expected is None:
        assert out.sharding.is_fully_replicated
    else:
        assert out.sharding.spec == expected and lse.sharding.spec == expected


# --------------------------------------------------------------------------- found by an outside tester


def _uneven_problem(num_pages: int, batch: int = 8):
    lengths = [0, 1, 13, 23, 24, 7, 20, 3, 17, 9][:batch]
    problem = make_paged_problem(
        batch=batch, num_heads=8, num_kv_heads=4, head_dim_qk=16, page_size=4, seq_lens=lengths, max_pages=6,
        spare_pages=0, sinks=False, seed=7,
    )  # fmt: skip
    pages = problem.k_cache.shape[0]
    assert pages <= num_pages
    pad = [(0, num_pages - pages)] + [(0, 0)] * 3
    problem.k_cache, problem.v_cache = np.pad(problem.k_cache, pad), np.pad(problem.v_cache, pad)
    return problem


@pytest.mark.parametrize(("n", "num_pages"), [(4, 69), (4, 67), (8, 61), (2, 69)])
def test_pages_that_do_not_divide_evenly(n, num_pages):
    """A page count the mesh does not divide (XLA pads the last shard: a sharding
    constraint inside jit allows it where device_put does not) still gives each device
    the pages it holds."""
    problem = _uneven_problem(num_pages)
    # Ids past the cache, where the last shard holds XLA's padding: left out, as unsharded.
    problem.page_table[3, 1], problem.page_table[4, 0] = num_pages, num_pages + 1
    mesh = _mesh((n,), ("sp",))
    spec = NamedSharding(mesh, P("sp"))

    @jax.jit
    def step(q, k, v, pt, sl):
        k, v = jax.lax.with_sharding_constraint(k, spec), jax.lax.with_sharding_constraint(v, spec)
        return jax_decode.decode_attention(q, k, v, pt, sl, return_lse=True, backend="xla")

    out, lse = step(*map(jnp.asarray, problem.arrays))
    expected_out, expected_lse = decode_attention_reference(*problem.arrays)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected_out, **OUT_TOL["float32"])
    np.testing.assert_allclose(np.asarray(lse, np.float64), expected_lse, **LSE_TOL)


@pytest.mark.parametrize(("n", "batch"), [(4, 10), (8, 10), (4, 3)])
def test_a_batch_that_does_not_divide_evenly(n, batch):
    problem = _uneven_problem(64, batch=batch)
    mesh = _mesh((n,), ("dp",))
    spec = NamedSharding(mesh, P("dp"))

    @jax.jit
    def step(q, k, v, pt, sl):
        q, pt, sl = (jax.lax.with_sharding_constraint(x, spec) for x in (q, pt, sl))
        return jax_decode.decode_attention(q, k, v, pt, sl, return_lse=True, backend="xla")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, lse = step(*map(jnp.asarray, problem.arrays))
    expected_out, expected_lse = decode_attention_reference(*problem.arrays)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected_out, **OUT_TOL["float32"])
    np.testing.assert_allclose(np.asarray(lse, np.float64), expected_lse, **LSE_TOL)
    said = [str(w.message) for w in caught if "decode_attention" in str(w.message)]
    assert said == [f"decode_attention: the batch of {batch} rows does not divide over ('dp',) ({n} devices), so this "
                    "call is computed whole on every device (q, the page table and the lengths are gathered): the "
                    "results are right, but it has no data parallelism; give it a batch the mesh divides"]  # fmt: skip


@pytest.mark.parametrize(("n", "num_pages", "kv_heads", "spec"), [(4, 17, 2, P("sp")), (8, 61, 2, P("sp")),
                                                                  (2, 16, 3, P(None, None, "sp"))])  # fmt: skip
def test_write_kv_into_pages_or_heads_that_do_not_divide_evenly(n, num_pages, kv_heads, spec):
    rng = np.random.default_rng(3)
    cache = np.zeros((num_pages, 4, kv_heads, 8), np.float32)
    new = rng.standard_normal((6, kv_heads, 8)).astype(np.float32)
    slots = np.array([0, 5, 4 * num_pages - 1, 4 * (num_pages - 1), 33, 4 * (num_pages // 2) + 1], np.int32)
    mesh = _mesh((n,), ("sp",))
    spec = NamedSharding(mesh, spec)

    @jax.jit
    def step(cache, new, slots):
        cache = jax.lax.with_sharding_constraint(cache, spec)
        return jax_decode.write_kv(cache, None, new, None, slots, backend="xla")

    got = np.asarray(step(jnp.asarray(cache), jnp.asarray(new), jnp.asarray(slots))[0])
    expected = cache.reshape(-1, kv_heads, 8).copy()
    expected[slots] = new
    np.testing.assert_array_equal(got.reshape(-1, kv_heads, 8), expected)


def test_heads_that_do_not_divide_evenly_are_refused():
    """12 query heads on 3 KV heads over 2 devices: no even share of KV heads."""
    problem = make_paged_problem(batch=2, num_heads=12, num_kv_heads=3, head_dim_qk=16, page_size=4, seq_lens=[5, 9],
                                 max_pages=4, sinks=False, seed=1)  # fmt: skip
    mesh = _mesh((2,), ("tp",))
    heads, kv = NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P(None, None, "tp"))

    @jax.jit
    def step(q, k, v, pt, sl):
        q = jax.lax.with_sharding_constraint(q, heads)
        k, v = jax.lax.with_sharding_constraint(k, kv), jax.lax.with_sharding_constraint(v, kv)
        return jax_decode.decode_attention(q, k, v, pt, sl, backend="xla")

    with pytest.raises(
        jax.errors.JaxRuntimeError, match=r"ShardingError: the caches' 3 KV heads cannot be split evenly"
    ):
        step(*map(jnp.asarray, problem.arrays))
