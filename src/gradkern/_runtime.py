"""Where kernels run: compiled Triton on CUDA, or Triton's interpreter on CPU when TRITON_INTERPRET=1."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

#: The device type whose tensors gradkern's kernels take, and the dispatch key `enable()` registers on.
DEVICE_TYPE: str = "cpu" if INTERPRET else "cuda"
BACKEND_KEY: str = "CPU" if INTERPRET else "CUDA"
AUTOGRAD_KEY: str = "AutogradCPU" if INTERPRET else "AutogradCUDA"

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
}


I32_MAX = 2**31 - 1  # the largest offset or size a kernel may compute in int32


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): tile sizes on the host, without triton's constexpr wrapper."""
    return 1 << max(0, int(n) - 1).bit_length()


def pow2_dividing(n: int, cap: int = 16) -> int:
    """The largest power of two <= cap that divides n (0 divides by anything): what a kernel may be told of a
    size or stride it multiplies back by a constexpr, so that its accesses vectorise (Triton marks an int
    argument only when it divides by 16; rows of 56 columns hold 16-byte runs of 16-bit elements too)."""
    return min(n & -n, cap) if n else cap


def magic(n: int) -> tuple[int, int]:
    """(m, l) such that x // n == (x * m) >> (30 + l) == ((4 x * m) >> 32) >> l for every 0 <= x < 2^30 (Granlund
    and Montgomery: with l = ceil(log2 n) and m = ceil(2^(30 + l) / n), the error m * n - 2^(30 + l) is below
    n <= 2^l); m < 2^31, a positive int32 (n > 1). Kernels divide with `tl_helpers.div`."""
    lg = (n - 1).bit_length()
    return -(-(1 << (30 + lg)) // n), lg


def magics(divisors, bounds, allowed: bool = True) -> tuple[tuple[bool, ...], tuple[int, ...]]:
    """For a kernel's runtime divisors and a bound on each one's dividends: which it divides as a multiply-high and
    shifts (`tl_helpers.div`'s MAGIC: where `allowed`, 32-bit index math, the bound below 2^30 and the divisor not 1,
    which Triton makes a constant, so that the division folds away) and their (m, l) pairs, flat ((0, 0) where
    not)."""
    flags = tuple(bool(allowed) and n != 1 and b < 2**30 for n, b in zip(divisors, bounds, strict=True))
    return flags, tuple(x for n, on in zip(divisors, flags, strict=True) for x in (magic(n) if on else (0, 0)))


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels compute in: fp64 for fp64 inputs, fp32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints: what triton.cdiv gives, for host code (triton.cdiv is a constexpr function there,
    about 2 us a call on a hot path)."""
    return -(-a // b)


def values_key(values) -> tuple | None:
    """A cache-key part for a sequence of int-like arguments (dims, repeats, sizes): the values with their types
    (2.0 and True equal 2 and 1, but only ints are valid); None, so not cached, where a tensor is among them (its
    value is read on every call, not hashed by identity)."""
    values = tuple(values)
    types = tuple(map(type, values))
    return None if torch.Tensor in types else (values, types)


def meta_key(values) -> tuple:
    """A cache-key part for arguments a check reads: each tensor's shape, dtype, device and negative bit, the type of
    anything else (a check reads no more of it)."""
    return (*[(v.shape, v.dtype, v.device, v.is_neg()) if isinstance(v, torch.Tensor) else type(v) for v in values],)


@contextlib.contextmanager
def thread_value(local, name: str, value) -> Iterator[None]:
    """`local.<name>` (a threading.local's attribute) set to `value` within the block, restored after; blocks
    nest."""
    previous = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, previous)


def default_device() -> torch.device:
    """The device gradkern's kernels take tensors on in this process (`gradkern.device()`): the current CUDA
    device, or the CPU when Triton's interpreter is on. Raises if there is neither."""
    if INTERPRET:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "gradkern: no CUDA device is available; set TRITON_INTERPRET=1 to run the kernels on CPU "
            "through Triton's interpreter"
        )
    return torch.device("cuda", torch.cuda.current_device())


def has_gpu() -> bool:
    return (not INTERPRET) and torch.cuda.is_available()
