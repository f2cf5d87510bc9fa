"""`enable()`, `disable()`, `use()`: routing ATen ops through gradkern's kernels.

Registration is derived from the registry: every overload an op lists is registered with torch.library on the
backend key (CUDA, or CPU under the interpreter) or, for ops that bring their own autograd formula, on the
autograd key. Overrides never re-enter themselves: while one runs, a nested call of a gradkern-routed op
(from gradkern's host code or from Triton's interpreter) goes to stock PyTorch. What an override declines, or
finds has more dims than the kernels index (RankUnsupported, raised before any launch), also goes to stock."""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Iterator

import torch

from . import _runtime
from .errors import RankUnsupported
from .registry import REGISTRY, OpInfo

__all__ = ["enable", "disable", "use", "is_enabled", "stock_call", "routed_overloads"]

_lib: torch.library.Library | None = None
_tls = threading.local()
_lock = threading.Lock()


def _overload(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def stock_call(info: OpInfo, overload: str) -> Callable:
    """A callable that runs stock PyTorch for `overload`, bypassing gradkern's registration of it."""
    op = _overload(overload)
    if info.dispatch == "autograd":
        # ATen's own autograd kernel for the op, called directly (it stays registered on the alias key while ours
        # overrides the runtime key): a declined or nested call gets stock autograd, graph included. (Redispatching
        # below autograd would drop the graph - zero gradients - and needs the caller's keyset.)
        for key in (torch._C.DispatchKey.Autograd, torch._C.DispatchKey.CompositeImplicitAutograd):
            if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
                return functools.partial(op._op_dk, key)
        raise RuntimeError(f"gradkern: aten::{overload} has no stock autograd kernel to fall back to")
    decomp = torch._decomp.decomposition_table.get(op)
    if decomp is None:
        raise RuntimeError(f"gradkern: no stock path for {overload} while its override is active")
    return decomp


def _wrap(info: OpInfo, overload: str, impl: Callable) -> Callable:
    fallback: list[Callable] = []

    def stock(*args, **kwargs):
        if not fallback:
            fallback.append(stock_call(info, overload))
        return fallback[0](*args, **kwargs)

    def override(*args, **kwargs):
        if getattr(_tls, "depth", 0):
            return stock(*args, **kwargs)
        _tls.depth = 1
        try:
            out = impl(*args, **kwargs)
        except RankUnsupported:
            # more dims than the kernels index, found before any launch (nothing written): stock runs it. (Other
            # errors propagate: stock's path here can be a Python decomposition without ATen's checks, or none.)
            out = NotImplemented
        finally:
            _tls.depth = 0
        if out is NotImplemented:  # the op declined these arguments (e.g. a dtype only stock handles)
            return stock(*args, **kwargs)
        return out

    override.__name__ = f"gradkern_{overload.replace('.', '_')}"
    return override


def routed_overloads() -> dict[str, str]:
    """ATen overload -> gradkern op name, for every registration `enable()` makes."""
    return {ov: info.name for info in REGISTRY.values() for ov in info.aten}


def is_enabled() -> bool:
    return _lib is not None


def enable() -> None:
    """Route every covered ATen op on gradkern's device through gradkern's kernels (idempotent)."""
    global _lib
    with _lock:
        if _lib is not None:
            return
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
            for info in REGISTRY.values():
                key = _runtime.AUTOGRAD_KEY if info.dispatch == "autograd" else _runtime.BACKEND_KEY
                for overload, impl in info.aten.items():
                    lib.impl(overload, _wrap(info, overload, impl), key)
        _lib = lib


def disable() -> None:
    """Restore stock PyTorch for every op gradkern routed (idempotent)."""
    global _lib
    with _lock:
        if _lib is not None:
            _lib._destroy()
            _lib = None


@contextlib.contextmanager
def use(enabled: bool = True) -> Iterator[None]:
    """`with gradkern.use():` routes through gradkern inside the block (`use(False)` routes to stock) and
    restores the previous state on exit; scopes nest. Routing is process-wide (torch.library registrations), so
    a block turns it on for every thread, and blocks that overlap in several threads restore each other's state
    out of order: there, call enable() once instead."""
    previous = is_enabled()
    (enable if enabled else disable)()
    try:
        yield
    finally:
        (enable if previous else disable)()
