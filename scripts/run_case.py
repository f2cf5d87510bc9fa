#!/usr/bin/env python
"""Run one `bench --sweep` case a few times, for a profiler to catch (Nsight Compute, compute-sanitizer):

    ncu --clock-control none --kernel-name regex:max_pool --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python scripts/run_case.py max_pool3d_with_indices_backward f32 "3/1/1"
    python scripts/run_case.py segment_max_forward bf16 "D=3 lengths uniform" --stock        # stock's kernel
    python scripts/run_case.py _segment_reduce_backward f32 "D=1 lengths u" --config segment_max lanes_write_rows=()

The first case of OP and DTYPE whose label holds LABEL is built, then gradkern's op (or with --stock the sweep's
stock call) runs --repeat times (3), the config overrides in force (--config FAMILY FIELD=VALUE..., values as
Python literals); --time prints its median time by do_bench after. Exit status 2 when no case matches."""

from __future__ import annotations

import argparse
import ast
import contextlib
import sys

import torch

from gradkern import _runtime, config, ops
from gradkern.registry import REGISTRY
from gradkern.routing.dispatch import use
from gradkern.tools import bench_sweep


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("op")
    p.add_argument("dtype", choices=sorted(_runtime.DTYPE_NAMES.values()))
    p.add_argument("label")
    p.add_argument("--stock", action="store_true")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--time", action="store_true")
    p.add_argument("--config", nargs="+", metavar="FAMILY FIELD=VALUE")
    a = p.parse_args(argv)
    dtype = {v: k for k, v in _runtime.DTYPE_NAMES.items()}[a.dtype]
    gpu = torch.cuda.is_available()
    case = next((c for c in bench_sweep.sweep_cases(a.op, dtype, gpu) if a.label in c.label), None)
    if case is None:
        print(f"no {a.op} {a.dtype} case holds {a.label!r}", file=sys.stderr)
        return 2
    built = case.build(_runtime.default_device())
    fn, args, kwargs = (built.stock or (REGISTRY[a.op].stock(), built.args, built.kwargs)) if a.stock else \
        (getattr(ops, a.op), built.args, built.kwargs)
    changes = {}
    if a.config:
        family, *fields = a.config
        changes = {k: ast.literal_eval(v) for k, v in (f.split("=", 1) for f in fields)}
        tunable = config.tunables()[family]
    with torch.no_grad(), use(False), (config.override(tunable, **changes) if changes else contextlib.nullcontext()):
        for _ in range(a.repeat):
            fn(*args, **kwargs)
        if gpu:
            torch.cuda.synchronize()
        print(f"{a.op} {a.dtype} {case.label}: ran {'stock' if a.stock else 'gradkern'} {a.repeat}x", flush=True)
        if a.time and gpu:
            import triton.testing

            ms = triton.testing.do_bench(lambda: fn(*args, **kwargs), return_mode="median")
            print(f"median {ms * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
