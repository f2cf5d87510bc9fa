"""`enable()`, `disable()`, `use()`: routing ATen ops through gradkern's kernels.

Registration is derived from the registry and happens once, at the first `enable()` or `use()`: every overload
an op lists gets a router with torch.library on the backend key (CUDA, or CPU under the interpreter) or, for ops
that bring their own autograd formula, on the autograd key; where the native router is built, a functional
backend overload also gets its C++ kernel over the Python router, which replays a descriptor's recorded calls without
entering Python (routing/native.py). After that, turning routing on or off only flips a process-wide flag that each
router reads: off, a router calls the stock kernel it captured before registering
(ATen's own, so stock results are ATen's bit for bit). Routers never re-enter themselves: while an override
runs, a nested call of a gradkern-routed op in the same thread (from gradkern's host code or from Triton's
interpreter) goes to stock PyTorch. What an override declines, or finds has more dims than the kernels index
(RankUnsupported, raised before any launch), also goes to stock.

Python-level interceptions (`intercept`: module functions that PyTorch calls before dispatch, such as the
decomposition F.pad takes in deterministic mode) are put in place by `enable()` and taken out by `disable()`."""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import _runtime
from ..errors import InvalidProblem, RankUnsupported
from ..registry import REGISTRY, OpInfo
from . import native

__all__ = ["enable", "disable", "use", "is_enabled", "mode", "stock_call", "routed_overloads", "auto_registers",
           "intercept", "unregister"]

_lib: torch.library.Library | None = None  # the registrations, made once (see unregister)
_enabled = False  # what every router reads on every call: process-wide, so autograd's own threads see it too
_always = False  # mode "always": every covered op goes to gradkern, whatever its route says
_tls = threading.local()  # .depth: an override of this thread is running (nested routed calls go to stock)
_lock = threading.RLock()  # taken to switch, register, or capture a stock kernel


def stock_call(info: OpInfo, overload: str) -> Callable:
    """A callable that runs stock PyTorch for `overload`, bypassing gradkern's registration of it."""
    op = native.aten_overload(overload)
    if info.dispatch == "autograd":
        # ATen's own autograd kernel for the op, called directly (it stays registered on the alias key while ours
        # overrides the runtime key): a declined or nested call gets stock autograd, graph included. (Redispatching
        # below autograd would drop the graph - zero gradients - and needs the caller's keyset.)
        for key in (torch._C.DispatchKey.Autograd, torch._C.DispatchKey.CompositeImplicitAutograd):
            if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
                return functools.partial(op._op_dk, key)
        raise RuntimeError(f"gradkern: aten::{overload} has no stock autograd kernel to fall back to")
    # (the keyset a kernel of the backend key is reached with: ATen's kernel there redispatches nothing)
    return functools.partial(_aten_kernel(overload).call_boxed, _BACKEND_KEYSET)


_BACKEND_KEYSET = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _runtime.BACKEND_KEY))
_captured: dict[str, torch._C._SafeKernelFunction] = {}  # backend overload -> ATen's kernel, taken before ours


def _aten_kernel(overload: str) -> torch._C._SafeKernelFunction:
    """ATen's kernel for backend `overload`, captured before gradkern registers its own (and kept after)."""
    kernel = _captured.get(overload)
    if kernel is None:
        with _lock:
            if overload in _registered:
                raise RuntimeError(f"gradkern: ATen's kernel for {overload} was not captured before registration")
            kernel = _captured[overload] = torch.library.get_kernel(f"aten::{overload}", _runtime.BACKEND_KEY)
    return kernel


def _router(info: OpInfo, overload: str, stock: Callable, recording: bool = False) -> Callable:
    """The kernel registered for `overload`: the op's implementation of it (read from the registry at each call)
    while routing is on, this thread is not already inside an override and the op's route sends these arguments
    to gradkern (always, in mode "always"), else `stock`. With `recording`, the twin the native router calls to
    record a descriptor: the same choice, and it commits what it did (routing/native.py)."""
    impls = info.aten
    # (an autograd-key op's override applies its route itself, from ATen's arguments)
    route = None if info.dispatch != "backend" else (lambda *a, **k: False) if info.route is False else info.route

    def router(*args, **kwargs):
        nested = getattr(_tls, "depth", 0)
        if not _enabled or nested or (route is not None and not _always and not route(*args, **kwargs)):
            if recording and _enabled and not nested:
                native.commit_stock()
            return stock(*args, **kwargs)
        _tls.depth = 1
        try:
            out = impls[overload](*args, **kwargs) if not recording else \
                native.recorded(overload, impls[overload], args, kwargs)
        except RankUnsupported:
            # more dims than the kernels index, found before any launch (nothing written): stock runs it. (Other
            # errors propagate, as stock's own checks would raise them.)
            out = NotImplemented
        finally:
            _tls.depth = 0
        if out is NotImplemented:  # the op declined these arguments (e.g. a dtype only stock handles)
            return stock(*args, **kwargs)
        return out

    router.__name__ = f"gradkern_{'record_' if recording else ''}{overload.replace('.', '_')}"
    return router


def routed_overloads() -> dict[str, str]:
    """ATen overload -> gradkern op name, for every registration `enable()` makes."""
    return {ov: info.name for info in REGISTRY.values() for ov in info.aten}


def auto_registers(info: OpInfo) -> bool:
    """Whether mode "auto" registers `info`'s routers: not where its route is stock for every descriptor
    (`route=False`: they would cost host time and route nothing), nor for an autograd-key op where the native
    router is not built (its Python override costs more host time than stock's autograd node:
    docs/tuning/routing.md)."""
    return info.route is not False and (info.dispatch != "autograd" or native.available())


def _register(always: bool) -> None:
    """Register the routers not registered yet (under _lock): every op's in mode "always", else those that
    `auto_registers`."""
    global _lib
    if _covered.get(always) == len(REGISTRY):  # (every op of the registry as it was then: done)
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
        if _lib is None:  # (the first registration since import or unregister)
            _lib = torch.library.Library("aten", "IMPL")
            if native.available():
                native.attach_whole_write(WHOLE_WRITE)
        for info in REGISTRY.values():
            if not always and not auto_registers(info):
                continue
            key = _runtime.AUTOGRAD_KEY if info.dispatch == "autograd" else _runtime.BACKEND_KEY
            for overload in info.aten:
                if overload not in _registered:
                    stock = stock_call(info, overload)  # (captured before this overload's router is in place)
                    fast = info.dispatch == "backend" and native.available() and native.eligible(overload)
                    if fast:
                        native.capture_stock(overload)
                    _lib.impl(overload, _router(info, overload, stock), key)
                    if fast:  # (over the Python router: see routing/native.py)
                        native.attach(overload, _router(info, overload, stock, recording=True))
                    elif hasattr(info.aten[overload], "parts") and native.available():
                        native.attach_autograd(overload, info.aten[overload])  # (a fused_autograd override)
                    _registered.add(overload)
    _covered[always] = len(REGISTRY)


# Stock CUDA ops that write everything they allocate before reading it (batch norm and its backward, cuDNN's and
# ATen's, the convolution backward's gradients, prelu's TensorIterator output): while gradkern is enabled their
# allocations skip deterministic mode's NaN fill, a kernel launch each, for the same bits (native.cpp, "the NaN
# fill"). They were most of the fills in the segmentation models' deterministic steps (docs/tuning/routing.md).
WHOLE_WRITE = ("cudnn_batch_norm", "cudnn_batch_norm_backward", "native_batch_norm", "native_batch_norm_backward",
               "convolution_backward", "_prelu_kernel")
_registered: set[str] = set()
_covered: dict[bool, int] = {}  # mode "always" (True) or "auto" -> the registry's size when it was last registered


# ----------------------------------------------------------------------------------------------- interceptions
@dataclass
class _Interception:
    module: object
    attr: str
    wrap: Callable[[Callable], Callable]  # the original -> the function put in its place
    original: Callable | None = None  # what stood there before enable() (None while disabled)
    wrapped: tuple | None = None  # (an original, its wrapper): built once, not at every enable()


_interceptions: list[_Interception] = []


def intercept(module, attr: str, wrap: Callable[[Callable], Callable]) -> None:
    """Declare that while gradkern is enabled, `module.attr` (a function PyTorch looks up at every call, before
    dispatch) is replaced by `wrap(original)`. A module without `attr` (another PyTorch version) is left alone."""
    _interceptions.append(_Interception(module, attr, wrap))


def _set_interceptions(on: bool) -> None:
    for i in _interceptions:
        current = getattr(i.module, i.attr, None)
        if current is None:
            continue
        if on and i.original is None:
            i.original = current
            if i.wrapped is None or i.wrapped[0] is not current:
                i.wrapped = (current, functools.update_wrapper(i.wrap(current), current))
            setattr(i.module, i.attr, i.wrapped[1])
        elif not on and i.original is not None:
            setattr(i.module, i.attr, i.original)
            i.original = None


# ----------------------------------------------------------------------------------------------- the switch
def is_enabled() -> bool:
    return _enabled


def mode() -> str:
    """The routing mode of enable()/use(): "auto" or "always" (see enable)."""
    return "always" if _always else "auto"


_MODES = ("auto", "always")


def _set(on: bool, always: bool) -> None:
    global _enabled, _always
    if on == _enabled and always == _always and (not on or _covered.get(always) == len(REGISTRY)):
        return  # (nothing to switch: a nested block's usual case)
    with _lock:
        if on:
            _register(always)
        _always = always
        if on != _enabled:
            _enabled = on
            _set_interceptions(on)
        native.set_state(on, always)


def _check_mode(mode: str) -> bool:
    if mode not in _MODES:
        raise InvalidProblem("gradkern.enable", "mode", f"one of {_MODES}", repr(mode))
    return mode == "always"


def enable(mode: str = "auto") -> None:
    """Route the covered ATen ops on gradkern's device through gradkern's kernels (idempotent). In mode "auto"
    each op's route decides per problem (a pure function of its shapes, strides, dtypes and scalars) whether
    gradkern or stock serves it, so that enabling never makes a step slower; "always" sends every covered op to
    gradkern. The first call registers gradkern's routers with PyTorch; later ones only switch them on."""
    _set(True, _check_mode(mode))


def disable() -> None:
    """Send every op gradkern routes back to stock PyTorch (idempotent). The routers stay registered and call
    ATen's own kernels; `unregister()` removes them."""
    _set(False, _always)


def unregister() -> None:
    """Disable and remove gradkern's registrations from PyTorch's dispatcher (for coexistence with other libraries
    that override the same ops; the next `enable()` or `use()` registers again)."""
    global _lib
    disable()
    with _lock:
        native.detach_all()
        if _lib is not None:
            _lib._destroy()
            _lib = None
            _captured.clear()
            _registered.clear()
            _covered.clear()


class use:  # noqa: N801 - used as a function: `with gradkern.use():`
    """`with gradkern.use():` routes through gradkern inside the block (`use(False)` routes to stock; `mode` as
    for enable) and restores the previous state on exit; scopes nest. Entering and leaving a block switches a
    flag (registration happens once). Routing is process-wide: a block turns it on for every thread, the autograd
    engine's included (a block around `loss.backward()` routes the backward), and blocks that overlap in several
    threads restore each other's state out of order: there, call enable() once instead."""

    __slots__ = ("_on", "_always", "_previous")

    def __init__(self, enabled: bool = True, mode: str = "auto"):
        self._on = bool(enabled)
        self._always = _check_mode(mode) if enabled else None

    def __enter__(self) -> None:
        self._previous = (_enabled, _always)
        _set(self._on, _always if self._always is None else self._always)

    def __exit__(self, *exc) -> None:
        _set(*self._previous)
