"""`gradkern.plan(op_name, *args, **kwargs)`: what gradkern does with one problem, decided once per descriptor.

A problem's descriptor is the op and, for each argument, a tensor's shape, strides, dtype and device, or a scalar's
type and value (never tensor values or timing). The first plan of a descriptor validates the problem by running
the op on copies of the arguments (so a rejected problem raises the op's named error and writes nothing), and
records what that run launched; later plans of the descriptor are a cache lookup. A plan states:

* `route`: whether `enable()` (mode "auto") sends this problem to gradkern or to stock PyTorch, and `route_rule`,
  the op's rule in words;
* `guarantee`: the op's precision guarantee for the problem's dtype;
* `kernels`: each Triton kernel the op launched, with its grid and its launch configuration (constexprs,
  num_warps);
* `bytes`: the minimum bytes the op moves (every tensor argument's distinct elements read once, every output
  written once; an op may declare its own count);
* `can_implement(*args, **kwargs)`, which raises the named error for a problem this plan cannot run (another
  descriptor, or one the op rejects) and writes nothing; and `plan(*args, **kwargs)`, which runs the op on new data
  of the plan's descriptor (a named error for another).

The ops' own caches (one per op family, keyed the same way) make a repeated call a lookup and a direct launch;
a plan adds only the descriptor check."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from numbers import Number

import torch

from .config import PlanCache
from .errors import InvalidProblem
from .launch import checks as launch_checks
from .launch import launcher
from .registry import Guarantee, OpInfo, get_op, route_rule
from .routing.dispatch import auto_registers

__all__ = ["Plan", "Launch", "plan", "descriptor"]


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan's run: the Triton kernel, its grid and its launch configuration."""

    kernel: str
    grid: tuple
    config: Mapping[str, object]


@dataclass(frozen=True, eq=False)
class Plan:
    op: str
    descriptor: tuple
    route: str  # "gradkern" or "stock": what enable() in mode "auto" does with this problem
    route_rule: str
    guarantee: Guarantee | None  # None for a problem without a floating dtype the op takes
    kernels: tuple[Launch, ...]
    bytes: int
    _fn: Callable = field(repr=False)

    def can_implement(self, *args, **kwargs) -> None:
        """Raise the named error unless this plan runs these arguments: another descriptor (InvalidProblem), or
        a problem the op rejects (its own error). Writes nothing: the op's checks run on copies."""
        self._check(args, kwargs)
        _validate(self._fn, args, kwargs)

    def __call__(self, *args, **kwargs):
        """The op on these arguments, which must have the plan's descriptor."""
        self._check(args, kwargs)
        return self._fn(*args, **kwargs)

    def _check(self, args, kwargs) -> None:
        got = descriptor(self.op, args, kwargs)
        if got != self.descriptor:
            raise InvalidProblem(self.op, "args", f"a problem of this plan's descriptor {self.descriptor}", got)


def descriptor(op: str, args: tuple, kwargs: Mapping) -> tuple:
    """The hashable description of a problem that plans are keyed by (see the module docstring)."""
    return (op, tuple(_describe(a) for a in args), tuple(sorted((k, _describe(v)) for k, v in kwargs.items())))


def _describe(a):
    if isinstance(a, torch.Tensor):
        return ("tensor", tuple(a.shape), a.stride(), a.dtype, a.device, a.is_neg(), a.is_conj())
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_describe(v) for v in a))
    if a is None or isinstance(a, (Number, str, torch.dtype, torch.device)):
        return (type(a).__name__, a)
    raise InvalidProblem("gradkern.plan", "args", "tensors, numbers, strings, None or sequences of them",
                         type(a).__name__)


_plans = PlanCache("plan._plans")
_lock = threading.Lock()


def plan(op_name: str, *args, **kwargs) -> Plan:
    """The plan of op `op_name` (a `gradkern.ops` name) for these arguments; see the module docstring."""
    info = get_op(op_name)
    key = descriptor(op_name, args, kwargs)
    found = _plans.get(key)
    if found is not None:
        return found
    with _lock:  # (one validating run at a time)
        found = _plans.get(key)
        if found is None:
            launches, result = _recorded(lambda: _validate(info.fn, args, kwargs))
            found = Plan(op_name, key, route_of(info, args, kwargs), route_rule(info),
                         _guarantee(info, args), tuple(launches), _bytes(info, args, kwargs, result), info.fn)
            _plans.remember(key, found)
    return found


def route_of(info: OpInfo, args: tuple, kwargs: Mapping) -> str:
    """Who serves this problem under enable() in mode "auto": "gradkern" or "stock" (a function of the
    descriptor)."""
    if not auto_registers(info) or (callable(info.route) and not info.route(*args, **kwargs)):
        return "stock"
    return "gradkern"


def _guarantee(info: OpInfo, args: tuple) -> Guarantee | None:
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype in info.dtypes:
            return info.guarantee(a.dtype)
    return None


def _copy(a):
    """A copy of an argument with the same layout (expanded dims stay expanded), for a run that writes nothing
    the caller can see."""
    if isinstance(a, torch.Tensor):
        if a.numel() == 0:
            return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
        span = 1 + launch_checks.reach(a.shape, a.stride())
        flat = a.detach().as_strided((span,), (1,), a.storage_offset()).clone()
        return flat.as_strided(a.shape, a.stride(), 0)
    if isinstance(a, (list, tuple)):
        return type(a)(_copy(v) for v in a)
    return a


def _validate(fn: Callable, args: tuple, kwargs: Mapping):
    """Run `fn` on copies of the arguments (its checks raise the named errors; nothing of the caller's is
    written); the result."""
    with torch.no_grad():
        return fn(*_copy(args), **{k: _copy(v) for k, v in kwargs.items()})


def _recorded(run: Callable) -> tuple[list[Launch], object]:
    """`run()`'s result and the Triton launches it made (each through the JIT, not the direct relaunch)."""
    launches: list[Launch] = []

    def note(jit, args, kwargs, grid, compiled):
        g = tuple(grid(kwargs) if callable(grid) else grid)
        config = {k: getattr(v, "__name__", None) or _name(v) for k, v in kwargs.items()}
        launches.append(Launch(_name(jit), g, config))

    with launcher.observe_launches(note):
        result = run()
    return launches, result


def _name(v) -> object:
    fn = getattr(v, "fn", None)
    if fn is not None and hasattr(fn, "__name__"):
        return fn.__name__
    return v if isinstance(v, (Number, str, bool, type(None), tuple)) else str(v)


def _bytes(info: OpInfo, args: tuple, kwargs: Mapping, result) -> int:
    if info.moved_bytes is not None:
        return info.moved_bytes(*args, **kwargs)
    read = sum(_distinct_bytes(a) for a in (*_tensors(args), *_tensors(kwargs.values())))
    return read + sum(_distinct_bytes(t) for t in _tensors((result,)))


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def _distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements of `t` (an expanded dim counts once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            n *= size
    return n * t.element_size() if t.numel() else 0
