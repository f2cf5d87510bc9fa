"""Compile an op's kernels for a GPU architecture without a GPU, and count what the compiler made of them.

    python scripts/sass.py OP [OP ...] [--dtypes f32,bf16] [--size small] [--cases N] [--arch 90] [--dump DIR]

Each op's first N registry cases (`--size`: one of the registry's sizes) run under Triton's interpreter in a child
process, which records every launch's arguments (`launcher.observe_launches`); each distinct launch is then
compiled for sm_ARCH with the Triton this process imports (set PYTHONPATH to another Triton's install to see what
that version makes: the GPU machine's Triton 3.6 compiles differently from CI's), and one line a launch gives its
registers, stack bytes, SASS lines, global loads and stores by width, and division subroutine calls (integer
divisions by runtime values: some 40-100 instructions each). `--dump DIR` writes each launch's SASS there. The
plans are the interpreter's for small shapes: a plan that depends on size (tiles, int64 index math) may differ
from a large problem's."""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import pickle
import re
import subprocess
import sys
import tempfile

_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}


def _capture(ops: list[str], dtypes: list[str], size: str, cases: int, out: str) -> None:
    """Child: run the ops' cases under the interpreter, recording each launch (kernel, args, constexprs; tensors
    as their dtypes, Triton functions passed as constexprs by module and name) to `out`."""
    import torch

    from gradkern.launch.launcher import observe_launches
    from gradkern.registry import REGISTRY

    rec, current = [], [None]

    def named(v):
        fn = getattr(v, "fn", None)
        return ("fn", fn.__module__, fn.__name__) if callable(fn) else v

    def seen(jit_fn, args, kwargs, grid, compiled):
        fn = getattr(jit_fn, "fn", jit_fn)
        rec.append((current[0], fn.__module__, fn.__name__,
                    [("tensor", a.dtype) if isinstance(a, torch.Tensor) else a for a in args],
                    {k: named(v) for k, v in kwargs.items()}))

    with observe_launches(seen):
        for op in ops:
            for dt in dtypes:
                current[0] = (op, dt)
                for case in REGISTRY[op].cases("cpu", getattr(torch, _DTYPES[dt]), size)[:cases]:
                    REGISTRY[op].fn(*case.args, **dict(case.kwargs))
    with open(out, "wb") as f:
        pickle.dump(rec, f)


def _compile(module: str, name: str, args: list, consts: dict, arch: int):
    """(the compiled kernel's cubin bytes) for `args` and `consts` as the JIT would specialise them."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = getattr(importlib.import_module(module), name)
    target = GPUTarget("cuda", arch, 64)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    args = [torch.empty(64, dtype=a[1]) if isinstance(a, tuple) and a[:1] == ("tensor",) else a for a in args]
    consts = {k: getattr(importlib.import_module(v[1]), v[2]) if isinstance(v, tuple) and v[:1] == ("fn",) else v
              for k, v in consts.items()}
    bound, spec, options = binder(*args, **consts)
    options, signature, constexprs, attrs = kernel._pack_args(backend, consts, bound, spec, options)
    return compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def _report(cubin: bytes, dump: str | None, label: str) -> str:
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", path], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", path], capture_output=True, text=True,
                              check=True).stdout
    if dump:
        with open(os.path.join(dump, re.sub(r"[^\w.-]+", "_", label) + ".sass"), "w") as f:
            f.write(sass)
    ops = collections.Counter(m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]+)",
                                                               sass))
    memory = " ".join(f"{k} {v}" for k, v in sorted(ops.items()) if k.startswith(("LDG", "STG")))
    regs = re.search(r"REG:(\d+)", res).group(1)
    stack = re.search(r"STACK:(\d+)", res).group(1)
    return (f"regs {regs:>3} stack {stack:>3} SASS {sum(ops.values()):5d} div calls {ops['CALL.REL.NOINC']:2d}  "
            f"{memory}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ops", nargs="+")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--size", default="small")
    p.add_argument("--cases", type=int, default=3)
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--dump")
    p.add_argument("--capture", help=argparse.SUPPRESS)  # (the child's output file)
    a = p.parse_args()
    dtypes = a.dtypes.split(",")
    if a.capture:
        _capture(a.ops, dtypes, a.size, a.cases, a.capture)
        return
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "launches.pickle")
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
        # (the child runs the installed Triton's interpreter: PYTHONPATH may name another Triton for the compile)
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=src)
        subprocess.run([sys.executable, __file__, *a.ops, "--dtypes", a.dtypes, "--size", a.size, "--cases",
                        str(a.cases), "--capture", out], env=env, check=True)
        with open(out, "rb") as f:
            launches = pickle.load(f)
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
    seen = set()
    for (op, dt), module, name, args, consts in launches:
        key = (module, name, repr(args), repr(sorted(consts.items(), key=lambda kv: kv[0])))
        if key in seen:
            continue
        seen.add(key)
        label = f"{op} {dt} {name} #{len(seen)}"
        print(f"{label:70s} {_report(_compile(module, name, args, consts, a.arch).asm['cubin'], a.dump, label)}",
              flush=True)


if __name__ == "__main__":
    main()
