"""The one elementwise launcher every pointwise op uses.

An op supplies a scalar `@triton.jit` math function `fn(a, b, c, s0, s1, s2, FLAG)`: up to three tensor
operands (already upcast to the math dtype; unused ones repeat `a`), three float scalars (in the math dtype) and
one constexpr flag. `Pointwise(...)(*tensors, scalars=..., flag=..., out=...)` then handles everything else:

* validation (dtype, device, broadcastable shapes, `out`), done before any launch and cached per
  (shapes, strides, dtypes, devices) together with the launch plan;
* a flat fast path when every operand has the output's shape and the same dense strides (contiguous,
  channels_last, any dense permutation): one 1-D pass over storage;
* an in-place strided path for everything else: arbitrary strides and broadcast (stride-0) inputs of rank up
  to 8 (after merging dims that are contiguous across all operands), int64 offsets;
* 0-d and empty tensors, dtype promotion as ATen's TensorIterator does it (math in fp32, fp64 for fp64);
* a low-overhead launch: after the first call of a specialisation the compiled kernel is called directly.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import _runtime
from ._runtime import cdiv
from .errors import InvalidProblem, RankUnsupported, Unsupported
from .tl_helpers import HAS_GDC, cast_out, scalar

__all__ = ["Pointwise", "scalar_bits", "round_to_dtype", "MAX_RANK", "check_tensor", "launch"]

MAX_RANK = 8
_I32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------------------------- host helpers
def scalar_bits(value: float) -> int:
    """A float as the int64 bit pattern of its float64 value: how kernels receive scalars at full precision
    (Triton would pass a Python float as fp32). (Zeros bypass the cache: 0.0 and -0.0 are one key there.)"""
    value = float(value)
    return _bits(value) if value != 0.0 else (0 if math.copysign(1.0, value) > 0 else -(2**63))


@functools.lru_cache(maxsize=4096)
def _bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value))[0]


def bits_spec(bits) -> tuple:
    """What Triton specialises scalar arguments `bits` on, part of the key under which a compiled kernel is
    relaunched directly: their type (int32 or int64). The kernels exempt them from value specialisation (see
    SCALAR_PARAMS), so a scalar's bits are never compiled in."""
    return tuple(-(2**31) <= b <= _I32_MAX for b in bits)


# the kernels' scalar parameters, exempt from Triton's value specialisation (do_not_specialize): it would compile
# bits equal to 1 (the float 5e-324) in as a constant, which the scalar helper cannot bitcast, and key others on
# their divisibility by 16
SCALAR_PARAMS = ("s0", "s1", "s2")


def round_to_dtype(value: float, dtype: torch.dtype) -> float:
    """`value` rounded to `dtype` (round to nearest even, overflow to ±inf), as ATen's Scalar.to<scalar_t>()."""
    value = float(value)
    if value == 0.0:  # (±0 is exact in every dtype; the cache below takes 0.0 and -0.0 for one key)
        return value
    return _rounded(value, dtype)


@functools.lru_cache(maxsize=4096)
def _rounded(value: float, dtype: torch.dtype) -> float:
    if dtype == torch.float64 or math.isnan(value) or math.isinf(value):
        return value
    if dtype == torch.float32:
        fmt = "<f"
    elif dtype == torch.float16:
        fmt = "<e"
    elif dtype == torch.bfloat16:
        f32 = _rounded(value, torch.float32)
        if math.isinf(f32):
            return f32
        bits = struct.unpack("<I", struct.pack("<f", f32))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    else:
        raise Unsupported("gradkern", "dtype", "a floating dtype", dtype)
    try:
        return struct.unpack(fmt, struct.pack(fmt, value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def result_dtype(ts: Sequence[torch.Tensor]) -> torch.dtype:
    """ATen's type promotion over floating tensors: 0-d tensors take part only when no tensor has dims (an f32
    vector with an f64 0-d tensor gives f32, as in torch.result_type)."""
    pool = [t.dtype for t in ts if t.dim() > 0] or [t.dtype for t in ts]
    out = pool[0]
    for d in pool[1:]:
        out = torch.promote_types(out, d)
    return out


def check_tensor(op: str, arg: str, t, dtypes: Sequence[torch.dtype] = _runtime.FLOAT_DTYPES) -> None:
    """Raise the named error unless `t` is a tensor of one of `dtypes` on gradkern's device type, without a
    pending negation (a negative-bit view: under enable() PyTorch resolves those before a kernel is reached)."""
    if not isinstance(t, torch.Tensor):
        raise Unsupported(op, arg, "a torch.Tensor", type(t).__name__)
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise Unsupported(op, arg, f"a tensor of dtype {names}", t.dtype)
    if t.device.type != _runtime.DEVICE_TYPE:
        where = "cuda" if _runtime.DEVICE_TYPE == "cuda" else "cpu (TRITON_INTERPRET=1)"
        raise Unsupported(op, arg, f"a tensor on device {where}", f"a tensor on device {t.device}")
    if not torch.compiler.is_compiling() and t.is_neg():  # the kernels read storage as is: a pending negation
        # would be lost (traced code reaches the kernels through custom ops, with real tensors)
        raise Unsupported(op, arg, "a tensor without a pending negation (call .resolve_neg() first)",
                          "a negative-bit view")


def check_like(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    """Raise the named error (Unsupported) unless tensor `t` (argument `arg`) has the dtype and device of `ref`."""
    if t.dtype != ref.dtype:
        raise Unsupported(op, arg, f"dtype {ref.dtype} (the dtype of {ref_arg})", t.dtype)
    if t.device != ref.device:
        raise Unsupported(op, arg, f"a tensor on {ref.device} (the device of {ref_arg})", t.device)


_BROADCAST: dict = {}  # shapes -> broadcast shape (torch.broadcast_shapes costs 10-20 us a call)


def broadcast_shape(op: str, names: Sequence[str], shapes: Sequence) -> tuple[int, ...]:
    """torch.broadcast_shapes(*shapes) as a tuple (cached: fused backwards ask on every call), or InvalidProblem
    naming each input (`names`, one per shape) with its shape."""
    try:
        key = tuple(tuple(s) for s in shapes)
        shape = _BROADCAST.get(key)
    except TypeError:  # symbolic sizes: not cached
        key, shape = None, None
    if shape is None:
        try:
            shape = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError:
            given = ", ".join(f"{n}{tuple(s)}" for n, s in zip(names, shapes, strict=False))
            raise InvalidProblem(op, "/".join(names), "shapes that broadcast together", given) from None
        _runtime.remember(_BROADCAST, key, shape)
    return shape


# ----------------------------------------------------------------------------------------------- kernels
@triton.jit
def as_operand(v, DT: tl.constexpr, MATH: tl.constexpr):
    """A loaded operand in the math dtype, first rounded to the op's common dtype DT where that loses bits (a 0-d
    operand of a wider dtype, which type promotion leaves out: ATen's TensorIterator casts every input to the
    common dtype; from float64 to a 16-bit type through float32, as c10's Half and BFloat16 convert a double)."""
    if v.dtype != DT and v.dtype.primitive_bitwidth >= DT.primitive_bitwidth:
        if v.dtype == tl.float64 and DT.primitive_bitwidth == 16:
            v = v.to(tl.float32)
        v = cast_out(v, DT)
    return v.to(MATH)


@triton.jit
def _apply(out, x0, x1, x2, oo, o0, o1, o2, mask, s0, s1, s2, FN: tl.constexpr, NIN: tl.constexpr,
           FLAG: tl.constexpr, MATH: tl.constexpr):
    # load the inputs at their offsets (upcast at once: the kernel rule, and the interpreter's bf16 trap; in the
    # common dtype first, where an operand's is wider), apply the op's math, store at the output's offsets
    DT: tl.constexpr = out.dtype.element_ty
    a = as_operand(tl.load(x0 + o0, mask=mask), DT, MATH)
    b = a
    c = a
    if NIN >= 2:
        b = as_operand(tl.load(x1 + o1, mask=mask), DT, MATH)
    if NIN >= 3:
        c = as_operand(tl.load(x2 + o2, mask=mask), DT, MATH)
    r = FN(a, b, c, scalar(s0, MATH), scalar(s1, MATH), scalar(s2, MATH), FLAG)
    tl.store(out + oo, cast_out(r, out.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=SCALAR_PARAMS)
def _flat_kernel(out, x0, x1, x2, s0, s1, s2, n,
                 FN: tl.constexpr, NIN: tl.constexpr, FLAG: tl.constexpr, MATH: tl.constexpr,
                 BLOCK: tl.constexpr, I64: tl.constexpr):
    if I64:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    _apply(out, x0, x1, x2, offs, offs, offs, offs, offs < n, s0, s1, s2, FN, NIN, FLAG, MATH)


@triton.jit
def strided_offsets(n, SHAPE, SO, S0, S1, S2, S3, USE: tl.constexpr, RANK: tl.constexpr, BLOCK: tl.constexpr,
                    I64: tl.constexpr):
    """This program's BLOCK linear indices into a collapsed problem of RANK dims (SHAPE) -> (mask, output
    offsets, offsets of operands 0..3), each operand through its strides (S1..S3 only where USE's bit 1..3 is
    set; the others stay 0). 32-bit index math unless I64: its divisions are much cheaper."""
    if I64:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rem = offs
    oo = tl.zeros_like(offs)
    f0 = tl.zeros_like(offs)
    f1 = tl.zeros_like(offs)
    f2 = tl.zeros_like(offs)
    f3 = tl.zeros_like(offs)
    for i in tl.static_range(RANK):
        size = SHAPE[RANK - 1 - i]
        idx = rem % size
        rem = rem // size
        oo += idx * SO[RANK - 1 - i]
        f0 += idx * S0[RANK - 1 - i]
        if USE & 2:
            f1 += idx * S1[RANK - 1 - i]
        if USE & 4:
            f2 += idx * S2[RANK - 1 - i]
        if USE & 8:
            f3 += idx * S3[RANK - 1 - i]
    return offs < n, oo, f0, f1, f2, f3


def strided_i64(n: int, shape_c: Sequence[int], strides_c: Sequence[Sequence[int]], block: int) -> bool:
    """Whether strided_offsets needs 64-bit index math: a linear index or some operand's offset passes 2^31."""
    span = max(sum((d - 1) * abs(st) for d, st in zip(shape_c, sc, strict=True)) for sc in strides_c)
    return n + block > _I32_MAX or span > _I32_MAX


@triton.jit(do_not_specialize=SCALAR_PARAMS)
def _strided_kernel(out, x0, x1, x2, s0, s1, s2, n, SHAPE, SO, S0, S1, S2,
                    FN: tl.constexpr, NIN: tl.constexpr, FLAG: tl.constexpr, MATH: tl.constexpr,
                    RANK: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr):
    mask, oo, o0, o1, o2, _o3 = strided_offsets(n, SHAPE, SO, S0, S1, S2, S0, (1 << NIN) - 1, RANK, BLOCK, I64)
    _apply(out, x0, x1, x2, oo, o0, o1, o2, mask, s0, s1, s2, FN, NIN, FLAG, MATH)


_TL_DTYPE = {torch.float32: tl.float32, torch.float64: tl.float64}
FLAT_BLOCK, FLAT_WARPS = 1024, 4  # measured best on an H200 among 1024..8192 x 4..16 warps
STRIDED_BLOCK, STRIDED_WARPS = 1024, 4


# ----------------------------------------------------------------------------------------------- fast launch
_fast_cache: dict = {}
_empty_like = torch.empty_like
_get_device = getattr(torch._C, "_cuda_getDevice", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_FAST_OK = not _runtime.INTERPRET
_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


#: set while gradkern.plan records a run's launches: every launch then goes through Triton's JIT entry point
RECORDING = False


def hooks_idle() -> bool:
    """True when no Triton launch hook is installed (a profiler's) and no plan is recording, so the launcher may
    be called directly with no launch metadata. Triton 3.6 keeps hooks in (possibly empty) HookChains; older
    versions use None."""
    if _KNOBS is None or RECORDING:
        return False
    for hook in (_KNOBS.launch_enter_hook, _KNOBS.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def relaunchable(ck) -> bool:
    """Whether `ck`, what `kernel[grid](...)` returned, is a compiled kernel we know how to call directly."""
    return _FAST_OK and all(hasattr(ck, a) for a in ("run", "function", "packed_metadata"))


def direct_launcher(ck) -> Callable:
    """A callable `(grid0, stream, *args)` that launches compiled kernel `ck` directly, as Triton's JIT does after
    its own cache lookup: `args` are every kernel parameter in order, constexprs included; pointers may be given
    as ints (data_ptr values), which spares the launcher a driver query per pointer. Only valid for the
    specialisation `ck` was compiled for, on the current device, with `hooks_idle()`."""
    run, function, meta = ck.run, ck.function, ck.packed_metadata
    raw = getattr(run, "launch", None)
    if raw is not None and getattr(run, "global_scratch_size", 1) == 0 \
            and getattr(run, "profile_scratch_size", 1) == 0 and hasattr(run, "launch_pdl"):
        # Triton 3.6's CudaLauncher.__call__ only adds the (here absent) scratch buffers before calling this
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl
        return lambda grid0, stream, *args: raw(grid0, 1, 1, stream, function, coop, pdl, None, None, meta, None,
                                                None, None, *args)
    return lambda grid0, stream, *args: run(grid0, 1, 1, stream, function, meta, None, None, None, *args)


# kernels with a PDL constexpr launch as programmatic dependents where the GPU can (pdl_ok)
PDL = True


def pdl_ok(device: int) -> bool:
    """Whether kernels on CUDA device `device` launch as programmatic dependents of the kernel before them in the
    stream: PDL on (read on every call), compiled Triton with gdc_wait, compute capability 9+. Such a kernel (its
    PDL constexpr set) may start while that kernel finishes; its first instruction, gdc_wait, waits until that
    kernel is done and its writes are visible, so only the launch latency overlaps."""
    return PDL and _pdl_capable(device)


@functools.cache
def _pdl_capable(device: int) -> bool:
    return _FAST_OK and HAS_GDC and device >= 0 and torch.cuda.get_device_capability(device)[0] >= 9


def launch_consts(constexprs: dict, num_warps: int, *, pdl: bool | None = None, **options) -> dict:
    """The `consts` that `launch` takes: the kernel's constexprs (in its parameter order; with `pdl` not None, its
    PDL constexpr last), their values for the direct relaunch, num_warps and other compile `options`, and
    launch_pdl where PDL is on."""
    consts = dict(constexprs) if pdl is None else {**constexprs, "PDL": pdl}
    consts = {**consts, "__values__": tuple(consts.values()), "num_warps": num_warps, **options}
    if pdl:
        consts["launch_pdl"] = True
    return consts


def launch(kernel, grid: tuple[int, ...], ptrs: Sequence[torch.Tensor], ints: Sequence, consts: dict, device: int,
           spec_key: tuple | None = None) -> None:
    """Launch `kernel[grid](*ptrs, *ints, **consts)` on CUDA device `device` (-1: CPU under the interpreter):
    `ptrs` are the tensors of the kernel's leading pointer parameters, `ints` its parameters after them.

    With a `spec_key`, the compiled kernel is called directly after the first launch of that specialisation,
    with the pointers as ints (which spares the launcher a driver query each: docs/tuning/pointwise.md). The key
    must capture the device and everything Triton specialises `ints` and the pointers' dtypes on (integer widths,
    values of 1, divisibility); launch adds the pointers' 16-byte alignment. `consts` as `launch_consts` makes
    them."""
    if spec_key is not None and _FAST_OK:
        addrs = [p.data_ptr() for p in ptrs]
        spec_key = (spec_key, *[not a & 15 for a in addrs])
        call = _fast_cache.get(spec_key)
        if call is not None and torch._C._cuda_getDevice() == device and hooks_idle():
            call(grid[0], torch._C._cuda_getCurrentRawStream(device), *addrs, *ints, *consts["__values__"])
            return
    kw = {k: v for k, v in consts.items() if k != "__values__"}
    if device >= 0 and torch.cuda.current_device() != device:
        with torch.cuda.device(device):
            kernel[grid](*ptrs, *ints, **kw)
        return
    ck = kernel[grid](*ptrs, *ints, **kw)
    if spec_key is not None and relaunchable(ck):
        _runtime.remember(_fast_cache, spec_key, direct_launcher(ck))  # built once per specialisation, not per call


# ----------------------------------------------------------------------------------------------- plans
@dataclass(frozen=True, eq=False)  # hashed by identity: plans are cached (one per op, flag and layout), and key the
class _Plan:  # relaunch cache
    shape: tuple[int, ...]
    out_dtype: torch.dtype
    math: object  # tl dtype
    n: int
    flat: bool
    dense_like: int  # flat: index of an input whose layout the output copies (-1: contiguous)
    rank: int = 0
    shape_c: tuple = ()  # collapsed shape / strides (strided path)
    strides_c: tuple = ()  # per operand, output first
    i64: bool = True  # strided: index math in int64
    consts: dict | None = None  # strided: the kernel's launch_consts


def _broadcast_strides(t: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...]:
    lead = len(shape) - t.dim()
    st = [0] * lead + list(t.stride())
    for i, s in enumerate(t.shape):
        if s == 1:
            st[lead + i] = 0
    return tuple(st)


def _collapse(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple, list[tuple]]:
    """Drop size-1 dims and merge neighbours that are contiguous with each other in every operand."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    cshape: list[int] = []
    cstr: list[list[int]] = [[] for _ in strides]
    for d in dims:
        if cshape and all(cs[-1] == st[d] * shape[d] for cs, st in zip(cstr, strides, strict=False)):
            cshape[-1] *= shape[d]
            for cs, st in zip(cstr, strides, strict=False):
                cs[-1] = st[d]
        else:
            cshape.append(shape[d])
            for cs, st in zip(cstr, strides, strict=False):
                cs.append(st[d])
    return tuple(cshape), [tuple(cs) for cs in cstr]


def check_out_overlap(op: str, name: str, out: torch.Tensor, inputs: dict, allow_same: bool = True) -> None:
    """ATen's memory-overlap rules for an output given by the caller, as named errors (InvalidProblem) raised
    before anything is written: `out` may not have elements that share memory (an expanded tensor: threads would
    race to write them), and may not partly overlap an input (`inputs`: name -> tensor or None), which would make
    the result depend on the order in which programs run. The same memory in the same layout (an in-place call)
    is allowed where `allow_same`, as ATen allows it for elementwise ops. As in ATen, an overlap that cannot be
    told from the layouts (a tensor with gaps) is let through."""
    if torch._debug_has_internal_overlap(out) == 1:
        raise InvalidProblem(op, name, "a tensor whose elements do not overlap in memory", f"strides {out.stride()}")
    if out.numel() == 0:
        return
    lo = out.data_ptr()
    hi = lo + _span_bytes(out)
    for arg, t in inputs.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device != out.device:
            continue
        if t.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
            continue
        t_lo = t.data_ptr()
        if t_lo >= hi or t_lo + _span_bytes(t) <= lo or not (_dense_strides(out) and _dense_strides(t)):
            continue
        same = t_lo == lo and t.shape == out.shape and t.stride() == out.stride() and t.dtype == out.dtype
        if not (same and allow_same):
            raise InvalidProblem(op, name, f"a tensor that does not {'share' if same else 'partly share'} memory "
                                 f"with '{arg}'", "one that does")


def _span_bytes(t: torch.Tensor) -> int:
    return (1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride(), strict=True))) * t.element_size()


def _dense_strides(t: torch.Tensor) -> bool:
    """True if `t` covers its storage span exactly once (no gaps, no overlap), in some dim order."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride(), strict=False), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


class Pointwise:
    """An elementwise op: `math` is the scalar Triton function, `inputs` names its tensor arguments (for error
    messages), `promote` chooses the output dtype as ATen's type promotion does."""

    def __init__(self, op: str, math_fn: Callable, inputs: Sequence[str], out_name: str = "out"):
        if not 1 <= len(inputs) <= 3:
            raise ValueError("Pointwise takes one to three tensor inputs")
        self.op, self.math_fn, self.inputs, self.out_name = op, math_fn, tuple(inputs), out_name
        self._plans: dict = {}  # validation + launch plan per (flag, out layout, input shapes/strides/dtypes)
        self._fast: dict = {}  # compiled relaunch entries for flat problems with a fresh output

    # -- validation and planning (cached) --------------------------------------------------------------
    def _plan(self, ts: Sequence, out, flag: int) -> _Plan:
        for name, t in zip(self.inputs, ts, strict=False):
            check_tensor(self.op, name, t)
        dev = ts[0].device
        for name, t in zip(self.inputs[1:], ts[1:], strict=False):
            if t.device != dev:
                raise Unsupported(self.op, name, f"a tensor on {dev} (the device of '{self.inputs[0]}')", t.device)
        shape = broadcast_shape(self.op, self.inputs[:len(ts)], [t.shape for t in ts])
        out_dtype = result_dtype(ts)
        if out is not None:
            check_tensor(self.op, self.out_name, out)
            if tuple(out.shape) != shape:
                raise InvalidProblem(self.op, self.out_name, f"shape {shape}", tuple(out.shape))
            if out.dtype != out_dtype:
                raise Unsupported(self.op, self.out_name, f"dtype {out_dtype}", out.dtype)
            if out.device != dev:
                raise Unsupported(self.op, self.out_name, f"a tensor on {dev}", out.device)
        if len(shape) > MAX_RANK and math.prod(shape) > 0:
            cshape, _ = _collapse(shape, [_broadcast_strides(t, shape) for t in ts])
            if len(cshape) > MAX_RANK:
                raise RankUnsupported(self.op, self.inputs[0], f"rank <= {MAX_RANK}", len(shape))
        mdt = _TL_DTYPE[_runtime.math_dtype(out_dtype)]
        n = math.prod(shape)
        same = all(tuple(t.shape) == shape for t in ts) and len({t.stride() for t in ts}) == 1
        if out is not None:
            same = same and out.stride() == ts[0].stride()
        if same and (ts[0].is_contiguous() or _dense_strides(ts[0])):
            return _Plan(shape, out_dtype, mdt, n, True, -1 if ts[0].is_contiguous() else 0)
        operands = [out.stride() if out is not None else torch.empty(shape, device="meta").stride()]
        operands += [_broadcast_strides(t, shape) for t in ts]
        cshape, cstr = _collapse(shape, operands)
        if not cshape:  # every dim has size 1
            cshape, cstr = (1,), [(0,)] * len(operands)
        i64 = strided_i64(n, cshape, cstr, STRIDED_BLOCK)
        consts = launch_consts({"FN": self.math_fn, "NIN": len(ts), "FLAG": flag, "MATH": mdt, "RANK": len(cshape),
                                "BLOCK": STRIDED_BLOCK, "I64": i64}, STRIDED_WARPS)
        return _Plan(shape, out_dtype, mdt, n, False, -1, len(cshape), cshape, tuple(cstr), i64, consts)

    # -- the call ----------------------------------------------------------------------------------------
    def __call__(self, *ts: torch.Tensor, scalars: tuple = (), flag: int = 0,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:  # the hot path: a flat problem seen before, relaunched with minimal host work
            try:
                # the scalars by value; a zero is keyed by its bits instead (0.0 == -0.0); the negative bit, which
                # check_tensor rejects
                sk = scalars if 0.0 not in scalars else tuple(map(scalar_bits, scalars))
                fkey = (flag, sk, *[(t.shape, t.stride(), t.dtype, t.device, t.is_neg()) for t in ts])
                entry = self._fast.get(fkey)
            except (AttributeError, TypeError):
                fkey = entry = None
            if entry is not None:
                call, grid0, dev, same_dtype, dtype, tail = entry
                ptrs = [t.data_ptr() for t in ts]
                aligned = True
                for p in ptrs:
                    aligned = aligned and not p & 15
                if aligned and _get_device() == dev and hooks_idle():
                    # a flat plan: every input has the output's shape and dense strides, so empty_like fits
                    out = _empty_like(ts[0]) if same_dtype else _empty_like(ts[0], dtype=dtype)
                    call(grid0, _raw_stream(dev), out.data_ptr(), *ptrs, *ptrs[:1] * (3 - len(ptrs)), *tail)
                    return out
        try:
            # the device itself, not get_device(): that is -1 for cpu and meta alike, and a plan found in the cache
            # skips validation
            key = (flag, None if out is None else (out.shape, out.stride(), out.dtype, out.device, out.is_neg()),
                   *[(t.shape, t.stride(), t.dtype, t.device, t.is_neg()) for t in ts])
            plan = self._plans.get(key)
        except AttributeError:  # a non-tensor argument: let validation name it
            plan, key = None, None
        if plan is None:
            if len(ts) != len(self.inputs):
                raise TypeError(f"{self.op}: expected {len(self.inputs)} tensors, got {len(ts)}")
            plan = _runtime.remember(self._plans, key, self._plan(ts, out, flag))
        fresh = out is None
        if not fresh:  # depends on the data pointers: checked on every call, not cached with the plan
            check_out_overlap(self.op, self.out_name, out, dict(zip(self.inputs, ts, strict=False)))
        if fresh:
            if plan.dense_like >= 0:
                out = torch.empty_like(ts[plan.dense_like], dtype=plan.out_dtype)
            else:
                out = torch.empty(plan.shape, dtype=plan.out_dtype, device=ts[0].device)
        if plan.n == 0:
            return out
        bits = [scalar_bits(s) for s in scalars] + [0] * (3 - len(scalars))
        x = list(ts) + [ts[0]] * (3 - len(ts))
        nin = len(ts)
        device = ts[0].get_device()
        if plan.flat:
            i64 = plan.n + FLAT_BLOCK > _I32_MAX
            grid = (cdiv(plan.n, FLAT_BLOCK),)
            tail = (*bits, plan.n, self.math_fn, nin, flag, plan.math, FLAT_BLOCK, i64)
            kw = {"num_warps": FLAT_WARPS}
            if device >= 0 and torch.cuda.current_device() != device:
                with torch.cuda.device(device):
                    _flat_kernel[grid](out, *x, *tail, **kw)
                return out
            ck = _flat_kernel[grid](out, *x, *bits, plan.n, FN=self.math_fn, NIN=nin, FLAG=flag, MATH=plan.math,
                                    BLOCK=FLAT_BLOCK, I64=i64, **kw)
            aligned = not any(t.data_ptr() & 15 for t in (out, *ts))
            if fresh and aligned and relaunchable(ck) and fkey is not None:
                _runtime.remember(self._fast, fkey, (direct_launcher(ck), grid[0], device,
                                                     plan.out_dtype == ts[0].dtype, plan.out_dtype, tail))
            return out
        grid = (cdiv(plan.n, STRIDED_BLOCK),)
        st = list(plan.strides_c) + [plan.strides_c[1]] * (3 - nin)
        ints = (bits[0], bits[1], bits[2], plan.n, plan.shape_c, st[0], st[1], st[2], st[3])
        # relaunched directly after the first launch: the plan (this op's, for this flag and layout: its n,
        # collapsed shape and strides) fixes every specialisation but the pointers' alignment and the scalars'
        launch(_strided_kernel, grid, (out, x[0], x[1], x[2]), ints, plan.consts, device,
               (_strided_kernel, plan, device, bits_spec(bits)))
        return out
