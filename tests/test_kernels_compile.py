"""Without a GPU the suite runs every kernel through Triton's interpreter, which accepts code the compiler rejects.
This test records every kernel specialisation that the registry's example problems launch under the interpreter
(all four dtypes, plus a strided layout), then compiles each one for an sm_90 GPU with Triton's real compiler in a
process without the interpreter: CPU is enough for that, down to the cubin. On a GPU the whole suite compiles for
real, so the test only runs under the interpreter.

It checks the Triton the machine has (CI: the newest); the GPU machine's older Triton can still reject what this
one accepts (Triton 3.6 asserted in its OptimizeThreadLocality pass on sparsemax's split kernel, which 3.9
compiles): the GPU run stays the judge of that."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import DEVICE, DTYPES, small_pad_tiles
from gradkern import _runtime, config
from gradkern.kernels.pad import padded_shape
from gradkern.registry import REGISTRY

pytestmark = pytest.mark.skipif(not _runtime.INTERPRET, reason="on a GPU every test compiles its kernels for real")

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float64: "*fp64",
        torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8",
        torch.bool: "*i1"}


def _is_constexpr(param) -> bool:
    return "constexpr" in str(param.annotation)


def _encode(value):
    """A constexpr value as JSON: tl dtypes by name, tuples as lists of their values, the rest as is (ints, floats,
    bools, None, strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    import triton.language as tl
    if isinstance(value, tl.dtype):
        return {"tl_dtype": value.name}
    if isinstance(value, tl.constexpr):
        return _encode(value.value)
    if isinstance(value, tuple):  # (pad's GEOM)
        return {"tuple": [_encode(v) for v in value]}
    if hasattr(value, "fn") and hasattr(value, "arg_names"):  # a jit function (an op's math), found by name
        return {"jit": [value.fn.__module__, value.fn.__qualname__]}
    raise TypeError(f"constexpr of type {type(value).__name__}: {value!r}")


def _type(kernel: str, name: str, value):
    """Triton's type string of a runtime argument; a tuple argument is a list of them (a tuple when compiling)."""
    if isinstance(value, torch.Tensor):
        return _PTR[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    if isinstance(value, (tuple, list)):
        return [_type(kernel, name, v) for v in value]
    raise TypeError(f"{kernel}: argument {name} = {value!r}")


def _spec(kernel, args, kwargs) -> dict:
    import inspect

    params = list(inspect.signature(kernel.fn).parameters.values())
    bound = dict(zip([p.name for p in params], args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in {p.name for p in params}})
    signature, constexprs = {}, {}
    for p in params:
        value = bound.get(p.name, p.default)
        if _is_constexpr(p):
            signature[p.name] = "constexpr"
            constexprs[p.name] = _encode(value)
        else:
            signature[p.name] = _type(kernel.fn.__name__, p.name, value)
    return {"module": kernel.fn.__module__, "name": kernel.fn.__qualname__, "signature": signature,
            "constexprs": constexprs, "num_warps": kwargs.get("num_warps", 4)}


def _record_launches(monkeypatch) -> list[dict]:
    from triton.runtime.interpreter import InterpretedFunction

    specs, seen = [], set()
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        spec = _spec(self, args, kwargs)
        key = json.dumps(spec, sort_keys=True)
        if key not in seen:
            seen.add(key)
            specs.append(spec)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", run)
    for name in sorted(REGISTRY):
        info = REGISTRY[name]
        for dtype in DTYPES:
            if dtype not in info.dtypes:
                continue
            for case in info.cases(DEVICE, dtype, "tiny"):
                info.fn(*case.args, **case.kwargs)
                strided = tuple(a.transpose(0, -1) if isinstance(a, torch.Tensor) and a.dim() >= 2
                                and a.is_floating_point() else a for a in case.args)
                try:  # a transposed layout reaches the strided kernels; ops whose shapes then disagree decline
                    info.fn(*strided, **case.kwargs)
                except (ValueError, RuntimeError, TypeError):
                    pass
    _record_pad_loops()
    _record_pad_narrow_planes()
    _record_segment_reduce_cumsum()
    _record_max_pool_outputs_side()
    return specs + _gpu_only_variants(specs)


def _gpu_only_variants(specs: list[dict]) -> list[dict]:
    """Specialisations that only a GPU launches (the interpreter never runs them), for one recorded specialisation
    of each kind: pad's kernel with its L2 prefetch (inline PTX; kinds: mode, crop, loops, planes loop, int64,
    column tile 1, 2, 4 or >= 8) and every kernel with a PDL constexpr as a programmatic dependent (its wait)."""
    kinds, out = set(), []
    for spec in specs:
        c = spec["constexprs"]
        if spec["name"] == "_pad_backward_kernel" and c.get("PREFETCH") is False:
            flag = "PREFETCH"
            kind = (flag, *(c[k] for k in ("REFLECT", "CROP", "LOOPS", "PLANES_LOOP", "I64")), min(c["BW"], 8))
        elif c.get("PDL") is False:
            flag = "PDL"
            kind = (flag, spec["name"], *(repr(c.get(k)) for k in ("I64", "STEP_SUM", "KR", "RR", "ENDS", "BITS")))
        else:
            continue
        if kind not in kinds:
            kinds.add(kind)
            out.append({**spec, "constexprs": {**c, flag: True}})
    assert {k[0] for k in kinds} == {"PREFETCH", "PDL"}, "no pad or summing specialisation recorded"
    return out


def _record_segment_reduce_cumsum() -> None:
    """_segment_reduce_backward reading the lengths' cumsum: the registry's small cases sum starts from the lengths
    in the kernel instead (few segments)."""
    from gradkern.kernels import segment_max

    with config.override(segment_max.CONFIG, lens_max_s=0):  # (every plan is rebuilt: none made before may serve)
        info = REGISTRY["_segment_reduce_backward"]
        for case in info.cases(DEVICE, torch.float32, "tiny"):
            info.fn(*case.args, **case.kwargs)


def _record_max_pool_outputs_side() -> None:
    """The max pools' outputs' side (`_outputs_side_kernel`) in four dtypes: the registry's small problems are below
    its least size, so they take the gather."""
    from gradkern.kernels import max_pool

    with config.override(max_pool.CONFIG, outputs_side_min_inputs=0):
        for op in ("max_pool3d_with_indices_backward", "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward"):
            info = REGISTRY[op]
            for dtype in DTYPES:
                for case in info.cases(DEVICE, dtype, "tiny"):
                    info.fn(*case.args, **case.kwargs)


def _record_pad_loops() -> None:
    """Replicate pad's loop paths (pads wider than _UNROLL, here 0 or 1) over many-tile planes, as test_pad's
    small_tiles fixture runs them: the registry's examples never reach them (their pads are unrolled)."""
    for unroll in (0, 1):
        with small_pad_tiles(unroll, loop_unroll_3d=unroll):
            for d in (1, 2, 3):
                info = REGISTRY[f"replication_pad{d}d_backward"]
                for case in info.cases(DEVICE, torch.float32, "small"):
                    info.fn(*case.args, **case.kwargs)


def _record_pad_narrow_planes() -> None:
    """pad on planes 1 and 2 columns wide, so column tiles that narrow (test_pad's shapes have them; the registry's
    examples do not)."""
    for w in (1, 2):
        for op, shape, pads in (("replication_pad3d_backward", (1, 2, 3, 4, w), (0, 0, 1, 2, 1, 1)),
                                ("reflection_pad2d_backward", (1, 2, 4, w), (0, 0, 1, 2))):
            REGISTRY[op].fn(torch.zeros(padded_shape(shape, pads), device=DEVICE), torch.zeros(shape, device=DEVICE),
                            list(pads))


_COMPILER = textwrap.dedent("""
    import importlib, json, sys, traceback
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def find(module, qualname):
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj

    failures = []
    for spec in json.load(open(sys.argv[1])):
        fn = find(spec["module"], spec["name"])
        tup = lambda t: tuple(map(tup, t)) if isinstance(t, list) else t  # noqa: E731 - JSON made tuples lists
        sig = {k: tup(v) for k, v in spec["signature"].items()}
        names = list(sig)
        consts = {}
        for k, v in spec["constexprs"].items():
            if isinstance(v, dict) and "jit" in v:
                v = find(*v["jit"])
            elif isinstance(v, dict) and "tuple" in v:
                v = tuple(v["tuple"])
            elif isinstance(v, dict):
                v = tl.dtype(v["tl_dtype"])
            consts[(names.index(k),)] = v
        try:
            triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": spec["num_warps"]})
        except Exception as e:  # noqa: BLE001 - every failure is reported with its specialisation
            failures.append(f"{spec['module']}.{spec['name']} {spec['constexprs']} {spec['signature']}: "
                            f"{type(e).__name__}: {str(e)[-2000:]}")
    print(json.dumps(failures))
""")


def test_every_launched_kernel_compiles_for_sm90(monkeypatch, tmp_path: Path):
    specs = _record_launches(monkeypatch)
    assert len({(s["module"], s["name"]) for s in specs}) >= 10, "the recording missed the kernels"
    path = tmp_path / "specs.json"
    path.write_text(json.dumps(specs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", _COMPILER, str(path)], capture_output=True, text=True, env=env,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failures, f"{len(failures)} of {len(specs)} specialisations do not compile:\n" + "\n".join(failures)
