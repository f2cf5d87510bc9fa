"""Autograd-level overrides: how `enable()` puts a fused backward under a stock ATen op without bypassing autograd.

An op whose gradients gradkern computes in one fused pass (where, lerp, prelu) cannot be routed on the backend key:
its backward is a formula of several ATen calls (one kernel per input) that autograd runs, so a backend kernel
would only replace the forward - and registering a backend kernel for an op autograd *decomposes*
(CompositeImplicitAutograd, e.g. `where.ScalarOther`) replaces the decomposition on that device and silently drops
the graph: the zero gradients of FlagGems #1971. Instead such an op registers on the autograd key
(`register_op(..., dispatch="autograd")`) an override made by `fused_autograd`:

* it declines (NotImplemented -> `dispatch` runs ATen's own autograd kernel, so stock autograd, graph included)
  unless grad mode is on, some input requires grad, and every tensor is a plain strided tensor on gradkern's
  device, outside functorch transforms, forward-mode AD and torch-dispatch modes (FakeTensor tracing), and the
  op's own `accepts` (dtypes: integer `torch.where` stays stock) agrees;
* otherwise it runs a `torch.autograd.Function`: the forward is stock PyTorch (`dispatch.stock_call`), it saves
  only what the requested gradients need, and its backward runs the fused kernel for exactly the inputs that
  require grad;
* double backward: with `create_graph=True` the backward runs the op's `composite` instead - the differentiable
  ATen formula of derivatives.yaml - so higher-order gradients are stock PyTorch's; so does an incoming gradient
  that is not a plain tensor (`plain_gradient`: a negative-bit view, a subclass, a zero tensor, a batched one).

Where the native router is built (routing/native.py), a C++ router sits over each of these overrides: a plain call
of a descriptor the override accepts runs stock's forward below autograd and a C++ node that calls the op's fused
backward (or its composite) through twin ops, so that a repeated forward + backward does not enter Python.

Pick the overload that autograd itself differentiates (its kernel on the `Autograd` alias key, `derivatives.yaml`):
`where.self`, `lerp.Scalar`, `lerp.Tensor`, `_prelu_kernel`. Composite entry points (`where.ScalarOther`,
`Tensor.where`, `prelu`) decompose into these above the autograd key and so reach the override on their own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import forward_ad

from .. import _runtime
from ..errors import RankUnsupported
from ..registry import REGISTRY
from .dispatch import stock_call

__all__ = ["fused_autograd", "plain_tensors", "plain_gradient", "direct_apply", "STOCK_IN_AUTO",
           "NATIVE_IN_AUTO"]

# enable()'s route (registry.OpInfo.route) for an autograd-key override not shown to gain in a model step (prelu,
# repeat): stock is deterministic for them, and the override costs host time on every call of its op
STOCK_IN_AUTO = {"route": False, "route_doc": "stock (deterministic; an autograd-key override costs host time a call, "
                 "declined or not); gradkern's fused backward only in mode \"always\""}
# ... and for one whose C++ node costs no more host time than stock's autograd node and gains in a model step: every
# problem its override accepts, in mode "auto" too, where the native router is built (dispatch.auto_registers);
# the figures are in docs/tuning/routing.md
NATIVE_IN_AUTO = {"route": None, "route_doc": "gradkern's fused backward for every problem the override accepts, "
                  "where the native router is built (its C++ autograd node costs no more host time than stock's); "
                  "stock (deterministic) where it is not"}

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor  # a vmap-batched (or functorch-wrapped) tensor
_transforms_active = torch._C._are_functorch_transforms_active
_dispatch_modes = torch._C._len_torch_dispatch_stack


def plain_tensors(args) -> bool:
    """True when gradkern's kernels can take the tensors among `args` as they are: plain strided tensors (or
    Parameters; not negative-bit views, zero tensors or functorch-wrapped ones, such as the batched gradient of
    `autograd.grad(..., is_grads_batched=True)`) all on one device of gradkern's type, with no functorch
    transform, forward-AD level or torch dispatch mode active (those need ATen's own autograd kernel)."""
    if _transforms_active() or forward_ad._current_level >= 0 or _dispatch_modes():
        return False
    device = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if (type(a) not in _PLAIN_TYPES or a.layout != _STRIDED or a.is_neg() or a._is_zerotensor()
                    or _wrapped(a)):
                return False
            if device is None:  # (the device's type read once: device.type builds a string)
                device = a.device
                if device.type != _runtime.DEVICE_TYPE:
                    return False
            elif a.device != device:
                return False
    return device is not None


_DENSE = getattr(torch._C.DispatchKey, _runtime.BACKEND_KEY)
_keys = torch._C._dispatch_keys


def plain_gradient(grad) -> bool:
    """Whether a backward's incoming gradient is a tensor the kernels can read as plain storage: `plain_tensors`,
    and a dense tensor of the backend (the batched gradient of `autograd.grad(..., is_grads_batched=True)`, which
    `jacobian(vectorize=True)` also uses, is a storage-less BatchedTensor of legacy vmap)."""
    return plain_tensors((grad,)) and _keys(grad).has(_DENSE)


def direct_apply(function: type[torch.autograd.Function]) -> Callable:
    """`function.apply` without autograd.Function.apply's Python prologue (binding for setup_context, functorch's
    check and its unwrapping of dead wrappers: about 1 us a call), for callers that found `plain_tensors` true (no
    transform active, no wrapped tensor) and a Function without setup_context."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, function)
    except (AttributeError, KeyError, TypeError):  # (another PyTorch: the public entry point)
        return function.apply


def fused_autograd(op_name: str, overload: str, *, accepts: Callable[..., bool], save: Callable,
                   fused: Callable, composite: Callable) -> Callable:
    """The autograd-key override of ATen `overload` for gradkern op `op_name`.

    `accepts(*args)`: whether the fused path takes these ATen arguments (beyond `plain_tensors`).
    `save(ctx, needs, *args)`: keep on `ctx` what the backward needs (`ctx.save_for_backward` for tensors);
    `needs` is `ctx.needs_input_grad`.
    `fused(ctx, grad, needs)` / `composite(ctx, grad, needs)`: one gradient (or None) per ATen argument - the
    fused kernel, and the differentiable ATen formula used when the backward itself is differentiated."""
    stock: list[Callable] = []

    def forward(ctx, *args):
        if not stock:
            stock.append(stock_call(REGISTRY[op_name], overload))
        save(ctx, ctx.needs_input_grad, *args)
        return stock[0](*args)

    def backward(ctx, grad):
        needs = ctx.needs_input_grad
        # create_graph=True (the gradient must itself be differentiable), or an incoming gradient the kernels
        # cannot read as plain storage (a negative-bit view, a subclass, a zero tensor, a batched gradient under
        # vmap: is_grads_batched, jacobian(vectorize=True)): the ATen formula
        if torch.is_grad_enabled() or not plain_gradient(grad):
            return tuple(composite(ctx, grad, needs))
        try:
            return tuple(fused(ctx, grad, needs))
        except RankUnsupported:  # more dims than the kernels index, found before any launch
            return tuple(composite(ctx, grad, needs))

    name = "Gradkern" + "".join(p.capitalize() for p in overload.replace(".", "_").split("_"))  # node: ...Backward
    function = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward), "__module__": __name__})
    apply = direct_apply(function)

    def override(*args, **kwargs):
        if kwargs or not torch.is_grad_enabled():
            return NotImplemented
        for a in args:  # (a loop, not any() over a generator: this runs on every call)
            if isinstance(a, torch.Tensor) and a.requires_grad:
                break
        else:
            return NotImplemented
        if not plain_tensors(args) or not accepts(*args):
            return NotImplemented
        return apply(*args)

    override.function = function  # for tests: the Function whose backward is fused
    override.parts = (accepts, save, fused, composite)  # for the native router (routing/native.py)
    return override
