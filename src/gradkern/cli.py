"""`python -m gradkern list | check | bench [--models]`."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch

from . import _runtime
from ._cases import SIZES
from .registry import REGISTRY, supported_ops


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
    from .testing import check_case

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
                    help="comma-separated f32,f16,bf16,f64 or all (default f32,bf16; --models without a GPU: f32)")
    pb.add_argument("--json", default=None, help="write every figure to this JSON file")
    pb.add_argument("--plot", default=None,
                    help="write a PNG chart (kernels: %% of the copy ceiling; --models: speedup per model)")
    # (argparse does not pass const through type: a bare --models leaves "all")
    pb.add_argument("--models", nargs="?", const="all", default=None, type=_models_arg, metavar="NAMES",
                    help="time training steps of small real models instead, stock vs gradkern (all, or "
                         "comma-separated names)")
    pb.add_argument("--list", action="store_true", help="with --models: print the models and exit")
    pb.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    pb.add_argument("--size", default=None, choices=SIZES,
                    help="case size class (default: large on a GPU, small otherwise)")
    args = p.parse_args(argv)
    if args.cmd == "list":
        return cmd_list(args)
    if args.cmd == "check":
        return cmd_check(args)
    if args.list and args.models is None:
        p.error("argument --list: only with --models")
    if args.models is not None:
        kernel_only = [o for o, v in (("--ops", args.ops), ("--size", args.size), ("--no-compile", args.no_compile))
                       if v]
        if kernel_only:
            p.error(f"argument {kernel_only[0]}: not with --models (it is for the kernel benchmark)")
        if args.list:
            from .bench_models import list_lines

            print("\n".join(list_lines()))
            return 0
    for opt, path in (("--json", args.json), ("--plot", args.plot)):  # (written at the end: check before the run)
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            p.error(f"argument {opt}: the folder of {path!r} does not exist")
    if args.models is not None:
        from .bench_models import run_models

        return run_models(None if args.models == "all" else args.models, args.dtypes, json_path=args.json,
                          plot_path=args.plot)
    from .bench import run_bench

    args.dtypes = args.dtypes or [torch.float32, torch.bfloat16]
    return run_bench(args)
