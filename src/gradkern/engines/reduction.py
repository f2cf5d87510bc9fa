"""Deterministic sums over any dims of a strided tensor: the reduction machinery every summing op shares.

`reduce_sum(x, dims, op=...)` sums `x` over `dims` (keepdim=False) into a fresh contiguous tensor;
`sum_to_shape(x, shape, op=...)` is autograd's `sum_to` on top of it.

How it works. On the host (cached per (shape, strides, dtype, dims, out_dtype)) the problem is brought to a
canonical form: the kept dims, in output order, with neighbours merged where x's strides allow it, and the
reduced dims, sorted by stride (outermost first, broadcast stride-0 dims outermost of all) and merged likewise.
One Triton kernel then sums a tile of BLOCK_R reduction terms x BLOCK_O outputs per step: offsets come from
decomposing the flat output index over the kept dims and the flat reduction index over the reduced dims (in
int64 where offsets can pass 2^31), with contiguity/alignment hints where the layout guarantees them, so that the
loads are coalesced (and vectorised) along whichever of the two axes is contiguous in memory. Each lane carries
its own partial sum across steps and a fixed tree sum over the BLOCK_R lanes finishes an output; or, where a
thread holds whole output columns (STEP_SUM), each step's BLOCK_R terms are tree-summed at once into one running
sum per output (a BLOCK_O accumulator instead of BLOCK_R x BLOCK_O: fewer registers, more programs an SM).

Two regimes, one kernel:
* many outputs, few terms each (e.g. repeat (4, 4) backward: 1M outputs of 16 terms) - one pass, each program
  owning BLOCK_O outputs, reading coalesced across outputs;
* few outputs, many terms each (a bias-like (1, D) sum over 1M rows, a full sum): the reduction range is split
  into fixed chunks over many programs, which write fp32/fp64 partial sums to a workspace; a second pass of the
  same kernel sums the partials in a fixed order. No atomics anywhere.

Where x's unit stride lies on a kept dim other than the result's innermost (a transposed or channels_last grad
summed to a contiguous result), `_sum_kernel` would read x one element a line; a second kernel,
`_tiled_sum_kernel`, takes [BT, BI] tiles of the kept dims instead (the pointwise engines' `tiled_offsets`) and
adds the terms one after another.

Every launch parameter (block sizes, split count, warps) is a function of the problem's shape, strides and dtype
only, so the summation order - and the result, bit for bit - is fixed for a given (shape, strides, dtype, device).
Accumulation is in fp32 for f16/bf16/f32 and in fp64 when x or the result is f64.

On Hopper and later GPUs every pass launches as a programmatic dependent of the kernel before it in the stream
(PDL): it may start while that kernel finishes, and its first instruction waits (griddepcontrol.wait) until that
kernel has completed and its writes are visible, so only the launch latency overlaps, never the data.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _runtime
from .._runtime import I32_MAX, cdiv, next_pow2, pow2_dividing
from ..config import PlanCache, Tunable
from ..errors import InvalidProblem, RankUnsupported, Unsupported
from ..launch import alloc
from ..launch.checks import check_tensor, contiguous_strides
from ..launch.launcher import launch, launch_consts, pdl_ok
from ..launch.tl_helpers import TL_MATH, cast_out, gdc_wait
from .elementwise import tile_dims, tiled_offsets

__all__ = ["reduce_sum", "sum_to_shape", "sum_to_dims", "plan_view", "run_plan", "MAX_RANK", "ReductionConfig",
           "CONFIG"]

#: the most kept dims and the most reduced dims (each, after merging) a reduction handles
MAX_RANK = 8


@dataclass(frozen=True)
class ReductionConfig:
    """The reduction's launch heuristics (a function of the layout only, never of timing; figures: H200,
    docs/tuning/reduction.md)."""

    target_programs: int = 2048  # split a reduction until about this many programs run
    min_steps_per_split: int = 4  # ... but give each split at least this many tile steps
    min_split_terms: int = 1024  # and split only reductions of at least this many terms per output
    max_splits: int = 4096  # the most splits (rows of the partials' workspace) of one reduction
    # tiles where the outputs are contiguous (see _blocks): bytes of a row across outputs (for 16-bit types: _16),
    # bytes of a tile for short (<= 16 terms) and longer reductions, warps (bf16 repeat (4, 4): 45 -> 18 us)
    row_bytes: int = 1024
    row_bytes_16: int = 2048
    short_tile_bytes: int = 8192
    long_tile_bytes: int = 32768
    o_warps: int = 4
    # a pass that is not split runs at least this many programs where narrower output rows allow (down to 128
    # bytes), and a split takes single-step splits up to it (64x64 rep (256, 256) had finished in 16 programs, 22 us)
    min_programs: int = 256
    #: where x's unit stride is on a kept dim other than the output's innermost (a transposed or channels_last grad
    #: summed to a contiguous result), a pass of [BT, BI] output tiles of at most this many elements, BT along that
    #: dim, the reduction a loop a program (`elementwise.tile_dims`); 0: never. H100, repeat (2, 2) backward of a
    #: transposed f32 2048 x 2048 grad: 142 -> 38 us (torch.compile 35)
    tiled_tile: int = 4096
    tiled_warps: int = 8
    #: where the outputs are contiguous in x but their rows are not a multiple of a 16-byte vector long (so a load
    #: takes a few elements an address), tiles of at most this many bytes; 0: as other rows. repeat (13, 3, 2) of a
    #: 50x70x110 input took 254 registers a thread in 32 KB f32 tiles, 40 at 4 KB (offline sm_90 compile)
    ragged_tile_bytes: int = 4096
    i32_max: int = I32_MAX  # offsets past this take int64 index math (tests lower it to run that path)


CONFIG = Tunable("reduction", ReductionConfig())


# ----------------------------------------------------------------------------------------------- kernel
@triton.jit
def _flat_offsets(idx, SHAPE, STRIDE, RANK: tl.constexpr):
    """Element offsets of flat row-major indices `idx` into a (SHAPE, STRIDE) view (the outermost dim unbounded)."""
    off = tl.zeros_like(idx)
    rem = idx
    for i in tl.static_range(RANK):
        if i == RANK - 1:
            off += rem * STRIDE[0]
        else:
            off += (rem % SHAPE[RANK - 1 - i]) * STRIDE[RANK - 1 - i]
            rem = rem // SHAPE[RANK - 1 - i]
    return off


@triton.jit
def _sum_kernel(x, out, n_out, n_red, red_per_split, n_oblk, KSHAPE, KSTRIDE, RSHAPE, RSTRIDE,
                KR: tl.constexpr, RR: tl.constexpr, ACC: tl.constexpr,
                BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr,
                O_CONTIG: tl.constexpr, O_DIV: tl.constexpr, R_CONTIG: tl.constexpr, R_DIV: tl.constexpr,
                I64: tl.constexpr, STEP_SUM: tl.constexpr, PDL: tl.constexpr):
    # KSHAPE, KSTRIDE (the kept dims) and RSHAPE, RSTRIDE (the reduced ones): MAX_RANK ints each, KR and RR of
    # them used
    if PDL:  # launched as a programmatic dependent: nothing is read or written before the kernel before is done
        gdc_wait()
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    pid_o = pid % n_oblk
    pid_s = pid // n_oblk
    o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    o_mask = o < n_out
    koff = _flat_offsets(o, KSHAPE, KSTRIDE, KR)
    if O_DIV > 1:
        koff = tl.multiple_of(koff, O_DIV)
    if O_CONTIG > 1:
        koff = tl.max_contiguous(koff, O_CONTIG)
    r_begin = pid_s * red_per_split
    r_end = tl.minimum(r_begin + red_per_split, n_red)
    if STEP_SUM:  # each step's BLOCK_R terms summed at once (a thread holds its outputs' whole columns)
        acc = tl.zeros([BLOCK_O], dtype=ACC)
    else:  # every lane its own partial sum, summed at the end
        acc = tl.zeros([BLOCK_R, BLOCK_O], dtype=ACC)
    for rb in range(r_begin, r_end, BLOCK_R):
        r = rb + tl.arange(0, BLOCK_R)
        roff = _flat_offsets(r, RSHAPE, RSTRIDE, RR)
        if R_DIV > 1:
            roff = tl.multiple_of(roff, R_DIV)
        if R_CONTIG > 1:
            roff = tl.max_contiguous(roff, R_CONTIG)
        mask = (r < r_end)[:, None] & o_mask[None, :]
        v = tl.load(x + (roff[:, None] + koff[None, :]), mask=mask, other=0.0)
        if STEP_SUM:
            acc += tl.sum(v.to(ACC), axis=0)
        else:
            acc += v.to(ACC)
    if STEP_SUM:
        res = acc
    else:
        res = tl.sum(acc, axis=0)
    tl.store(out + (pid_s * n_out + o), cast_out(res, out.dtype.element_ty), mask=o_mask)


@triton.jit
def _tiled_sum_kernel(x, out, n_red, KSHAPE, KSTRIDE, OSTRIDE, RSHAPE, RSTRIDE, KR: tl.constexpr,
                      RR: tl.constexpr, ACC: tl.constexpr, TD: tl.constexpr, BT: tl.constexpr, BI: tl.constexpr,
                      I64: tl.constexpr, PDL: tl.constexpr):
    """A [BT, BI] tile of outputs (`tiled_offsets` over the kept dims: BT along kept dim TD, where x has its unit
    stride, by BI along the output's innermost), summing the n_red terms in flat order over the reduced dims: the
    loads coalesce along TD, the store along the output's rows (Triton converts between the two layouts)."""
    if PDL:
        gdc_wait()
    mask, oo, xo, _x1, _x2, _x3 = tiled_offsets(KSHAPE, OSTRIDE, KSTRIDE, KSTRIDE, KSTRIDE, KSTRIDE, 1, KR, TD, BT,
                                                BI, I64)
    acc = tl.zeros([BT, BI], dtype=ACC)
    for r in range(0, n_red):
        # (term r's offset; r a tensor also where the interpreter's loop gives an int)
        roff = _flat_offsets(r + tl.zeros([], tl.int64 if I64 else tl.int32), RSHAPE, RSTRIDE, RR)
        acc += tl.load(x + roff + xo, mask=mask, other=0.0).to(ACC)
    tl.store(out + oo, cast_out(acc, out.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------- planning
_CONST_NAMES = ("KR", "RR", "ACC", "BLOCK_O", "BLOCK_R", "O_CONTIG", "O_DIV", "R_CONTIG", "R_DIV", "I64", "STEP_SUM")


@dataclass(frozen=True)
class _Pass:
    """One launch of `_sum_kernel`, or of `_tiled_sum_kernel` where `tiled` is set: reads `x` (the caller's tensor
    or the previous pass's workspace)."""

    n_out: int
    n_red: int
    red_per_split: int
    n_split: int
    n_oblk: int
    kshape: tuple[int, ...]
    kstride: tuple[int, ...]
    rshape: tuple[int, ...]
    rstride: tuple[int, ...]
    block_o: int
    block_r: int
    o_contig: int
    o_div: int
    r_contig: int
    r_div: int
    i64: bool
    num_warps: int
    acc: torch.dtype
    step_sum: bool
    uid: int = 0  # identifies the pass (and so its specialisation) in the relaunch cache
    tiled: tuple[int, int, int, int] | None = None  # `_tiled_sum_kernel`'s (TD, BT, BI, programs), if it runs

    @property
    def consts(self) -> dict:
        """The kernel's constexpr values by name."""
        if self.tiled:
            td, bt, bi, _ = self.tiled
            return {"KR": len(self.kshape), "RR": len(self.rshape), "ACC": TL_MATH[self.acc], "TD": td, "BT": bt,
                    "BI": bi, "I64": self.i64}
        return dict(zip(_CONST_NAMES, (len(self.kshape), len(self.rshape), TL_MATH[self.acc], self.block_o,
                                       self.block_r, self.o_contig, self.o_div, self.r_contig, self.r_div, self.i64,
                                       self.step_sum), strict=True))

    def launch_args(self) -> tuple:
        """(kernel, grid, integer arguments after the two pointers: shapes and strides as MAX_RANK-tuples, padded
        with 1s)."""
        pad = lambda t: t + (1,) * (MAX_RANK - len(t))
        dims = (pad(self.kshape), pad(self.kstride), pad(self.rshape), pad(self.rstride))
        if self.tiled:
            ostride = pad(contiguous_strides(self.kshape))
            return _tiled_sum_kernel, (self.tiled[3],), (self.n_red, *dims[:2], ostride, *dims[2:])
        return _sum_kernel, (self.n_oblk * self.n_split,), (self.n_out, self.n_red, self.red_per_split, self.n_oblk,
                                                             *dims)


@dataclass(frozen=True)
class _Plan:
    out_shape: tuple[int, ...]
    out_dtype: torch.dtype
    acc_dtype: torch.dtype
    zeros: bool  # empty reduction: the result is all zeros (and nothing is read)
    passes: tuple[_Pass, ...]  # 1 or 2 (split + finish); empty when the result has no elements or is zeros


_plans = PlanCache("engines.reduction._plans")
_uids = itertools.count(1)



def _merge(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge neighbouring (size, stride) pairs, outermost first, where the outer one steps over the inner."""
    merged: list[tuple[int, int]] = []
    for size, stride in dims:
        if merged and merged[-1][1] == stride * size:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    return merged


def _hints(dims: list[tuple[int, int]], block: int, esize: int) -> tuple[int, int]:
    """(contiguity, divisibility) hints, in elements, for offsets of `block` consecutive flat indices over
    `dims` starting at a multiple of `block`: runs of `contig` consecutive addresses whose first element's offset
    is a multiple of `div` (only powers of two; 1 means no claim)."""
    if not dims:
        return 1, 1
    vec = max(1, 16 // esize)
    inner_size, inner_stride = dims[-1]
    contig = pow2_dividing(inner_size, block) if inner_stride == 1 else 1
    div = vec
    for _size, stride in dims[:-1]:
        div = min(div, pow2_dividing(stride, vec))
    if inner_stride == 1:
        div = min(div, contig)
    else:
        div = min(div, pow2_dividing(inner_stride, vec))
    return contig, div


def _blocks(kdims, rdims, n_out: int, n_red: int, esize: int, cfg: ReductionConfig, spread: bool = False
            ) -> tuple[int, int, int, bool]:
    """(BLOCK_O, BLOCK_R, num_warps, STEP_SUM): the tile, from the layout alone (measured on an H200:
    docs/tuning/reduction.md).

    Outputs contiguous: rows of 1 KB (2 KB for 16-bit types) across outputs and a few reduction rows per step
    (8 KB tiles for short reductions, 32 KB for longer ones); Triton's pipeliner overlaps the steps' loads.
    `spread` (a pass that is not split): rows as narrow as 128 bytes, so that at least min_programs programs run.
    Where a row spans every thread's vector (so a thread holds whole columns), each step is summed at once."""
    o_contig = bool(kdims) and kdims[-1][1] == 1
    r_contig = bool(rdims) and rdims[-1][1] == 1
    if o_contig:  # coalesce across outputs
        bo = min(next_pow2(n_out), (cfg.row_bytes_16 if esize == 2 else cfg.row_bytes) // esize)
        if spread:
            while bo * esize > 128 and cdiv(n_out, bo) < cfg.min_programs:
                bo //= 2
        tile_bytes = cfg.short_tile_bytes if n_red <= 16 else cfg.long_tile_bytes
        if cfg.ragged_tile_bytes and kdims[-1][0] % (16 // esize):
            tile_bytes = min(tile_bytes, cfg.ragged_tile_bytes)
        br = min(next_pow2(n_red), max(1, tile_bytes // (bo * esize)), 1024)
        if not spread:
            bo = min(next_pow2(n_out), max(bo, tile_bytes // (br * esize)), 4096)
        step = bo * esize >= 16 * 32 * cfg.o_warps
        return bo, br, cfg.o_warps, step
    tile = 4096 if esize <= 4 else 2048
    if r_contig:  # coalesce along the reduction
        br = min(next_pow2(n_red), 256 if esize >= 4 else 512)
        bo = min(next_pow2(n_out), max(1, tile // br))
        while bo > 1 and cdiv(n_out, bo) < cfg.min_programs:  # few outputs: one (or a few) a program, longer
            bo //= 2  # rows (prelu's partials, 64 x 4096: 16 programs then a finishing pass took 4-8 us)
        br = min(next_pow2(n_red), max(br, tile // bo), 4096)
    else:  # gathers either way: square-ish tiles
        bo = min(next_pow2(n_out), 64)
        br = min(next_pow2(n_red), max(1, tile // bo))
        bo = min(next_pow2(n_out), max(bo, tile // br), 1024)
    warps = 8 if bo * br >= 4096 else 4
    return bo, br, warps, False


def _max_offset(dims) -> int:
    return sum((s - 1) * abs(st) for s, st in dims)


def _tiled_pass(kdims, rdims, n_out: int, n_red: int, acc: torch.dtype, cfg: ReductionConfig) -> _Pass | None:
    """A `_tiled_sum_kernel` pass where x's unit stride lies on a kept dim other than the innermost (`tile_dims`)
    and its tiles alone give at least min_programs programs (fewer, with many terms each, are better split)."""
    if len(kdims) < 2:
        return None
    kshape, kstride = tuple(s for s, _ in kdims), tuple(st for _, st in kdims)
    td, bt, bi, programs = tile_dims(kshape, [contiguous_strides(kshape), kstride], cfg.tiled_tile)
    if td < 0 or programs < cfg.min_programs:
        return None
    rshape, rstride = (tuple(s for s, _ in rdims), tuple(st for _, st in rdims)) if rdims else ((1,), (0,))
    span = _max_offset(kdims) + _max_offset(rdims)
    i64 = span >= cfg.i32_max or n_out + bt * bi >= cfg.i32_max or n_red >= cfg.i32_max
    return _Pass(n_out, n_red, n_red, 1, programs, kshape, kstride, rshape, rstride, bi, bt, 1, 1, 1, 1, i64,
                 cfg.tiled_warps, acc, False, next(_uids), (td, bt, bi, programs))


def _make_pass(kdims, rdims, esize: int, acc: torch.dtype, cfg: ReductionConfig, *, allow_split: bool) -> _Pass:
    n_out = math.prod(s for s, _ in kdims)
    n_red = math.prod(s for s, _ in rdims)
    tiled = _tiled_pass(kdims, rdims, n_out, n_red, acc, cfg)
    if tiled is not None:
        return tiled
    bo, br, warps, step = _blocks(kdims, rdims, n_out, n_red, esize, cfg)
    n_oblk = cdiv(n_out, bo)
    steps = cdiv(n_red, br)
    n_split = 1
    if (allow_split and n_oblk < cfg.target_programs and steps >= 2 * cfg.min_steps_per_split
            and n_red >= cfg.min_split_terms):
        # (steps of their own where that alone reaches min_programs programs: a 4096 x 64 column sum took 12.9
        # us in 8 programs of 4 steps, 4.9 us in 32 of one; H200)
        per_split = max(steps // cfg.min_steps_per_split, min(steps, cdiv(cfg.min_programs, n_oblk)))
        n_split = min(cdiv(cfg.target_programs, n_oblk), per_split, cfg.max_splits)
    elif n_oblk < cfg.min_programs:  # not split: narrower tiles, for more programs
        bo, br, warps, step = _blocks(kdims, rdims, n_out, n_red, esize, cfg, spread=True)
        n_oblk = cdiv(n_out, bo)
        steps = cdiv(n_red, br)
    steps_per_split = cdiv(steps, n_split)
    n_split = cdiv(steps, steps_per_split)
    o_contig, o_div = _hints(kdims, bo, esize)
    r_contig, r_div = _hints(rdims, br, esize)
    span = _max_offset(kdims) + _max_offset(rdims)
    lim = cfg.i32_max
    i64 = (2 * span >= lim or n_out * n_split + bo >= lim or n_red + steps_per_split * br >= lim
           or n_oblk * n_split >= lim)
    kshape, kstride = (tuple(s for s, _ in kdims), tuple(st for _, st in kdims)) if kdims else ((1,), (0,))
    rshape, rstride = (tuple(s for s, _ in rdims), tuple(st for _, st in rdims)) if rdims else ((1,), (0,))
    return _Pass(n_out, n_red, steps_per_split * br, n_split, n_oblk, kshape, kstride, rshape, rstride,
                 bo, br, o_contig, o_div, r_contig, r_div, i64, warps, acc, step, next(_uids))


def _normalize_dims(op: str, dims, ndim: int) -> tuple[int, ...]:
    if isinstance(dims, int):
        dims = (dims,)
    try:
        dims = tuple(operator.index(d) for d in dims)
    except (TypeError, ValueError):
        raise InvalidProblem(op, "dims", "a sequence of ints", dims) from None
    rank = max(ndim, 1)  # a 0-d tensor accepts dim 0 / -1, as torch.sum does
    out = []
    for d in dims:
        if not -rank <= d < rank:
            raise InvalidProblem(op, "dims", f"dims in [{-rank}, {rank - 1}] for a {ndim}-d tensor", d)
        d = d % rank
        if d in out:
            raise InvalidProblem(op, "dims", "distinct dims", dims)
        out.append(d)
    if ndim == 0:
        return ()
    return tuple(sorted(out))


def _acc_dtype(x_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in (x_dtype, out_dtype) else torch.float32


def _plan_for(op: str, shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype,
              dims: tuple[int, ...], out_dtype: torch.dtype) -> _Plan:
    out_shape = tuple(s for d, s in enumerate(shape) if d not in dims)
    acc = _acc_dtype(dtype, out_dtype)
    n_out = math.prod(out_shape)
    n_red = math.prod(shape[d] for d in dims)
    if n_out == 0 or n_red == 0:
        return _Plan(out_shape, out_dtype, acc, n_red == 0, ())
    kdims = _merge([(shape[d], strides[d]) for d in range(len(shape)) if d not in dims and shape[d] != 1])
    rdims = [(shape[d], strides[d]) for d in dims if shape[d] != 1]
    # reduced dims: broadcast (stride-0) ones outermost, then by decreasing stride, so that the innermost is the
    # densest (and the summation order is a function of the layout only)
    rdims.sort(key=lambda p: (p[1] != 0, -p[1], -p[0]))
    rdims = _merge(rdims)
    if len(kdims) > MAX_RANK or len(rdims) > MAX_RANK:
        raise RankUnsupported(op, "input", f"at most {MAX_RANK} kept and {MAX_RANK} reduced dims after merging "
                              "contiguous ones", f"{len(kdims)} kept and {len(rdims)} reduced (shape "
                              f"{shape}, strides {strides})")
    esize = torch.empty((), dtype=dtype).element_size()
    cfg = CONFIG.current
    first = _make_pass(kdims, rdims, esize, acc, cfg, allow_split=True)
    if first.n_split == 1:
        return _Plan(out_shape, out_dtype, acc, False, (first,))
    # finish: sum the (n_split, n_out) workspace over its first dim, in one pass, in a fixed order
    ws_esize = torch.empty((), dtype=acc).element_size()
    ws_k = [(first.n_out, 1)]
    ws_r = [(first.n_split, first.n_out)]
    second = _make_pass(ws_k, ws_r, ws_esize, acc, cfg, allow_split=False)
    return _Plan(out_shape, out_dtype, acc, False, (first, second))


def _get_plan(op: str, x: torch.Tensor, dims, out_dtype) -> _Plan:
    try:
        dkey = (dims, type(dims)) if isinstance(dims, int) else _runtime.values_key(dims)
        key = None if dkey is None else (x.shape, x.stride(), x.dtype, x.device, dkey, out_dtype, op, x.is_neg())
        plan = _plans.get(key) if key is not None else None
    except (AttributeError, TypeError):
        plan, key = None, None
    if plan is not None:
        return plan
    check_tensor(op, "input", x)
    if out_dtype is None:
        out_dtype = x.dtype
    if out_dtype not in _runtime.FLOAT_DTYPES:
        raise Unsupported(op, "out_dtype", "one of float32, float16, bfloat16, float64", out_dtype)
    nd = _normalize_dims(op, dims, x.dim())
    plan = _plan_for(op, tuple(x.shape), tuple(x.stride()), x.dtype, nd, out_dtype)
    return _plans.remember(key, plan)


def plan_view(shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype, dims: tuple[int, ...], *,
              op: str, out_dtype: torch.dtype | None = None) -> _Plan:
    """The (cached) plan for summing a view with `shape` and `strides` of a tensor of `dtype` over `dims`, for
    callers that validated the view themselves (every offset it reaches lies within their tensor's elements;
    `dims` sorted, distinct, in range). Run it with `run_plan`."""
    out_dtype = out_dtype or dtype
    key = ("view", shape, strides, dtype, dims, out_dtype, op)
    plan = _plans.get(key)
    if plan is None:
        plan = _plan_for(op, shape, strides, dtype, dims, out_dtype)
        _plans.remember(key, plan)
    return plan


def run_plan(plan: _Plan, x: torch.Tensor, out_shape: Sequence[int] | None = None) -> torch.Tensor:
    """Run a `plan_view` plan on x's data (from its first element); the result gets `out_shape` if given (same
    number of elements as the plan's)."""
    return _execute(plan, x, out_shape)


# (pass uid, PDL) -> the pass's kernel, grid, integer arguments and launch_consts
_launches = PlanCache("engines.reduction._launches")


def _run_pass(p: _Pass, src: torch.Tensor, dst: torch.Tensor, device: int) -> None:
    pdl = pdl_ok(device)  # (H200, prelu backward, 64M elements: its partials' pass 1.5 us sooner, f32 and bf16)
    hit = _launches.get((p.uid, pdl))
    if hit is None:
        kernel, grid, ints = p.launch_args()
        hit = _launches.remember((p.uid, pdl), (kernel, grid, ints, launch_consts(p.consts, p.num_warps, pdl=pdl)))
    kernel, grid, ints, consts = hit
    launch(kernel, grid, (src, dst), ints, consts, device, (kernel, p.uid, device, pdl))


def _execute(plan: _Plan, x: torch.Tensor, out_shape=None) -> torch.Tensor:
    shape = plan.out_shape if out_shape is None else out_shape
    if plan.zeros:
        return alloc.zeros(shape, plan.out_dtype, x.device)
    out = alloc.empty(shape, plan.out_dtype, x.device)
    if not plan.passes:
        return out
    device = x.get_device()
    if len(plan.passes) == 1:
        _run_pass(plan.passes[0], x, out, device)
        return out
    first, second = plan.passes
    ws = alloc.empty((first.n_split, first.n_out), plan.acc_dtype, x.device)
    _run_pass(first, x, ws, device)
    _run_pass(second, ws, out, device)
    return out


# ----------------------------------------------------------------------------------------------- public API
def reduce_sum(x: torch.Tensor, dims: Sequence[int], *, op: str,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum x over `dims` (keepdim=False). x may have any strides, including stride 0 (broadcast) - read in
    place. Result: a fresh contiguous tensor of x's remaining dims (in order), dtype out_dtype or x.dtype.
    Accumulate in fp32 (fp64 for f64), one fixed summation order (no atomics, no timing-dependent config):
    bitwise deterministic for a given (shape, strides, dtype). Empty reduction -> zeros. `op` names the
    calling op in error messages."""
    return _execute(_get_plan(op, x, dims, out_dtype), x)


def sum_to_shape(x: torch.Tensor, shape: Sequence[int], *, op: str,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """autograd's sum_to: sum the leading dims x has beyond len(shape) and every dim where shape has 1 and x
    does not, to exactly `shape` (fresh contiguous tensor). If nothing needs summing, return x converted to
    out_dtype (x itself when no conversion is needed)."""
    check_tensor(op, "input", x)
    try:
        shape = tuple(operator.index(s) for s in shape)
    except (TypeError, ValueError):
        raise InvalidProblem(op, "shape", "a sequence of ints", shape) from None
    dims = sum_to_dims(tuple(x.shape), shape, op=op)
    if all(x.shape[d] == 1 for d in dims):  # nothing to add up: a view (and a conversion where asked)
        y = x.reshape(shape) if x.dim() > len(shape) else x
        return y if out_dtype is None or out_dtype == y.dtype else y.to(out_dtype)
    return reduce_sum(x, dims, op=op, out_dtype=out_dtype).view(shape)


def sum_to_dims(x_shape: tuple[int, ...], shape: tuple[int, ...], *, op: str) -> tuple[int, ...]:
    """The dims (ascending) that autograd's sum_to adds up to bring a tensor of `x_shape` to `shape`: the leading
    ones it has beyond len(shape), and those where shape has 1 and it does not (InvalidProblem: no such sum)."""
    lead = len(x_shape) - len(shape)
    if lead < 0 or any(s < 0 for s in shape):
        raise InvalidProblem(op, "shape", f"a shape x of shape {x_shape} can be summed to", shape)
    dims = list(range(lead))
    for i, s in enumerate(shape):
        xs = x_shape[lead + i]
        if s == 1 and xs != 1:
            dims.append(lead + i)
        elif s != xs:
            raise InvalidProblem(op, "shape", f"a shape x of shape {x_shape} can be summed to", shape)
    return tuple(dims)
