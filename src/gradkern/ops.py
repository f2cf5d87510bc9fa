"""Every gradkern kernel as a plain function: `gradkern.ops.<name>(...)`, with ATen's names and signatures for
ATen ops. Generated from the registry: an op is declared once, next to its kernel.

Each function is also a torch.library custom op, `torch.ops.gradkern.<name>`, whose fake (meta) implementation
is the op's reference computation run on fake tensors. Inside a `torch.compile` region `gradkern.ops.<name>`
calls the custom op, so compiled graphs keep gradkern's kernel as one opaque node (no graph break); in eager code
it calls the kernel's function directly (no dispatcher overhead)."""

from __future__ import annotations

import functools
import inspect
import logging
import typing
from collections.abc import Callable

import torch

from . import kernels as _kernels  # noqa: F401  (importing declares every op)
from .registry import REGISTRY as _REGISTRY
from .registry import OpInfo

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _custom_op(info: OpInfo):
    """`torch.ops.gradkern.<name>`: the op's positional signature (its out= keywords left out: a custom op must
    not write its inputs), schema inferred from the type hints, fake implementation = the op's reference."""
    fn = info.fn
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = [p.replace(annotation=hints.get(p.name, p.annotation))
              for p in sig.parameters.values() if p.kind in _POSITIONAL]

    def prototype(*args):
        return fn(*args)

    prototype.__signature__ = sig.replace(parameters=params, return_annotation=hints.get("return"))
    prototype.__name__ = info.name
    op = torch.library.custom_op(f"gradkern::{info.name}", prototype, mutates_args=())
    fake = info.fake if info.fake is not None else info.reference_fn()
    positional = prototype.__signature__

    def fake_impl(*args, **kwargs):  # the dispatcher may leave out trailing arguments at their defaults
        bound = positional.bind(*args, **kwargs)
        bound.apply_defaults()
        return fake(*bound.args)

    op.register_fake(fake_impl)
    return op


#: op name -> why it has no custom op (its signature has types torch.library cannot express); such an op is
#: traced into under torch.compile instead.
NO_CUSTOM_OP: dict[str, str] = {}


def _public(info: OpInfo) -> tuple[Callable, object]:
    fn = info.fn
    quiet = logging.getLogger("torch._library.opaque_object")  # it logs each type it cannot express
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        op = _custom_op(info)
    except (ValueError, TypeError) as e:
        NO_CUSTOM_OP[info.name] = str(e).split(" The valid types")[0].split(" Got func")[0]
        return fn, None
    finally:
        quiet.setLevel(level)
    n_positional = sum(1 for p in inspect.signature(fn).parameters.values() if p.kind in _POSITIONAL)
    out_names = [p.name for p in inspect.signature(fn).parameters.values() if p.kind == p.KEYWORD_ONLY]

    @functools.wraps(fn)
    def public(*args, **kwargs):
        if not torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        outs = {k: kwargs.pop(k) for k in out_names if kwargs.get(k) is not None}
        for k in out_names:
            kwargs.pop(k, None)
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        bound.apply_defaults()
        result = op(*list(bound.arguments.values())[:n_positional])
        for t in outs.values():  # out= under compile: the custom op's result copied into the given tensor
            t.copy_(result)
            result = t
        return result

    public.custom_op = op
    return public, op


_CUSTOM = {}
for _name, _info in sorted(_REGISTRY.items()):
    globals()[_name], _op = _public(_info)
    if _op is not None:
        _CUSTOM[_name] = _op

__all__ = sorted(_REGISTRY)
