"""Benchmarks of jax_decode on a GPU: ``python -m benchmarks.bench`` and the tools beside it."""
