"""A multi-output elementwise launcher: one pass reads up to four operands and writes up to three results.

Made for fused backwards (where, lerp, prelu), where one read of grad_output (and the saved inputs) produces the
gradient of every input at once. An op supplies a scalar `@triton.jit` math function
`fn(a, b, c, d, s0, s1, FLAG) -> (r0, r1, r2)` (operands upcast to the math dtype; an operand not passed repeats
`a`; results an op does not ask for may be anything - they are never stored, and the compiler drops their math)
and calls `MultiPointwise(...)(inputs, outputs, scalars=..., flag=...)`:

* `inputs`: up to four tensors or None (not read); the first one is required. They broadcast together to the
  problem shape B. Each is read in place (any strides, stride-0 broadcast).
* `outputs`: per result, None (not computed, not written) or `(shape, dtype)`: the result is computed at B and, if
  `shape` is not B, summed back to `shape` (autograd's sum_to) by `reduction.sum_to_shape` - deterministic, fixed
  order. Results at B are written once, in the output dtype; results to be summed are written at B in the math
  dtype (fp32, fp64 for f64: not rounded to a 16-bit dtype before they are added up) and summed in it - or, for
  an op whose results are selections of the first input (`exact=True`: nothing to round), in that input's dtype.

A flat 1-D pass over storage runs when every input has shape B and the same dense strides (contiguous,
channels_last or any dense permutation; outputs then take that layout). Results summed over B's trailing dims
(a per-row `(N, 1)` operand of an `(N, M)` problem: B seen as R rows x M columns, each result kept either at B or
at (R, 1)) or over its leading dims (a per-column `(M,)` operand: kept at B or at (1, M)) take a summing pass
instead: each program sums its part of a row (or of a column, over its chunk of rows) into an fp32/fp64 partial,
and the shared reduction adds the partials in a fixed order - no result at B is written and read back just to
be summed. Otherwise a strided pass over up to 8 dims (after merging dims contiguous in every operand), int64
offsets where needed, in runs of the results' layout or in 2-D tiles where an input is laid out across it
(`elementwise.tile_dims`). Validation of dtypes is the calling op's job (it knows the rules); this checks devices
and shapes, before any launch. Plans are cached per problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from .._runtime import I32_MAX, cdiv
from ..config import PlanCache, Tunable
from ..errors import InvalidProblem, RankUnsupported, Unsupported
from ..launch import alloc
from ..launch.checks import _dense_strides, broadcast_shape, contiguous_strides
from ..launch.launcher import SCALAR_PARAMS, bits_spec, launch, launch_consts, scalar_bits
from ..launch.tl_helpers import TL_MATH, cast_out, scalar
from .elementwise import (
    _broadcast_strides,
    _collapse,
    collapse_in_order,
    flat_split,
    result_layout,
    strided_pass,
    walk_offsets,
)
from .reduction import plan_view, run_plan, sum_to_dims

__all__ = ["MultiPointwise", "MultiPointwiseConfig", "CONFIG", "check_output_mask", "MAX_INPUTS", "MAX_OUTPUTS",
           "MAX_RANK"]

MAX_INPUTS, MAX_OUTPUTS, MAX_RANK = 4, 3, 8


@dataclass(frozen=True)
class MultiPointwiseConfig:
    """The fused pointwise passes' launch heuristics (figures: H200, 8192x8192, docs/tuning/pointwise.md)."""

    # the flat pass's elements a program by the widest operand's element size (16 bytes a thread for 2- and 4-byte
    # ones), and warps: f32 512 against 1024, lerp 0.1993 -> 0.1974 ms
    flat_block: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({2: 1024, 4: 512, 8: 1024}))
    flat_warps: int = 4
    strided_block: int = 1024  # the strided pass's elements a program, and warps
    strided_warps: int = 4
    # ... over 2-D tiles where an input is read across the results' layout (elementwise.tile_dims): elements a
    # tile (0: never), warps
    tiled_tile: int = 4096
    tiled_warps: int = 8
    # the strided pass sums a result summed whole (a 0-d operand's gradient) as a partial a program (False: writes it
    # at B for the shared reduction): H100, where f32 causal mask 4x16x1024x1024 381 -> 190 us
    totals: bool = True
    # the summing pass over columns (per-row results): tile elements, widest column block, warps (lerp 1.03-1.17x
    # against 4096 / 4096 / 8 warps)
    rows_tile: int = 2048
    rows_max_bc: int = 2048
    rows_warps: int = 4
    # ... over rows (per-column results), the rows split until about cols_programs programs run (where 1.27-1.53x
    # against the row pass's constants)
    cols_tile: int = 4096
    cols_max_bc: int = 1024
    cols_warps: int = 4
    cols_programs: int = 512
    i32_max: int = I32_MAX  # offsets past this take int64 index math (tests lower it to run that path)


CONFIG = Tunable("multi_pointwise", MultiPointwiseConfig())


def check_output_mask(op: str, output_mask, n: int) -> tuple[bool, ...]:
    """`output_mask` (which gradients a fused backward computes, as in ATen's multi-output backwards) as n bools."""
    try:  # (bools, or what bool() takes, as ATen's bool[n]; not the characters of a string)
        mask = () if isinstance(output_mask, (str, bytes)) else tuple(map(bool, output_mask))
    except TypeError:
        mask = ()
    if len(mask) != n:
        raise InvalidProblem(op, "output_mask", f"a sequence of {n} booleans", output_mask)
    return mask


# ----------------------------------------------------------------------------------------------- kernels
@triton.jit
def _apply(o0, o1, o2, x0, x1, x2, x3, oo, f0, f1, f2, f3, mask, s0, s1,
           FN: tl.constexpr, INS: tl.constexpr, OUTS: tl.constexpr, FLAG: tl.constexpr, MATH: tl.constexpr,
           TOTALS: tl.constexpr):
    """Load the operands INS names (at offsets f*), apply FN, store the results OUTS names (at offsets oo); those
    TOTALS names are summed whole, so each program stores the sum of its elements (in MATH) at o + its id."""
    a = tl.load(x0 + f0, mask=mask).to(MATH)
    b = a
    c = a
    d = a
    if INS & 2:
        b = tl.load(x1 + f1, mask=mask).to(MATH)
    if INS & 4:
        c = tl.load(x2 + f2, mask=mask).to(MATH)
    if INS & 8:
        d = tl.load(x3 + f3, mask=mask).to(MATH)
    r0, r1, r2 = FN(a, b, c, d, scalar(s0, MATH), scalar(s1, MATH), FLAG)
    _store(o0, r0, oo, mask, 0, OUTS, TOTALS)
    _store(o1, r1, oo, mask, 1, OUTS, TOTALS)
    _store(o2, r2, oo, mask, 2, OUTS, TOTALS)


@triton.jit
def _store(o, r, oo, mask, J: tl.constexpr, OUTS: tl.constexpr, TOTALS: tl.constexpr):
    if OUTS & (1 << J):
        if TOTALS & (1 << J):
            tl.store(o + tl.program_id(0), tl.sum(tl.where(mask, r, 0.0)))
        else:
            tl.store(o + oo, cast_out(r, o.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=SCALAR_PARAMS[:2])
def _flat_kernel(o0, o1, o2, x0, x1, x2, x3, s0, s1, n,
                 FN: tl.constexpr, INS: tl.constexpr, OUTS: tl.constexpr, FLAG: tl.constexpr,
                 MATH: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr):
    if I64:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    body, tail = flat_split(n, BLOCK)
    _apply(o0, o1, o2, x0, x1, x2, x3, offs, offs, offs, offs, offs, offs < body, s0, s1, FN, INS, OUTS, FLAG, MATH,
           0)
    if tail:
        _apply(o0, o1, o2, x0, x1, x2, x3, offs, offs, offs, offs, offs, (offs >= body) & (offs < n), s0, s1, FN,
               INS, OUTS, FLAG, MATH, 0)


@triton.jit(do_not_specialize=SCALAR_PARAMS[:2])
def _strided_kernel(o0, o1, o2, x0, x1, x2, x3, s0, s1, n, SHAPE, SO, S0, S1, S2, S3,
                    FN: tl.constexpr, INS: tl.constexpr, OUTS: tl.constexpr, FLAG: tl.constexpr,
                    MATH: tl.constexpr, RANK: tl.constexpr, BLOCK: tl.constexpr, I64: tl.constexpr,
                    TD: tl.constexpr, BT: tl.constexpr, BI: tl.constexpr, TOTALS: tl.constexpr):
    mask, oo, f0, f1, f2, f3 = walk_offsets(n, SHAPE, SO, S0, S1, S2, S3, INS, RANK, BLOCK, I64, TD, BT, BI)
    _apply(o0, o1, o2, x0, x1, x2, x3, oo, f0, f1, f2, f3, mask, s0, s1, FN, INS, OUTS, FLAG, MATH, TOTALS)


@triton.jit
def _sum_step(o0, o1, o2, x0, x1, x2, x3, p0, p1, p2, s0, s1, r, rmask, c, cmask, M, n_cb, cb, ST,
              FN: tl.constexpr, INS: tl.constexpr, OUTS: tl.constexpr, SUMS: tl.constexpr, FLAG: tl.constexpr,
              MATH: tl.constexpr, AXIS: tl.constexpr):
    """One [rows r x columns c] tile: results at B stored; results summed back over columns (AXIS 1) stored as
    per-row partials; the results to be summed over rows (AXIS 0) returned, zero outside the tile."""
    mask = rmask[:, None] & cmask[None, :]
    a = tl.load(x0 + (r[:, None] * ST[0] + c[None, :] * ST[1]), mask=mask).to(MATH)
    b = a
    cc = a
    d = a
    if INS & 2:
        b = tl.load(x1 + (r[:, None] * ST[2] + c[None, :] * ST[3]), mask=mask).to(MATH)
    if INS & 4:
        cc = tl.load(x2 + (r[:, None] * ST[4] + c[None, :] * ST[5]), mask=mask).to(MATH)
    if INS & 8:
        d = tl.load(x3 + (r[:, None] * ST[6] + c[None, :] * ST[7]), mask=mask).to(MATH)
    v0, v1, v2 = FN(a, b, cc, d, scalar(s0, MATH), scalar(s1, MATH), FLAG)
    oo = r[:, None] * M + c[None, :]
    po = r * n_cb + cb
    _sum_store(v0, o0, p0, oo, po, mask, rmask, 0, OUTS, SUMS, AXIS)
    _sum_store(v1, o1, p1, oo, po, mask, rmask, 1, OUTS, SUMS, AXIS)
    _sum_store(v2, o2, p2, oo, po, mask, rmask, 2, OUTS, SUMS, AXIS)
    return tl.where(mask, v0, 0.0), tl.where(mask, v1, 0.0), tl.where(mask, v2, 0.0)


@triton.jit
def _sum_store(v, o, p, oo, po, mask, rmask, J: tl.constexpr, OUTS: tl.constexpr, SUMS: tl.constexpr,
               AXIS: tl.constexpr):
    if OUTS & (1 << J):
        if SUMS & (1 << J):
            if AXIS == 1:
                tl.store(p + po, tl.sum(tl.where(mask, v, 0.0), axis=1), mask=rmask)
        else:
            tl.store(o + oo, cast_out(v, o.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=SCALAR_PARAMS[:2])
def _sum_pass_kernel(o0, o1, o2, x0, x1, x2, x3, p0, p1, p2, s0, s1, R, M, n_cb, RPP, NP, ST,
                     FN: tl.constexpr, INS: tl.constexpr, OUTS: tl.constexpr, SUMS: tl.constexpr,
                     FLAG: tl.constexpr, MATH: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, AXIS: tl.constexpr,
                     I64: tl.constexpr):
    # B as R rows x M columns; program (sp, cb) takes rows [sp*RPP, +RPP), BR at a time, x columns [cb*BC, +BC).
    # Input i is at row * ST[2i] + column * ST[2i + 1]; results at B are contiguous (R, M). Results summed back:
    # AXIS 1 (over columns: RPP == BR, one tile) into partials (R, n_cb); AXIS 0 (over rows) into partials (M, NP),
    # column-major (a column's partials contiguous).
    pid = tl.program_id(0)
    cb = pid % n_cb
    sp = pid // n_cb
    if I64:
        cb = cb.to(tl.int64)
        sp = sp.to(tl.int64)
    c = cb * BC + tl.arange(0, BC)
    cmask = c < M
    if AXIS == 1:
        r = sp * BR + tl.arange(0, BR)
        _sum_step(o0, o1, o2, x0, x1, x2, x3, p0, p1, p2, s0, s1, r, r < R, c, cmask, M, n_cb, cb, ST,
                  FN, INS, OUTS, SUMS, FLAG, MATH, AXIS)
    else:
        r_hi = tl.minimum(sp * RPP + RPP, R)
        acc0 = tl.zeros([BR, BC], MATH)
        acc1 = tl.zeros([BR, BC], MATH)
        acc2 = tl.zeros([BR, BC], MATH)
        for r0 in range(sp * RPP, r_hi, BR):
            r = r0 + tl.arange(0, BR)
            v0, v1, v2 = _sum_step(o0, o1, o2, x0, x1, x2, x3, p0, p1, p2, s0, s1, r, r < r_hi, c, cmask, M, n_cb,
                                   cb, ST, FN, INS, OUTS, SUMS, FLAG, MATH, AXIS)
            if SUMS & 1:
                acc0 += v0
            if SUMS & 2:
                acc1 += v1
            if SUMS & 4:
                acc2 += v2
        if SUMS & 1:
            tl.store(p0 + c * NP + sp, tl.sum(acc0, axis=0), mask=cmask)
        if SUMS & 2:
            tl.store(p1 + c * NP + sp, tl.sum(acc1, axis=0), mask=cmask)
        if SUMS & 4:
            tl.store(p2 + c * NP + sp, tl.sum(acc2, axis=0), mask=cmask)


# ----------------------------------------------------------------------------------------------- planning
@dataclass(frozen=True, eq=False)  # hashed by identity: plans are cached, and key the relaunch cache
class _Plan:
    """One problem, worked out once: a repeated call only allocates, launches and sums back what this lists."""

    shape: tuple[int, ...]  # B, the broadcast shape every result is computed at
    n: int
    flat: bool
    summing: tuple  # the summing pass: (axis, R, M, BR, BC, n_cb, RPP, NP, per-input (row, column) strides), or ()
    i64: bool  # index math in int64
    device: int  # the inputs' device index (get_device)
    allocs: tuple  # (j, shape, strides, dtype): result j as the kernel writes it (at B)
    parts: tuple  # (j, shape, dtype): the summing pass's per-program partials of result j
    kernel: object  # what to launch (None: nothing, for an empty B or no result asked for)
    grid: tuple
    ints: tuple  # the kernel's integer arguments after the two scalars
    consts: dict | None  # its launch_consts
    sums: tuple  # (j, reduction plan, shape): result j summed back from its partials, or from its values at B
    views: tuple  # (j, shape, dtype): result j at B with only leading dims of size 1 to drop (and a conversion)
    zeros: tuple  # (j, shape, dtype): result j summed back over an empty B


_NO_SCALARS = ((0, 0), (True, True))  # the scalar arguments' bits and their bits_spec where an op passes none


class MultiPointwise:
    """A fused elementwise op with up to four inputs and three outputs; `inputs` / `outputs` name them for error
    messages."""

    def __init__(self, op: str, math_fn: Callable, inputs: Sequence[str], outputs: Sequence[str], *,
                 exact: bool = False):
        if not 1 <= len(inputs) <= MAX_INPUTS or not 1 <= len(outputs) <= MAX_OUTPUTS:
            raise ValueError(f"MultiPointwise takes 1..{MAX_INPUTS} inputs and 1..{MAX_OUTPUTS} outputs")
        self.op, self.math_fn, self.inputs, self.outputs = op, math_fn, tuple(inputs), tuple(outputs)
        self.exact = exact
        self._plans = PlanCache("engines.multi_pointwise._plans")

    def __call__(self, inputs: Sequence[torch.Tensor | None], outputs: Sequence[tuple | None], *,
                 scalars: Sequence[float] = (), flag: int = 0) -> tuple[torch.Tensor | None, ...]:
        try:  # (the device itself, not get_device(): that is -1 for cpu and meta alike)
            key = (flag, tuple(outputs),
                   *[None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in inputs])
            plan = self._plans.get(key)
        except (AttributeError, TypeError):  # a non-tensor argument: let validation name it
            plan, key = None, None
        if plan is None:
            plan = self._plans.remember(key, self._plan(inputs, outputs, flag))
        first = inputs[0]
        dev = first.device
        res: list = [None] * MAX_OUTPUTS
        for j, shape, strides, dtype in plan.allocs:
            res[j] = alloc.empty(shape, dtype, dev, strides)
        parts = res  # what the results summed back are read from
        if plan.parts:
            parts = [None] * MAX_OUTPUTS
            for j, shape, dtype in plan.parts:
                parts[j] = alloc.empty(shape, dtype, dev)
        if plan.kernel is not None:
            bits, spec = _scalar_args(scalars) if scalars else _NO_SCALARS
            ptrs = [first if r is None else r for r in res] + [first if t is None else t for t in inputs]
            ptrs += [first] * (MAX_INPUTS - len(inputs))
            if plan.parts:
                ptrs += [first if p is None else p for p in parts]
            # relaunched directly after the first launch: the plan fixes the device, the pointers' dtypes and every
            # integer argument but the scalars (their bits_spec joins the key; launch adds the alignment)
            launch(plan.kernel, plan.grid, ptrs, (*bits, *plan.ints), plan.consts, plan.device, (plan, spec))
        for j, rplan, shape in plan.sums:
            res[j] = run_plan(rplan, parts[j], shape)
        for j, shape, dtype in plan.views:
            r = res[j].reshape(shape)
            res[j] = r if r.dtype == dtype else r.to(dtype)
        for j, shape, dtype in plan.zeros:
            res[j] = alloc.zeros(shape, dtype, dev)
        return tuple(res[:len(self.outputs)])

    def _plan(self, inputs: Sequence, outputs: Sequence, flag: int) -> _Plan:
        """Validation (devices, shapes) and everything a call of this problem does."""
        ins = list(inputs) + [None] * (MAX_INPUTS - len(inputs))
        outs = tuple(outputs) + (None,) * (MAX_OUTPUTS - len(outputs))
        if ins[0] is None:
            raise TypeError(f"{self.op}: the first input ('{self.inputs[0]}') is required")
        given = [(name, t) for name, t in zip(self.inputs, ins, strict=False) if t is not None]
        dev = ins[0].device
        for name, t in given:
            if not isinstance(t, torch.Tensor):
                raise Unsupported(self.op, name, "a torch.Tensor", type(t).__name__)
            if t.device != dev:
                raise Unsupported(self.op, name, f"a tensor on {dev} (the device of '{self.inputs[0]}')", t.device)
        shape = broadcast_shape(self.op, [n for n, _ in given], [t.shape for _, t in given])
        # fp64 math where any operand or result is fp64 (an f32 grad with f64 inputs: ATen promotes to f64), else fp32
        wide = any(t.dtype == torch.float64 for _, t in given) or any(s is not None and s[1] == torch.float64
                                                                          for s in outs)
        math_torch = torch.float64 if wide else torch.float32
        mdt = TL_MATH[math_torch]
        compute = ins[0].dtype if self.exact else math_torch  # what results to sum are in
        out_dtypes, reduce_to, final = [], [], []
        for spec in outs:
            if spec is None:
                out_dtypes.append(None), reduce_to.append(None), final.append(None)
                continue
            oshape, odt = tuple(spec[0]), spec[1]
            final.append(odt)
            if oshape == shape:
                out_dtypes.append(odt), reduce_to.append(None)
            else:
                out_dtypes.append(compute), reduce_to.append(oshape)
        ins_mask = sum(1 << i for i, t in enumerate(ins) if t is not None)
        outs_mask = sum(1 << j for j, s in enumerate(outs) if s is not None)
        n = math.prod(shape)
        present = [t for _, t in given]
        same = all(tuple(t.shape) == shape for t in present) and len({t.stride() for t in present}) == 1
        contiguous = contiguous_strides(shape)
        base = {"FN": self.math_fn, "INS": ins_mask, "OUTS": outs_mask, "FLAG": flag, "MATH": mdt}
        device = ins[0].get_device()
        cfg = CONFIG.current
        summing = _summing_view(shape, ins, reduce_to, cfg)
        if summing is not None:
            return self._summing_plan(summing, base, shape, device, out_dtypes, reduce_to, final, math_torch,
                                      contiguous, cfg)
        flat = same and (present[0].is_contiguous() or _dense_strides(present[0]))
        if flat:  # results in the inputs' layout (empty_like's strides)
            strides = [contiguous if present[0].is_contiguous() or odt is None else
                       torch.empty_like(present[0], dtype=odt, device="meta").stride() for odt in out_dtypes]
            block = cfg.flat_block[max(t.element_size() for t in present)]
            i64 = n + block > cfg.i32_max
            kernel, grid, ints = _flat_kernel, (cdiv(n, block),), (n,)
            consts = launch_consts({**base, "BLOCK": block, "I64": i64}, cfg.flat_warps)
            totals = 0  # (the flat pass writes results summed whole at B: its last program also takes the tail)
        else:  # results in the layout ATen gives them, walked in its order
            layout = result_layout(shape, present)
            strides = [layout] * MAX_OUTPUTS
            operands = [layout] + [_broadcast_strides(t, shape) if t is not None else None for t in ins]
            live = [s for s in operands if s is not None]
            cshape, cstr = collapse_in_order(shape, live)
            if not cshape:  # every dim has size 1
                cshape, cstr = (1,), [(0,)] * len(live)
            if len(cshape) > MAX_RANK:
                raise RankUnsupported(self.op, self.inputs[0], f"rank <= {MAX_RANK} (after merging dims)", len(shape))
            it = iter(cstr)
            cstrides = tuple(next(it) if s is not None else cstr[0] for s in operands)
            programs, walk, warps = strided_pass(n, cshape, cstr, cfg)
            i64 = walk["I64"]
            kernel, grid, ints = _strided_kernel, (programs,), (n, cshape, *cstrides)
            # results summed whole (to a 0-d or all-ones shape): a partial sum a program, in the math dtype,
            # instead of the result at B written and read back
            totals = sum(1 << j for j, to in enumerate(reduce_to) if to is not None and n > 1
                         and math.prod(to) == 1 and cfg.totals)
            consts = launch_consts({**base, "RANK": len(cshape), **walk, "TOTALS": totals}, warps)
        allocs, sums, views = [], [], []
        for j, (odt, to, dt) in enumerate(zip(out_dtypes, reduce_to, final, strict=True)):
            if odt is None:
                continue
            if totals & (1 << j):
                allocs.append((j, grid, (1,), math_torch))
                sums.append((j, plan_view(grid, (1,), math_torch, (0,), op=self.op, out_dtype=dt), to))
                continue
            allocs.append((j, shape, strides[j], odt))
            if to is None:
                continue
            dims = sum_to_dims(shape, to, op=self.op)  # autograd's sum_to, planned on the result's layout
            if all(shape[d] == 1 for d in dims):
                views.append((j, to, dt))
            else:
                sums.append((j, plan_view(shape, strides[j], odt, dims, op=self.op, out_dtype=dt), to))
        return _Plan(shape=shape, n=n, flat=flat, summing=(), i64=i64, device=device, allocs=tuple(allocs),
                     parts=(), kernel=kernel if n and outs_mask else None, grid=grid, ints=ints, consts=consts,
                     sums=tuple(sums), views=tuple(views), zeros=())

    def _summing_plan(self, summing: tuple, base: dict, shape: tuple, device: int, out_dtypes: list,
                      reduce_to: list, final: list, acc: torch.dtype, contiguous: tuple,
                      cfg: MultiPointwiseConfig) -> _Plan:
        """A plan of the summing pass: results at B written, results summed back as per-program partials that the
        shared reduction then adds up (zeros, and nothing launched, for an empty B)."""
        axis, R, M, BR, BC, n_cb, RPP, NP, istrides = summing
        i64 = _summing_i64(summing, cfg.i32_max)
        pshape = (R, n_cb) if axis == 1 else (M, NP)
        n = R * M
        allocs, parts, sums, zeros, sums_mask = [], [], [], [], 0
        for j, (odt, to, dt) in enumerate(zip(out_dtypes, reduce_to, final, strict=True)):
            if odt is None:
                continue
            if to is None:
                allocs.append((j, shape, contiguous, odt))
            elif n == 0:
                zeros.append((j, to, dt))
            else:
                parts.append((j, pshape, acc))
                sums.append((j, plan_view(pshape, (pshape[1], 1), acc, (1,), op=self.op, out_dtype=dt), to))
                sums_mask |= 1 << j
        consts = launch_consts({"FN": base["FN"], "INS": base["INS"], "OUTS": base["OUTS"], "SUMS": sums_mask,
                                "FLAG": base["FLAG"], "MATH": base["MATH"], "BR": BR, "BC": BC, "AXIS": axis,
                                "I64": i64}, cfg.cols_warps if axis == 0 else cfg.rows_warps)
        ints = (R, M, n_cb, RPP, NP, tuple(v for st in istrides for v in st))  # ST: (row, column) pairs, flat
        return _Plan(shape=shape, n=n, flat=False, summing=summing, i64=i64, device=device, allocs=tuple(allocs),
                     parts=tuple(parts), kernel=_sum_pass_kernel if n else None, grid=(NP * n_cb,), ints=ints,
                     consts=consts, sums=tuple(sums), views=(), zeros=tuple(zeros))


def _scalar_args(scalars: Sequence[float]) -> tuple[list[int], tuple[bool, ...]]:
    """The kernels' two scalar arguments, as float64 bits (0 for those not given), and their bits_spec."""
    bits = [scalar_bits(v) for v in scalars] + [0] * (2 - len(scalars))
    return bits, bits_spec(bits)


def _summing_view(shape: tuple[int, ...], ins: list, reduce_to: tuple, cfg: MultiPointwiseConfig):
    """The summing pass's view of B, or None: every result summed back is summed over the same dims of B - its
    trailing dims (its shape, aligned right, keeps B's leading k dims and is 1 after them: axis 1) or its leading
    ones (1 up to k, B's dims after: axis 0) - and every input's strides merge into one (row, column) pair over
    B[:k] and B[k:]."""
    targets = {t for t in reduce_to if t is not None}
    if not targets:
        return None
    views = set()
    for t in targets:
        full = (1,) * (len(shape) - len(t)) + tuple(t)
        if len(full) != len(shape):
            return None
        k = 0
        while k < len(shape) and full[k] == shape[k]:
            k += 1
        if all(d == 1 for d in full[k:]) and math.prod(shape[k:]) > 1:
            views.add((1, k))
            continue
        k = 0
        while k < len(shape) and full[k] == 1:
            k += 1
        if tuple(full[k:]) == tuple(shape[k:]) and math.prod(shape[:k]) > 1:
            views.add((0, k))
            continue
        return None
    if len(views) != 1:
        return None
    axis, k = views.pop()
    R, M = math.prod(shape[:k]), math.prod(shape[k:])
    istrides = []
    for t in list(ins) + [None] * (MAX_INPUTS - len(ins)):
        if t is None:
            istrides.append((0, 0))
            continue
        st = _broadcast_strides(t, shape)
        pair = []
        for lo, hi in ((0, k), (k, len(shape))):
            cshape, (cst,) = _collapse(shape[lo:hi], [st[lo:hi]])
            if len(cshape) > 1:
                return None
            pair.append(cst[0] if cshape else 0)
        istrides.append(tuple(pair))
    tile, max_bc = (cfg.cols_tile, cfg.cols_max_bc) if axis == 0 else (cfg.rows_tile, cfg.rows_max_bc)
    rt, mt = max(R, 1), max(M, 1)  # (an empty B is tiled as one element, never launched: _run_summing returns
    bc = min(triton.next_power_of_2(mt), max_bc)  # zeros first)
    br = min(triton.next_power_of_2(rt), max(1, tile // bc))
    n_cb = cdiv(mt, bc)
    if axis == 1:
        rpp, n_p = br, cdiv(rt, br)
    else:  # a program walks a chunk of rows
        n_p = max(1, min(cdiv(rt, br), cdiv(cfg.cols_programs, n_cb)))
        rpp = cdiv(cdiv(rt, n_p), br) * br
        n_p = cdiv(rt, rpp)
    return axis, R, M, br, bc, n_cb, rpp, n_p, tuple(istrides)


def _summing_i64(summing: tuple, lim: int) -> bool:
    _axis, R, M, BR, BC, n_cb, _rpp, n_p, istrides = summing
    span = max((R - 1) * abs(r) + (M - 1) * abs(c) for r, c in istrides)
    return ((R + BR) * M + BC > lim or span + BR * max(abs(r) for r, _ in istrides) > lim
            or (R + BR) * n_cb > lim or (M + BC) * n_p > lim)
