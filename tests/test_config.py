"""The one config and plan-cache mechanism (gradkern.config): frozen configs swapped by `override`, caches emptied
with every swap, bounded caches, and every tuned family declared through it."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from conftest import import_script
from gradkern import config
from gradkern.config import PlanCache, Tunable, override, plan_builder


@dataclasses.dataclass(frozen=True)
class _Demo:
    tile: int = 64
    warps: int = 4


def _demo_tunable() -> Tunable:
    name = f"demo-{threading.get_ident()}-{len(config.tunables())}"
    return Tunable(name, _Demo())


def test_override_swaps_the_config_for_a_block_and_restores_it_nested():
    t = _demo_tunable()
    with override(t, tile=128) as cfg:
        assert cfg is t.current and t.current == _Demo(128, 4)
        with override(t, warps=8):
            assert t.current == _Demo(128, 8)
        assert t.current == _Demo(128, 4)
    assert t.current is t.default


def test_override_restores_the_config_when_the_block_raises():
    t = _demo_tunable()
    with pytest.raises(RuntimeError), override(t, tile=1):
        raise RuntimeError("inside")
    assert t.current is t.default


def test_an_unknown_field_or_a_mutable_config_is_refused():
    t = _demo_tunable()
    with pytest.raises(TypeError), override(t, tiles=1):
        pass
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.current.tile = 3
    with pytest.raises(TypeError):
        Tunable("demo-mutable", object())
    with pytest.raises(ValueError, match="twice"):
        Tunable(t.name, _Demo())


def test_every_plan_is_rebuilt_under_a_new_config_and_again_after_it():
    t = _demo_tunable()
    cache = PlanCache("demo")
    builds = []

    @plan_builder
    def build(n):
        builds.append((n, t.current.tile))
        return n * t.current.tile

    cache.remember("k", build(2))
    assert build(2) == 128 and len(builds) == 1  # memoised
    with override(t, tile=3):
        assert "k" not in cache
        assert build(2) == 6
    assert build(2) == 128 and len(builds) == 3
    assert "k" not in cache


def test_caches_stay_bounded_and_a_none_key_is_not_remembered(monkeypatch):
    """A None key (a problem that could not be keyed) is not stored, and a cache that holds more than CACHE_LIMIT
    entries is emptied before the next one goes in."""
    monkeypatch.setattr(config, "CACHE_LIMIT", 2)
    cache = PlanCache("demo-bounded")
    assert cache.remember(None, "x") == "x" and cache == {}
    for k in range(3):
        assert cache.remember(k, k * 10) == k * 10
    assert cache == {0: 0, 1: 10, 2: 20}
    cache.remember(3, 30)
    assert cache == {3: 30}


def test_checked_validates_a_problem_once_and_remembers_no_failure():
    cache = PlanCache("demo-checked")
    calls = []

    def check():
        calls.append(1)
        return "spec"

    assert cache.checked("k", check) == "spec" and cache.checked("k", check) == "spec"
    assert len(calls) == 1

    def bad():
        raise ValueError("invalid")

    for _ in range(2):
        with pytest.raises(ValueError):
            cache.checked("bad", bad)
    assert "bad" not in cache


def _tune():
    return import_script("tune")


def test_every_tune_group_applies_and_the_defaults_come_back():
    """scripts/tune.py's configs name real fields of real config objects (a renamed field fails here, not on the
    GPU machine), and after the last one every family's config is its default again."""
    tune = _tune()
    for _ops, _dtypes, configs in tune.GROUPS.values():
        for group_config in configs:
            tune._apply(group_config)
    tune._apply(tune.DEFAULTS)
    assert all(t.current is t.default for t in config.tunables().values())


def test_tune_times_a_group_over_sweep_cases(tmp_path, monkeypatch):
    """`tune.py time GROUP` writes a record per (config, op, dtype, case), each checked against stock: over the
    sweep's cases whose label TUNE_CASES names (a case with its own stock call: segment_max_forward's is
    segment_reduce). It once raised at its first record (the config module indexed for the group's config)."""
    tune = _tune()
    monkeypatch.setenv("TUNE_CASES", "sweep:D=3 lengths unit")
    tune.time_group("segcols", str(tmp_path))
    records = json.loads((tmp_path / "tune-segcols.json").read_text())
    configs = len(tune.GROUPS["segcols"][2])
    assert len(records) == configs * 2  # (one case, f32 and bf16)
    assert {r["config"] for r in records} == set(range(configs))
    assert all(r["check"] == "ok" and r["case"].startswith("N=") and r["stock_ms"] > 0 for r in records)
    assert {r["family"] for r in records} == {"defaults", "segment_max"}
    assert all(t.current is t.default for t in config.tunables().values())


def test_tune_checks_sweep_cases_as_the_sweep_does(tmp_path, monkeypatch):
    """Over sweep cases, `tune.py time` checks each result with the sweep's own check (bench_sweep.check_result),
    not the tests' float64 one, which failed large f32 upsampling cases that the sweep passes."""
    from gradkern.tools import bench_sweep

    tune = _tune()
    seen = []
    real = bench_sweep.check_result
    monkeypatch.setattr(bench_sweep, "check_result", lambda op, *a: seen.append(op) or real(op, *a))
    monkeypatch.setattr(tune, "check_case", lambda *a, **k: pytest.fail("the tests' check ran on a sweep case"))
    monkeypatch.setenv("TUNE_CASES", "sweep:D=3 lengths unit")
    tune.time_group("segcols", str(tmp_path))
    assert seen and set(seen) == {"segment_max_forward"}
    records = json.loads((tmp_path / "tune-segcols.json").read_text())
    assert all(r["check"] == "ok" for r in records)
