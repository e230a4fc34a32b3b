"""The cuda alias's two errors: it cannot turn on, or a CUDA feature it does not cover was used."""

from __future__ import annotations

from ..errors import FlError


class CudaAliasError(FlError):
    """The alias was asked for but cannot turn on (a real CUDA device is present and force was not given)."""


class UnsupportedCudaFeatureError(FlError, NotImplementedError):
    """A CUDA feature the alias does not cover (CUDA graphs, NCCL, custom CUDA kernels, ...). The message
    names the feature and what to use instead."""
