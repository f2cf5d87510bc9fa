"""The one elementwise launcher every pointwise op uses.

An op supplies a scalar `@triton.jit` math function `fn(a, b, c, s0, s1, s2, FLAG)`: up to three tensor
operands (already upcast to the math dtype; unused ones repeat `a`), three float scalars (in the math dtype) and
one constexpr flag. `Pointwise(...)(*tensors, scalars=..., flag=..., out=...)` then handles everything else:

* validation (dtype, device, broadcastable shapes, `out`), done before any launch and cached per
  (shapes, strides, dtypes, devices) together with the launch plan;
* a flat fast path when every operand has the output's shape and the same dense strides (contiguous,
  channels_last, any dense permutation): one 1-D pass over storage;
* an in-place strided path for everything else: arbitrary strides and broadcast (stride-0) inputs of rank up
  to 8 (after merging dims that are contiguous across all operands), int64 offsets where needed; it walks runs in
  the output's memory order, or 2-D tiles where an input's unit stride lies on another dim (a transposed or
  channels_last input of a contiguous result: `tile_dims`), so that every operand loads whole lines;
* 0-d and empty tensors, dtype promotion as ATen's TensorIterator does it (math in fp32, fp64 for fp64);
* a low-overhead launch: after the first call of a specialisation the compiled kernel is called directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _runtime
from .._runtime import I32_MAX, cdiv
from ..config import PlanCache, Tunable
from ..errors import InvalidProblem, RankUnsupported, Unsupported
from ..launch import alloc
from ..launch.checks import (
    _dense_strides,
    broadcast_shape,
    check_out_overlap,
    check_tensor,
    contiguous_strides,
    result_dtype,
)
from ..launch.launcher import (
    SCALAR_PARAMS,
    _get_device,
    _raw_stream,
    bits_spec,
    direct_launcher,
    hooks_idle,
    launch,
    launch_consts,
    relaunchable,
    scalar_bits,
)
from ..launch.tl_helpers import TL_MATH, cast_out, scalar

__all__ = ["Pointwise", "PointwiseConfig", "CONFIG", "MAX_RANK"]

MAX_RANK = 8


@dataclass(frozen=True)
class PointwiseConfig:
    """The elementwise launcher's launch constants."""

    # the flat pass's elements a program, and warps: measured best on an H200 among 1024..8192 x 4..16 warps
    flat_block: int = 1024
    flat_warps: int = 4
    strided_block: int = 1024  # the strided pass's elements a program, and warps
    strided_warps: int = 4
    # the strided pass over 2-D tiles where an input is read across the output's layout (`tile_dims`): elements a
    # tile (0: never), and warps
    tiled_tile: int = 4096
    tiled_warps: int = 8
    i32_max: int = I32_MAX  # offsets past this take int64 index math (tests lower it to run that path)


CONFIG = Tunable("pointwise", PointwiseConfig())


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
    body, tail = flat_split(n, BLOCK)
    _apply(out, x0, x1, x2, offs, offs, offs, offs, offs < body, s0, s1, s2, FN, NIN, FLAG, MATH)
    if tail:
        _apply(out, x0, x1, x2, offs, offs, offs, offs, (offs >= body) & (offs < n), s0, s1, s2, FN, NIN, FLAG, MATH)


@triton.jit
def flat_split(n, BLOCK: tl.constexpr):
    """A flat pass's (body end, whether this program holds the tail): the body ends at n rounded down to a
    multiple of 16, which Triton can prove, so its masks are constant over 16 elements and its loads and stores
    vectorise whatever n is (where n itself is not a multiple of 16, masks against it cannot: 16-bit 2^26 + 5
    ran at 0.5x ATen); the at most 15 elements after it go to the last program, masked one by one."""
    body = n // 16 * 16
    return body, (body < n) & (tl.program_id(0) == (n - 1) // BLOCK)


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
        oo, f0, f1, f2, f3 = _plus_index(idx, RANK - 1 - i, SO, S0, S1, S2, S3, oo, f0, f1, f2, f3, USE)
    return offs < n, oo, f0, f1, f2, f3


@triton.jit
def _plus_index(idx, D: tl.constexpr, SO, S0, S1, S2, S3, oo, f0, f1, f2, f3, USE: tl.constexpr):
    """The offsets (output, operands 0..3) moved by `idx` steps along collapsed dim D, each through its own strides
    (S1..S3 only where USE's bit 1..3 is set)."""
    oo += idx * SO[D]
    f0 += idx * S0[D]
    if USE & 2:
        f1 += idx * S1[D]
    if USE & 4:
        f2 += idx * S2[D]
    if USE & 8:
        f3 += idx * S3[D]
    return oo, f0, f1, f2, f3


@triton.jit
def tiled_offsets(SHAPE, SO, S0, S1, S2, S3, USE: tl.constexpr, RANK: tl.constexpr, TD: tl.constexpr,
                  BT: tl.constexpr, BI: tl.constexpr, I64: tl.constexpr):
    """strided_offsets over a [BT, BI] tile instead of a run of BLOCK: BT indices along collapsed dim TD by BI along
    the innermost (the output's fastest), the other dims one index a program. Each load then takes the layout of
    its operand's own fastest dim (Triton converts between them through shared memory), so an operand read across
    the output's layout (a transposed or channels_last input of a contiguous result) still loads whole lines."""
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    n_i = tl.cdiv(SHAPE[RANK - 1], BI)
    n_t = tl.cdiv(SHAPE[TD], BT)
    ib = pid % n_i
    rem = pid // n_i
    tb = rem % n_t
    rem = rem // n_t
    oo = rem * 0
    f0 = oo
    f1 = oo
    f2 = oo
    f3 = oo
    for k in tl.static_range(1, RANK):  # the other dims, innermost first: dim RANK - 1 - k
        if RANK - 1 - k != TD:
            idx = rem % SHAPE[RANK - 1 - k]
            rem = rem // SHAPE[RANK - 1 - k]
            oo, f0, f1, f2, f3 = _plus_index(idx, RANK - 1 - k, SO, S0, S1, S2, S3, oo, f0, f1, f2, f3, USE)
    t = (tb * BT + tl.arange(0, BT))[:, None]
    i = (ib * BI + tl.arange(0, BI))[None, :]
    oo, f0, f1, f2, f3 = _plus_index(t, TD, SO, S0, S1, S2, S3, oo, f0, f1, f2, f3, USE)
    oo, f0, f1, f2, f3 = _plus_index(i, RANK - 1, SO, S0, S1, S2, S3, oo, f0, f1, f2, f3, USE)
    mask = (t < SHAPE[TD]) & (i < SHAPE[RANK - 1])
    return mask, oo, f0, f1, f2, f3


@triton.jit
def walk_offsets(n, SHAPE, SO, S0, S1, S2, S3, USE: tl.constexpr, RANK: tl.constexpr, BLOCK: tl.constexpr,
                 I64: tl.constexpr, TD: tl.constexpr, BT: tl.constexpr, BI: tl.constexpr):
    """The strided pass's (mask, output offsets, operands' offsets): a run of BLOCK in the output's order
    (`strided_offsets`), or where TD >= 0 a [BT, BI] tile (`tiled_offsets`); `strided_pass` plans which."""
    if TD >= 0:
        return tiled_offsets(SHAPE, SO, S0, S1, S2, S3, USE, RANK, TD, BT, BI, I64)
    else:
        return strided_offsets(n, SHAPE, SO, S0, S1, S2, S3, USE, RANK, BLOCK, I64)


def strided_pass(n: int, shape_c: Sequence[int], strides_c: Sequence[Sequence[int]], cfg) -> tuple[int, dict, int]:
    """(programs, the `walk_offsets` constexprs BLOCK, I64, TD, BT, BI, warps) of a strided pass over a collapsed
    problem of n elements (`strides_c` output first), under either engine's config (its strided_* and tiled_*
    fields and i32_max)."""
    td, bt, bi, programs = tile_dims(shape_c, strides_c, cfg.tiled_tile)
    block = cfg.strided_block
    if td < 0:
        programs = cdiv(n, block)
    i64 = strided_i64(n, shape_c, strides_c, block if td < 0 else 0, cfg.i32_max)
    return programs, {"BLOCK": block, "I64": i64, "TD": td, "BT": bt, "BI": bi}, \
        cfg.strided_warps if td < 0 else cfg.tiled_warps


def tile_dims(shape_c: Sequence[int], strides_c: Sequence[Sequence[int]], tile: int) -> tuple[int, int, int, int]:
    """(TD, BT, BI, programs) of `tiled_offsets` for a collapsed problem (dims in the output's order, `strides_c`
    output first), or TD = -1 where a run of the output's order serves: no input that covers the problem (no
    broadcast dim) has its unit stride on a dim other than the innermost. Where one does, a 1-D run reads it one
    element a line (0.5x of torch.compile's tiled kernels on a transposed operand, H100). BI (16 to 64) and BT (up to
    tile / BI): `_tile_side`."""
    rank = len(shape_c)
    td = -1
    for st in strides_c[1:]:
        if rank < 2 or 0 in st or not tile:
            continue
        fast = min(range(rank), key=lambda d: abs(st[d]))
        if abs(st[fast]) == 1 and fast != rank - 1:
            td = fast
            break
    if td < 0 or shape_c[td] < 8 or shape_c[-1] < 8:
        return -1, 0, 0, 0
    bi = _tile_side(shape_c[-1], (64, 32, 16))
    bt = _tile_side(shape_c[td], [b for b in (2 ** k for k in range(12, 3, -1)) if b <= tile // bi])
    rest = math.prod(shape_c) // (shape_c[td] * shape_c[-1])
    return td, bt, bi, rest * cdiv(shape_c[td], bt) * cdiv(shape_c[-1], bi)


def _tile_side(size: int, sides: Sequence[int]) -> int:
    """The largest of `sides` (descending powers of two) that pads `size` by at most an eighth, else the one that
    pads it least (a dim of 72: 16, not 64, which would leave 44% of the tiles' lanes idle)."""
    for b in sides:
        if cdiv(size, b) * b - size <= size // 8:
            return b
    return min(sides, key=lambda b: cdiv(size, b) * b)


def strided_i64(n: int, shape_c: Sequence[int], strides_c: Sequence[Sequence[int]], block: int, i32_max: int) -> bool:
    """Whether strided_offsets needs 64-bit index math: a linear index or some operand's offset passes i32_max
    (I32_MAX but in tests)."""
    span = max(sum((d - 1) * abs(st) for d, st in zip(shape_c, sc, strict=True)) for sc in strides_c)
    return n + block > i32_max or span > i32_max


@triton.jit(do_not_specialize=SCALAR_PARAMS)
def _strided_kernel(out, x0, x1, x2, s0, s1, s2, n, SHAPE, SO, S0, S1, S2,
                    FN: tl.constexpr, NIN: tl.constexpr, FLAG: tl.constexpr, MATH: tl.constexpr,
                    RANK: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr, TD: tl.constexpr,
                    BT: tl.constexpr, BI: tl.constexpr):
    mask, oo, o0, o1, o2, _o3 = walk_offsets(n, SHAPE, SO, S0, S1, S2, S0, (1 << NIN) - 1, RANK, BLOCK, I64, TD, BT,
                                             BI)
    _apply(out, x0, x1, x2, oo, o0, o1, o2, mask, s0, s1, s2, FN, NIN, FLAG, MATH)


# ----------------------------------------------------------------------------------------------- plans
@dataclass(frozen=True, eq=False)  # hashed by identity: plans are cached (one per op, flag and layout), and key the
class _Plan:  # relaunch cache
    shape: tuple[int, ...]
    out_dtype: torch.dtype
    math: object  # tl dtype
    n: int
    flat: bool
    dense_like: int  # flat: index of an input whose layout the output copies (-1: contiguous)
    block: int  # elements a program
    warps: int
    i64: bool  # index math in int64
    rank: int = 0
    shape_c: tuple = ()  # collapsed shape / strides (strided path)
    strides_c: tuple = ()  # per operand, output first
    consts: dict | None = None  # the kernel's launch_consts
    out_strides: tuple = ()  # strided: a fresh output's strides (result_layout)
    programs: int = 0  # strided: the grid
    tile_dim: int = -1  # strided: the dim tiled with the innermost (tile_dims), -1 for runs in the output's order


def _broadcast_strides(t: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...]:
    lead = len(shape) - t.dim()
    st = [0] * lead + list(t.stride())
    for i, s in enumerate(t.shape):
        if s == 1:
            st[lead + i] = 0
    return tuple(st)


def result_layout(shape: tuple[int, ...], ts: Sequence) -> tuple[int, ...]:
    """The strides of a fresh result at broadcast shape `shape`: those of the first of `ts` (None skipped) that has
    that shape and covers it densely - the layout ATen's TensorIterator gives its results there - else contiguous."""
    for t in ts:
        if t is not None and tuple(t.shape) == shape and _dense_strides(t):
            return t.stride()
    return contiguous_strides(shape)


def collapse_in_order(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple, list[tuple]]:
    """`_collapse` of the dims reordered outermost first by the first operand's strides (the result's), so that a
    walk in order of the collapsed index follows the result's memory: its stores, and the loads of inputs in its
    layout, coalesce (a channels_last or transposed problem walked in contiguous order ran at 0.3x ATen, H200)."""
    order = sorted(range(len(shape)), key=lambda d: -strides[0][d])
    return _collapse(tuple(shape[d] for d in order), [tuple(st[d] for d in order) for st in strides])


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


class Pointwise:
    """An elementwise op: `math` is the scalar Triton function, `inputs` names its tensor arguments (for error
    messages), `promote` chooses the output dtype as ATen's type promotion does."""

    def __init__(self, op: str, math_fn: Callable, inputs: Sequence[str], out_name: str = "out"):
        if not 1 <= len(inputs) <= 3:
            raise ValueError("Pointwise takes one to three tensor inputs")
        self.op, self.math_fn, self.inputs, self.out_name = op, math_fn, tuple(inputs), out_name
        # validation + launch plan per (flag, out layout, input shapes/strides/dtypes)
        self._plans = PlanCache("engines.elementwise._plans")
        # compiled relaunch entries for flat problems with a fresh output
        self._fast = PlanCache("engines.elementwise._fast")

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
        mdt = TL_MATH[_runtime.math_dtype(out_dtype)]
        n = math.prod(shape)
        cfg = CONFIG.current
        same = all(tuple(t.shape) == shape for t in ts) and len({t.stride() for t in ts}) == 1
        if out is not None:
            same = same and out.stride() == ts[0].stride()
        if same and (ts[0].is_contiguous() or _dense_strides(ts[0])):
            i64 = n + cfg.flat_block > cfg.i32_max
            consts = launch_consts({"FN": self.math_fn, "NIN": len(ts), "FLAG": flag, "MATH": mdt,
                                    "BLOCK": cfg.flat_block, "I64": i64}, cfg.flat_warps)
            return _Plan(shape, out_dtype, mdt, n, True, -1 if ts[0].is_contiguous() else 0, cfg.flat_block,
                         cfg.flat_warps, i64, consts=consts)
        out_strides = out.stride() if out is not None else result_layout(shape, ts)
        operands = [out_strides] + [_broadcast_strides(t, shape) for t in ts]
        cshape, cstr = collapse_in_order(shape, operands)
        if not cshape:  # every dim has size 1
            cshape, cstr = (1,), [(0,)] * len(operands)
        programs, walk, warps = strided_pass(n, cshape, cstr, cfg)
        consts = launch_consts({"FN": self.math_fn, "NIN": len(ts), "FLAG": flag, "MATH": mdt, "RANK": len(cshape),
                                **walk}, warps)
        return _Plan(shape, out_dtype, mdt, n, False, -1, walk["BLOCK"], warps, walk["I64"], len(cshape), cshape,
                     tuple(cstr), consts, out_strides, programs, walk["TD"])

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
                    out = alloc.empty_like(ts[0], None if same_dtype else dtype)
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
            plan = self._plans.remember(key, self._plan(ts, out, flag))
        fresh = out is None
        if not fresh:  # depends on the data pointers: checked on every call, not cached with the plan
            check_out_overlap(self.op, self.out_name, out, dict(zip(self.inputs, ts, strict=False)))
        if fresh:
            if plan.dense_like >= 0:
                out = alloc.empty_like(ts[plan.dense_like], plan.out_dtype)
            elif plan.flat:
                out = alloc.empty(plan.shape, plan.out_dtype, ts[0].device)
            else:
                out = alloc.empty(plan.shape, plan.out_dtype, ts[0].device, plan.out_strides)
        if plan.n == 0:
            return out
        bits = [scalar_bits(s) for s in scalars] + [0] * (3 - len(scalars))
        x = list(ts) + [ts[0]] * (3 - len(ts))
        nin = len(ts)
        device = ts[0].get_device()
        if plan.flat:
            grid = (cdiv(plan.n, plan.block),)
            aligned = not any(t.data_ptr() & 15 for t in (out, *ts))
            if not (fresh and aligned and fkey is not None) or (device >= 0 and torch.cuda.current_device() != device):
                # an out= call or an operand off 16-byte alignment (a view at a storage offset): relaunched
                # directly too, keyed by the pointers' alignment
                launch(_flat_kernel, grid, (out, *x), (*bits, plan.n), plan.consts, device,
                       (_flat_kernel, plan, device, bits_spec(bits)))
                return out
            tail = (*bits, plan.n, self.math_fn, nin, flag, plan.math, plan.block, plan.i64)
            ck = _flat_kernel[grid](out, *x, *bits, plan.n, FN=self.math_fn, NIN=nin, FLAG=flag, MATH=plan.math,
                                    BLOCK=plan.block, I64=plan.i64, num_warps=plan.warps)
            if relaunchable(ck):
                self._fast.remember(fkey, (direct_launcher(ck), grid[0], device,
                                                     plan.out_dtype == ts[0].dtype, plan.out_dtype, tail))
            return out
        grid = (plan.programs,)
        st = list(plan.strides_c) + [plan.strides_c[1]] * (3 - nin)
        ints = (bits[0], bits[1], bits[2], plan.n, plan.shape_c, st[0], st[1], st[2], st[3])
        # relaunched directly after the first launch: the plan (this op's, for this flag and layout: its n,
        # collapsed shape and strides) fixes every specialisation but the pointers' alignment and the scalars'
        launch(_strided_kernel, grid, (out, x[0], x[1], x[2]), ints, plan.consts, device,
               (_strided_kernel, plan, device, bits_spec(bits)))
        return out
