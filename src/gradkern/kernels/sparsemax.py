"""Sparsemax (Martins & Astudillo, 2016): forward, backward and the autograd-aware `gradkern.sparsemax`.

p = sparsemax(z) is the Euclidean projection of z onto the probability simplex along `dim`: p = max(z - tau, 0)
with tau the root of sum(max(z - tau, 0)) = 1 (shared/docs/semantics.md gives the sort-based definition).

Forward, without sorting. Per row, in the math dtype (fp32; fp64 for fp64): shift by the row max, d = z - max,
so tau lies in [-1, 0). Each iteration evaluates G thresholds at once (`SparsemaxConfig`), each giving
|{d > t}| and the sum of those d: a Newton step from the bracket's lower end (Michelot's step,
tau' = (sum_S d - 1)/|S| with S = {d > lo}, which never overshoots the root) and G - 1 points splitting the rest
of the bracket. The row is finished when the Newton candidate keeps the support of `lo` (|{d > t}| = |S|): then
tau = t is the self-consistent threshold, S = {d > tau} and tau = (sum_S d - 1)/|S| exactly as evaluated, which
is the sort-based definition's k = |S|. (If rounding makes the Newton point not exceed `lo`, the row also stops
there: an element lies within rounding of the threshold.) A fixed iteration cap bounds pathological rows; typical
rows take 2-5 iterations.

Rows of up to `fwd_row_max` elements (SparsemaxConfig) are held in registers by one program, several rows per
program when short, and iterate in place (one read of x, one write of p). Longer rows are split into chunks of
`block_max` across programs, with one launch per iteration (a fixed count: the iteration cap + 2, so no host
synchronisation): each chunk program combines the previous launch's per-chunk counts and sums in a fixed order
(no atomics, so results are bit-stable) and evaluates the next thresholds on its chunk; programs whose rows are
all finished only carry their state over.

Backward, one pass: dx = 1_S * (g - sum_S g / |S|) with S = {y > 0}, counted from y itself. Where the rows are
contiguous (and held whole by a program), g is read only in the 16-byte vectors holding some y > 0: sparsemax's
outputs are mostly 0, so it reads far less than its g (at 32768 x 1024, N(0, 4) inputs: 2.5 entries a row). With a
whole-row support it reads everything, after y (docs/tuning/sparsemax.md).

Special values (both directions are pinned by the tests):
- a row holding a NaN gives NaN everywhere in that row;
- -inf entries get probability 0 (exactly), the rest of the row is sparsemax of the finite entries;
- a row whose maximum is infinite (an entry +inf, or every entry -inf) puts equal mass on the entries equal to
  that maximum: 1/k on each of the k entries equal to +inf, 0 elsewhere; 1/n on each entry of a row of n -inf;
  these are the limits of the finite cases, so the output is always a distribution unless a NaN is present;
- entries tied exactly at the threshold get 0 (the sort-based k excludes them) and ties above it share the mass.
Backward: entries with y > 0 get g - mean_S(g); entries with y == 0 get 0 whatever g holds; entries whose y is
NaN get NaN (so the rows the forward fills with NaN get NaN gradients).
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _runtime
from .._cases import Draw, describe, randn, refuse
from .._runtime import I32_MAX, cdiv, next_pow2
from ..config import Tunable, plan_builder
from ..engines.elementwise import _collapse
from ..errors import InvalidProblem, Unsupported
from ..launch import alloc
from ..launch.checks import _dense_strides, check_tensor, contiguous_strides
from ..launch.launcher import launch, launch_consts
from ..launch.tl_helpers import TL_MATH, cast_out
from ..registry import Case, register_op

__all__ = ["sparsemax", "sparsemax_forward", "sparsemax_backward"]

# Iteration caps (fp64; fp32 math for the rest) at 4 thresholds an iteration. A row the cap stops takes the Newton
# point from lo, within the bracket of the exact threshold: at most 4**-(cap - 1) wide (about 1e-14 in fp32, 3e-24
# in fp64); with G thresholds an iteration the cap is the fewest iterations that narrow the bracket as far
# (`_maxit`).
_MAXIT = {torch.float64: 40}
_MAXIT_DEFAULT = 24


def _maxit(dtype: torch.dtype, g: int) -> int:
    """The iteration cap at `g` thresholds an iteration: G**-(cap - 1) <= 4**-(cap_4 - 1)."""
    return 1 + math.ceil((_MAXIT.get(dtype, _MAXIT_DEFAULT) - 1) * 2 / math.log2(g))


@dataclass(frozen=True)
class SparsemaxConfig:
    """How sparsemax's rows map onto programs, warps and registers (docs/tuning/sparsemax.md; H200, 32768 x 1024)."""

    # the longest row one program of the backward keeps in registers (half of it in fp64), and the chunk of a
    # split row; longer rows are split over programs (the forward: one launch an iteration)
    block_max: int = 16384
    # the longest row the forward holds whole (half of it in fp64): one launch where a split row takes one an
    # iteration; f32 1024 x 16385 1307 -> 239 us (docs/tuning/sparsemax.md)
    fwd_row_max: int = 32768
    # short contiguous rows a program takes together, up to this many elements: the forward 1.3x faster (f32) with
    # 2048 than with 4096
    fwd_row_tile: int = 2048
    # the backward's: one 1024-element row a program, bf16 3,826-3,848 GB/s against 3,756-3,795 with 4096
    bwd_row_tile: int = 1024
    # one warp per this many elements of a tile (1 to 16 warps), forward and backward: the backward's row in 4
    # warps, bf16 3,826-3,848 GB/s against 3,262-3,282 in 1
    fwd_warp_elems: int = 256
    bwd_warp_elems: int = 256
    # ... but the forward's contiguous rows of up to fwd_short_row entries take a warp per fwd_short_warp_elems:
    # f32 4194304 x 3 248 -> 172 us, 21 classes channels_last 540 -> 424
    fwd_short_row: int = 32
    fwd_short_warp_elems: int = 128
    # rows a program takes when the reduced dim is strided, so that loads of adjacent rows coalesce (no sweep)
    col_rows: int = 16
    # chunk partials of a split row combined per step, in a fixed order (no recorded sweep)
    combine_block: int = 64
    # thresholds an iteration evaluates in rows held whole: the Newton step and G - 1 bisection points. Most rows
    # finish in 2-4 iterations whatever G, and each threshold is a pass over the row with two sums: f32 32768 x
    # 1024 256 -> 169 us with 2 (4 before)
    fwd_thresholds: int = 2
    # ... in split rows, where more thresholds mean fewer iterations and so fewer launches (the cap's), but more
    # work in each live one (docs/tuning/sparsemax.md)
    split_thresholds: int = 4
    # the backward's vector kernel waits for y before it reads g, so it needs every warp the SM holds: a cap of 32
    # registers (0: none) where a thread holds at most vec_cap_elems elements (of 4 bytes or less) of each tile;
    # uncapped, bf16 gets 35 registers: 3,740 against 4,218-4,299 GB/s
    vec_maxnreg: int = 32
    vec_cap_elems: int = 8
    # offsets past this take the int64 index path (the int32 limit; tests lower it to reach that path)
    i32_max: int = I32_MAX


CONFIG = Tunable("sparsemax", SparsemaxConfig())


# --------------------------------------------------------------------------------------------- shared Triton
@triton.jit
def _count_sum(d, t):
    """Per row of the tile d [R, B]: |{d > t}| (int32) and the sum of those d, for thresholds t [R]."""
    sel = d > t[:, None]
    return tl.sum(sel.to(tl.int32), 1), tl.sum(tl.where(sel, d, 0.0), 1)


@triton.jit
def _add_pair(c0, s0, c1, s1):
    return c0 + c1, s0 + s1


@triton.jit
def _support_sum(y, g):
    """Per row: |S| and sum_S g, S = {y > 0}."""
    sel = y > 0.0
    return tl.sum(sel.to(tl.int32), 1), tl.sum(tl.where(sel, g, 0.0), 1)


@triton.jit
def _outer_offset(o, OSHAPE, OSTRIDE, ORANK: tl.constexpr):
    """The storage offset (int64) of outer index `o` over the collapsed outer dims (innermost last)."""
    off = 0
    rem = o.to(tl.int64)
    for i in tl.static_range(ORANK):
        off += (rem % OSHAPE[ORANK - 1 - i]) * OSTRIDE[ORANK - 1 - i]
        rem = rem // OSHAPE[ORANK - 1 - i]
    return off


@triton.jit
def _span(block, SIZE: tl.constexpr, I64: tl.constexpr):
    """Indices block*SIZE ... block*SIZE + SIZE - 1 (int64 where offsets can pass 2^31)."""
    if I64:
        return block.to(tl.int64) * SIZE + tl.arange(0, SIZE)
    else:
        return block * SIZE + tl.arange(0, SIZE)


@triton.jit
def _tile_offsets(rows, cols, S):
    """Offsets of the tile [rows, cols] in an operand whose inner dim and reduced dim have strides S."""
    return rows[:, None] * S[0] + cols[None, :] * S[1]


@triton.jit
def _candidate(lo, hi, cnt_lo, s_lo, first, J: tl.constexpr, G: tl.constexpr):
    """Threshold J of an iteration: the Newton step from lo (J = 0), then G - 1 points splitting what is left
    of the bracket [lo, hi]; on the first iteration (no sums at lo yet) G points from lo = -1 up."""
    newton = (s_lo - 1.0) / tl.maximum(cnt_lo, 1).to(lo.dtype)
    base = tl.where(first, lo, tl.maximum(newton, lo))
    if J == 0:
        t = tl.where(first, lo, newton)
    else:
        t = base + (hi - base) * (J / G)
    return t


@triton.jit
def _absorb(J: tl.constexpr, t, c, s, n_lo, n_cnt, n_s, n_hi, fin, lo, cnt_lo, first):
    """Fold threshold J's count and sum into the next bracket (n_lo with its count and sum, n_hi)."""
    if J == 0:
        # the Newton point is a lower bound of the root; it is the root when it keeps lo's support
        fin = tl.where(first, False, (c == cnt_lo) | (t <= lo))  # (`first` may be a Python bool)
        n_lo, n_cnt, n_s = t, c, s
    else:
        below = s - c.to(t.dtype) * t - 1.0 >= 0.0  # f(t) >= 0: t <= root
        n_lo = tl.where(below, t, n_lo)
        n_cnt = tl.where(below, c, n_cnt)
        n_s = tl.where(below, s, n_s)
        n_hi = tl.where(below, n_hi, tl.minimum(n_hi, t))
    return n_lo, n_cnt, n_s, n_hi, fin


@triton.jit
def _start(rmask, R: tl.constexpr, MATH: tl.constexpr):
    """The bracket before the first iteration: lo = -1, hi = 0 (no count and sum at lo yet, nothing found);
    (lo, hi, cnt_lo, s_lo, tau, done), rows outside the tensor done."""
    zero = tl.zeros((R,), MATH)
    return zero - 1.0, zero, tl.zeros((R,), tl.int32), zero, zero, ~rmask


@triton.jit
def _advance(lo, hi, cnt_lo, s_lo, tau, done, t0, n_lo, n_cnt, n_s, n_hi, fin):
    """Apply one iteration's outcome to the rows not finished yet."""
    live = ~done
    tau = tl.where(live & fin, t0, tau)
    step = live & ~fin
    lo = tl.where(step, n_lo, lo)
    hi = tl.where(step, n_hi, hi)
    cnt_lo = tl.where(step, n_cnt, cnt_lo)
    s_lo = tl.where(step, n_s, s_lo)
    return lo, hi, cnt_lo, s_lo, tau, done | fin


@triton.jit
def _shifted(z, m, mask):
    """d = z - max per row; where the max is infinite, 0 on the entries equal to it and -inf elsewhere."""
    inf_max = (m == float("inf")) | (m == float("-inf"))
    finite_m = tl.where(inf_max, 0.0, m)  # (no inf - inf computed, even where it is not selected)
    d = tl.where(inf_max[:, None], tl.where(z == m[:, None], 0.0, float("-inf")), z - finite_m[:, None])
    return tl.where(mask, d, float("-inf"))


@triton.jit
def _finish(d, tau, done, lo, cnt_lo, s_lo, nan_row):
    newton = (s_lo - 1.0) / tl.maximum(cnt_lo, 1).to(lo.dtype)
    tau = tl.where(done, tau, newton)
    p = tl.maximum(d - tau[:, None], 0.0)
    return tl.where(nan_row[:, None], float("nan"), p)


@triton.jit
def _tile(K, N_IB, INNER, N, ORANK: tl.constexpr, R: tl.constexpr, B: tl.constexpr, I64: tl.constexpr):
    """This program's tile: chunk k (of K per row; 0 of 1 for whole rows) of rows `rows` (ids `rid` in the
    scratch buffers) at outer index o, and its mask."""
    pid = tl.program_id(0)
    k = pid % K
    rt = pid // K
    if ORANK == 0:  # no outer dims, no division: its latency delays the first load (f32 backward 7%, H200)
        o = tl.zeros_like(rt)
        rows = _span(rt, R, I64)
    else:
        o = rt // N_IB
        rows = _span(rt % N_IB, R, I64)
    rmask = rows < INNER
    cols = _span(k, B, I64)
    return k, o, rows, rmask, o.to(tl.int64) * INNER + rows, cols, rmask[:, None] & (cols < N)[None, :]


@triton.jit
def _combine(part_c, part_s, base, step, K, rmask, R: tl.constexpr, KB: tl.constexpr, MATH: tl.constexpr):
    """Per row: the sums of the K chunk partials at base + k*step (counts, sums), in a fixed order."""
    # (R, KB) accumulators reduced once after the loop: a reduction inside the loop whose result is used more
    # than once trips an assertion in Triton 3.6's OptimizeThreadLocality pass ("loopResult.hasOneUse()").
    c = tl.zeros((R, KB), tl.int32)
    s = tl.zeros((R, KB), MATH)
    for k0 in range(0, K, KB):
        kk = k0 + tl.arange(0, KB)
        pm = rmask[:, None] & (kk < K)[None, :]
        at = base[:, None] + kk[None, :] * step
        c += tl.load(part_c + at, mask=pm, other=0)
        s += tl.load(part_s + at, mask=pm, other=0.0)
    return tl.sum(c, 1), tl.sum(s, 1)


# --------------------------------------------------------------------------------------------- forward kernels
# Shapes and strides come as tuples of ints (each specialised as a plain int argument is), so compiled kernels can
# be relaunched directly (launcher.launch): OSHAPE the outer dims' sizes (padded to _MAX_OUTER with 1s), XO (YO, GO,
# DO) an operand's strides along them (padded with 0s), XS (YS, ...) its strides along the inner and reduced dims.
@triton.jit
def _fwd_rows_kernel(x, y, N, INNER, N_IB, OSHAPE, XO, YO, XS, YS,
                     ORANK: tl.constexpr, R: tl.constexpr, B: tl.constexpr, G: tl.constexpr,
                     MAXIT: tl.constexpr, MATH: tl.constexpr, I64: tl.constexpr):
    _k, o, rows, rmask, _rid, cols, mask = _tile(1, N_IB, INNER, N, ORANK, R, B, I64)
    xp = x + _outer_offset(o, OSHAPE, XO, ORANK)
    z = tl.load(xp + _tile_offsets(rows, cols, XS), mask=mask, other=float("-inf")).to(MATH)
    isnan = z != z
    nan_row = tl.sum(isnan.to(tl.int32), 1) > 0
    z = tl.where(isnan, float("-inf"), z)
    d = _shifted(z, tl.max(z, 1), mask)

    lo, hi, cnt_lo, s_lo, tau, done = _start(rmask, R, MATH)
    it = 0
    go = tl.sum((~done).to(tl.int32), 0) > 0
    while go:
        first = it == 0
        t0 = lo
        n_lo, n_cnt, n_s, n_hi, fin = lo, cnt_lo, s_lo, hi, done
        for j in tl.static_range(G):
            t = _candidate(lo, hi, cnt_lo, s_lo, first, j, G)
            c, s = _count_sum(d, t)
            if j == 0:
                t0 = t
            n_lo, n_cnt, n_s, n_hi, fin = _absorb(j, t, c, s, n_lo, n_cnt, n_s, n_hi, fin, lo, cnt_lo, first)
        lo, hi, cnt_lo, s_lo, tau, done = _advance(lo, hi, cnt_lo, s_lo, tau, done, t0,
                                                   n_lo, n_cnt, n_s, n_hi, fin)
        it += 1
        go = (tl.sum((~done).to(tl.int32), 0) > 0) & (it < MAXIT)

    p = _finish(d, tau, done, lo, cnt_lo, s_lo, nan_row)
    yp = y + _outer_offset(o, OSHAPE, YO, ORANK)
    tl.store(yp + _tile_offsets(rows, cols, YS), cast_out(p, y.dtype.element_ty), mask=mask)


@triton.jit
def _split_state(st_f, st_i, buf, M, rid, rmask):
    """A split row's bracket state (lo, hi, s_lo, tau, cnt_lo, done) from double-buffer half `buf`."""
    sf = st_f + (buf * M + rid) * 4
    si = st_i + (buf * M + rid) * 2
    return (tl.load(sf, mask=rmask, other=0.0), tl.load(sf + 1, mask=rmask, other=0.0),
            tl.load(sf + 2, mask=rmask, other=0.0), tl.load(sf + 3, mask=rmask, other=0.0),
            tl.load(si, mask=rmask, other=0), tl.load(si + 1, mask=rmask, other=1) != 0)


@triton.jit
def _store_split_state(st_f, st_i, buf, M, rid, rmask, lo, hi, s_lo, tau, cnt_lo, done):
    sf = st_f + (buf * M + rid) * 4
    si = st_i + (buf * M + rid) * 2
    tl.store(sf, lo, mask=rmask)
    tl.store(sf + 1, hi, mask=rmask)
    tl.store(sf + 2, s_lo, mask=rmask)
    tl.store(sf + 3, tau, mask=rmask)
    tl.store(si, cnt_lo, mask=rmask)
    tl.store(si + 1, done.to(tl.int32), mask=rmask)


@triton.jit(do_not_specialize=["STAGE"])
def _fwd_split_kernel(x, y, pmax, pnan, part_c, part_s, st_f, st_i, STAGE, LAST, M, N, INNER, N_IB, K,
                      OSHAPE, XO, YO, XS, YS,
                      ORANK: tl.constexpr, R: tl.constexpr, B: tl.constexpr, G: tl.constexpr, KB: tl.constexpr,
                      MATH: tl.constexpr, I64: tl.constexpr):
    """One launch of a split row's iteration. STAGE 0: per-chunk max and NaN count. STAGE s in 1..LAST-1:
    combine the row max, take iteration s-2's combined counts and sums into the bracket (s >= 2; chunk 0
    stores the state), evaluate iteration s-1's thresholds on this chunk. STAGE LAST: as s, then write p.
    Most rows finish in a few iterations of the fixed LAST - 1: a program whose rows are all finished before
    LAST only has chunk 0 carry their state over to the next buffer."""
    k, o, rows, rmask, rid, cols, mask = _tile(K, N_IB, INNER, N, ORANK, R, B, I64)
    xp = x + _outer_offset(o, OSHAPE, XO, ORANK) + _tile_offsets(rows, cols, XS)

    if STAGE == 0:
        z = tl.load(xp, mask=mask, other=float("-inf")).to(MATH)
        isnan = z != z
        tl.store(pnan + rid * K + k, tl.sum(isnan.to(tl.int32), 1), mask=rmask)
        tl.store(pmax + rid * K + k, tl.max(tl.where(isnan, float("-inf"), z), 1), mask=rmask)
    else:
        cur = STAGE % 2
        prev = 1 - cur
        if STAGE == 1:
            lo, hi, cnt_lo, s_lo, tau, done = _start(rmask, R, MATH)
        else:
            lo, hi, s_lo, tau, cnt_lo, done = _split_state(st_f, st_i, prev, M, rid, rmask)
        if (STAGE == LAST) | (tl.sum((~done).to(tl.int32), 0) > 0):
            # the row max and NaN count, from every chunk's partials
            m2 = tl.full((R, KB), float("-inf"), MATH)
            nan2 = tl.zeros((R, KB), tl.int32)
            for k0 in range(0, K, KB):  # reduced after the loop, as in _combine
                kk = k0 + tl.arange(0, KB)
                pm = rmask[:, None] & (kk < K)[None, :]
                at = rid[:, None] * K + kk[None, :]
                m2 = tl.maximum(m2, tl.load(pmax + at, mask=pm, other=float("-inf")))
                nan2 += tl.load(pnan + at, mask=pm, other=0)
            m = tl.max(m2, 1)
            nans = tl.sum(nan2, 1)

            if STAGE > 1:
                first = STAGE == 2
                t0 = lo
                n_lo, n_cnt, n_s, n_hi, fin = lo, cnt_lo, s_lo, hi, done
                for j in tl.static_range(G):
                    t = _candidate(lo, hi, cnt_lo, s_lo, first, j, G)
                    c, s = _combine(part_c, part_s, (prev * M + rid) * K * G + j, G, K, rmask, R, KB, MATH)
                    if j == 0:
                        t0 = t
                    n_lo, n_cnt, n_s, n_hi, fin = _absorb(j, t, c, s, n_lo, n_cnt, n_s, n_hi, fin, lo, cnt_lo,
                                                          first)
                lo, hi, cnt_lo, s_lo, tau, done = _advance(lo, hi, cnt_lo, s_lo, tau, done, t0,
                                                           n_lo, n_cnt, n_s, n_hi, fin)

            if STAGE < LAST:
                if k == 0:
                    _store_split_state(st_f, st_i, cur, M, rid, rmask, lo, hi, s_lo, tau, cnt_lo, done)
                live = mask & (~done)[:, None]
                if tl.sum(live.to(tl.int32)) > 0:  # rows already finished read nothing more
                    z = tl.load(xp, mask=live, other=float("-inf")).to(MATH)
                    d = _shifted(tl.where(z != z, float("-inf"), z), m, live)
                    first = STAGE == 1
                    for j in tl.static_range(G):
                        t = _candidate(lo, hi, cnt_lo, s_lo, first, j, G)
                        c, s = _count_sum(d, t)
                        at = ((cur * M + rid) * K + k) * G + j
                        tl.store(part_c + at, c, mask=rmask)
                        tl.store(part_s + at, s, mask=rmask)
            else:
                z = tl.load(xp, mask=mask, other=float("-inf")).to(MATH)
                d = _shifted(tl.where(z != z, float("-inf"), z), m, mask)
                p = _finish(d, tau, done, lo, cnt_lo, s_lo, nans > 0)
                yp = y + _outer_offset(o, OSHAPE, YO, ORANK)
                tl.store(yp + _tile_offsets(rows, cols, YS), cast_out(p, y.dtype.element_ty), mask=mask)
        elif k == 0:  # every row finished: its state carried over unchanged
            _store_split_state(st_f, st_i, cur, M, rid, rmask, lo, hi, s_lo, tau, cnt_lo, done)


# --------------------------------------------------------------------------------------------- backward kernels
@triton.jit
def _bwd_dx(g, y, c, s):
    """dx from the tiles g, y and their rows' |S| and sum_S g (c, s: broadcastable to the tiles)."""
    mean = s / tl.maximum(c, 1).to(s.dtype)
    return tl.where(y > 0.0, g - mean, tl.where(y == y, 0.0, float("nan")))


@triton.jit
def _bwd_load(y, g, o, rows, cols, mask, OSHAPE, YO, GO, YS, GS, ORANK: tl.constexpr, MATH: tl.constexpr):
    yv = tl.load(y + _outer_offset(o, OSHAPE, YO, ORANK) + _tile_offsets(rows, cols, YS), mask=mask,
                 other=0.0).to(MATH)
    gv = tl.load(g + _outer_offset(o, OSHAPE, GO, ORANK) + _tile_offsets(rows, cols, GS), mask=mask,
                 other=0.0).to(MATH)
    return yv, gv


@triton.jit
def _bwd_rows_kernel(y, g, dx, N, INNER, N_IB, OSHAPE, YO, GO, DO, YS, GS, DS,
                     ORANK: tl.constexpr, R: tl.constexpr, B: tl.constexpr, MATH: tl.constexpr,
                     I64: tl.constexpr):
    _k, o, rows, _rmask, _rid, cols, mask = _tile(1, N_IB, INNER, N, ORANK, R, B, I64)
    yv, gv = _bwd_load(y, g, o, rows, cols, mask, OSHAPE, YO, GO, YS, GS, ORANK, MATH)
    c, s = _support_sum(yv, gv)
    dp = dx + _outer_offset(o, OSHAPE, DO, ORANK)
    tl.store(dp + _tile_offsets(rows, cols, DS),
             cast_out(_bwd_dx(gv, yv, c[:, None], s[:, None]), dx.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_vec_kernel(y, g, dx, N, INNER, N_IB, OSHAPE, YO, GO, DO, YS, GS, DS,
                    ORANK: tl.constexpr, R: tl.constexpr, B: tl.constexpr, V: tl.constexpr, MATH: tl.constexpr,
                    I64: tl.constexpr):
    """_bwd_rows_kernel for rows contiguous in all three operands (YS[1] = GS[1] = DS[1] = 1): the tile is taken as
    [R, B / V, V], vectors of V elements (16 bytes), and g is read only in the vectors that hold some y > 0:
    outside S, dx is 0 whatever g holds."""
    _k, o, rows, rmask, _rid, _cols, _mask = _tile(1, N_IB, INNER, N, ORANK, R, B, I64)
    cols = tl.arange(0, B // V)[:, None] * V + tl.arange(0, V)[None, :]  # within a row: int32 (B <= 16384)
    mask = rmask[:, None, None] & (cols < N)[None, :, :]
    yv = tl.load(y + _outer_offset(o, OSHAPE, YO, ORANK) + rows[:, None, None] * YS[0] + cols[None, :, :],
                 mask=mask, other=0.0).to(MATH)
    sel = yv > 0.0
    live = tl.max(sel.to(tl.int32), 2) > 0
    gv = tl.load(g + _outer_offset(o, OSHAPE, GO, ORANK) + rows[:, None, None] * GS[0] + cols[None, :, :],
                 mask=mask & live[:, :, None], other=0.0).to(MATH)
    c, s = tl.reduce((sel.to(tl.int32), tl.where(sel, gv, 0.0)), 2, _add_pair)
    c, s = tl.reduce((c, s), 1, _add_pair)  # one pass through shared memory for both, where two sums take three
    dp = dx + _outer_offset(o, OSHAPE, DO, ORANK) + rows[:, None, None] * DS[0]
    tl.store(dp + cols[None, :, :], cast_out(_bwd_dx(gv, yv, c[:, None, None], s[:, None, None]),
                                             dx.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["STAGE"])
def _bwd_split_kernel(y, g, dx, part_c, part_s, STAGE, N, INNER, N_IB, K, OSHAPE, YO, GO, DO, YS, GS, DS,
                      ORANK: tl.constexpr, R: tl.constexpr, B: tl.constexpr, KB: tl.constexpr,
                      MATH: tl.constexpr, I64: tl.constexpr):
    """STAGE 0: per-chunk |S| and sum_S g. STAGE 1: combine them in a fixed order and write dx."""
    k, o, rows, rmask, rid, cols, mask = _tile(K, N_IB, INNER, N, ORANK, R, B, I64)
    yv, gv = _bwd_load(y, g, o, rows, cols, mask, OSHAPE, YO, GO, YS, GS, ORANK, MATH)
    if STAGE == 0:
        c, s = _support_sum(yv, gv)
        tl.store(part_c + rid * K + k, c, mask=rmask)
        tl.store(part_s + rid * K + k, s, mask=rmask)
    else:
        c, s = _combine(part_c, part_s, rid * K, 1, K, rmask, R, KB, MATH)
        dp = dx + _outer_offset(o, OSHAPE, DO, ORANK)
        tl.store(dp + _tile_offsets(rows, cols, DS),
                 cast_out(_bwd_dx(gv, yv, c[:, None], s[:, None]), dx.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------- host: plans
_MAX_OUTER = 6  # outer dims a kernel decomposes (rank 8 less the reduced and the inner dim)
_plan_ids = itertools.count(1)


@dataclass(frozen=True)
class _Plan:
    """How a problem maps onto programs: rows are the positions of every dim but `dim`, collapsed; the
    dim with the smallest stride (the inner dim) is a tile axis, the other (outer) dims are decomposed per
    program. Each program takes R rows of the inner dim and B entries of each row (all of it when K == 1,
    else chunk k of K). `ints` are the kernel's shape and stride arguments (OSHAPE, then each operand's outer
    strides, then each one's inner and reduced strides; operands in kernel order)."""

    out_strides: tuple[int, ...]
    n: int
    inner: int
    n_outer: int
    R: int
    B: int
    K: int
    i64: bool
    math: torch.dtype
    ints: tuple[tuple[int, ...], ...]
    vec: int  # the backward's vector length V when every operand's rows are contiguous and K == 1, else 0
    g: int  # the forward's thresholds an iteration and its iteration cap (0 in the backward's)
    maxit: int
    kernel: triton.JITFunction  # the kernel that runs the problem
    consts: dict  # its constexprs and compile options (launch_consts)
    uid: int  # identifies the plan (and so its kernel's specialisation) in the relaunch cache

    @property
    def n_ib(self) -> int:
        return cdiv(self.inner, self.R)

    @property
    def tiles(self) -> int:
        return self.n_outer * self.n_ib


def _norm_dim(op: str, t: torch.Tensor, dim) -> int:
    try:  # (not a bool: torch's dims refuse them)
        if isinstance(dim, bool):
            raise TypeError
        d = operator.index(dim)
    except TypeError:
        raise InvalidProblem(op, "dim", "an int", repr(dim)) from None
    nd = max(t.dim(), 1)
    if not -nd <= d < nd:
        raise InvalidProblem(op, "dim", f"a dim in [{-nd}, {nd - 1}] for a tensor of rank {t.dim()}", d)
    return d % nd



def _out_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The result's layout: the input's where that is dense (no gaps, no overlap), else contiguous."""
    return tuple(t.stride()) if _dense_strides(t) else contiguous_strides(t.shape)


@plan_builder
def _plan(op: str, shape: tuple[int, ...], strides: tuple[tuple[int, ...], ...], dtype: torch.dtype,
          dim: int) -> _Plan:
    """`strides`: the operands' strides, the one that sets the tiling first, the output last."""
    cfg = CONFIG.current
    forward = op.endswith("forward")
    if not shape:  # 0-d: one row of one entry
        shape, strides = (1,), tuple((1,) for _ in strides)
    n = shape[dim]
    bshape = shape[:dim] + shape[dim + 1:]
    cshape, cstr = _collapse(bshape, [st[:dim] + st[dim + 1:] for st in strides])
    if cshape:
        inner_at = min(range(len(cshape)), key=lambda i: (abs(cstr[0][i]), -i))
        inner = cshape[inner_at]
        s_inner = [st[inner_at] for st in cstr]
        outer = [i for i in range(len(cshape)) if i != inner_at]
    else:
        inner, s_inner, outer = 1, [0] * len(strides), []
    if len(outer) > _MAX_OUTER:
        raise Unsupported(op, "x" if forward else "y",
                          f"at most {_MAX_OUTER + 2} dims after merging contiguous ones", len(shape))
    oshape = [cshape[i] for i in outer]
    pad = _MAX_OUTER - len(outer)
    s_dim = [st[dim] for st in strides]

    half = 2 if dtype == torch.float64 else 1
    block_max = max(cfg.block_max // half, 1)
    whole = max((cfg.fwd_row_max if forward else cfg.block_max) // half, 1)
    bn = next_pow2(n)
    contiguous = s_dim[0] == 1 or n == 1
    if contiguous:  # short rows grouped, long ones split
        R = max(1, min((cfg.fwd_row_tile if forward else cfg.bwd_row_tile) // bn, next_pow2(inner)))
        B = bn if bn <= whole else block_max
    else:  # rows are strided: take adjacent rows together so that loads coalesce
        R = max(1, min(cfg.col_rows, next_pow2(inner)))
        B = min(bn, max(block_max // R, 1))
    K = cdiv(n, B)
    if not forward:
        warp_elems = cfg.bwd_warp_elems
    else:
        short = contiguous and bn <= cfg.fwd_short_row
        warp_elems = cfg.fwd_short_warp_elems if short else cfg.fwd_warp_elems
    warps = max(1, min(16, R * B // warp_elems))
    extent = max(sum((s - 1) * abs(st) for s, st in zip(shape, t, strict=False)) for t in strides)
    i64 = extent + R * max(map(abs, s_inner)) + B * max(map(abs, s_dim)) > cfg.i32_max
    ints = ((*oshape, *[1] * pad),
            *[(*[st[i] for i in outer], *[0] * pad) for st in cstr],
            *zip(s_inner, s_dim, strict=True))
    vec = min(16 // dtype.itemsize, B) if not forward and K == 1 and set(s_dim) == {1} else 0
    maxnreg = cfg.vec_maxnreg if vec and dtype.itemsize <= 4 and R * B <= 32 * warps * cfg.vec_cap_elems else 0
    g = (cfg.fwd_thresholds if K == 1 else cfg.split_thresholds) if forward else 0
    maxit = _maxit(dtype, g) if forward else 0
    if forward:
        kernel, extra = ((_fwd_rows_kernel, {"G": g, "MAXIT": maxit}) if K == 1
                         else (_fwd_split_kernel, {"G": g, "KB": cfg.combine_block}))
    elif K == 1:
        kernel, extra = (_bwd_vec_kernel, {"V": vec}) if vec else (_bwd_rows_kernel, {})
    else:
        kernel, extra = _bwd_split_kernel, {"KB": cfg.combine_block}
    math_dtype = _runtime.math_dtype(dtype)
    consts = launch_consts({"ORANK": len(outer), "R": R, "B": B, **extra, "MATH": TL_MATH[math_dtype], "I64": i64},
                           warps, **({"maxnreg": maxnreg} if maxnreg else {}))
    return _Plan(strides[-1], n, inner, math.prod(oshape), R, B, K, i64, math_dtype, ints, vec, g, maxit, kernel,
                 consts, next(_plan_ids))


def _launch(plan: _Plan, grid: int, ptrs: tuple, ints: tuple, device: int) -> None:
    """Launch the plan's kernel through `launcher.launch`: after a specialisation's first launch its compiled
    kernel is called directly (the plan fixes every int argument's specialisation; launch keys the pointers'
    alignment)."""
    launch(plan.kernel, (grid,), ptrs, ints, plan.consts, device, (plan.kernel, plan.uid, device))


# --------------------------------------------------------------------------------------------- host: ops
def _check_forward(x: torch.Tensor, dim) -> tuple[_Plan, tuple[int, ...]]:
    op = "sparsemax_forward"
    check_tensor(op, "x", x)
    d = _norm_dim(op, x, dim)
    out_strides = _out_strides(x)
    return _plan(op, tuple(x.shape), (tuple(x.stride()), out_strides), x.dtype, d), out_strides


def _forward(x: torch.Tensor, dim: int) -> torch.Tensor:
    plan, out_strides = _check_forward(x, dim)
    y = alloc.empty(x.shape, x.dtype, x.device, out_strides)
    if y.numel() == 0:
        return y
    dev = x.get_device()
    if plan.K == 1:
        _launch(plan, plan.tiles, (x, y), (plan.n, plan.inner, plan.n_ib, *plan.ints), dev)
        return y
    rows, g = plan.n_outer * plan.inner, plan.g
    f, i = (plan.math, x.device), (torch.int32, x.device)
    scratch = (alloc.empty((rows * plan.K,), *f), alloc.empty((rows * plan.K,), *i),  # chunk max, NaN count
               alloc.empty((2 * rows * plan.K * g,), *i), alloc.empty((2 * rows * plan.K * g,), *f),  # counts, sums
               alloc.empty((2 * rows * 4,), *f), alloc.empty((2 * rows * 2,), *i))  # bracket state, double-buffered
    last = plan.maxit + 1
    for stage in range(last + 1):
        _launch(plan, plan.tiles * plan.K, (x, y, *scratch),
                (stage, last, rows, plan.n, plan.inner, plan.n_ib, plan.K, *plan.ints), dev)
    return y


def _check_backward(grad: torch.Tensor, y: torch.Tensor, dim) -> tuple[_Plan, tuple[int, ...]]:
    op = "sparsemax_backward"
    check_tensor(op, "grad", grad)
    check_tensor(op, "y", y)
    if grad.shape != y.shape:
        raise InvalidProblem(op, "grad", f"the shape of y {tuple(y.shape)}", tuple(grad.shape))
    if grad.dtype != y.dtype:
        raise Unsupported(op, "grad", f"the dtype of y ({y.dtype})", grad.dtype)
    if grad.device != y.device:
        raise Unsupported(op, "grad", f"a tensor on {y.device} (the device of y)", grad.device)
    d = _norm_dim(op, y, dim)
    out_strides = _out_strides(y)
    plan = _plan(op, tuple(y.shape), (tuple(y.stride()), tuple(grad.stride()), out_strides), y.dtype, d)
    return plan, out_strides


def _backward(grad: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    plan, out_strides = _check_backward(grad, y, dim)
    dx = alloc.empty(y.shape, y.dtype, y.device, out_strides)
    if dx.numel() == 0:
        return dx
    dev = y.get_device()
    if plan.K == 1:
        _launch(plan, plan.tiles, (y, grad, dx), (plan.n, plan.inner, plan.n_ib, *plan.ints), dev)
        return dx
    rows = plan.n_outer * plan.inner
    scratch = (alloc.empty((rows * plan.K,), torch.int32, y.device), alloc.empty((rows * plan.K,), plan.math, y.device))
    for stage in (0, 1):
        _launch(plan, plan.tiles * plan.K, (y, grad, dx, *scratch),
                (stage, plan.n, plan.inner, plan.n_ib, plan.K, *plan.ints), dev)
    return dx


# --------------------------------------------------------------------------------------------- references
def sparsemax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The sort-based definition (shared/docs/semantics.md) as a torch composite, with this module's
    conventions for NaN and infinite maxima; differentiable (autograd through sort/cumsum/gather)."""
    if x.dim() == 0:
        return sparsemax_reference(x.reshape(1), 0).reshape(())
    z = x.movedim(dim, -1)
    if z.numel() == 0:
        return torch.empty_like(x)
    nan_row = z.isnan().any(-1, keepdim=True)
    z = z.masked_fill(z.isnan(), -math.inf)
    m = z.amax(-1, keepdim=True)
    z = torch.where(m.isinf(), torch.where(z == m, 0.0, -math.inf).to(z.dtype), z - m)
    zs = z.sort(-1, descending=True).values
    cs = zs.cumsum(-1)
    j = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    k = ((1 + j * zs > cs) * torch.arange(1, z.shape[-1] + 1, device=z.device)).amax(-1, keepdim=True)
    tau = (cs.gather(-1, k - 1) - 1) / k.to(z.dtype)
    p = (z - tau).clamp_min(0)
    p = torch.where(nan_row, math.nan, p)
    return p.movedim(-1, dim)


def _forward_fake(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The result's shape, dtype and layout, for torch.compile (the reference's layout can differ)."""
    return torch.empty_strided(x.shape, _out_strides(x), dtype=x.dtype, device=x.device)


def _backward_fake(grad: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    return _forward_fake(y, dim)


def _backward_reference(grad: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    s = y > 0
    mean = torch.where(s, grad, 0).sum(dim, keepdim=True) / s.sum(dim, keepdim=True)
    dx = torch.where(s, grad - mean, 0)
    return torch.where(y.isnan(), math.nan, dx)


# --------------------------------------------------------------------------------------------- cases
_SHAPES = {  # (shape, dim, label)
    "tiny": [((4, 1024), -1, "")],
    "small": [((48, 37), -1, ""), ((37, 24), 0, "dim 0"), ((5, 19, 6), 1, "middle dim")],
    "check": [((4096, 1024), -1, ""), ((1024, 1000), 0, "dim 0"), ((8, 100_000), -1, "long rows")],
    "large": [((32768, 1024), -1, ""), ((64, 1 << 20), -1, "long rows"), ((1024, 32768), 0, "dim 0")],
}
# inputs are N(0, 2^2): a row of 1024 keeps about 2.5 entries, so the backward reads little of g (it reads g only
# where y > 0). The backward also gets the first large shape with a whole-row support (x within 1/n of its mean),
# where it reads every byte its case counts.
_DENSE_SCALE = 1e-7


def _rows(device, dtype, size: str, dense: bool = False):
    for i, (shape, dim, label) in enumerate(_SHAPES[size]):
        name = f"{label + ' ' if label else ''}{'x'.join(map(str, shape))} dim={dim}"
        yield name, randn(shape, device, dtype, scale=2.0), dim
        if dense and size == "large" and i == 0:
            yield f"dense support {name}", randn(shape, device, dtype, scale=_DENSE_SCALE), dim


def _forward_cases(device, dtype, size: str) -> list[Case]:
    el = torch.empty((), dtype=dtype).element_size()
    return [Case(label, (x, dim), bytes=2 * x.numel() * el, elements=x.numel())
            for label, x, dim in _rows(device, dtype, size)]


def _backward_cases(device, dtype, size: str) -> list[Case]:
    el = torch.empty((), dtype=dtype).element_size()
    out = []
    for label, x, dim in _rows(device, dtype, size, dense=True):
        y = _forward(x, dim)
        out.append(Case(label, (randn(x.shape, device, dtype), y, dim), bytes=3 * x.numel() * el,
                        elements=x.numel()))
    return out


def _inputs(d: Draw, edge: str) -> tuple[torch.Tensor, int]:
    """(x, dim): rank 0 to 3, sometimes one dim of 7 to 40; dim negative too; values spread (scales 0.01 to 50) or
    on the k/8 grid (ties, at the threshold too), a few NaN, -inf and +inf entries in some."""
    shape = list(d.shape(edge, ranks=(0, 3), hi=6))
    if shape and d.rng.random() < 0.5:
        shape[d.rng.randrange(len(shape))] = d.rng.randint(7, 40)
    rank = max(len(shape), 1)
    x = d.values(shape, d.rng.choice(("normal", "grid")))
    x = x * d.rng.choice((0.01, 2.0, 50.0)) if d.rng.random() < 0.5 else x
    if x.numel() and d.rng.random() < 0.3:
        for _ in range(d.rng.randint(1, 3)):
            x.view(-1)[d.rng.randrange(x.numel())] = d.rng.choice((math.nan, -math.inf, math.inf))
    return d.place(x), d.rng.randint(-rank, rank - 1)


def _forward_samples(rng, device, dtype):
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        x, dim = _inputs(d, edge)
        yield Case(describe(x=x, dim=dim), (x, dim))


def _backward_samples(rng, device, dtype):
    """y the reference's sparsemax of the forward's inputs (in float64, then rounded), grad of any values."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        x, dim = _inputs(d, edge)
        y = d.place(sparsemax_reference(x.cpu().double(), dim).to(dtype))
        g = d.tensor(tuple(x.shape), huge=False)
        yield Case(describe(grad=g, y=y, dim=dim), (g, y, dim))


def _forward_errors(device):
    x = torch.randn(3, 4, device=device)
    return [refuse("dim out of range", InvalidProblem, "dim", x, 2),
            refuse("dim a float", InvalidProblem, "dim", x, 1.0),
            refuse("int x", Unsupported, "x", x.int(), -1)]


def _backward_errors(device):
    y = torch.rand(3, 4, device=device)
    return [refuse("grad of another shape", InvalidProblem, "grad", torch.randn(3, 5, device=device), y, -1),
            refuse("grad of another dtype", Unsupported, "grad", y.double(), y, -1),
            refuse("dim out of range", InvalidProblem, "dim", y, y, -3),
            refuse("int y", Unsupported, "y", y, y.int(), -1)]


# --------------------------------------------------------------------------------------------- ops
@register_op("sparsemax_forward", accumulates=True, reference=sparsemax_reference, cases=_forward_cases,
             fake=_forward_fake, samples=_forward_samples, errors=_forward_errors)
def sparsemax_forward(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax along `dim`: max(x - tau, 0) summing to 1 (sort-free threshold search; see `sparsemax`)."""
    return _forward(x, dim)


@register_op("sparsemax_backward", accumulates=True, reference=_backward_reference, cases=_backward_cases,
             fake=_backward_fake, samples=_backward_samples, errors=_backward_errors)
def sparsemax_backward(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Gradient of sparsemax from its output y: 1_S * (g - sum_S g / |S|) along `dim`, S = {y > 0}."""
    return _backward(grad, y, dim)


class _Sparsemax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        from .. import ops  # the compile-aware entry points (custom ops while torch.compile traces)

        y = ops.sparsemax_forward(x, dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        from .. import ops

        (y,) = ctx.saved_tensors
        return ops.sparsemax_backward(grad, y, ctx.dim), None


def sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax along `dim` (any dim, negative too), differentiable: the Euclidean projection of x onto the
    probability simplex, p = max(x - tau, 0) with tau such that p sums to 1 (Martins & Astudillo, 2016).

    Sparse where softmax is dense: entries at or below the threshold get exactly 0. Math in fp32 (fp64 for
    fp64 inputs), result in x's dtype; deterministic and bit-stable (no atomics). Strided inputs are read in
    place; the result has x's layout when x is dense, else is contiguous. Special values:

    - a row (the entries along `dim` at one position of the other dims) holding a NaN is NaN throughout;
    - -inf entries get 0; a row whose maximum is infinite puts 1/k on each of its k entries equal to that
      maximum (k entries of +inf share the mass; a row of n -inf is uniform, 1/n); so, NaN aside, every row
      is a distribution;
    - entries tied exactly at the threshold get 0; ties above it share equally.

    The backward is dx = g - mean(g over S) on S = {y > 0} and 0 elsewhere (whatever g holds there), NaN where
    y is NaN. Integer or complex inputs raise `gradkern.Unsupported`; a dim out of range raises
    `gradkern.InvalidProblem`, before anything runs.

        p = gradkern.sparsemax(torch.tensor([1.5, 0.5, 0.5, -1.0], device="cuda"))   # [1, 0, 0, 0]
    """
    return _Sparsemax.apply(x, dim)
