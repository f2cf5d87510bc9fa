"""Triton helpers every kernel shares (import these rather than re-deriving them in an op file)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._runtime import INTERPRET

_INTERPRETED = tl.constexpr(INTERPRET)

#: the Triton dtype kernels compute in, by `_runtime.math_dtype` (fp64 for fp64 inputs, fp32 for the rest)
TL_MATH = {torch.float32: tl.float32, torch.float64: tl.float64}

try:  # programmatic dependent launch's wait (griddepcontrol.wait): see `launcher.pdl_ok`
    from triton.language.extra.cuda import gdc_wait
    HAS_GDC = True
except ImportError:  # pragma: no cover - a Triton without it: PDL stays off and this is never called
    HAS_GDC = False

    @triton.jit
    def gdc_wait():
        pass


@triton.jit
def scalar(bits, MATH: tl.constexpr):
    """A float scalar passed as the int64 bits of its float64 value (see `launcher.scalar_bits`)."""
    return bits.to(tl.int64).to(tl.float64, bitcast=True).to(MATH)


@triton.jit
def below(col, n, V: tl.constexpr):
    """col < n, for a multiple n of V: as (col // V) < (n // V), so that Triton sees the mask constant over runs of
    V columns (a mask that may change at any column keeps the vector stores and loads scalar where n is not known
    to be a multiple of 16)."""
    if V > 1:
        return col // V < n // V
    else:
        return col < n


@triton.jit
def div(x, n, m, sh, MAGIC: tl.constexpr):
    """x // n for 0 <= x; with MAGIC (32-bit x < 2^30), as the high word of (4 x) m shifted right by sh, m and sh
    from `_runtime.magic` (`_runtime.magics` decides MAGIC): a multiply and two shifts where a division by a runtime
    n takes some 20 instructions."""
    if MAGIC:
        return tl.umulhi(x * 4, m) >> sh
    else:
        return x // n


@triton.jit
def divmod_(x, n, m, sh, MAGIC: tl.constexpr):
    """(x // n, x % n) for 0 <= x, as `div`."""
    q = div(x, n, m, sh, MAGIC)
    return q, x - q * n


@triton.jit
def _round_bf16(x):
    # round-to-nearest-even to bfloat16 precision, staying in fp32 (NaN kept as is)
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def cast_in(x, MATH: tl.constexpr):
    """`x.to(MATH)`, exact everywhere: bf16 by its bits (the top half of a float32), because Triton's interpreter
    flushes bf16 subnormals to zero on the way up (seen with triton 3.9); compiled, it is the same shift."""
    if x.dtype.is_bf16():
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True).to(MATH)
    else:
        return x.to(MATH)


@triton.jit
def cast_out(x, DT: tl.constexpr):
    """`x.to(DT)` with round-to-nearest-even everywhere: Triton's interpreter truncates fp32 -> bf16
    (seen with triton 3.9), compiled Triton rounds; this makes both round."""
    if _INTERPRETED and DT == tl.bfloat16:
        return _round_bf16(x.to(tl.float32)).to(DT)
    else:
        return x.to(DT)
