"""`python -m gradkern bench --models`: the listing, a smoke run's JSON, "raises" cells, and that every model's
training step runs gradkern's ops (counted) with stock's gradients."""

import collections
import copy
import json
import math
import statistics

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gradkern
from conftest import DEVICE, gpu_only
from gradkern.registry import REGISTRY
from gradkern.routing.dispatch import routed_overloads
from gradkern.testing import assert_bitwise_equal
from gradkern.tools import bench_models, cli

SPARSEMAX = "gradkern.sparsemax"  # a route that is a gradkern function, not a routed ATen op


def test_list_prints_each_model_and_runs_nothing(capfd, monkeypatch):
    monkeypatch.setattr(bench_models, "measure", None)  # (a call would raise)
    assert cli.main(["bench", "--models", "--list"]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(bench_models.MODELS)
    assert len(bench_models.MODELS) >= 6


@pytest.mark.parametrize("argv", [["bench", "--list"], ["bench", "--models", "--ops", "hardshrink"],
                                  ["bench", "--models", "no-such-model"]])
def test_bad_model_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_smoke_run_writes_the_records(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(bench_models, "REPEATS", 2)  # (on a GPU: short runs)
    monkeypatch.setattr(bench_models, "TARGET_S", 0.01)
    path, png = tmp_path / "models.json", tmp_path / "models.png"
    assert cli.main(["bench", "--models", "gated-rnn", "--dtypes", "f32", "--json", str(path), "--plot", str(png)]) == 0
    out = capfd.readouterr().out
    assert "gated-rnn" in out and "speedup (median of paired runs)" in out and "det vs stock det-off" in out
    assert png.stat().st_size > 0
    result = json.loads(path.read_text())
    assert {"device", "torch", "triton", "date", "repeats", "records"} <= result.keys()
    assert [r["deterministic"] for r in result["records"]] == [False, True] * (len(result["records"]) // 2)
    for r in result["records"]:
        assert r["model"] == "gated-rnn" and r["dtype"] == "f32"
        assert r["stock_status"] == r["gradkern_status"] == "ok"
        for key in ("stock_ms", "gradkern_ms", "stock_ms_median", "gradkern_ms_median", "stock_issue_ms",
                    "gradkern_issue_ms", "speedup", "speedup_min", "speedup_median"):
            assert math.isfinite(r[key]) and r[key] > 0, key
        for m in ("stock", "gradkern"):
            assert len(r[f"{m}_wall_ms_all"]) == len(r[f"{m}_issue_ms_all"]) == r["repeats"]
            assert r[f"{m}_ms"] == min(r[f"{m}_wall_ms_all"]) <= r[f"{m}_ms_median"]
        assert r["stock_issue_ms"] <= r["stock_ms"]
        assert r["speedup_min"] == r["stock_ms"] / r["gradkern_ms"]
        pairs = sorted(s / g for s, g in zip(r["stock_wall_ms_all"], r["gradkern_wall_ms_all"], strict=True))
        assert r["speedup"] == statistics.median(pairs)
    for off, on in zip(result["records"][::2], result["records"][1::2]):
        assert off["det_vs_stock_det_off"] is None and off["stock_det_off_ms"] is None
        assert on["stock_det_off_ms"] == off["stock_ms"]
        assert on["det_vs_stock_det_off"] == off["stock_ms"] / on["gradkern_ms"]


def test_timed_runs_take_turns_and_the_paired_median_is_the_headline(monkeypatch):
    """A mode's ms is its fastest run; the speedup is the median of the rounds' stock / gradkern (here 1.25, 0.5
    and 1.8: 1.25), not the fastest against the fastest (1.2)."""
    calls = []
    walls = iter([5.0, 4.0, 3.0, 6.0, 4.5, 2.5])  # stock, gradkern, stock, ...

    def fake_timed_run(step, n, warmup, gpu):
        calls.append((gradkern.is_enabled(), n, warmup))
        w = next(walls)
        return w, w / 2

    monkeypatch.setattr(bench_models, "_timed_run", fake_timed_run)
    rec = bench_models.measure(bench_models.GatedRecurrent, "tiny", torch.float32, False, torch.device(DEVICE),
                               gpu=False, repeats=3, steps=4, warmup=0, run_warmup=2)
    assert calls == [(False, 4, 2), (True, 4, 2)] * 3
    assert rec["stock_wall_ms_all"] == [5.0, 3.0, 4.5] and rec["gradkern_wall_ms_all"] == [4.0, 6.0, 2.5]
    assert (rec["stock_ms"], rec["stock_ms_median"], rec["stock_issue_ms"]) == (3.0, 4.5, 1.5)
    assert (rec["gradkern_ms"], rec["gradkern_ms_median"], rec["gradkern_issue_ms"]) == (2.5, 4.0, 1.25)
    assert rec["speedup"] == 5.0 / 4.0 and rec["speedup_min"] == 3.0 / 2.5 and rec["speedup_median"] == 4.5 / 4.0
    assert bench_models._speedup_cell(rec) == "1.25x" and bench_models._det_off_cell(rec) == "-"


def test_rounds_follow_the_step_time():
    """Host-bound rows (short steps) take the most rounds, GPU-bound ones (slow steps) at least MIN_REPEATS, and
    never more than asked."""
    assert bench_models._rounds(7, 5.0, 21) == 21
    assert bench_models._rounds(3, 40.0, 21) == bench_models.MIN_REPEATS
    assert bench_models._rounds(3, 20.0, 21) == 12
    assert bench_models._rounds(7, 5.0, 3) == 3


def test_a_timed_run_warms_up_collects_and_times_with_the_collector_off(monkeypatch):
    seen, collected = [], []
    monkeypatch.setattr(bench_models.gc, "collect", lambda *a: collected.append(len(seen)) or 0)
    wall, issue = bench_models._timed_run(lambda: seen.append(bench_models.gc.isenabled()), 3, 2, gpu=False)
    assert seen == [True, True, False, False, False] and collected == [2]
    assert bench_models.gc.isenabled() and wall >= issue > 0


def test_deterministic_rows_compare_with_stock_det_off():
    def rec(det, stock, gk, model="m", dtype="f32", status="ok"):
        return {"model": model, "config": "large", "dtype": dtype, "deterministic": det, "stock_ms": stock,
                "gradkern_ms": gk, "gradkern_status": status}

    records = [rec(False, 10.0, 8.0), rec(True, 20.0, 12.5), rec(True, 20.0, 5.0, dtype="bf16"),
               rec(True, None, None, model="n", status="raises")]
    bench_models.link_det_off(records)
    assert [r["det_vs_stock_det_off"] for r in records] == [None, 0.8, None, None]
    assert [r["stock_det_off_ms"] for r in records] == [None, 10.0, None, None]
    assert [bench_models._det_off_cell(r) for r in records] == ["-", "0.80x", "-", "gradkern raises"]


def test_configs_keep_tiny_tiny_and_large_larger_than_small():
    for cls in bench_models.MODELS.values():
        assert {"tiny", "small", "large"} <= cls.configs.keys()
        torch.manual_seed(0)
        sizes = {}
        for size in ("tiny", "small", "large"):
            cfg = cls.configs[size]
            work = cls.make(cfg.batch, torch.float32, torch.device("meta"), **cfg.kw)
            sizes[size] = sum(t.numel() for t in work.inputs)
        assert sizes["tiny"] <= 1000 and sizes["small"] < sizes["large"] <= 2**26, (cls.name, sizes)


class _StockRaises(torch.nn.Module):
    """A model whose stock forward hits an op without a deterministic implementation."""

    name, routes = "stock-raises", ()
    configs = {"tiny": bench_models.Config(2, "4")}

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        if not gradkern.is_enabled():  # put_ without accumulate has no deterministic implementation
            x.new_zeros(4).put_(torch.tensor([0, 0], device=x.device), x.new_ones(2))
        return self.fc(x)

    @classmethod
    def make(cls, batch, dtype, device):
        return bench_models._workload(cls(), (torch.randn(batch, 4),), torch.randn(batch, 4),
                                      torch.nn.functional.mse_loss, dtype, device)


def test_a_mode_raising_in_deterministic_mode_is_a_cell():
    rec = bench_models.measure(_StockRaises, "tiny", torch.float32, True, torch.device(DEVICE), gpu=False,
                               repeats=1, steps=1, warmup=1)
    assert (rec["stock_status"], rec["gradkern_status"]) == ("raises", "ok")
    assert rec["stock_ms"] is None and rec["speedup"] is None and rec["gradkern_ms"] > 0
    assert bench_models._speedup_cell(rec) == "stock raises"
    assert not torch.are_deterministic_algorithms_enabled()


class _SeenOps(TorchDispatchMode):
    """Records the ATen overloads a region runs, named as routed_overloads() names them."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, overload = func.overloadpacket.__name__, func._overloadname
        self.seen.add(name if overload == "default" else f"{name}.{overload}")
        return func(*args, **(kwargs or {}))


def _counting_routes(monkeypatch) -> collections.Counter:
    """Counts, per route, the calls gradkern served (not declined) while enabled."""
    counts = collections.Counter()

    def counted(route, fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            if out is not NotImplemented:
                counts[route] += 1
            return out
        return wrapper

    for info in REGISTRY.values():  # (in place: routers read the registry's implementations at each call)
        for ov, impl in list(info.aten.items()):
            monkeypatch.setitem(info.aten, ov, counted(ov, impl))
    for name in ("sparsemax_forward", "sparsemax_backward"):
        monkeypatch.setattr(gradkern.ops, name, counted(SPARSEMAX, getattr(gradkern.ops, name)))
    return counts


def _grads(work: bench_models.Workload) -> dict:
    work.loss_fn(work.model(*work.inputs)).backward()
    return {n: p.grad for n, p in work.model.named_parameters()}


@pytest.mark.parametrize("name", list(bench_models.MODELS))
def test_model_runs_its_routes_with_stock_gradients(name, monkeypatch):
    """In float64 at the tiny size: stock runs every ATen op the model declares; under
    gradkern.use(mode="always") each route is served by gradkern, and the gradients equal stock's."""
    cls = bench_models.MODELS[name]
    assert cls.routes and all(r in routed_overloads() or r == SPARSEMAX for r in cls.routes)
    cfg = cls.configs["tiny"]
    torch.manual_seed(0)
    work = cls.make(cfg.batch, torch.float64, torch.device(DEVICE), **cfg.kw)
    twin = bench_models.Workload(copy.deepcopy(work.model), work.inputs, work.loss_fn)

    with bench_models.stock_pytorch(), _SeenOps() as mode:
        expected = _grads(work)
    assert {r for r in cls.routes if r != SPARSEMAX} <= mode.seen

    counts = _counting_routes(monkeypatch)
    with gradkern.use(mode="always"):
        got = _grads(twin)
    assert all(counts[r] > 0 for r in cls.routes), counts
    assert expected.keys() == got.keys() and all(g is not None for g in got.values())
    for n in expected:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-9, atol=1e-12, msg=f"{name}: grad of {n}")


def test_stock_sparsemax_matches_the_reference():
    x = (torch.randn(3, 5, 9, dtype=torch.float64) * 2).requires_grad_()
    g = torch.randn(3, 5, 9, dtype=torch.float64)
    ref = REGISTRY["sparsemax_forward"].reference
    for dim in (-1, 1):
        y = bench_models.stock_sparsemax(x, dim)
        torch.testing.assert_close(y, ref(x, dim))
        (dx,) = torch.autograd.grad(y, x, g)
        (dx_ref,) = torch.autograd.grad(ref(x, dim), x, g)
        torch.testing.assert_close(dx, dx_ref)


@gpu_only
@pytest.mark.parametrize("name", ["unet3d-seg", "psp-seg", "vnet"])
def test_deterministic_training_under_gradkern_gives_the_same_bits_each_run(name, monkeypatch):
    """The segmentation and 3-D models train under torch.use_deterministic_algorithms(True) with gradkern on (mode
    "auto", as enable() sets it), where stock raises (MaxPool3d's backward, nll_loss2d) or takes slow paths, and two
    runs from one seed end with the same bits in every parameter (three SGD steps each, at the small size: the
    bench's own training step)."""
    cls = bench_models.MODELS[name]
    cfg = cls.configs["small"]

    def train() -> dict:
        torch.manual_seed(0)
        work = cls.make(cfg.batch, torch.float32, torch.device(DEVICE), **cfg.kw)
        step = bench_models._step_fn(work)
        for _ in range(3):
            step()
        return {n: p.detach().clone() for n, p in work.model.named_parameters()}

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # (as the bench sets it: cuBLAS's deterministic mode)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with gradkern.use():
            first, second = train(), train()
    finally:
        torch.use_deterministic_algorithms(was)
    assert first.keys() == second.keys() and first
    for n in first:
        assert_bitwise_equal(second[n], first[n], f"{name}: {n}")
