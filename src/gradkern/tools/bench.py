"""`python -m gradkern bench`: gradkern vs ATen eager vs torch.compile, per (op, dtype, case).

Figures: median ms (`triton.testing.do_bench`), effective GB/s (the case's minimum bytes / time), % of the copy
ceiling measured in the same run (a large `y.copy_(x)`, bytes read + written), speedups, and host overhead in
µs/call at ~4K elements (host clock over many calls, no synchronisation in between). Without a GPU it says so
and runs a small smoke version through Triton's interpreter (timings there mean nothing)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import torch

from .. import _runtime, ops
from ..registry import REGISTRY
from ..routing import dispatch, native
from ..routing.dispatch import use
from .cli import print_table


def _median_ms(fn: Callable, gpu: bool) -> float:
    if gpu:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[1]


def copy_ceiling_gbs(gpu: bool) -> float:
    """Bytes read + written per second by a large device copy."""
    n = (1 << 28) if gpu else (1 << 16)
    x = torch.randn(n, device=_runtime.default_device())
    y = torch.empty_like(x)
    ms = _median_ms(lambda: y.copy_(x), gpu)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def host_overhead_us(fn: Callable, calls: int) -> float:
    for _ in range(20):
        fn()
    if torch.cuda.is_available() and not _runtime.INTERPRET:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    if torch.cuda.is_available() and not _runtime.INTERPRET:
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _safe(fn: Callable, what: str):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
        print(f"    ({what} failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})",
              file=sys.stderr, flush=True)
        return None


def run_bench(args) -> int:
    gpu = _runtime.has_gpu()
    size = args.size or ("large" if gpu else "small")
    device = _runtime.default_device()
    if gpu:
        dev_name = torch.cuda.get_device_name()
    else:
        dev_name = "CPU (Triton interpreter)"
        print("No CUDA GPU: running a small smoke benchmark through Triton's interpreter on CPU; the timings "
              "say nothing about GPU performance.", flush=True)
    compile_ok = gpu and not args.no_compile
    ceiling = copy_ceiling_gbs(gpu)
    print(f"device: {dev_name}; copy ceiling {ceiling:.0f} GB/s (read + write); size class '{size}'", flush=True)
    names = args.ops or sorted(REGISTRY)
    # host time first: measured after the torch.compile baselines in the same process, ours and ATen's alike read
    # up to 2x higher (H200 machine, prelu tiny case: 75.5 / 55.4 us after them, 38.3 / 33.2 before)
    overhead = _overheads(names, device, gpu)
    work = []
    for name in names:
        info = REGISTRY[name]
        for dtype in args.dtypes:
            if dtype in info.dtypes:
                work.append((info, dtype))
    rows, records = [], []
    with use(False):  # the baselines are stock PyTorch
        for i, (info, dtype) in enumerate(work, 1):
            dt = _runtime.DTYPE_NAMES[dtype]
            torch.manual_seed(0)
            cases = info.cases(device, dtype, size)
            stock = info.stock()
            compiled = torch.compile(stock, dynamic=False) if compile_ok else None
            for case in cases:
                print(f"[{i}/{len(work)}] {info.name} {dt} {case.label} ...", file=sys.stderr, flush=True)
                a, kw = case.args, dict(case.kwargs)
                ours = _median_ms(lambda: info.fn(*a, **kw), gpu)
                aten = _safe(lambda: _median_ms(lambda: stock(*a, **kw), gpu), "ATen eager")
                comp = _safe(lambda: _median_ms(lambda: compiled(*a, **kw), gpu), "torch.compile") \
                    if compiled is not None else None
                gbs = case.bytes / (ours * 1e-3) / 1e9
                rec = {"op": info.name, "dtype": dt, "case": case.label, "bytes": case.bytes,
                       "gradkern_ms": ours, "aten_ms": aten, "compile_ms": comp, "gradkern_gbs": gbs,
                       "aten_gbs": case.bytes / (aten * 1e-3) / 1e9 if aten else None,
                       "compile_gbs": case.bytes / (comp * 1e-3) / 1e9 if comp else None,
                       "pct_copy": 100 * gbs / ceiling,
                       "speedup_vs_aten": aten / ours if aten else None,
                       "speedup_vs_compile": comp / ours if comp else None}
                records.append(rec)
                rows.append([info.name, dt, case.label, f"{ours:.4f}", _f(aten, ".4f"), _f(comp, ".4f"),
                             f"{gbs:.0f}", f"{rec['pct_copy']:.1f}%", _f(rec["speedup_vs_aten"], ".2f", "x"),
                             _f(rec["speedup_vs_compile"], ".2f", "x")])
    print()
    print_table(["op", "dtype", "case", "gradkern ms", "ATen ms", "compile ms", "GB/s", "% copy", "vs ATen",
                 "vs compile"], rows)
    print()
    print_table(["op", "path", "case", "gradkern µs/call", "stock µs/call", "ratio", "delta µs", "target"],
                [[o["op"], o["path"], o["case"], f"{o['gradkern_us']:.1f}", _f(o["aten_us"], ".1f"),
                  _f(o["ratio"], ".2f", "x"), _f(o["delta_us"], "+.1f"), "met" if o["target_met"] else "MISSED"]
                 for o in overhead])
    result = {"device": dev_name, "torch": torch.__version__, "size": size, "copy_ceiling_gbs": ceiling,
              "cases": records, "host_overhead": overhead}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.json}")
    if args.plot:
        _plot(records, ceiling, dev_name, args.plot)
    return 0


# host-cost targets (design.md): a routed op or gradkern.ops function at most this many times ATen's time a call,
# an autograd-key route's forward+backward at most this many microseconds above stock's
HOST_RATIO_TARGET, HOST_DELTA_TARGET_US = 1.2, 15.0
# each side timed in this many short runs of `calls` calls, alternating, keeping its fastest: host noise only adds
# time, and two long runs a side let it move rows past the target and back (docs/tuning/routing.md, host table)
HOST_ROUNDS = 20


def _overheads(names: list[str], device, gpu: bool) -> list[dict]:
    """Host µs per call at the "tiny" size, gradkern against stock in the same process, per op and path: the
    `gradkern.ops` function against stock's op, the ATen op routed by `use()` against the same call with gradkern
    unregistered (so stock pays no router), and for autograd-key routes forward + backward likewise."""
    calls, rounds = (200, HOST_ROUNDS) if gpu else (3, 2)  # (the interpreter: a smoke run)
    out = []
    for name in names:
        info = REGISTRY[name]
        case = info.cases(device, torch.float32, "tiny")[0]
        a, kw = case.args, dict(case.kwargs)
        fn, stock = getattr(ops, name), info.stock()
        out.append(_host_row(name, "gradkern.ops", case.label, lambda: fn(*a, **kw), lambda: stock(*a, **kw),
                             calls, rounds, routed=False))
        if info.dispatch == "backend" and name in info.aten:
            aten_op = getattr(torch.ops.aten, name)
            out.append(_host_row(name, "routed", case.label, lambda: aten_op(*a, **kw), None, calls, rounds))
        if info.dispatch == "autograd" and info.aten_examples is not None:
            for overload, (ea, ekw) in info.aten_examples(device, torch.float32).items():
                step, path = _forward_backward(native.aten_overload(overload), ea, ekw)
                out.append(_host_row(name, f"{overload} {path}", "example", step, None, calls, rounds))
    return out


def _forward_backward(op, args: tuple, kwargs: dict) -> tuple[Callable, str]:
    """A call of `op` and, where an input requires grad, autograd.grad of its result to those inputs; and what
    it times ("fwd+bwd" or "routed")."""
    inputs = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
    if not inputs:
        return (lambda: op(*args, **kwargs)), "routed"
    grad = torch.ones_like(op(*args, **kwargs))
    return (lambda: torch.autograd.grad(op(*args, **kwargs), inputs, grad)), "fwd+bwd"


def _host_row(name: str, path: str, label: str, ours: Callable, stock: Callable | None, calls: int,
              rounds: int, routed: bool = True) -> dict:
    """Both timed `rounds` times, alternating, keeping each one's best. `stock` None: `ours` itself with gradkern
    unregistered; `routed`: `ours` runs under use()."""
    stock_us, ours_us = [], []
    for _ in range(rounds):
        dispatch.unregister()
        stock_us.append(_safe(lambda: host_overhead_us(stock or ours, calls), f"stock {name} {path}"))
        with use(routed, mode="always"):
            ours_us.append(host_overhead_us(ours, calls))
    best_ours = min(ours_us)
    best_stock = min((t for t in stock_us if t is not None), default=None)
    ratio = best_ours / best_stock if best_stock else None
    if "fwd+bwd" in path:
        met = best_stock is not None and best_ours <= best_stock + HOST_DELTA_TARGET_US
    else:
        met = ratio is not None and ratio <= HOST_RATIO_TARGET
    return {"op": name, "path": path, "case": label, "gradkern_us": best_ours, "aten_us": best_stock,
            "ratio": ratio, "delta_us": best_ours - best_stock if best_stock else None, "target_met": met}


def _f(v, fmt: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{suffix}"


def _plot(records: list[dict], ceiling: float, dev_name: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['op']} {r['dtype']}\n{r['case']}" for r in records]
    series = [("gradkern", "gradkern_gbs"), ("ATen eager", "aten_gbs"), ("torch.compile", "compile_gbs")]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(records) + 2), 5))
    width = 0.27
    for k, (name, key) in enumerate(series):
        vals = [100 * (r[key] or 0) / ceiling for r in records]
        ax.bar([i + (k - 1) * width for i in range(len(records))], vals, width, label=name)
    ax.axhline(100, color="k", lw=0.8, ls="--")
    ax.set_ylabel("% of copy ceiling")
    ax.set_title(f"gradkern vs ATen vs torch.compile on {dev_name} (copy ceiling {ceiling:.0f} GB/s)")
    ax.set_xticks(range(len(records)))
    ax.set_xticklabels(labels, rotation=90, fontsize=6)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
