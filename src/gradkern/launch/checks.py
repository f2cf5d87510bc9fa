"""Argument checks every op shares: tensor dtype/device, like-ness, broadcasting, type promotion and ATen's
output-overlap rules, each raising gradkern's named errors before anything is written."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _runtime
from ..config import PlanCache
from ..errors import InvalidProblem, Unsupported


def result_dtype(ts: Sequence[torch.Tensor]) -> torch.dtype:
    """ATen's type promotion over floating tensors: 0-d tensors take part only when no tensor has dims (an f32
    vector with an f64 0-d tensor gives f32, as in torch.result_type)."""
    pool = [t.dtype for t in ts if t.dim() > 0] or [t.dtype for t in ts]
    out = pool[0]
    for d in pool[1:]:
        out = torch.promote_types(out, d)
    return out


def check_tensor(op: str, arg: str, t, dtypes: Sequence[torch.dtype] = _runtime.FLOAT_DTYPES) -> None:
    """Raise the named error unless `t` is a tensor of one of `dtypes` on gradkern's device type, without a
    pending negation (a negative-bit view: under enable() PyTorch resolves those before a kernel is reached)."""
    if not isinstance(t, torch.Tensor):
        raise Unsupported(op, arg, "a torch.Tensor", type(t).__name__)
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise Unsupported(op, arg, f"a tensor of dtype {names}", t.dtype)
    if t.device.type != _runtime.DEVICE_TYPE:
        where = "cuda" if _runtime.DEVICE_TYPE == "cuda" else "cpu (TRITON_INTERPRET=1)"
        raise Unsupported(op, arg, f"a tensor on device {where}", f"a tensor on device {t.device}")
    if not torch.compiler.is_compiling() and t.is_neg():  # the kernels read storage as is: a pending negation
        # would be lost (traced code reaches the kernels through custom ops, with real tensors)
        raise Unsupported(op, arg, "a tensor without a pending negation (call .resolve_neg() first)",
                          "a negative-bit view")


def check_like(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    """Raise the named error (Unsupported) unless tensor `t` (argument `arg`) has the dtype and device of `ref`."""
    if t.dtype != ref.dtype:
        raise Unsupported(op, arg, f"dtype {ref.dtype} (the dtype of {ref_arg})", t.dtype)
    if t.device != ref.device:
        raise Unsupported(op, arg, f"a tensor on {ref.device} (the device of {ref_arg})", t.device)


# shapes -> broadcast shape (torch.broadcast_shapes costs 10-20 us a call)


_BROADCAST = PlanCache("launch.checks._BROADCAST")


def broadcast_shape(op: str, names: Sequence[str], shapes: Sequence) -> tuple[int, ...]:
    """torch.broadcast_shapes(*shapes) as a tuple (cached: fused backwards ask on every call), or InvalidProblem
    naming each input (`names`, one per shape) with its shape."""
    try:
        key = tuple(tuple(s) for s in shapes)
        shape = _BROADCAST.get(key)
    except TypeError:  # symbolic sizes: not cached
        key, shape = None, None
    if shape is None:
        try:
            shape = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError:
            given = ", ".join(f"{n}{tuple(s)}" for n, s in zip(names, shapes, strict=False))
            raise InvalidProblem(op, "/".join(names), "shapes that broadcast together", given) from None
        _BROADCAST.remember(key, shape)
    return shape


def check_out_overlap(op: str, name: str, out: torch.Tensor, inputs: dict, allow_same: bool = True) -> None:
    """ATen's memory-overlap rules for an output given by the caller, as named errors (InvalidProblem) raised
    before anything is written: `out` may not have elements that share memory (an expanded tensor: threads would
    race to write them), and may not partly overlap an input (`inputs`: name -> tensor or None), which would make
    the result depend on the order in which programs run. The same memory in the same layout (an in-place call)
    is allowed where `allow_same`, as ATen allows it for elementwise ops. As in ATen, an overlap that cannot be
    told from the layouts (a tensor with gaps) is let through."""
    if torch._debug_has_internal_overlap(out) == 1:
        raise InvalidProblem(op, name, "a tensor whose elements do not overlap in memory", f"strides {out.stride()}")
    if out.numel() == 0:
        return
    lo = out.data_ptr()
    hi = lo + _span_bytes(out)
    for arg, t in inputs.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device != out.device:
            continue
        if t.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
            continue
        t_lo = t.data_ptr()
        if t_lo >= hi or t_lo + _span_bytes(t) <= lo or not (_dense_strides(out) and _dense_strides(t)):
            continue
        same = t_lo == lo and t.shape == out.shape and t.stride() == out.stride() and t.dtype == out.dtype
        if not (same and allow_same):
            raise InvalidProblem(op, name, f"a tensor that does not {'share' if same else 'partly share'} memory "
                                 f"with '{arg}'", "one that does")


def reach(shape: Sequence[int], stride: Sequence[int]) -> int:
    """The largest element offset, from its first element, of a non-empty tensor of this layout (what a kernel's
    offsets into it can reach)."""
    return sum((d - 1) * st for d, st in zip(shape, stride, strict=True))


def _span_bytes(t: torch.Tensor) -> int:
    return (1 + reach(t.shape, t.stride())) * t.element_size()


def contiguous_strides(shape) -> tuple[int, ...]:
    """The strides of a contiguous tensor of `shape`, as c10 computes them (a size-0 dim counts as 1), without
    making a meta tensor for them (several us a call)."""
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(out))


def _dense_strides(t: torch.Tensor) -> bool:
    """True if `t` covers its storage span exactly once (no gaps, no overlap), in some dim order."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride(), strict=False), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True
