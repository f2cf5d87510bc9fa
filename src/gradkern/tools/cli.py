"""`python -m gradkern list | check | bench [--models | --sweep]`."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch

from .. import _runtime
from .._cases import SIZES
from ..registry import REGISTRY, supported_ops


def _dtype_arg(names: str) -> list[torch.dtype]:
    by_name = {v: k for k, v in _runtime.DTYPE_NAMES.items()}
    if names == "all":
        return list(_runtime.FLOAT_DTYPES)
    try:
        dtypes = [by_name[n.strip()] for n in names.split(",") if n.strip()]
    except KeyError as e:
        raise argparse.ArgumentTypeError(f"unknown dtype {e.args[0]!r}; use f32,f16,bf16,f64 or all") from None
    if not dtypes:
        raise argparse.ArgumentTypeError("no dtype given; use f32,f16,bf16,f64 or all")
    return dtypes


def _ops_arg(names: str) -> list[str]:
    ops = [n.strip() for n in names.split(",") if n.strip()]
    if not ops:
        raise argparse.ArgumentTypeError("no op given (leave --ops out for every op)")
    unknown = [n for n in ops if n not in REGISTRY]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown op(s) {unknown}; `python -m gradkern list` shows them")
    return ops


def _models_arg(names: str) -> list[str]:
    from .bench_models import MODELS

    if names == "all":
        return list(MODELS)
    models = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in models if n not in MODELS]
    if unknown or not models:
        raise argparse.ArgumentTypeError(f"unknown model(s) {unknown}; one of {sorted(MODELS)} or all")
    return models


_SWEEP_INTERP_CASES = 2  # (bench_sweep.INTERP_CASES, without importing it for --help)


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {value!r}")
    return n


def _positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"a positive number, not {value!r}")
    return x


def _paths_arg(value: str) -> list[str]:
    paths = [v.strip() for v in value.split(",") if v.strip()]
    if not paths:
        raise argparse.ArgumentTypeError("no file given")
    return paths


def print_table(headers: list[str], rows: list[list], out=None) -> None:
    out = out if out is not None else sys.stdout  # (read at call time: sys.stdout may be replaced after import)
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line, file=out)
    print("-" * len(line), file=out)
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)), file=out)


def cmd_list(_args) -> int:
    rows = []
    for op in supported_ops():
        g = next(iter(op["guarantees"].values()))
        accum = {d: (str(gd.accumulator_dtype).replace("torch.", "") if gd.accumulator_dtype else "-")
                 for d, gd in op["guarantees"].items()}
        rows.append([op["name"], ", ".join(op["aten"]) or "-", ",".join(op["dtypes"]),
                     "yes" if g.deterministic else "no", "yes" if g.bit_stable else "no",
                     "f64 for f64, else f32", "/".join(sorted(set(accum.values())))])
    print_table(["op", "ATen overloads (enable())", "dtypes", "deterministic", "bit-stable", "math", "accumulator"],
                rows)
    print("\nwhich problems enable() sends to gradkern (mode \"auto\"; mode \"always\": every one)")
    print_table(["op", "route"], [[op["name"], op["route"]] for op in supported_ops()])
    return 0


def cmd_check(args) -> int:
    from ..testing import check_case

    size = "small" if _runtime.INTERPRET else "check"
    device = _runtime.default_device()
    print(f"checking every op against stock PyTorch (float64 reference on CPU) on {_device_name()}, "
          f"size class '{size}'", flush=True)
    rows, failed = [], 0
    for name in args.ops or sorted(REGISTRY):
        info = REGISTRY[name]
        for dtype in args.dtypes:
            if dtype not in info.dtypes:
                continue
            torch.manual_seed(0)
            for case in info.cases(device, dtype, size):
                try:
                    check_case(name, case.args, dict(case.kwargs), what=f"{name} {case.label}")
                    status = "PASS"
                except Exception as e:  # noqa: BLE001 - a table row per failure, then a non-zero exit
                    status = f"FAIL: {str(e).splitlines()[0][:100]}"
                    failed += 1
                    if args.verbose:
                        traceback.print_exc()
                rows.append([name, _runtime.DTYPE_NAMES[dtype], case.label, status])
                print(f"  {status[:4]}  {name} {_runtime.DTYPE_NAMES[dtype]} {case.label}", file=sys.stderr,
                      flush=True)
    print_table(["op", "dtype", "case", "result"], rows)
    print(f"\n{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _device_name() -> str:
    if _runtime.INTERPRET or not torch.cuda.is_available():
        return "CPU (Triton interpreter)"
    return torch.cuda.get_device_name()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gradkern", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="ops, dtypes and precision guarantees")
    pc = sub.add_parser("check", help="every op against stock PyTorch on random inputs, as a pass/fail table")
    pb = sub.add_parser("bench", help="gradkern vs ATen eager vs torch.compile")
    for sp in (pc, pb):
        sp.add_argument("--ops", type=_ops_arg, default=None, help="comma-separated op names (default: all)")
    pc.add_argument("--dtypes", type=_dtype_arg, default=list(_runtime.FLOAT_DTYPES), help="f32,f16,bf16,f64|all")
    pc.add_argument("-v", "--verbose", action="store_true")
    pb.add_argument("--dtypes", type=_dtype_arg, default=None,
                    help="comma-separated f32,f16,bf16,f64 or all (default f32,bf16; --sweep: f32,bf16,f16; "
                         "--models and --sweep without a GPU: f32)")
    pb.add_argument("--json", default=None, help="write every figure to this JSON file")
    pb.add_argument("--plot", default=None,
                    help="write a PNG chart (kernels: %% of the copy ceiling; --models: speedup per model; --sweep: "
                         "speedup per case, a panel per op family)")
    # (argparse does not pass const through type: a bare --models leaves "all")
    pb.add_argument("--models", nargs="?", const="all", default=None, type=_models_arg, metavar="NAMES",
                    help="time training steps of small real models instead, stock vs gradkern (all, or "
                         "comma-separated names)")
    pb.add_argument("--sweep", action="store_true",
                    help="every op over many seeded shapes, layouts and sizes (at least 24 cases per op and dtype), "
                         "judged per op by min and geometric mean (default dtypes f32,bf16,f16; without a GPU: f32, "
                         f"{_SWEEP_INTERP_CASES} tiny cases per op)")
    pb.add_argument("--cases", type=_positive_int, default=None, metavar="N",
                    help="with --sweep: the first N cases per op and dtype only")
    pb.add_argument("--compile-cases", type=_positive_int, default=None, metavar="N",
                    help="with --sweep: the torch.compile baseline on the first N cases per op and dtype only (an "
                         "Inductor compile a case is most of a sweep's time)")
    pb.add_argument("--time-limit", type=_positive_float, default=None, metavar="SECONDS",
                    help="with --sweep: start no case after this long (the tables, JSON and plot cover what ran)")
    pb.add_argument("--gpu-time", action="store_true",
                    help="with --sweep on a GPU: also each call's GPU time (torch.profiler) and host time, for "
                         "gradkern and stock eager, and the speedup on GPU time (host-bound cases read the host)")
    pb.add_argument("--merge", type=_paths_arg, default=None, metavar="A.json,B.json",
                    help="with --sweep: run nothing; merge these sweep JSONs (one per run) into one table, and "
                         "--json / --plot")
    pb.add_argument("--list", action="store_true",
                    help="with --models: print the models; with --sweep: print its cases, '<op> <dtype> <case>' a "
                         "line (every case unless --cases); then exit")
    pb.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    pb.add_argument("--size", default=None, choices=SIZES,
                    help="case size class (default: large on a GPU, small otherwise)")
    args = p.parse_args(argv)
    if args.cmd == "list":
        return cmd_list(args)
    if args.cmd == "check":
        return cmd_check(args)
    if args.sweep and args.models is not None:
        p.error("argument --sweep: not with --models")
    if args.list and args.models is None and not args.sweep:
        p.error("argument --list: only with --models or --sweep")
    sweep_only = [o for o, v in (("--cases", args.cases), ("--compile-cases", args.compile_cases),
                                 ("--time-limit", args.time_limit), ("--merge", args.merge),
                                 ("--gpu-time", args.gpu_time or None)) if v is not None]
    if sweep_only and not args.sweep:
        p.error(f"argument {sweep_only[0]}: only with --sweep")
    if args.models is not None:
        kernel_only = [o for o, v in (("--ops", args.ops), ("--size", args.size), ("--no-compile", args.no_compile))
                       if v]
        if kernel_only:
            p.error(f"argument {kernel_only[0]}: not with --models (it is for the kernel benchmark)")
        if args.list:
            from .bench_models import list_lines

            print("\n".join(list_lines()))
            return 0
    if args.sweep:
        if args.size is not None:
            p.error("argument --size: not with --sweep (its cases come in one size: full on a GPU, tiny otherwise)")
        if args.merge is not None and (args.list or args.ops or args.dtypes or args.cases or args.time_limit
                                       or args.compile_cases or args.no_compile or args.gpu_time):
            p.error("argument --merge: only with --json and --plot (it runs nothing)")
        if args.list:
            from .bench_sweep import SWEEP_DTYPES, list_lines

            ops = args.ops or sorted(REGISTRY)
            print("\n".join(list_lines(ops, args.dtypes or list(SWEEP_DTYPES), args.cases)))
            return 0
        for path in args.merge or ():
            if not os.path.isfile(path):
                p.error(f"argument --merge: no file {path!r}")
    for opt, path in (("--json", args.json), ("--plot", args.plot)):  # (written at the end: check before the run)
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            p.error(f"argument {opt}: the folder of {path!r} does not exist")
    if args.models is not None:
        from .bench_models import run_models

        return run_models(None if args.models == "all" else args.models, args.dtypes, json_path=args.json,
                          plot_path=args.plot)
    if args.sweep:
        from .bench_sweep import merge, run_sweep

        if args.merge is not None:
            return merge(args.merge, json_path=args.json, plot_path=args.plot)
        return run_sweep(args.ops, args.dtypes, args.cases, json_path=args.json, plot_path=args.plot,
                         compile_ok=False if args.no_compile else None, time_limit_s=args.time_limit,
                         compile_cases=args.compile_cases, gpu_time=args.gpu_time)
    from .bench import run_bench

    args.dtypes = args.dtypes or [torch.float32, torch.bfloat16]
    return run_bench(args)
