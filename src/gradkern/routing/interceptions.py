"""Python-level routes: functions PyTorch calls before dispatch, replaced while gradkern is enabled.

In deterministic mode, three `torch.nn.functional` paths leave ATen before dispatch for a decomposition whose
backward is a sort-based `index_put` (14-54x slower than ATen's kernels, measured on an H100):

* `F.pad(mode="replicate")` (nn.ReplicationPad*d) calls `decompositions._replication_pad` instead of
  `aten::replication_pad*d`;
* `F.interpolate(mode="bilinear")` on 4-D and `"trilinear"` on 5-D inputs call `decompositions._upsample_linear_vec`
  instead of `aten::upsample_bilinear2d` / `upsample_trilinear3d`;
* `F.max_pool3d(return_indices=True)` (nn.MaxPool3d(return_indices=True)) calls
  `decompositions.max_pool3d_with_indices` instead of `aten::max_pool3d_with_indices`.

Each looks its function up on `torch._decomp.decompositions` at every call, so while gradkern is enabled a wrapper
stands there (`dispatch.intercept`: installed by `enable()`, removed by `disable()`) that takes the path the
function takes outside deterministic mode: the ATen op, whose forward is deterministic and whose backward
gradkern serves. A call keeps the original decomposition wherever gradkern would not serve that backward: routing
off, another device, tensor subclasses (fake or functional tensors while tracing), while compiling, a backward op
gradkern does not declare, and problems ATen's kernel refuses where the decomposition does not."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch

from .. import _runtime
from .._runtime import I32_MAX
from ..kernels.pad import padded_shape
from ..registry import REGISTRY
from .dispatch import intercept, is_enabled

_PLAIN = (torch.Tensor, torch.nn.Parameter)  # (subclasses, such as FakeTensor while tracing, keep the original)


def _may_serve(t) -> bool:
    """Whether gradkern may serve a backward for tensor `t` right now."""
    return (is_enabled() and type(t) in _PLAIN and t.device.type == _runtime.DEVICE_TYPE
            and not torch.compiler.is_compiling())


def _route(name: str, backward: Callable[..., str | None], aten: Callable) -> None:
    """While gradkern is enabled, `decompositions.<name>(*args)` calls `aten(*args)` instead wherever
    `backward(*args)` names a backward op gradkern serves for the first argument (None: not this call)."""

    def wrap(original):
        def routed(*args, **kwargs):
            if args and not kwargs and _may_serve(args[0]) and backward(*args) in REGISTRY:
                return aten(*args)
            return original(*args, **kwargs)
        return routed

    intercept(importlib.import_module("torch._decomp.decompositions"), name, wrap)


# ----------------------------------------------------------------------------------------------- F.pad
def _replication_pad_backward(a, padding) -> str | None:
    if len(padding) > 2 * a.dim() or len(padding) % 2 or not 2 <= len(padding) <= 6:  # (the original's rules)
        return None
    out = padded_shape(a.shape, padding)
    # ATen's kernel refuses an empty input or output (the decomposition returns them), and its CUDA kernel
    # indexes in 32 bits
    if a.numel() == 0 or min(out) <= 0 or max(a.numel(), math.prod(out)) > I32_MAX:
        return None
    return f"replication_pad{len(padding) // 2}d_backward"


_route("_replication_pad", _replication_pad_backward, lambda a, padding: torch._C._nn.pad(a, padding, "replicate"))


# ----------------------------------------------------------------------------------------------- F.interpolate
_LINEAR = {3: "upsample_linear1d", 4: "upsample_bilinear2d", 5: "upsample_trilinear3d"}  # by input rank


def _upsample_linear_backward(input, output_size, align_corners, scale_factors) -> str | None:
    name = _LINEAR.get(input.dim())
    return None if name is None or input.numel() == 0 else f"{name}_backward"


def _upsample_linear(input, output_size, align_corners, scale_factors):
    return getattr(torch._C._nn, _LINEAR[input.dim()])(input, output_size, align_corners, scale_factors)


_route("_upsample_linear_vec", _upsample_linear_backward, _upsample_linear)


# ----------------------------------------------------------------------------------------------- F.max_pool3d
def _max_pool3d_backward(input, *args) -> str | None:
    return "max_pool3d_with_indices_backward" if input.dim() in (4, 5) and input.numel() > 0 else None


_route("max_pool3d_with_indices", _max_pool3d_backward, torch._C._nn.max_pool3d_with_indices)
