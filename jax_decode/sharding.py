"""decode_attention and write_kv under ``jax.sharding``: each device runs the kernels on its shard.

XLA's partitioner cannot see inside the kernels' custom calls; ``custom_partitioning``
gives it a rule (a Shardy sharding rule for propagation, and a partition callback that
reads the operands' shardings and returns the per-device computation):

* **Heads** (tensor parallel): ``q`` (and ``sinks``) sharded on ``num_heads`` over
  mesh axes whose leading ones also shard the caches' ``num_kv_heads``.  Each device
  attends with its own heads.  The heads' axes may go beyond the KV heads' (a KV head
  replicated over several devices, its query heads split among them).
* **Batch** (data parallel): ``q``, ``page_table`` and ``seq_lens`` sharded on
  ``batch``; each device decodes its rows.
* **Pages** (sequence parallel): the caches sharded on ``num_pages``, with the page
  table holding global page ids.  Each device attends over the pages it holds (a page
  id outside its shard is one the kernels leave out) and the partial results are
  merged across those axes by log-sum-exp, sinks counted once: the collectives move
  ``out`` and ``lse``, never the cache.
* **write_kv**: caches sharded on ``num_kv_heads`` and/or ``num_pages``; each device
  writes the slots it holds (the slot mapping holds global slots), in place.

Any other sharding that touches a cache (a head dim, a page's slots) raises
:class:`ShardingError`: meeting it would mean moving the cache.  One of a small operand
(q's head dim, q's heads split unlike the caches' KV heads, the page table's width, a
write's tokens, a batch the mesh does not divide) is replaced by what the kernels need,
with a warning.  Inside ``shard_map``, and on
one device, the kernels run directly on what they are given.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_decode.launch import SCALE_PER_KV_HEAD, DecodeProblem, WriteProblem
from jax_decode.operands import DecodeOperands, WriteOperands

# Each operand's dimensions as the sharding rules name them: b batch, k KV heads, g query
# heads per KV head (q's heads are "(k g)"), d / e the q.k / v widths, p pages, s a
# page's slots, m the page table's width, t a write's tokens, and q's query tokens per
# row (multi-token decode: "b t (k g) d", never split).  The caches' widths are factors
# of their own (kd, vd, cd), not q's, out's or a write's: a factor two operands share is
# one the partitioner carries from one to the other, and a sharding of q's head dim
# carried to a cache would be refused as moving it.
_DECODE_FACTORS = {
    "q": "b (k g) d",
    "k_cache": "p s k kd",
    "v_cache": "p s k vd",
    "page_table": "b m",
    "seq_lens": "b",
    "sinks": "(k g)",
}
_WRITE_FACTORS = {"cache": "p s k cd", "new": "t k d", "slot_mapping": "t"}


class ShardingError(ValueError):
    """A sharding the kernels cannot run under without moving a cache."""


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def refuse_explicit_axes(named: dict) -> None:
    """ShardingError for an operand sharded over Explicit mesh axes (sharding in types).

    The rules here partition under Auto axes, where XLA's partitioner decides; with
    Explicit axes JAX would type every op of the xla backend by hand.  ``jax.make_mesh``
    makes Explicit axes in current JAX, so the error says how to make Auto ones.
    """
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    typeof = getattr(jax, "typeof", None)
    if explicit is None or typeof is None:
        return
    for name, array in named.items():
        sharding = getattr(typeof(array), "sharding", None)
        mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
        if mesh is None or spec is None or not getattr(mesh, "axis_types", None):
            continue
        types = dict(zip(mesh.axis_names, mesh.axis_types, strict=False))
        axes = sorted({a for entry in spec for a in _axes(entry) if types.get(a) == explicit})
        if axes:
            raise ShardingError(
                f"{name} is sharded over Explicit mesh axes {axes}; decode_attention and write_kv "
                "partition themselves over Auto axes: build the mesh with "
                "jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names)) "
                "or jax.sharding.Mesh(devices, names)"
            )


def _dims(arg) -> tuple[tuple[str, ...], ...]:
    """The mesh axes of each dimension of an operand (from its NamedSharding)."""
    spec = tuple(arg.sharding.spec) if isinstance(arg.sharding, NamedSharding) else ()
    return tuple(_axes(e) for e in spec) + ((),) * (len(arg.shape) - len(spec))


def _operands(cls, names: list[str], arrays) -> tuple:
    """An operands NamedTuple from the present ones (the others None)."""
    given = dict(zip(names, arrays, strict=True))
    return cls(*(given.get(n) for n in cls._fields))


def _entry(axes: tuple[str, ...]):
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _size(mesh, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def _shard(size: int, mesh, axes: tuple[str, ...]) -> int:
    """A dimension's length on each device: XLA pads a dimension the axes do not divide,
    so every shard is the rounded-up share (the last one partly padding)."""
    return -(-size // _size(mesh, axes))


@dataclasses.dataclass(frozen=True)
class Split:
    """The mesh axes each dimension of the call is split over."""

    batch: tuple[str, ...] = ()
    heads: tuple[str, ...] = ()  # q heads; the leading ones also split the KV heads
    kv_heads: tuple[str, ...] = ()
    pages: tuple[str, ...] = ()

    def spec(self, factors: str, scale_per_kv_head: bool = False) -> P:
        """The PartitionSpec of an operand with these rule factors."""
        by_factor = {"b": self.batch, "(k g)": self.heads, "h": self.heads, "k": self.kv_heads, "p": self.pages}
        return P(*(_entry(by_factor.get(f, ())) for f in _split_factors(factors)))


def _split_factors(factors: str) -> list[str]:
    """'b (k g) d' -> ['b', '(k g)', 'd']."""
    out, group = [], None
    for token in factors.split():
        if token.startswith("("):
            group = [token]
        elif group is not None:
            group.append(token)
            if token.endswith(")"):
                out.append(" ".join(group))
                group = None
        else:
            out.append(token)
    return out


def _check_cache(name: str, dims: tuple[tuple[str, ...], ...]) -> None:
    for dim, what in ((1, "page_size"), (3, "head_dim")):
        if dims[dim]:
            raise ShardingError(
                f"{name} is sharded on its {what} dimension over {dims[dim]}: the kernels read whole pages of whole "
                "heads, so that would move the cache; shard num_pages (sequence parallel) or num_kv_heads (tensor "
                "parallel) instead"
            )


def _warn_resharded(op: str, name: str, factors: str, dims, split: Split, told: tuple[str, ...] = ()) -> None:
    """Warn of each dimension of ``name`` whose sharding ``split`` replaces (but of the
    factors in ``told``, whose warning was given already)."""
    wanted = split.spec(factors)
    for got, want, factor in zip(dims, wanted, _split_factors(factors), strict=True):
        if got and got != _axes(want) and factor not in told:
            warnings.warn(
                f"{op}: {name}'s '{factor}' dimension is sharded over {got}, which the kernels cannot use; it is "
                f"resharded to {_axes(want) or 'replicated'} (a small array, not a cache)",
                stacklevel=2,
            )


def plan_decode(mesh, dims: dict[str, tuple], problem: DecodeProblem) -> Split:
    """How one decode_attention call splits, from its operands' shardings (``dims``:
    each operand's mesh axes per dimension).

    The caches decide: their KV heads and pages stay where they are, or ShardingError
    says why they cannot.  q, the page table and the lengths (small) follow: their
    batch and heads are kept where they fit the caches' split, else resharded with a
    warning.
    """
    k = dims["k_cache"]
    v = dims.get("v_cache", k)
    _check_cache("k_cache", k)
    _check_cache("v_cache", v)
    if (k[0], k[2]) != (v[0], v[2]):
        raise ShardingError(f"k_cache (pages {k[0]}, KV heads {k[2]}) and v_cache (pages {v[0]}, KV heads {v[2]}) "
                            "must be sharded alike")  # fmt: skip
    pages, kv_heads = k[0], k[2]
    if set(pages) & set(kv_heads):
        raise ShardingError(f"the caches' pages {pages} and KV heads {kv_heads} must be sharded over distinct axes")
    if problem.num_kv_heads % _size(mesh, kv_heads):
        raise ShardingError(f"the caches' {problem.num_kv_heads} KV heads cannot be split evenly over {kv_heads}")

    batch, heads = dims["q"][0], dims["q"][2 if problem.token_axis else 1]
    heads = tuple(a for a in heads if a not in pages)  # every device of a page shard needs all of its rows' heads
    if heads[: len(kv_heads)] != kv_heads:
        heads = kv_heads  # a device needs the query heads of its KV heads
    beyond = heads[len(kv_heads) :]
    if beyond and (problem.num_kv_heads // _size(mesh, kv_heads) > 1 or problem.kv_group % _size(mesh, beyond)):
        # Query heads split finer than KV heads must split single KV heads' groups evenly.
        heads = kv_heads
    batch = tuple(a for a in batch if a not in heads and a not in pages)
    told = ()
    if problem.batch % _size(mesh, batch):
        warnings.warn(
            f"decode_attention: the batch of {problem.batch} rows does not divide over {batch} "
            f"({_size(mesh, batch)} devices), so this call is computed whole on every device (q, the page table and "
            "the lengths are gathered): the results are right, but it has no data parallelism; give it a batch the "
            "mesh divides",
            stacklevel=2,
        )
        batch, told = (), ("b",)
    split = Split(batch=batch, heads=heads, kv_heads=kv_heads, pages=pages)
    for name, factors in _DECODE_FACTORS.items():
        if name == "q" and problem.token_axis:
            factors = "b t (k g) d"  # the token axis: never split
        if name in dims and name not in ("k_cache", "v_cache"):
            _warn_resharded("decode_attention", name, factors, dims[name], split, told)
    return split


def merge_over(axes: tuple[str, ...], out, lse, sinks=None):
    """Attention over the union of each device's part (``out``, ``lse``), merged across
    ``axes`` by log-sum-exp (merge_attention_states' rule); ``sinks`` (one per head) join
    the merged denominator once."""
    peak = jax.lax.pmax(lse, axes)
    empty = peak == -jnp.inf
    peak = jnp.where(empty, 0.0, peak)
    weight = jnp.exp(lse - peak)  # 0 for a device that held none of a row's tokens
    total = jax.lax.psum(weight, axes)
    merged = jax.lax.psum(out.astype(jnp.float32) * weight[..., None], axes) / jnp.where(empty, 1.0, total)[..., None]
    merged_lse = jnp.where(empty, -jnp.inf, peak + jnp.log(jnp.where(empty, 1.0, total)))
    if sinks is not None:
        with_sinks = jnp.logaddexp(merged_lse, sinks)
        merged = merged * jnp.exp(merged_lse - with_sinks)[..., None]
        merged_lse = with_sinks
    return merged.astype(out.dtype), merged_lse


_HOST_CALLBACK = (
    "backend='interpret' runs the kernels in a host callback, which JAX cannot place in a partitioned custom call; "
    "run it on one device, or inside jax.shard_map (each device then runs the kernels on its shard), or use "
    "backend='xla' / 'triton'"
)


def _decode_factors(problem: DecodeProblem) -> dict[str, str]:
    """Each operand's rule factors; q's heads are "(k g)", or "h" / "k" where a factor
    of one (one KV head, or one query head per KV head) cannot join a compound."""
    if problem.num_kv_heads == 1:
        heads = "h"
    elif problem.kv_group == 1:
        heads = "k"
    else:
        heads = "(k g)"
    factors = {name: f.replace("(k g)", heads) for name, f in _DECODE_FACTORS.items()}
    for name, mode in (("k_scale", problem.k_scale), ("v_scale", problem.v_scale)):
        factors[name] = "k" if mode == SCALE_PER_KV_HEAD else name  # a per-tensor scale: one value, never split
    rows = f"b t {heads}" if problem.token_axis else f"b {heads}"
    if problem.token_axis:
        factors["q"] = f"{rows} d"
    factors["out"], factors["lse"] = f"{rows} e", rows
    return factors


def sharded_decode(ops: DecodeOperands, problem: DecodeProblem, compute: Callable, *, host_callback: bool = False):
    """``compute(ops, problem) -> (out, lse)``, partitioned by the operands' shardings.

    ``host_callback``: ``compute`` calls back to the host (the interpret backend), which
    cannot be partitioned: a sharded call raises ShardingError.
    """
    names = [n for n in DecodeOperands._fields if getattr(ops, n) is not None]
    refuse_explicit_axes({n: getattr(ops, n) for n in names})
    factors = _decode_factors(problem)

    def whole(*arrays):
        return compute(_operands(DecodeOperands, names, arrays), problem)

    def partition(mesh, arg_shapes, result_shape):
        if host_callback:
            raise ShardingError(_HOST_CALLBACK)
        dims = {n: _dims(a) for n, a in zip(names, arg_shapes, strict=True)}
        split = plan_decode(mesh, dims, problem)
        local = dataclasses.replace(
            problem,
            batch=_shard(problem.batch, mesh, split.batch),
            num_heads=problem.num_heads // _size(mesh, split.heads),  # (plan_decode: even splits only)
            num_kv_heads=_shard(problem.num_kv_heads, mesh, split.kv_heads),
            num_pages=_shard(problem.num_pages, mesh, split.pages),
            has_sinks=problem.has_sinks and not split.pages,  # added once, after the merge
        )

        def on_shard(*arrays):
            shard = _operands(DecodeOperands, names, arrays)
            sinks = shard.sinks
            if split.pages:  # global page ids -> this device's; the kernels leave out the others'
                offset = jax.lax.axis_index(split.pages) * local.num_pages
                table = shard.page_table
                # An id past the cache (>= num_pages) would land in the padding XLA adds to
                # the last shard when the mesh does not divide the pages: make it invalid.
                valid = (table >= 0) & (table < problem.num_pages)
                table = jnp.where(valid, table - offset.astype(table.dtype), -1)
                shard = shard._replace(page_table=table, sinks=None)
            out, lse = compute(shard, local)
            if split.pages:
                out, lse = merge_over(split.pages, out, lse, sinks)
            return out, lse

        arg_shardings = tuple(NamedSharding(mesh, split.spec(factors[n])) for n in names)
        results = (NamedSharding(mesh, split.spec(factors["out"])), NamedSharding(mesh, split.spec(factors["lse"])))
        return mesh, on_shard, results, arg_shardings

    partitioned = custom_partitioning(whole)
    operands = ", ".join(factors[n] for n in names)
    sizes = {"g": problem.kv_group} if "(k g)" in factors["q"] else {}
    partitioned.def_partition(
        partition=partition,
        sharding_rule=f"{operands} -> {factors['out']}, {factors['lse']}",
        reduction_factors=("p",),
        need_replication_factors=("t",) if problem.token_axis else (),
        **sizes,
    )
    return partitioned(*(getattr(ops, n) for n in names))


def plan_write(mesh, dims: dict[str, tuple]) -> Split:
    """How one cache's write splits: the cache's pages and KV heads (the new rows'
    tokens and the slot mapping are whole on every device)."""
    cache = dims["cache"]
    _check_cache("the cache", cache)
    split = Split(kv_heads=cache[2], pages=cache[0])
    for name in ("new", "slot_mapping"):
        _warn_resharded("write_kv", name, _WRITE_FACTORS[name], dims[name], split)
    return split


def sharded_write(ops: WriteOperands, problem: WriteProblem, compute: Callable, *, host_callback: bool = False):
    """``compute(ops, problem) -> cache``, partitioned by the cache's sharding (see
    :func:`sharded_decode` for ``host_callback``)."""
    names = [n for n in WriteOperands._fields if getattr(ops, n) is not None]
    refuse_explicit_axes({n: getattr(ops, n) for n in names})
    factors = dict(_WRITE_FACTORS, scale="k" if problem.scale == SCALE_PER_KV_HEAD else "scale")

    def whole(*arrays):
        return compute(_operands(WriteOperands, names, arrays), problem)

    def partition(mesh, arg_shapes, result_shape):
        if host_callback:
            raise ShardingError(_HOST_CALLBACK)
        dims = {n: _dims(a) for n, a in zip(names, arg_shapes, strict=True)}
        split = plan_write(mesh, dims)
        local = dataclasses.replace(
            problem,
            num_kv_heads=_shard(problem.num_kv_heads, mesh, split.kv_heads),
            num_pages=_shard(problem.num_pages, mesh, split.pages),
        )

        def on_shard(*arrays):
            shard = _operands(WriteOperands, names, arrays)
            if split.pages:  # global slots -> this device's; the kernels skip the others'
                offset = jax.lax.axis_index(split.pages) * local.num_slots
                shard = shard._replace(slot_mapping=shard.slot_mapping - offset.astype(shard.slot_mapping.dtype))
            return compute(shard, local)

        kv = {"k": split.kv_heads, "p": split.pages}
        specs = {n: P(*(_entry(kv.get(f, ())) for f in factors[n].split())) for n in names}
        return mesh, on_shard, NamedSharding(mesh, specs["cache"]), tuple(NamedSharding(mesh, specs[n]) for n in names)

    partitioned = custom_partitioning(whole)
    partitioned.def_partition(
        partition=partition,
        sharding_rule=", ".join(factors[n] for n in names) + f" -> {factors['cache']}",
        need_replication_factors=("t",),
    )
    return partitioned(*(getattr(ops, n) for n in names))
