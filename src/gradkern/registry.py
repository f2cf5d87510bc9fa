"""The op registry. An op is declared once, next to its kernel, with `@register_op`; `gradkern.ops`,
`supported_ops()`, `guarantee()`, the ATen registration behind `enable()` and the CLI are all derived from it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ._runtime import DTYPE_NAMES, FLOAT_DTYPES, math_dtype
from .errors import InvalidProblem, Unsupported

__all__ = ["Guarantee", "Case", "ErrorCase", "OpInfo", "register_op", "REGISTRY", "guarantee", "supported_ops",
           "get_op"]


@dataclass(frozen=True)
class Guarantee:
    """What an op promises about its numerics, for one dtype. Tests check each field against behaviour."""

    deterministic: bool  # same inputs, same process -> same bits, every run
    bit_stable: bool  # same bits across processes and launches for a given (shape, dtype, device)
    math_dtype: torch.dtype  # the dtype the arithmetic is done in
    accumulator_dtype: torch.dtype | None  # the dtype sums are carried in; None where the op does not sum


@dataclass(frozen=True)
class Case:
    """One example problem of an op, for `check`, `bench` and the generic tests."""

    label: str
    args: tuple
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    bytes: int = 0  # the minimum bytes a kernel must move: each input read once, each output written once
    elements: int = 0  # the number of output elements, for the host-overhead size


@dataclass(frozen=True)
class ErrorCase:
    """One ill-posed or refused call of an op, for the generic tests and the fuzzer: it must raise `error` (a
    gradkern error class) whose message matches the regex `match` (which names the offending argument), before
    writing any of its tensors."""

    label: str
    args: tuple
    kwargs: Mapping[str, Any]
    error: type[Exception]
    match: str


@dataclass(frozen=True)
class OpInfo:
    name: str
    fn: Callable  # the plain function, `gradkern.ops.<name>`
    aten: Mapping[str, Callable]  # ATen overload name ("elu_backward", "hardshrink.default") -> implementation
    dispatch: str  # "backend": registered on CUDA (CPU when interpreting); "autograd": on AutogradCUDA/CPU
    dtypes: tuple[torch.dtype, ...]
    accumulates: bool
    exact: bool  # the result is a selection or an exact scaling: bit-exact against the float64 reference
    reference: Callable | None  # what tests compare with, from the same arguments (None: `stock()`)
    cases: Callable[..., list[Case]] | None  # cases(device, dtype, size), size one of _cases.SIZES
    aten_examples: Callable[..., dict] | None  # (device, dtype) -> {overload: (args, kwargs)} for adapters
    fake: Callable | None  # shape/dtype function for torch.compile (None: `reference_fn()` on fake tensors)
    doc: str
    baseline: Callable | None = None  # the bench's stock timing where PyTorch has no op of this name
    # which problems enable() (mode "auto") sends to gradkern, from the op's arguments: None every one, False none
    # (stock is deterministic and as fast: the op is routed only in mode "always"), or a predicate of the
    # problem's descriptor (shapes, strides, dtypes, scalars; never of values or timing)
    route: Callable[..., bool] | bool | None = None
    route_doc: str = ""  # the rule, in words, for the README and plans
    # the minimum bytes a problem moves, from the op's arguments, where the plan's rule (every tensor argument's
    # distinct elements read once, every output written once) counts arguments the kernel does not read
    moved_bytes: Callable[..., int] | None = None
    # samples(rng, device, dtype): an endless stream of random small problems (`Case`s, interpreter-sized), every
    # choice drawn from `rng` (a random.Random), so that a seed replays them: the op's parameters, boundary sizes
    # (empty, 1, odd) and layouts (strided, permuted, expanded, channels_last where the op has 4-D/5-D tensors)
    samples: Callable[..., Iterator[Case]] | None = None
    errors: Callable[..., Iterable[ErrorCase]] | None = None  # errors(device): the op's `ErrorCase`s

    def guarantee(self, dtype: torch.dtype) -> Guarantee:
        if dtype not in self.dtypes:
            raise Unsupported("gradkern.guarantee", "dtype", f"one of {_names(self.dtypes)} for {self.name}", dtype)
        m = math_dtype(dtype)
        return Guarantee(deterministic=True, bit_stable=True, math_dtype=m,
                         accumulator_dtype=m if self.accumulates else None)

    def stock(self) -> Callable:
        """Stock PyTorch's op of the same name (the benchmark's baseline); for ops PyTorch lacks, `baseline`,
        else `reference`."""
        if hasattr(torch.ops.aten, self.name):
            return getattr(torch.ops.aten, self.name)
        if self.baseline is not None:
            return self.baseline
        if self.reference is None:
            raise RuntimeError(f"gradkern op {self.name!r} is not an ATen op and declares no reference")
        return self.reference

    def reference_fn(self) -> Callable:
        """What the tests compare with: `reference` where declared (ATen's CUDA conventions where its CPU
        kernel differs, or a composite for ops PyTorch lacks), else stock PyTorch's op."""
        return self.reference if self.reference is not None else self.stock()


REGISTRY: dict[str, OpInfo] = {}


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(DTYPE_NAMES.get(d, str(d)) for d in dtypes)


def register_op(
    name: str,
    *,
    aten: Sequence[str] | Mapping[str, Callable] = (),
    dispatch: str = "backend",
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    accumulates: bool = False,
    exact: bool = False,
    reference: Callable | None = None,
    cases: Callable[..., list[Case]] | None = None,
    aten_examples: Callable[..., dict] | None = None,
    fake: Callable | None = None,
    baseline: Callable | None = None,
    route: Callable[..., bool] | bool | None = None,
    route_doc: str = "",
    moved_bytes: Callable[..., int] | None = None,
    samples: Callable[..., Iterator[Case]] | None = None,
    errors: Callable[..., Iterable[ErrorCase]] | None = None,
) -> Callable[[Callable], Callable]:
    """Declare the decorated function as gradkern op `name`.

    `aten` lists the ATen overloads `enable()` routes to this op: a sequence of names served by the function
    itself (it must then take ATen's arguments), or a mapping from overload name to an adapter; adapters need
    `aten_examples` so that a test can prove each registration is live. `cases` builds the example problems
    that `check`, `bench` and the generic tests run; `reference` is stock PyTorch's computation with the op's
    own arguments (default: the ATen op of the same name; run on CPU in float64, so give one where ATen's
    CPU kernel departs from the CUDA semantics gradkern follows). Under torch.compile the op is a custom op whose
    fake implementation is `reference` run on fake tensors, or `fake` where the reference cannot run on them
    (data-dependent shapes). `baseline`, for ops PyTorch lacks, is the stock computation `bench` times against
    when it is lighter than `reference` (e.g. one that skips an output the reference must also produce).
    `route` / `route_doc`: which problems enable() sends to gradkern (see OpInfo.route), and the rule in words;
    for an autograd-key op the route is a predicate of the op's own arguments (for plans: its override decides
    from ATen's). `moved_bytes`: see OpInfo. `samples(rng, device, dtype)` streams random small problems and
    `errors(device)` lists ill-posed calls with the error each must raise (see OpInfo): the generic tests, the
    fuzzer (scripts/fuzz.py) and the hypothesis tests all draw from them."""
    if dispatch not in ("backend", "autograd"):
        raise ValueError(f"register_op({name!r}): dispatch must be 'backend' or 'autograd', got {dispatch!r}")

    def deco(fn: Callable) -> Callable:
        if name in REGISTRY:
            raise ValueError(f"register_op: op {name!r} is declared twice")
        impls = dict(aten) if isinstance(aten, Mapping) else {a: fn for a in aten}
        REGISTRY[name] = OpInfo(
            name=name, fn=fn, aten=impls, dispatch=dispatch, dtypes=tuple(dtypes), accumulates=accumulates,
            exact=exact, reference=reference, cases=cases, aten_examples=aten_examples, fake=fake,
            doc=(fn.__doc__ or "").strip().split("\n")[0], baseline=baseline, route=route, route_doc=route_doc,
            moved_bytes=moved_bytes, samples=samples, errors=errors,
        )
        return fn

    return deco


def get_op(name: str) -> OpInfo:
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):  # (TypeError: an unhashable name, such as a list)
        raise InvalidProblem("gradkern", "op_name", f"one of {sorted(REGISTRY)}", repr(name)) from None


def guarantee(op_name: str, dtype: torch.dtype) -> Guarantee:
    """The precision guarantee of op `op_name` for inputs of `dtype`."""
    return get_op(op_name).guarantee(dtype)


def route_rule(info: OpInfo) -> str:
    """Which problems enable() (mode "auto") sends to gradkern, in words."""
    if info.route_doc:
        return info.route_doc
    return "gradkern, for every problem" if info.aten else "gradkern: no ATen op to route (a gradkern function)"


def supported_ops() -> list[dict[str, Any]]:
    """Every op with its ATen overloads, dtypes and per-dtype guarantee."""
    out = []
    for info in sorted(REGISTRY.values(), key=lambda i: i.name):
        out.append({
            "name": info.name,
            "aten": sorted(info.aten),
            "dispatch": info.dispatch,
            "dtypes": [DTYPE_NAMES.get(d, str(d)) for d in info.dtypes],
            "guarantees": {DTYPE_NAMES.get(d, str(d)): info.guarantee(d) for d in info.dtypes},
            "route": route_rule(info),
            "doc": info.doc,
        })
    return out
