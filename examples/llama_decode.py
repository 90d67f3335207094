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


def init_params(cfg: Config, seed: int = 0) -> dict:
    keys = iter(jax.random.split(jax.random.key(seed), 4 + 7 * cfg.layers))

    def dense(shape):
        return jax.random.normal(next(keys), shape, jnp.float32) / np.sqrt(shape[0])

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
    return dict(embed=dense((cfg.vocab, cfg.dim)) * np.sqrt(cfg.dim), layers=layers, head=dense((cfg.dim, cfg.vocab)))


def rms_norm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def rope(x, positions, base):
    """x [..., tokens or batch, heads, head_dim] rotated by its positions (half-split layout)."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[..., None, None].astype(jnp.float32) * freqs  # [..., 1, half]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def mlp(p, x):
    return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def empty_caches(cfg: Config, batch: int):
    pages_per_row = cfg.max_len // cfg.page_size
    # Page 0 is spare; the count is rounded up to a multiple of 8 so pages shard evenly.
    shape = (-(-(batch * pages_per_row + 1) // 8) * 8, cfg.page_size, cfg.kv_heads, cfg.head_dim)
    caches = [(jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)) for _ in range(cfg.layers)]
    # Rows own shuffled pages (page 0 is spare), as a serving engine's allocator would hand out.
    order = np.random.default_rng(0).permutation(np.arange(1, batch * pages_per_row + 1))
    page_table = jnp.asarray(order.reshape(batch, pages_per_row), jnp.int32)
    return caches, page_table


@functools.partial(jax.jit, static_argnames=("cfg", "backend"), donate_argnames=("caches",))
def decode_step(params, caches, page_table, tokens, positions, *, cfg: Config, backend: str):
    """One token per row at ``positions``: returns (logits [batch, vocab], caches)."""
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
        attn = jax_decode.decode_attention(q, k_cache, v_cache, page_table, positions + 1, backend=backend)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="auto", choices=jax_decode.BACKENDS)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--tensor-parallel", type=int, default=1, help="devices the heads are sharded over")
    parser.add_argument("--sequence-parallel", type=int, default=1, help="devices the cache pages are sharded over")
    parser.add_argument(
        "--draft-tokens", type=int, default=0, help="verify this many tokens per row and step (0: one token)"
    )
    args = parser.parse_args()
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
        speculative_greedy(params, cfg, prompts, 2, args.draft_tokens, args.backend)  # compile
        start = time.perf_counter()
        drafted, calls = speculative_greedy(params, cfg, prompts, args.steps, args.draft_tokens, args.backend)
        elapsed = time.perf_counter() - start
        if not np.array_equal(drafted, tokens):
            raise SystemExit("speculative decoding gave other tokens than one-token decoding")
        print(f"--draft-tokens {args.draft_tokens}: the same tokens in {calls} verify steps (one-token decoding: "
              f"{args.steps}), {args.batch * args.steps / elapsed:.0f} tokens/s")  # fmt: skip


if __name__ == "__main__":
    main()
