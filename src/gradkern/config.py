"""Tuned launch configuration and the per-problem caches: one mechanism for every op family.

A tuned op family keeps the constants of its launch heuristics in one frozen dataclass, apart from its kernels, and
reads them through a `Tunable` when it builds a plan (never on the hot path: a repeated problem is a cache hit):

    @dataclass(frozen=True)
    class PadConfig:
        tile: Mapping[int, int] = ...  # what it controls, why this value, one headline figure

    CONFIG = Tunable("pad", PadConfig())
    ...
    cfg = CONFIG.current  # inside the plan builder

Every per-problem cache (validated problems, plans, launchers) is a `PlanCache`, or a builder memoised with
`@plan_builder`. Both register here, so `override(CONFIG, tile=...)`, which tests and `scripts/tune.py` use to try
other values, empties all of them on entry and on exit: no plan built under one config serves under another.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ._runtime import I32_MAX

__all__ = ["CACHE_LIMIT", "PlanCache", "plan_builder", "clear_plans", "Tunable", "override", "tunables", "GridLimits"]

#: a per-problem cache holding more entries than this is emptied (a run with ever-new shapes stays bounded)
CACHE_LIMIT = 4096

_CACHES: list[PlanCache] = []
_BUILDERS: list[Callable] = []
_TUNABLES: dict[str, Tunable] = {}
_LOCK = threading.Lock()  # config swaps and cache registration (lookups need no lock: dict reads are atomic)


class PlanCache(dict):
    """Problems seen before -> what was found for them (a plan, a validation result, a launcher). A dict, so that
    the hot path's lookup is `cache.get(key)`; registered so that `clear_plans()` empties it; emptied once it
    holds more than CACHE_LIMIT entries."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        with _LOCK:
            _CACHES.append(self)

    def __repr__(self) -> str:
        return f"PlanCache({self.name!r}, {len(self)} entries)"

    __hash__ = object.__hash__  # (a dict is unhashable; a cache is one object)
    __eq__ = object.__eq__

    def remember(self, key, value):
        """`self[key] = value` (nothing for a None key: a problem that could not be keyed). Returns value."""
        if key is not None:
            if len(self) > CACHE_LIMIT:
                self.clear()
            self[key] = value
        return value

    def checked(self, key, check: Callable):
        """`self[key]`, else `check()` (which raises for an invalid problem) remembered under `key`: a problem is
        validated once. Nothing is remembered while torch.compile traces (check_tensor lets negative-bit views
        pass there) or for a None key."""
        hit = self.get(key) if key is not None else None
        if hit is None:
            hit = check()
            if not torch.compiler.is_compiling():
                self.remember(key, hit)
        return hit


def plan_builder(fn: Callable | None = None, *, maxsize: int = CACHE_LIMIT):
    """`functools.lru_cache(maxsize)` for a function from a problem's descriptor to its plan, registered so that
    `clear_plans()` empties it. Its arguments must be hashable (shapes, strides and sizes as tuples)."""
    if fn is None:
        return lambda f: plan_builder(f, maxsize=maxsize)
    cached = functools.lru_cache(maxsize=maxsize)(fn)
    with _LOCK:
        _BUILDERS.append(cached)
    return cached


def clear_plans() -> None:
    """Empty every per-problem cache and memoised plan builder (after a config changes)."""
    with _LOCK:
        for cache in _CACHES:
            cache.clear()
        for builder in _BUILDERS:
            builder.cache_clear()


class Tunable:
    """The active configuration of one op family: `current` is a frozen dataclass instance, `default` the one the
    family ships with. Swap it with `override`, never by assignment (that would leave plans of the old one)."""

    __slots__ = ("name", "default", "current")

    def __init__(self, name: str, default: Any):
        if not (dataclasses.is_dataclass(default) and type(default).__dataclass_params__.frozen):
            raise TypeError(f"Tunable({name!r}): the config must be a frozen dataclass instance")
        if name in _TUNABLES:
            raise ValueError(f"Tunable({name!r}) is declared twice")
        self.name, self.default, self.current = name, default, default
        _TUNABLES[name] = self

    def __repr__(self) -> str:
        return f"Tunable({self.name!r}, {self.current!r})"


@dataclasses.dataclass(frozen=True)
class GridLimits:
    """Two limits, not tuning choices, for the configs of kernels with a grid-stride loop and an int64 index path
    (their config dataclasses derive from this one): tests lower them with `override` to run those paths."""

    #: programs a launch runs at most, beyond which each takes several tiles in turn (a grid-stride loop)
    max_programs: int = 2**30
    #: index math is 32-bit unless a value can pass this: int32's limit
    i32_max: int = I32_MAX


@contextmanager
def override(tunable: Tunable, config: Any = None, /, **changes) -> Iterator[Any]:
    """Within the block, `tunable`'s config is `config` (a whole one) or the current one with `changes` applied
    (`dataclasses.replace`, so an unknown field raises TypeError); every plan is rebuilt on entry and again on
    exit. Yields the config in force. Nests; not for use while other threads launch kernels."""
    new = dataclasses.replace(tunable.current if config is None else config, **changes)
    with _LOCK:
        old, tunable.current = tunable.current, new
    clear_plans()
    try:
        yield new
    finally:
        with _LOCK:
            tunable.current = old
        clear_plans()


def tunables() -> dict[str, Tunable]:
    """Every tuned op family's Tunable, by name."""
    return dict(_TUNABLES)
