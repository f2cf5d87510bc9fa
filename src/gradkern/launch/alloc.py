"""Output allocation for kernels that write every element of what they allocate, and the layout ATen gives them.

In deterministic mode PyTorch fills the memory of `torch.empty` (and `empty_like`, `empty_strided`) with NaN
(`torch.utils.deterministic.fill_uninitialized_memory`, on by default): for gradkern's outputs, which the kernel
then overwrites whole, an extra pass over them (a pad backward's grad_input: about a third more traffic). ATen's
own kernels allocate below that check; `empty` here does the same, through a storage of the caching allocator
(graph pools and streams as for torch.empty), and is torch.empty otherwise."""

from __future__ import annotations

import functools
import threading

import torch

from .._runtime import thread_value
from .checks import contiguous_strides, reach

__all__ = ["empty", "empty_like", "zeros", "empty_contiguous_like", "channels_last_format", "recording"]

_deterministic = torch._C._get_deterministic_algorithms
_fills = torch._C._get_deterministic_fill_uninitialized_memory


def empty(shape, dtype: torch.dtype, device: torch.device, stride=None) -> torch.Tensor:
    """An uninitialised tensor (contiguous, or with `stride`), never filled: the caller writes every element."""
    if not (_deterministic() and _fills()):
        return torch.empty(shape, dtype=dtype, device=device) if stride is None else \
            torch.empty_strided(shape, stride, dtype=dtype, device=device)
    stride, span = _layout(tuple(shape), None if stride is None else tuple(stride))
    rec = getattr(_recorder, "current", None)
    if rec is not None:
        rec.quiet += 1  # (the steps below are one allocation to the native router's recording)
    try:
        storage = torch.UntypedStorage(span * dtype.itemsize, device=device)
        out = torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape, stride)
    finally:
        if rec is not None:
            rec.quiet -= 1
    if rec is not None:
        rec.allocated(out)
    return out


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.empty_like(t, dtype=dtype)` for a `t` whose strides are dense (a permutation of contiguous ones,
    which empty_like keeps), never filled: the caller writes every element."""
    if not (_deterministic() and _fills()):
        return torch.empty_like(t) if dtype is None else torch.empty_like(t, dtype=dtype)
    return empty(t.shape, t.dtype if dtype is None else dtype, t.device, t.stride())


def zeros(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.zeros`, contiguous: one zero fill, where deterministic mode would fill with NaN first."""
    if not (_deterministic() and _fills()):
        return torch.zeros(shape, dtype=dtype, device=device)
    return empty(shape, dtype, device).zero_()


_recorder = threading.local()  # .current: the native router's recording on this thread (routing/native.py)


def recording(rec):
    """Within the block, this thread's unfilled allocations are noted by `rec.allocated(tensor)`."""
    return thread_value(_recorder, "current", rec)


@functools.lru_cache(maxsize=4096)
def _layout(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> tuple[tuple[int, ...], int]:
    """(strides, elements spanned) of a tensor of `shape` with `stride` (None: contiguous): worked out once a
    layout, since deterministic mode takes this path on every call (2x21x16x16 on the CPU: 4.8 -> 3.7 us a call)."""
    if stride is None:
        stride = contiguous_strides(shape)
    return stride, (1 + reach(shape, stride) if all(shape) else 0)


_CONTIGUOUS = torch.contiguous_format


def empty_contiguous_like(t: torch.Tensor) -> torch.Tensor:
    """`empty(t.shape, t.dtype, t.device)`, contiguous whatever t's layout; through empty_like where no fill is due
    (about half torch.empty's host time: no shape, dtype and device arguments to parse)."""
    if not (_deterministic() and _fills()):
        return torch.empty_like(t, memory_format=_CONTIGUOUS)
    return empty(t.shape, t.dtype, t.device)


def channels_last_format(t: torch.Tensor) -> torch.memory_format | None:
    """ATen's `suggest_memory_format()` where it is channels_last (4-D) or channels_last_3d (5-D), else None (the
    layout ATen's pool and upsample kernels give grad_input, from their input's strides): c10's
    is_channels_last_strides_{2d_s4,3d_s5}, strides decreasing in the order C, W, (H, D,) N, ambiguous cases
    contiguous."""
    if t.dim() not in (4, 5) or t.stride()[1] == 0:
        return None
    sizes, strides = t.shape, t.stride()
    low = 0
    for d in (1, *range(t.dim() - 1, 1, -1), 0):
        if sizes[d] == 0 or strides[d] < low or (d == 0 and low == strides[1]):
            return None
        low = strides[d] * sizes[d] if sizes[d] > 1 else strides[d]
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d
