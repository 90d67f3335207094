"""A small Llama-style decoder in JAX, decoding greedily from a paged KV cache.

Random weights; GQA, RoPE, RMSNorm, SwiGLU, several layers.  A batch of prompts of
different lengths is fed token by token (each row reads its prompt until it runs out,
then its own greedy choices), so every step is one jitted function that, per layer,
writes the new K/V into the paged cache with ``jax_decode.write_kv`` (caches donated:
updated in place) and attends with ``jax_decode.decode_attention``.

    python examples/llama_decode.py                  # the Triton kernels on a GPU, xla elsewhere
    python examples/llama_decode.py --backend xla --steps 64 --batch 8
    XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        python examples/llama_decode.py --backend xla --tensor-parallel 2 --sequence-parallel 2

With ``--tensor-parallel N`` the attention weights and the caches are sharded on heads
over N devices, with ``--sequence-parallel M`` the caches on pages over M devices (on a
CPU, host devices stand in for GPUs); the same jitted step then runs partitioned, and
``decode_attention`` / ``write_kv`` run on each device's shard.

With ``--draft-tokens K`` it decodes speculatively: each step verifies K tokens per
row in one ``decode_attention`` call (q ``[batch, K, heads, head_dim]``, causal among
the K), its prompt's next tokens or, past the prompt, guesses that copy what followed
the row's last token earlier on (prompt lookup); the longest run of guesses the model
agrees with is kept, plus the model's own next token.  Greedy decoding gives the same
tokens either way (checked on every run), in fewer steps when guesses hit.

    python examples/llama_decode.py --backend xla --draft-tokens 4

``dense_greedy`` decodes the same model with plain causal attention over the whole
sequence; the test suite checks both give the same tokens.

With ``--preset llama-3.1-8b`` it times decode steps of Llama-3.1-8B's shapes instead
(32 layers, 32 query / 8 KV heads of 128, dim 4096, MLP 14336, vocab 128256; random
bf16 weights; a paged cache of 16-token pages pre-filled with random K/V to
``--context`` tokens per row, no prompt run through the model), with ``--attention``
choosing the attention inside the jitted step: ``jax_decode`` (``--backend``, the Triton
kernels on a GPU), ``fa3`` (FlashAttention-3's JAX binding, ``flash-attn3-jax``; Hopper)
or ``xla`` (``backend="xla"``).  It reports tokens/s and attention's share of the step
(see :func:`run_preset` for how, and for the GPU commands); ``--layers`` and ``--vocab``
scale it down:

    python examples/llama_decode.py --preset llama-3.1-8b --layers 1 --vocab 1024 \
        --batch 2 --context 256 --steps 4 --attention xla
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_decode


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    dim: int = 128
    layers: int = 3
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    hidden: int = 256
    page_size: int = 8
    max_len: int = 64
    rope_base: float = 10000.0
    dtype: str = "float32"  # weights, activations and caches


# Real models' shapes (``max_len`` is set per run, from the context and the steps).
PRESETS = {
    "llama-3.1-8b": Config(vocab=128256, dim=4096, layers=32, heads=32, kv_heads=8, head_dim=128, hidden=14336,
                           page_size=16, max_len=8192, rope_base=500000.0, dtype="bfloat16"),
}  # fmt: skip


def init_params(cfg: Config, seed: int = 0) -> dict:
    keys = iter(jax.random.split(jax.random.key(seed), 4 + 7 * cfg.layers))

    def dense(shape, gain=1.0):
        x = jax.random.normal(next(keys), shape, jnp.float32) / np.sqrt(shape[0])
        return (x if gain == 1.0 else x * gain).astype(cfg.dtype)  # float32: the same values as ever

    layers = []
    for _ in range(cfg.layers):
        layers.append(
            dict(
                wq=dense((cfg.dim, cfg.heads * cfg.head_dim)),
                wk=dense((cfg.dim, cfg.kv_heads * cfg.head_dim)),
                wv=dense((cfg.dim, cfg.kv_heads * cfg.head_dim)),
                wo=dense((cfg.heads * cfg.head_dim, cfg.dim)),
                w_gate=dense((cfg.dim, cfg.hidden)),
                w_up=dense((cfg.dim, cfg.hidden)),
                w_down=dense((cfg.hidden, cfg.dim)),
            )
        )
    return dict(embed=dense((cfg.vocab, cfg.dim), np.sqrt(cfg.dim)), layers=layers, head=dense((cfg.dim, cfg.vocab)))


def rms_norm(x):
    """In float32 whatever x's dtype (a no-op cast for float32 x), returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def rope(x, positions, base):
    """x [..., tokens or batch, heads, head_dim] rotated by its positions (half-split layout)."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[..., None, None].astype(jnp.float32) * freqs  # [..., 1, half]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def mlp(p, x):
    return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def cache_layout(cfg: Config, batch: int) -> tuple[tuple[int, ...], jax.Array]:
    """(the shape of each layer's K and V cache, the page table [batch, max_len // page_size])."""
    pages_per_row = cfg.max_len // cfg.page_size
    # Page 0 is spare; the count is rounded up to a multiple of 8 so pages shard evenly.
    shape = (-(-(batch * pages_per_row + 1) // 8) * 8, cfg.page_size, cfg.kv_heads, cfg.head_dim)
    # Rows own shuffled pages (page 0 is spare), as a serving engine's allocator would hand out.
    order = np.random.default_rng(0).permutation(np.arange(1, batch * pages_per_row + 1))
    page_table = jnp.asarray(order.reshape(batch, pages_per_row), jnp.int32)
    return shape, page_table


def empty_caches(cfg: Config, batch: int):
    shape, page_table = cache_layout(cfg, batch)
    caches = [(jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype)) for _ in range(cfg.layers)]
    return caches, page_table


def prefilled_caches(cfg: Config, batch: int, seed: int = 0):
    """:func:`empty_caches`' layout with every slot holding random K/V (standard normal, in
    ``cfg.dtype``): a row's first positions then stand for a prompt already run, so a step
    at position ``p`` attends to ``p + 1`` tokens, without running the prompt."""
    shape, page_table = cache_layout(cfg, batch)
    keys = jax.random.split(jax.random.key(seed), 2 * cfg.layers)
    normal = jax.jit(lambda key: jax.random.normal(key, shape, cfg.dtype))
    caches = [(normal(keys[2 * i]), normal(keys[2 * i + 1])) for i in range(cfg.layers)]
    return caches, page_table


ATTENTIONS = ("jax_decode", "fa3", "xla")


def attend(q, k_cache, v_cache, page_table, seq_lens, *, backend: str, attention: str, fa3_splits: int):
    """One token per row's attention (q ``[batch, heads, head_dim]``) by ``attention``:
    ``"jax_decode"`` (``backend``), ``"xla"`` (``backend="xla"``), ``"fa3"`` (FlashAttention-3's
    JAX binding at ``fa3_splits``), or ``"stand-in"``: q itself, same shape and dtype, no
    cache read (the step without attention, to measure attention's share)."""
    if attention == "stand-in":
        return q
    if attention == "fa3":
        from flash_attn3_jax import flash_mha_with_kvcache

        out = flash_mha_with_kvcache(q[:, None], k_cache, v_cache, cache_seqlens=seq_lens, page_table=page_table,
                                     softmax_scale=q.shape[-1] ** -0.5, num_splits=fa3_splits)  # fmt: skip
        return out[:, 0]
    if attention not in ("jax_decode", "xla"):
        raise ValueError(f"attention must be one of {ATTENTIONS} or 'stand-in', got {attention!r}")
    return jax_decode.decode_attention(q, k_cache, v_cache, page_table, seq_lens,
                                      backend="xla" if attention == "xla" else backend)  # fmt: skip


@functools.partial(jax.jit, static_argnames=("cfg", "backend", "attention", "fa3_splits"), donate_argnames=("caches",))
def decode_step(params, caches, page_table, tokens, positions, *, cfg: Config, backend: str,
                attention: str = "jax_decode", fa3_splits: int = 1):  # fmt: skip
    """One token per row at ``positions``: returns (logits [batch, vocab], caches).

    ``write_kv`` runs on ``backend``; the attention is :func:`attend`'s ``attention``."""
    batch = tokens.shape[0]
    x = params["embed"][tokens]
    slots = page_table[jnp.arange(batch), positions // cfg.page_size] * cfg.page_size + positions % cfg.page_size
    new_caches = []
    for p, (k_cache, v_cache) in zip(params["layers"], caches, strict=True):
        h = rms_norm(x)
        q = rope((h @ p["wq"]).reshape(batch, cfg.heads, cfg.head_dim), positions, cfg.rope_base)
        k = rope((h @ p["wk"]).reshape(batch, cfg.kv_heads, cfg.head_dim), positions, cfg.rope_base)
        v = (h @ p["wv"]).reshape(batch, cfg.kv_heads, cfg.head_dim)
        k_cache, v_cache = jax_decode.write_kv(k_cache, v_cache, k, v, slots, backend=backend)
        attn = attend(q, k_cache, v_cache, page_table, positions + 1, backend=backend, attention=attention,
                      fa3_splits=fa3_splits)  # fmt: skip
        x = x + attn.reshape(batch, -1) @ p["wo"]
        x = x + mlp(p, rms_norm(x))
        new_caches.append((k_cache, v_cache))
    return rms_norm(x) @ params["head"], new_caches


@functools.partial(jax.jit, static_argnames=("cfg", "backend"), donate_argnames=("caches",))
def verify_step(params, caches, page_table, tokens, positions, *, cfg: Config, backend: str):
    """``K`` tokens per row at ``positions + [0, K)``: returns (logits [batch, K, vocab], caches).

    The K tokens' keys and values are written first (``batch * K`` slots in one
    write_kv), then each attends causally: token j sees the row up to its own position.
    """
    batch, k = tokens.shape
    token_positions = positions[:, None] + jnp.arange(k)  # [batch, K]
    x = params["embed"][tokens]  # [batch, K, dim]
    rows = jnp.arange(batch)[:, None]
    slots = page_table[rows, token_positions // cfg.page_size] * cfg.page_size + token_positions % cfg.page_size
    new_caches = []
    for p, (k_cache, v_cache) in zip(params["layers"], caches, strict=True):
        h = rms_norm(x)
        q = rope((h @ p["wq"]).reshape(batch, k, cfg.heads, cfg.head_dim), token_positions, cfg.rope_base)
        keys = rope((h @ p["wk"]).reshape(batch, k, cfg.kv_heads, cfg.head_dim), token_positions, cfg.rope_base)
        values = (h @ p["wv"]).reshape(batch, k, cfg.kv_heads, cfg.head_dim)
        k_cache, v_cache = jax_decode.write_kv(
            k_cache, v_cache, keys.reshape(batch * k, cfg.kv_heads, cfg.head_dim),
            values.reshape(batch * k, cfg.kv_heads, cfg.head_dim), slots.reshape(-1), backend=backend,
        )  # fmt: skip
        attn = jax_decode.decode_attention(q, k_cache, v_cache, page_table, positions + k, backend=backend)
        x = x + attn.reshape(batch, k, -1) @ p["wo"]
        x = x + mlp(p, rms_norm(x))
        new_caches.append((k_cache, v_cache))
    return rms_norm(x) @ params["head"], new_caches


def prompt_lookup(sequence: list[int], count: int) -> list[int]:
    """``count`` guesses of what follows ``sequence``: what followed its last token the
    last time it appeared before, else that token repeated."""
    last = sequence[-1]
    for start in range(len(sequence) - 2, -1, -1):
        if sequence[start] == last:
            guess = sequence[start + 1 : start + 1 + count]
            return guess + [last] * (count - len(guess))
    return [last] * count


def speculative_greedy(params, cfg: Config, prompts: list[list[int]], steps: int, draft_tokens: int,
                       backend: str = "auto") -> tuple[np.ndarray, int]:  # fmt: skip
    """:func:`paged_greedy`'s tokens, verifying ``draft_tokens`` per row and step; returns
    (tokens [batch, steps], the number of verify steps taken)."""
    batch, k = len(prompts), draft_tokens
    if steps + k > cfg.max_len:
        raise ValueError(f"steps + draft_tokens ({steps + k}) must be at most the cache's max_len ({cfg.max_len})")
    caches, page_table = empty_caches(cfg, batch)
    known = [list(p) for p in prompts]  # each row's tokens so far (prompt, then decoded)
    done = np.zeros(batch, np.int64)  # positions whose keys and values are in the cache
    calls = 0
    while min(len(row) for row in known) < steps + 1:
        window = np.zeros((batch, k), np.int32)
        for row in range(batch):
            ahead = known[row][done[row] : done[row] + k]
            window[row] = ahead + prompt_lookup(known[row], k - len(ahead))
        logits, caches = verify_step(params, caches, page_table, jnp.asarray(window), jnp.asarray(done, jnp.int32),
                                     cfg=cfg, backend=backend)  # fmt: skip
        choice = np.asarray(jnp.argmax(logits, axis=-1))  # the model's next token after each window position
        calls += 1
        for row in range(batch):
            if len(known[row]) >= steps + 1:
                continue  # finished: its window is rewritten with the same tokens, never advanced
            accepted = 0
            for j in range(k):
                position = done[row] + j + 1  # the position window[row, j] predicts
                if position >= len(known[row]):
                    known[row].append(int(choice[row, j]))
                accepted = j + 1
                if j + 1 < k and window[row, j + 1] != known[row][position]:
                    break  # the next guess was wrong: what the model saw after it is void
            done[row] += accepted
    return np.asarray([row[1 : steps + 1] for row in known]), calls


def shard(params, caches, mesh):
    """Heads over mesh axis "tp" (the attention weights, the caches' KV heads), pages over
    "sp" (the caches): NamedShardings the jitted step runs under."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def put(x, *spec):
        return jax.device_put(x, NamedSharding(mesh, P(*spec)))

    kv_heads = caches[0][0].shape[2]
    if kv_heads % mesh.shape["tp"]:
        raise ValueError(f"{kv_heads} KV heads cannot be split over {mesh.shape['tp']} devices")

    layers = [
        dict(p, wq=put(p["wq"], None, "tp"), wk=put(p["wk"], None, "tp"), wv=put(p["wv"], None, "tp"),
             wo=put(p["wo"], "tp", None))
        for p in params["layers"]
    ]  # fmt: skip
    caches = [(put(k, "sp", None, "tp"), put(v, "sp", None, "tp")) for k, v in caches]
    return dict(params, layers=layers), caches


def paged_greedy(params, cfg: Config, prompts: list[list[int]], steps: int, backend: str = "auto", mesh=None):
    """Feed prompts token by token, then greedy-decode; returns tokens [batch, steps].

    ``mesh``: a ``jax.sharding.Mesh`` with axes "tp" and "sp" to run the step sharded
    (see :func:`shard`)."""
    batch = len(prompts)
    caches, page_table = empty_caches(cfg, batch)
    if mesh is not None:
        params, caches = shard(params, caches, mesh)
    lengths = np.array([len(p) for p in prompts])
    if steps >= cfg.max_len:
        raise ValueError(f"steps ({steps}) must be below the cache's max_len ({cfg.max_len})")
    padded = np.zeros((batch, max(steps, int(lengths.max())) + 1), np.int32)
    for row, prompt in enumerate(prompts):
        padded[row, : len(prompt)] = prompt
    sequence = padded.copy()
    for step in range(steps):
        tokens = jnp.asarray(sequence[:, step])
        positions = jnp.full((batch,), step, jnp.int32)
        logits, caches = decode_step(params, caches, page_table, tokens, positions, cfg=cfg, backend=backend)
        choice = np.asarray(jnp.argmax(logits, axis=-1))
        # A row still inside its prompt keeps the prompt's next token.
        sequence[:, step + 1] = np.where(step + 1 < lengths, padded[:, step + 1], choice)
    return sequence[:, 1 : steps + 1]


def dense_forward(params, cfg: Config, tokens):
    """Logits of every position of one sequence, with dense causal attention."""
    n = tokens.shape[0]
    positions = jnp.arange(n)
    x = params["embed"][tokens]
    causal = jnp.tril(jnp.ones((n, n), bool))
    group = cfg.heads // cfg.kv_heads
    for p in params["layers"]:
        h = rms_norm(x)
        q = rope((h @ p["wq"]).reshape(n, cfg.heads, cfg.head_dim), positions, cfg.rope_base)
        k = rope((h @ p["wk"]).reshape(n, cfg.kv_heads, cfg.head_dim), positions, cfg.rope_base)
        v = (h @ p["wv"]).reshape(n, cfg.kv_heads, cfg.head_dim)
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
        scores = jnp.einsum("qhd,khd->hqk", q, k, precision="highest") / np.sqrt(cfg.head_dim)
        weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        attn = jnp.einsum("hqk,khd->qhd", weights, v, precision="highest")
        x = x + attn.reshape(n, -1) @ p["wo"]
        x = x + mlp(p, rms_norm(x))
    return rms_norm(x) @ params["head"]


def dense_greedy(params, cfg: Config, prompts: list[list[int]], steps: int):
    """The same decoding with no cache: recompute every position each step."""
    out = []
    for prompt in prompts:
        sequence = list(prompt[:1])
        for step in range(steps):
            logits = dense_forward(params, cfg, jnp.asarray(sequence, jnp.int32))[-1]
            nxt = prompt[step + 1] if step + 1 < len(prompt) else int(jnp.argmax(logits))
            sequence.append(nxt)
        out.append(sequence[1:])
    return np.asarray(out)


# --------------------------------------------------------------------------- --preset: timed decode steps

FA3_SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)  # flash_attn3_jax takes num_splits >= 1 (no "0 = heuristic")
WARMUP_STEPS = 2  # the first compiles


def require_fa3() -> None:
    """Exit with the reason where ``--attention fa3`` cannot run: FlashAttention-3's JAX
    binding (``flash-attn3-jax``, a Python 3.12 wheel) must import and JAX must run on a
    Hopper GPU (the binding lowers for CUDA only; the wheel's kernels are sm_90)."""
    try:
        import flash_attn3_jax  # noqa: F401
    except Exception as error:
        raise SystemExit(
            "--attention fa3 needs FlashAttention-3's JAX binding (pip install flash-attn3-jax==0.2.3; Python 3.12, "
            f"a Hopper GPU), which does not import here: {type(error).__name__}: {error}"
        ) from None
    device = jax.devices()[0]
    if device.platform != "gpu":
        raise SystemExit(f"--attention fa3 runs on a CUDA GPU only (FlashAttention-3 has no {device.platform} "
                         "lowering); use --attention xla or jax_decode here")  # fmt: skip
    capability = getattr(device, "compute_capability", "")
    if not str(capability).startswith("9."):
        raise SystemExit(f"--attention fa3: flash-attn3-jax's kernels are built for sm_90 (Hopper), this GPU is "
                         f"{device.device_kind} (compute capability {capability})")  # fmt: skip


def parse_context(text: str) -> int:
    """``4096`` or ``4k``."""
    value = int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"the context must be at least 1 token, got {text}")
    return value


def time_steps(params, caches, page_table, context: int, steps: int, *, cfg: Config, backend: str,
               attention: str, fa3_splits: int = 1):  # fmt: skip
    """Seconds per step over ``steps`` steps after :data:`WARMUP_STEPS`, each row at
    positions ``context``, ``context + 1``, ... (its greedy token fed back on the device,
    no host sync between steps); returns (seconds per step, caches)."""
    batch = page_table.shape[0]
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, cfg.vocab, batch), jnp.int32)
    positions = jnp.full((batch,), context, jnp.int32)
    start = None
    for step in range(WARMUP_STEPS + steps):
        if step == WARMUP_STEPS:
            jax.block_until_ready((tokens, caches))
            start = time.perf_counter()
        logits, caches = decode_step(params, caches, page_table, tokens, positions, cfg=cfg, backend=backend,
                                     attention=attention, fa3_splits=fa3_splits)  # fmt: skip
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        positions = positions + 1
    jax.block_until_ready((tokens, caches))
    return (time.perf_counter() - start) / steps, caches


def fa3_splits_by_time(cfg: Config, k_cache, v_cache, page_table, context: int, calls: int = 32) -> dict[int, float]:
    """Seconds per FA3 attention call at each of :data:`FA3_SPLITS`, on one layer's cache
    at ``context + 1`` tokens: ``calls`` calls chained in one jitted program (each call's
    output is the next one's q, so none is merged away), wall time of the program."""
    from flash_attn3_jax import flash_mha_with_kvcache

    batch = page_table.shape[0]
    q = jax.random.normal(jax.random.key(3), (batch, 1, cfg.heads, cfg.head_dim), cfg.dtype)
    seq_lens = jnp.full((batch,), context + 1, jnp.int32)
    seconds = {}
    for splits in FA3_SPLITS:

        @jax.jit
        def chain(q, k_cache, v_cache, splits=splits):
            for _ in range(calls):
                q = flash_mha_with_kvcache(q, k_cache, v_cache, cache_seqlens=seq_lens, page_table=page_table,
                                           softmax_scale=cfg.head_dim**-0.5, num_splits=splits)  # fmt: skip
            return q

        jax.block_until_ready(chain(q, k_cache, v_cache))  # compile
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(chain(q, k_cache, v_cache))
            rounds.append((time.perf_counter() - start) / calls)
        seconds[splits] = float(np.median(rounds))
    return seconds


def run_preset(args) -> None:
    """Time decode steps of a preset model (``--preset``) and print tokens/s and
    attention's share of the step.

    Tokens/s: ``batch * steps`` over the wall time of ``--steps`` back-to-back jitted steps
    (after :data:`WARMUP_STEPS`; each step writes every layer's new K/V with ``write_kv``,
    attends over the row's ``context + 1 + i`` tokens, and feeds its greedy token back on
    the device; the host waits once, at the end).  Attention's share: the same steps timed
    again with the attention replaced by a stand-in of its output's shape and dtype (the
    query itself: no cache read, everything else -- projections, RoPE, ``write_kv``, MLP,
    logits -- unchanged), share = 1 - stand-in step / real step.  The difference also
    holds what XLA fuses differently around the attention call; it is wall time, so at
    tiny steps host dispatch weighs in.  ``--attention fa3`` runs FlashAttention-3's JAX
    binding at ``--fa3-splits`` (default: whichever of :data:`FA3_SPLITS` is fastest for
    the attention call alone at this batch and context, timed first and printed).

    On an H200 (the b64 ctx8k cache is 69 GB, the weights 16 GB: too much for an H100's
    80 GB beside the weights; give JAX the memory), from the repository root::

        export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
        for attention in jax_decode fa3 xla; do for batch in 1 16 64; do for context in 1k 4k 8k; do
          python examples/llama_decode.py --preset llama-3.1-8b --attention $attention \\
            --batch $batch --context $context --steps 32
        done; done; done
    """
    cfg = PRESETS[args.preset]
    cfg = dataclasses.replace(
        cfg, layers=args.layers or cfg.layers, vocab=args.vocab or cfg.vocab,
        max_len=cfg.page_size * -(-(args.context + WARMUP_STEPS + args.steps) // cfg.page_size),
    )  # fmt: skip
    if args.attention == "fa3":
        require_fa3()
    weights = 2 * cfg.vocab * cfg.dim + cfg.layers * (
        2 * cfg.dim * (cfg.heads + cfg.kv_heads) * cfg.head_dim + 3 * cfg.dim * cfg.hidden
    )
    shape, _ = cache_layout(cfg, args.batch)
    item = np.dtype(jnp.dtype(cfg.dtype)).itemsize
    plural = "s" * (cfg.layers != 1)
    print(f"{args.preset}: {cfg.layers} layer{plural}, {cfg.heads}/{cfg.kv_heads} heads of {cfg.head_dim}, "
          f"dim {cfg.dim}, MLP {cfg.hidden}, vocab {cfg.vocab}, {cfg.dtype}: {weights / 1e9:.2f} B parameters "
          f"({weights * item / 1e9:.1f} GB), KV cache {2 * cfg.layers * np.prod(shape) * item / 1e9:.1f} GB "
          f"(batch {args.batch}, {cfg.max_len} positions per row in pages of {cfg.page_size})", flush=True)  # fmt: skip
    params = init_params(cfg)
    caches, page_table = prefilled_caches(cfg, args.batch)
    splits = args.fa3_splits or 1
    label = args.attention
    if args.attention == "fa3":
        if not args.fa3_splits:
            by_splits = fa3_splits_by_time(cfg, *caches[0], page_table, args.context)
            splits = min(by_splits, key=by_splits.get)
            print("FA3 attention call alone, us per call by num_splits: "
                  + ", ".join(f"{s}: {t * 1e6:.1f}" for s, t in by_splits.items()), flush=True)  # fmt: skip
        label = f"fa3 (num_splits {splits})"
    elif args.attention == "jax_decode":
        label = f"jax_decode (backend {args.backend})"
    options = dict(cfg=cfg, backend=args.backend, fa3_splits=splits)
    step_s, caches = time_steps(params, caches, page_table, args.context, args.steps, attention=args.attention,
                                **options)  # fmt: skip
    bare_s, caches = time_steps(params, caches, page_table, args.context, args.steps, attention="stand-in", **options)
    share = 1 - bare_s / step_s
    # A step with the stand-in can time slower than the real one: below the timing noise.
    share_text = f"attention {100 * share:.1f}% of the step" if share > 0 else "attention's share within the noise"
    print(f"batch {args.batch}, context {args.context}, attention {label} on {jax.devices()[0].device_kind}: "
          f"{args.batch / step_s:.1f} tokens/s ({step_s * 1e3:.2f} ms per step over {args.steps} steps); "
          f"with a stand-in for attention {bare_s * 1e3:.2f} ms: {share_text}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="auto", choices=jax_decode.BACKENDS)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--tensor-parallel", type=int, default=1, help="devices the heads are sharded over")
    parser.add_argument("--sequence-parallel", type=int, default=1, help="devices the cache pages are sharded over")
    parser.add_argument(
        "--draft-tokens", type=int, default=0, help="verify this many tokens per row and step (0: one token)"
    )
    preset = parser.add_argument_group("--preset: timed decode steps of a real model's shapes")
    preset.add_argument("--preset", choices=sorted(PRESETS), help="time decode steps of this model's shapes")
    preset.add_argument("--attention", choices=ATTENTIONS, help="the attention in the step (default jax_decode)")
    preset.add_argument("--context", type=parse_context, help="tokens already in each row's cache, e.g. 4096 or 4k "
                        "(default 4k)")  # fmt: skip
    preset.add_argument("--layers", type=int, help="fewer layers than the preset's (a scaled-down run)")
    preset.add_argument("--vocab", type=int, help="a smaller vocabulary than the preset's")
    preset.add_argument("--fa3-splits", type=int, help="FA3's num_splits (default: the fastest, timed first)")
    args = parser.parse_args(argv)
    preset_only = ("attention", "context", "layers", "vocab", "fa3_splits")
    if args.preset is None:
        given = [f"--{name.replace('_', '-')}" for name in preset_only if getattr(args, name) is not None]
        if given:
            parser.error(f"{', '.join(given)} apply to --preset only")
    else:
        if args.draft_tokens or args.tensor_parallel * args.sequence_parallel > 1:
            parser.error("--preset runs one token per row on one device")
        args.attention = args.attention or "jax_decode"
        args.context = args.context or 4096
        for name in ("batch", "steps", "layers", "vocab"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                parser.error(f"--{name} must be at least 1")
        if args.fa3_splits is not None and not 1 <= args.fa3_splits <= 128:
            parser.error(f"--fa3-splits must be in [1, 128], got {args.fa3_splits}")
        run_preset(args)
        return
    if args.draft_tokens < 0 or args.draft_tokens > 16:
        parser.error(f"--draft-tokens must be in [0, 16], got {args.draft_tokens}")
    if args.draft_tokens and args.tensor_parallel * args.sequence_parallel > 1:
        parser.error("--draft-tokens runs on one device")
    mesh = None
    devices = args.tensor_parallel * args.sequence_parallel
    if devices > 1:
        from jax.sharding import Mesh

        pool = jax.devices()
        if len(pool) < devices:  # host devices stand in
            pool = jax.devices("cpu")
        if len(pool) < devices:
            raise SystemExit(f"run with XLA_FLAGS=--xla_force_host_platform_device_count={devices} for {devices} "
                             "host devices")  # fmt: skip
        grid = np.array(pool[:devices]).reshape(args.sequence_parallel, args.tensor_parallel)
        mesh = Mesh(grid, ("sp", "tp"))
    page_size = Config.page_size
    cfg = Config(max_len=page_size * -(-(args.steps + 1 + args.draft_tokens) // page_size))  # holds every step
    params = init_params(cfg)
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(0, cfg.vocab, size=int(n))) for n in rng.integers(2, 12, size=args.batch)]
    paged_greedy(params, cfg, prompts, 2, args.backend, mesh)  # compile
    start = time.perf_counter()
    tokens = paged_greedy(params, cfg, prompts, args.steps, args.backend, mesh)
    elapsed = time.perf_counter() - start
    print(f"{args.batch} rows x {args.steps} steps on {jax.devices()[0].platform} ({args.backend}): "
          f"{args.batch * args.steps / elapsed:.0f} tokens/s")  # fmt: skip
    print("row 0:", tokens[0].tolist())
    if args.draft_tokens:
        # Compile: as many steps as the longest prompt, so that at least one verify step
        # runs (a row stops once its prompt and decoded tokens reach steps + 1).
        speculative_greedy(params, cfg, prompts, max(map(len, prompts)), args.draft_tokens, args.backend)
        start = time.perf_counter()
        drafted, calls = speculative_greedy(params, cfg, prompts, args.steps, args.draft_tokens, args.backend)
        elapsed = time.perf_counter() - start
        if not np.array_equal(drafted, tokens):
            raise SystemExit("speculative decoding gave other tokens than one-token decoding")
        print(f"--draft-tokens {args.draft_tokens}: the same tokens in {calls} verify steps (one-token decoding: "
              f"{args.steps}), {args.batch * args.steps / elapsed:.0f} tokens/s")  # fmt: skip


if __name__ == "__main__":
    main()
