"""Example-problem builders shared by op files (for `check`, `bench` and the generic tests)."""

from __future__ import annotations

import torch

from .registry import Case

#: Size classes every op's `cases(device, dtype, size)` understands: "tiny" is the host-overhead size (about 4K
#: elements), "small" what the interpreter runs (CI, tests on CPU), "check" the GPU test/check size, "large" the
#: benchmark's (>= 256 MB moved in f32).
SIZES = ("tiny", "small", "check", "large")
POINTWISE_N = {"tiny": 4096, "small": 1 << 12, "check": 1 << 20, "large": 1 << 26}


def matrix_shape(size: str) -> tuple[int, int]:
    """(rows, cols) of a near-square 2-D problem of POINTWISE_N[size] elements (for row/column broadcasts)."""
    n = POINTWISE_N[size]
    rows = 1 << ((n.bit_length() - 1) // 2)
    return rows, n // rows


def randn(shape, device, dtype, *, scale: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random normal values (never zeros) made in float32 and cast, so every dtype sees the same problem."""
    t = torch.randn(shape, device=device, dtype=torch.float32, generator=generator) * scale
    return t.to(dtype)


def stand_in(shape, device, dtype) -> torch.Tensor:
    """A tensor of `shape` and `dtype` that owns one element (a broadcast view): for arguments whose shape and
    dtype are all a kernel reads (e.g. where's self/other), so that large cases do not allocate them. Zero, not
    uninitialised: a NaN there would make bitwise input checks fail spuriously."""
    return torch.zeros((), dtype=dtype, device=device).expand(shape)


def pointwise_cases(make_args, n_inputs: int, n_outputs: int = 1):
    """A `cases(device, dtype, size)` for an elementwise op: `make_args(device, dtype, n)` returns a list of
    (label, args) pairs over 1-D tensors of n elements."""

    def cases(device, dtype, size: str) -> list[Case]:
        n = POINTWISE_N[size]
        el = torch.empty((), dtype=dtype).element_size()
        return [Case(f"{label} n={n}", args, {}, bytes=(n_inputs + n_outputs) * n * el, elements=n)
                for label, args in make_args(device, dtype, n)]

    return cases
