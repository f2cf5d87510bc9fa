"""Every gradkern kernel as a plain function: `gradkern.ops.<name>(...)`, with ATen's names and signatures for
ATen ops. Generated from the registry: an op is declared once, next to its kernel.

Each function is also a torch.library custom op, `torch.ops.gradkern.<name>`, whose fake (meta) implementation
is the op's own `fake` or else its reference computation run on fake tensors; with the reference, the custom op's
results (real and fake alike) are made contiguous, since the kernels' output layouts need not be the reference's
and a compiled graph asserts the fake's strides.
Inside a `torch.compile` region `gradkern.ops.<name>` calls the custom op, so compiled graphs keep gradkern's
kernel as one opaque node (no graph break); in eager code, on CUDA, it calls its twin op through the native router
(loaded at the first call; every op but those split by argument kind, and not for out= calls: routing/native.py), so
that a repeated call replays from C++, else the kernel's function directly."""

from __future__ import annotations

import collections.abc
import functools
import inspect
import itertools
import logging
import typing
from collections.abc import Callable

import torch

from . import kernels as _kernels  # noqa: F401  (importing declares every op)
from .errors import Unsupported
from .registry import REGISTRY as _REGISTRY
from .registry import OpInfo
from .routing.native import eager_call as _eager_call

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _custom_op(info: OpInfo):
    """`torch.ops.gradkern.<name>`: the op's positional signature (its out= keywords left out: a custom op must
    not write its inputs), schema inferred from the type hints, fake implementation = the op's reference."""
    fn = info.fn
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = [p.replace(annotation=hints.get(p.name, p.annotation))
              for p in sig.parameters.values() if p.kind in _POSITIONAL]

    fake, layout = _fake_and_layout(info)

    def prototype(*args):
        return layout(fn(*args))

    prototype.__signature__ = sig.replace(parameters=params, return_annotation=hints.get("return"))
    prototype.__name__ = info.name
    op = torch.library.custom_op(f"gradkern::{info.name}", prototype, mutates_args=())
    positional = prototype.__signature__

    def fake_impl(*args, **kwargs):  # the dispatcher may leave out trailing arguments at their defaults
        bound = positional.bind(*args, **kwargs)
        bound.apply_defaults()
        return layout(fake(*bound.args))

    op.register_fake(fake_impl)
    return op


# Ops whose signatures torch.library cannot express directly - a Tensor-or-number argument (where's self/other,
# lerp's weight), optional outputs (None for gradients not asked for) - get one custom op per combination of
# Tensor / number arguments, `gradkern::<name>__<t|s...>`, returning the list of the outputs that are not None.
# Which outputs are None follows from the arguments: output i belongs to the i-th of the arguments just before
# `output_mask`, and is None when the mask says so or that argument is a number.
_NUMBER = int | float | bool  # torch.library's "Scalar"

#: op name -> why it has no custom op at all; such an op is traced into under torch.compile instead.
NO_CUSTOM_OP: dict[str, str] = {}


def _eager_only(op: str, fn: Callable) -> Callable:
    """`fn` as gradkern.ops.<op> runs it outside torch.compile: refusing inputs that require grad."""
    names = [p.name for p in inspect.signature(fn).parameters.values() if p.kind in _POSITIONAL]

    @functools.wraps(fn)
    def public(*args, **kwargs):
        if _grad_enabled():
            _refuse_requires_grad(op, names, args, kwargs)
        return fn(*args, **kwargs)

    return public


_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor


def _refuse_requires_grad(op: str, names: list[str], args: tuple, kwargs: dict) -> None:
    """gradkern.ops.* are plain kernels: a result computed from an input that requires grad would silently carry
    no graph (stock's ATen op would). Named error instead, saying what to use."""
    for i, a in enumerate(args):
        if isinstance(a, _Tensor) and a.requires_grad:
            _requires_grad_error(op, names[i] if i < len(names) else str(i))
    if kwargs:
        for k, a in kwargs.items():
            if isinstance(a, _Tensor) and a.requires_grad:
                _requires_grad_error(op, k)


def _requires_grad_error(op: str, arg: str):
    raise Unsupported(op, arg, "a tensor that does not require grad (gradkern.ops.* are not differentiable: call "
                      "it under torch.no_grad() or on .detach()ed tensors; for gradients use PyTorch's op with "
                      "gradkern.enable(), or gradkern.sparsemax / gradkern.segment_max)", "one that requires grad")


def _same(x):
    return x


def _contiguous(x):
    """Every tensor among the results `x` (a tensor, or a tuple or list with Nones) made contiguous."""
    if isinstance(x, torch.Tensor):
        return x.contiguous()
    if isinstance(x, (tuple, list)):
        return type(x)(_contiguous(t) for t in x)
    return x


def _fake_and_layout(info: OpInfo) -> tuple[Callable, Callable]:
    """The custom op's fake, and what both it and the real op do to their results: an op's own fake states the
    kernels' layouts (nothing to do); the reference (often ATen's op) follows its own layout rules, so with it
    both sides return contiguous results."""
    if info.fake is not None:
        return info.fake, _same
    return info.reference_fn(), _contiguous


def _is_tensor_or_number(hint) -> bool:
    if hint is inspect.Parameter.empty:
        return True
    args = typing.get_args(hint)
    return torch.Tensor in args and any(a is not torch.Tensor and a is not type(None) for a in args)


def _variant_ops(info: OpInfo) -> dict[tuple[bool, ...], object]:
    """(is-tensor flags of the Tensor-or-number arguments) -> custom op returning list[Tensor]."""
    fn = info.fn
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = [p for p in sig.parameters.values() if p.kind in _POSITIONAL]
    varying = [p.name for p in params if _is_tensor_or_number(hints.get(p.name, p.annotation))]
    fake, layout = _fake_and_layout(info)
    ops = {}
    for flags in itertools.product((True, False), repeat=len(varying)):
        kinds = dict(zip(varying, flags))
        annotated = []
        for p in params:
            hint = hints.get(p.name, p.annotation)
            if p.name in kinds:
                hint = torch.Tensor if kinds[p.name] else _NUMBER
            elif typing.get_origin(hint) in (collections.abc.Sequence, list, tuple):
                hint = list[typing.get_args(hint)[0]]
            annotated.append(p.replace(annotation=hint, default=inspect.Parameter.empty))

        def prototype(*args):
            return [layout(t) for t in _as_tuple(fn(*args)) if t is not None]

        prototype.__signature__ = inspect.Signature(annotated, return_annotation=list[torch.Tensor])
        suffix = "".join("t" if f else "s" for f in flags)
        prototype.__name__ = f"{info.name}__{suffix}" if suffix else f"{info.name}__list"
        op = torch.library.custom_op(f"gradkern::{prototype.__name__}", prototype, mutates_args=())
        op.register_fake(lambda *args, _f=fake: [layout(t) for t in _as_tuple(_f(*args)) if t is not None])
        ops[flags] = op
    return ops


def _as_tuple(x):
    return x if isinstance(x, (tuple, list)) else (x,)


def _present(names: list[str], values: list) -> list[bool] | None:
    """Which outputs are not None, by the output_mask rule above (None: the op has no output_mask)."""
    if "output_mask" not in names:
        return None
    k = names.index("output_mask")
    mask = list(values[k])
    owners = values[k - len(mask):k]
    return [bool(m) and isinstance(v, torch.Tensor) for m, v in zip(mask, owners, strict=True)]


def _public(info: OpInfo) -> tuple[Callable, object]:
    fn = info.fn
    quiet = logging.getLogger("torch._library.opaque_object")  # it logs each type it cannot express
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    variants = None
    try:
        op = _custom_op(info)
    except (ValueError, TypeError) as e:
        op = None
        try:
            variants = _variant_ops(info)
        except (ValueError, TypeError) as e2:
            NO_CUSTOM_OP[info.name] = f"{str(e).split(' The valid types')[0].split(' Got func')[0]} ({e2})"
            return _eager_only(info.name, fn), None
    finally:
        quiet.setLevel(level)
    sig = inspect.signature(fn)
    names = [p.name for p in sig.parameters.values() if p.kind in _POSITIONAL]
    by_name = frozenset(names)  # keywords the twin takes as they are (not out=, not unknown ones: those stay in Python)
    out_names = [p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
    hints = typing.get_type_hints(fn)
    varying = [nm for nm in names if _is_tensor_or_number(hints.get(nm, inspect.Parameter.empty))]

    compiling = torch.compiler.is_compiling

    @functools.wraps(fn)
    def public(*args, **kwargs):
        if not compiling():
            # the eager path, inlined (one Python frame less a call): refuse inputs that require grad
            if _grad_enabled():
                _refuse_requires_grad(info.name, names, args, kwargs)
            if not kwargs or by_name.issuperset(kwargs):
                fast = _eager_call(info.name)  # (the native router's, loaded at the first call: routing/native.py)
                if fast is not None:
                    return fast(*args, **kwargs)
            return fn(*args, **kwargs)
        outs = {k: kwargs.pop(k) for k in out_names if kwargs.get(k) is not None}
        for k in out_names:
            kwargs.pop(k, None)
        bound = sig.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        values = [bound.arguments[nm] for nm in names]
        if op is not None:
            result = op(*values)
        else:
            flags = tuple(isinstance(bound.arguments[nm], torch.Tensor) for nm in varying)
            got = iter(variants[flags](*[list(v) if isinstance(v, tuple) else v for v in values]))
            present = _present(names, values)
            result = tuple(next(got) if p else None for p in present) if present is not None else tuple(got)
        for k, t in outs.items():  # out= under compile: the custom op's result copied into the given tensor, which
            # must be what eager takes (copy_ would cast silently)
            if not isinstance(t, torch.Tensor) or t.dtype != result.dtype or t.device != result.device:
                # (a TypeError with Unsupported's message: the tracer cannot build gradkern's error classes)
                raise TypeError(f"{info.name}: argument '{k}': expected a tensor of dtype {result.dtype} on "
                                f"{result.device}, but got {getattr(t, 'dtype', type(t).__name__)} on "
                                f"{getattr(t, 'device', '-')}")
            t.copy_(result)
            result = t
        return result

    public.custom_op = op if op is not None else variants
    return public, public.custom_op


_CUSTOM = {}
for _name, _info in sorted(_REGISTRY.items()):
    globals()[_name], _op = _public(_info)
    if _op is not None:
        _CUSTOM[_name] = _op

__all__ = sorted(_REGISTRY)
