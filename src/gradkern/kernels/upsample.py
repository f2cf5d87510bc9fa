"""Upsampling backward (linear 1d, bilinear 2d, trilinear 3d, bicubic 2d, antialiased bilinear 2d): a gather, no
atomics.

The forward is separable: along each resized dim, output o reads a few inputs ("taps") with weights that depend on
o alone, and ATen's backward scatters w * g[o] onto each tap (atomicAdd on CUDA: nondeterministic, and raising under
torch.use_deterministic_algorithms). Here each grad_input element gathers instead. Along a dim the source map
o -> first tap is monotone, so the outputs that read input i form a contiguous range [lo, hi): an estimate from
the inverse of the source map (area_pixel_compute_scale / area_pixel_compute_source_index, or the antialias window
ends), then corrected by a step or two against the forward's own index computation, so the range is exact. For
each output in the range the forward's taps and weights are recomputed as ATen computes them (in fp32, fp64 for
f64: ATen's accscalar_t) and the weights of the taps that land on i summed. Ranges and weights depend on a dim's
index alone, so they are computed once a plan and device, one small launch a dim (`_table_kernel`), into tables:
input i's range, and the weight (and whether the term is "mixed", below) of its k-th reader. The tile kernels read
the tables and know nothing of the interpolation; the element sums w_d * w_h * w_w * g over its outputs and is
written once. Along D and H the outputs are loops (ascending); along W up to KW of them (KW the most outputs an
input has, counted on the host, up to 16: more are taken in turn) are a tensor axis, their weights loaded once a
tile and summed with tl.sum for each (od, oh) in each thread's registers; where an input's first readers along W
have weight 0 on it (linear: the outputs clamped onto input 0, or exactly one input below), W's table leaves them
out and their g * 0 is added apart, so that 2x takes 4 candidates, not 8 (LEAD). The loops run as many times as
the most outputs an element of the tile has (about 2 * out/in + 1 when upsampling, 1 or 2 when downsampling,
whatever the factor), so the cost tracks the outputs per input. When no dim is resized, grad_input is a copy.

Per dim (ATen's semantics, CUDA's where the CPU kernel departs from it):
* linear: scale = (in-1)/(out-1) with align_corners (0 for out = 1), else 1/scales given and > 0, else in/out;
  source s = scale*o (align_corners) or max(scale*(o+0.5) - 0.5, 0); taps f = min(floor(s), in-1) and
  f + (f < in-1) with weights 1-l and l, l = clamp(s - f, 0, 1) (CPU's guard_index_and_lambda: where CUDA would
  index past the input for scales inconsistent with the sizes, this clamps).
* cubic: the source is not clamped at 0; four taps f-1..f+2, each clamped into the input, weighted by the cubic
  convolution coefficients with A = -0.75 of t = s - f.
* antialias (bilinear): support = max(scale, 1); output o reads [max(floor(c - support + 0.5), 0),
  min(floor(c + support + 0.5), in)) around c = scale*(o+0.5), triangle weights of (j - c + 0.5)/max(scale, 1)
  normalised by their sum (computed in closed form: a sum of a linear function over consecutive integers).
When every resized dim keeps its size, ATen's CUDA kernels copy grad_output whatever the scales (bilinear's CPU
kernel does the same per dim, its antialias kernel does not); so does this kernel.

Stock adds w * g tap by tap, so an infinite g gives NaN on an input where a tap of weight zero, or taps of both signs
(cubic's clamped border taps), land; a term here is formed once per output and dimension, and marked to add 0 * g
(NaN for an infinite g, nothing otherwise) where that happens and the taps' sum is not 0 (a sum of 0 gives the NaN
by itself): the same NaNs. Few tiles hold a marked term (bicubic's borders, align_corners' last input); the others
take a loop that neither loads the marks nor adds the g * 0.

A program owns a [BW, BH] tile of one (n, c, d) plane of grad_input (past 2^30 tiles, several in turn; for 1d, whose
H is 1, the channels are the plane's rows); the output ranges along H and W are per-row and per-column vectors, the D
range a scalar, and grad_output is read in place
through its strides (where grad_output's fastest axis is H, the plan swaps H and W, so that the tile's lanes read
along it). A channels_last grad_input (C > 1) is tiled by rows instead: one (n, d, h) row, a [BC, BW]
block of (c, w), C the fastest axis, so stores (and a channels_last grad_output's loads) are contiguous; the same
terms in the same order. The order is fixed for a problem, so its bits are; two tilings of one problem may group the
W candidates' sum differently (tl.sum over another layout) and differ in the last bit. grad_input takes ATen's
layout (its meta functions, shared by CPU and CUDA): bilinear 2d, trilinear 3d and antialiased bilinear follow
grad_output's suggested memory format (channels_last / channels_last_3d), linear 1d and bicubic are contiguous."""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import triton
import triton.language as tl

from .._cases import Draw, describe, randn, refuse
from .._runtime import cdiv, math_dtype, values_key
from ..config import GridLimits, PlanCache, Tunable, plan_builder
from ..errors import InvalidProblem, Unsupported
from ..launch.alloc import channels_last_format, empty
from ..launch.checks import check_tensor
from ..launch.launcher import launch, launch_consts, round_to_dtype, scalar_bits, tile_warps
from ..launch.tl_helpers import TL_MATH, cast_out, scalar
from ..registry import Case, register_op


@dataclass(frozen=True)
class UpsampleConfig(GridLimits):
    """Upsampling's launch heuristics, read once per plan. Figures: H100, f32, Triton 3.6; the layouts, tiles and
    timings behind them: docs/tuning/upsample.md."""

    #: grad_input elements x candidate columns a program holds at once (its tile: block / KW elements)
    block: int = 2048
    #: of those, a thread's: ~80-150 registers in f32 on sm_90 (spills: none, but 20 bytes in 3-d downsampling)
    per_thread: int = 16
    #: plane tiles: (w, h) elements a thread at least, whatever the candidates (8x upsampling, 16 candidates: 2
    #: elements a thread share their column's table loads, 8x21x64x64 -> 512x512 f32 390 -> 360 us against 1, H100)
    min_elements: int = 2
    #: candidate columns taken at once at most (more, as for upsampling by more than 6: in turn)
    max_kw: int = 16
    #: columns a plane tile spans at most when it has several rows (4 columns a thread x 128 lanes; 1d problems:
    #: the whole tile)
    max_bw: int = 512
    #: channels a row tile spans at most (more channels: several channel blocks)
    max_bc: int = 128
    #: outputs along W past which the candidate count is a bound (`_candidates`), not counted on the host
    #: (counting costs host time proportional to the outputs, once a plan)
    count_max: int = 2**22
    #: registers a thread of the plane kernel (ptxas --maxrregcount; 0: none) in bilinear and trilinear problems
    #: whose grad_input planes hold at least `plane_maxnreg_min` elements: uncapped it holds 139-153 on the 2x
    #: cases (12-15 warps an SM). H200: bilinear f32 2x 97.5 -> 85.1 us; small planes lose with the cap, hence
    #: the bound (docs/tuning/upsample.md). Linear 1-D, bicubic and antialias: not timed, uncapped
    plane_maxnreg: int = 128
    plane_maxnreg_min: int = 1024
    #: tiles with no mixed term take a loop that neither loads the mixed flags nor adds g * 0 (False: every tile
    #: takes the flagged loop). H200 f32 geomean over 12 sweep cases: bilinear 1.82x -> 2.13x stock, trilinear
    #: 1.92x -> 2.28x (docs/tuning/upsample.md, "Tiles without mixed terms")
    unmixed_loop: bool = True
    #: "planes" or "rows" forces that tiling (tests); None: grad_input's layout chooses (`_tiling`)
    tiling: str | None = None


CONFIG = Tunable("upsample", UpsampleConfig())

# interpolation along a dim; COPY: output o is input o (a dim that is not resized in the op, or ATen's copy when
# no dim is resized)
_COPY = tl.constexpr(0)
_LINEAR = tl.constexpr(1)
_CUBIC = tl.constexpr(2)
_ANTIALIAS = tl.constexpr(3)
# correction steps each way after the range estimate: rounding puts the estimate an output off the exact boundary
# at most (the forward's fp32 source index against its inverse); the second is margin
_FIX = tl.constexpr(2)
# the least scale the estimate inverts: a zero scale (align_corners with one input: every output reads input 0)
# gets a finite inverse, so that threshold * inverse is +-large or 0, never NaN
_MIN_SCALE = tl.constexpr(2.0**-40)
_A = tl.constexpr(-0.75)  # ATen's bicubic coefficient


# ----------------------------------------------------------------------------------------------- kernel: per dim
# Every helper takes its integers (indices, sizes) as tensors or as Python ints: compiled Triton specialises an
# integer argument equal to 1 to a constexpr (sizes of 1 are common: the D of a 2-d problem, a 1x1 pyramid bin,
# N = C = 1), so a size can arrive as an int, where the interpreter always passes tensors. Hence tl.cast rather than
# .to() on them, and _as_index on the indices whose dtype a result takes.
@triton.jit
def _as_index(x):
    """x as an integer tensor: a tensor keeps its dtype (int64 stays int64), a Python int becomes an int32 scalar."""
    return x + tl.zeros([], tl.int32)


@triton.jit
def _first_tap(o, n_in, scale, MODE: tl.constexpr, ALIGN: tl.constexpr):
    """(f, t): output o's first tap (linear: the lower of two; cubic: the second of four) and the fraction of the
    source index past it, as ATen computes them (area_pixel_compute_source_index, guard_index_and_lambda)."""
    o = _as_index(o)
    x = tl.cast(o, scale.dtype)
    if ALIGN:
        s = scale * x
    else:
        s = scale * (x + 0.5) - 0.5
        if MODE == _LINEAR:
            s = tl.maximum(s, 0.0)
    f = tl.minimum(tl.floor(s), tl.cast(n_in - 1, s.dtype))  # (clamped as a float: an overshooting s stays in range)
    t = tl.minimum(tl.maximum(s - f, 0.0), 1.0)
    return f.to(o.dtype), t


@triton.jit
def _window(o, n_in, scale):
    """Output o's antialias window [lo, hi) and its center (ATen's _compute_weights_span)."""
    o = _as_index(o)
    support = tl.maximum(scale, 1.0)  # (filter size 2) * 0.5 * scale when downsampling, else 1
    center = scale * (tl.cast(o, scale.dtype) + 0.5)
    top = tl.cast(n_in, scale.dtype)
    lo = tl.minimum(tl.maximum(tl.floor(center - support + 0.5), 0.0), top)
    hi = tl.minimum(tl.maximum(tl.floor(center + support + 0.5), 0.0), top)
    return lo.to(o.dtype), hi.to(o.dtype), center


@triton.jit
def _key(o, n_in, scale, UPPER: tl.constexpr, MODE: tl.constexpr, ALIGN: tl.constexpr):
    """A monotone function of output o that bounds the inputs it reads: the first tap (linear, cubic); the last
    input of the window (antialias, lower bound) or its first (UPPER)."""
    if MODE == _ANTIALIAS:
        lo, hi, _c = _window(o, n_in, scale)
        k = lo if UPPER else hi - 1
    else:
        k, _t = _first_tap(o, n_in, scale, MODE, ALIGN)
    return k


@triton.jit
def _first(t, n_in, n_out, scale, UPPER: tl.constexpr, MODE: tl.constexpr, ALIGN: tl.constexpr):
    """The first output whose key is at least t (n_out if none): the inverse of the source map, rounded up, then
    corrected against the key itself."""
    t = _as_index(t)
    tf = tl.cast(t, scale.dtype)
    inv = 1.0 / tl.maximum(scale, _MIN_SCALE)
    if MODE == _ANTIALIAS:
        support = tl.maximum(scale, 1.0)
        if UPPER:  # floor(c - support + 0.5) >= t  <=>  c >= t - 0.5 + support
            x = (tf - 0.5 + support) * inv - 0.5
        else:  # floor(c + support + 0.5) - 1 >= t  <=>  c >= t + 0.5 - support
            x = (tf + 0.5 - support) * inv - 0.5
    elif ALIGN:
        x = tf * inv
    else:
        x = (tf + 0.5) * inv - 0.5
    o = tl.minimum(tl.maximum(tl.ceil(x), 0.0), tl.cast(n_out, x.dtype)).to(t.dtype)
    for _ in tl.static_range(_FIX):
        o = tl.where((o > 0) & (_key(tl.maximum(o - 1, 0), n_in, scale, UPPER, MODE, ALIGN) >= t), o - 1, o)
    for _ in tl.static_range(_FIX):
        o = tl.where((o < n_out) & (_key(tl.minimum(o, n_out - 1), n_in, scale, UPPER, MODE, ALIGN) < t), o + 1, o)
    if MODE != _ANTIALIAS:  # the clamps of the first tap, which the inverse does not see
        o = tl.where(t > n_in - 1, n_out, o)
        if MODE == _LINEAR and not ALIGN:
            o = tl.where(t <= 0, 0, o)
    return o


@triton.jit
def _readers(i, n_in, n_out, scale, MODE: tl.constexpr, ALIGN: tl.constexpr):
    """[lo, hi): the outputs that read input i along a dim. Linear taps f and f+1 reach i iff f is i-1 or i, cubic
    taps f-1..f+2 (clamped) iff f is in [i-2, i+1], an antialias window iff it starts at or before i and ends
    after it."""
    i = _as_index(i)
    if MODE == _COPY:
        lo = i
        hi = i + 1
    elif MODE == _LINEAR:
        lo = _first(i - 1, n_in, n_out, scale, False, MODE, ALIGN)
        hi = _first(i + 1, n_in, n_out, scale, False, MODE, ALIGN)
    elif MODE == _CUBIC:
        lo = _first(i - 2, n_in, n_out, scale, False, MODE, ALIGN)
        hi = _first(i + 2, n_in, n_out, scale, False, MODE, ALIGN)
    else:
        lo = _first(i, n_in, n_out, scale, False, MODE, ALIGN)
        hi = _first(i + 1, n_in, n_out, scale, True, MODE, ALIGN)
    return lo, hi


@triton.jit
def _cubic_far(x):
    """ATen's cubic_convolution2 (|x| in [1, 2])."""
    return ((_A * x - 5.0 * _A) * x + 8.0 * _A) * x - 4.0 * _A


@triton.jit
def _cubic_near(x):
    """ATen's cubic_convolution1 (|x| <= 1)."""
    return ((_A + 2.0) * x - (_A + 3.0)) * x * x + 1.0


@triton.jit
def _tap(w, lo, hi, idx, i, c):
    """Add a tap at idx of weight c to input i's (weight, least and greatest landing weight)."""
    on = idx == i
    return w + tl.where(on, c, 0.0), tl.where(on, tl.minimum(lo, c), lo), tl.where(on, tl.maximum(hi, c), hi)


@triton.jit
def _weight(o, i, n_in, scale, MODE: tl.constexpr, ALIGN: tl.constexpr):
    """(w, hit, mixed): output o's weight on input i along a dim (its taps on i summed), whether a tap lands on i,
    and whether the taps landing there include a zero weight or weights of both signs while w is not 0 (stock adds
    w * g tap by tap: an infinite g gives NaN there, where w * g of the sum does not)."""
    o = _as_index(o)
    i = _as_index(i)
    if MODE == _COPY:
        hit = o == i
        mixed = o != o
        w = tl.where(hit, 1.0, 0.0).to(scale.dtype)
    elif MODE == _ANTIALIAS:
        lo, hi, center = _window(o, n_in, scale)
        inv = tl.where(scale >= 1.0, 1.0 / tl.maximum(scale, 1.0), 1.0)
        offset = lo.to(scale.dtype) - center  # ATen's xmin - center; tap j's argument is (j + offset + 0.5) * inv
        x = tl.abs((tl.cast(i - lo, scale.dtype) + offset + 0.5) * inv)
        # the window's weight sum, sum_j max(0, 1 - |j + a| * inv) over j < n with a = offset + 0.5: every tap of
        # the window has |j + a| * inv <= 1, so it is n - inv * sum_j |j + a|, m of the j + a negative
        n = tl.maximum(hi - lo, 0).to(scale.dtype)
        a = offset + 0.5
        m = tl.minimum(tl.maximum(tl.ceil(-a), 0.0), n)
        total = n - inv * ((n - 2.0 * m) * a + 0.5 * n * (n - 1.0) - m * (m - 1.0))
        c = tl.where(x < 1.0, 1.0 - x, 0.0)
        hit = (lo <= i) & (i < hi)
        mixed = o != o  # (one tap per input: a zero weight zeroes the whole term already)
        w = tl.where(hit, c / tl.where(total != 0.0, total, 1.0), 0.0)  # (a zero sum: weights left as they are)
    else:
        f, t = _first_tap(o, n_in, scale, MODE, ALIGN)
        w = tl.zeros_like(t)
        lo = w + 2.0  # (above and below every tap weight: |weight| <= 1)
        hi = w - 2.0
        if MODE == _LINEAR:
            w, lo, hi = _tap(w, lo, hi, f, i, 1.0 - t)
            w, lo, hi = _tap(w, lo, hi, f + (f < n_in - 1).to(f.dtype), i, t)
        else:
            top = n_in - 1
            w, lo, hi = _tap(w, lo, hi, tl.minimum(tl.maximum(f - 1, 0), top), i, _cubic_far(t + 1.0))
            w, lo, hi = _tap(w, lo, hi, tl.minimum(tl.maximum(f, 0), top), i, _cubic_near(t))
            w, lo, hi = _tap(w, lo, hi, tl.minimum(tl.maximum(f + 1, 0), top), i, _cubic_near(1.0 - t))
            # ((1 - t) + 1 as ATen's get_cubic_upsample_coefficients rounds it, not 2 - t: the same fp32 weight)
            w, lo, hi = _tap(w, lo, hi, tl.minimum(tl.maximum(f + 2, 0), top), i, _cubic_far((1.0 - t) + 1.0))
        hit = lo <= hi
        # (a sum of 0 is not mixed: 0 * g gives stock's NaN for an infinite g already)
        mixed = (lo <= 0.0) & (hi >= 0.0) & (w != 0.0)
    return w, hit, mixed


# ----------------------------------------------------------------------------------------------- kernel: tables
# a bit of a table's count entry: some term of the input is mixed. The tile kernels load the mixed flags of an
# input's terms only where it is set (most inputs have none)
_MIXED = tl.constexpr(1 << 30)


@triton.jit
def _table_kernel(idx, wt, mx, n_in, n_out, r, T, MODE: tl.constexpr, ALIGN: tl.constexpr, ACC: tl.constexpr,
                  LEAD: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr):
    """One dim's table: input i's readers [lo, lo + count) at idx[i] and idx[n_in + i] (the count plus _MIXED where
    some term of i is mixed); the weight on i of its k-th reader at wt[i * T + k] (0 past the count), and at
    mx[i * T + k] whether that term is mixed (`_weight`). With LEAD, the readers of weight 0 that lead i's range
    are left out of it, their number at idx[2 n_in + i] (else 0): such a term is g * 0, and the tile kernels add
    it apart from the candidates (linear: the outputs clamped onto input 0, or whose position is exactly i - 1)."""
    s = scalar(r, ACC)
    i = tl.program_id(0) * BI + tl.arange(0, BI)
    m = i < n_in
    i = tl.minimum(i, n_in - 1)
    lo, hi = _readers(i, n_in, n_out, s, MODE, ALIGN)
    lead = tl.zeros([BI], dtype=lo.dtype)
    if LEAD:
        lead = hi - lo  # (the first reader of nonzero weight, or all of them)
        for k0 in range(0, T, BK):
            k = k0 + tl.arange(0, BK)[None, :]
            o = lo[:, None] + k
            w, hit, mixed = _weight(o, i[:, None], n_in, s, MODE, ALIGN)
            weighs = hit & (o < hi[:, None]) & (w != 0.0)
            lead = tl.minimum(lead, tl.min(tl.where(weighs, k, T), axis=1).to(lo.dtype))
        lo += lead
    tl.store(idx + i, lo.to(tl.int32), mask=m)
    tl.store(idx + 2 * n_in + i, lead.to(tl.int32), mask=m)
    some = tl.zeros([BI], dtype=tl.int32)  # whether some term of input i is mixed
    for k0 in range(0, T, BK):
        k = k0 + tl.arange(0, BK)[None, :]
        o = lo[:, None] + k
        w, hit, mixed = _weight(o, i[:, None], n_in, s, MODE, ALIGN)
        on = hit & (o < hi[:, None])
        at = i[:, None].to(tl.int64) * T + k
        keep = m[:, None] & (k < T)
        tl.store(wt + at, tl.where(on, w, 0.0), mask=keep)
        tl.store(mx + at, (on & mixed).to(tl.int8), mask=keep)
        some = tl.maximum(some, tl.max((on & mixed & keep).to(tl.int32), axis=1))
    tl.store(idx + n_in + i, (hi - lo).to(tl.int32) + some * _MIXED, mask=m)


# ----------------------------------------------------------------------------------------------- kernel: tiles
# (a scalar condition meets a block one through tl.where: Triton 3.9's interpreter broadcasts a scalar int1 as
# int32, so `block & scalar` makes a mask tl.load rejects)
@triton.jit
def _or(s, b):
    """Scalar condition s or block condition b."""
    return tl.where(s, b == b, b)


# The tile kernels know nothing of the interpolation: every dim's readers and weights come from the plan's tables
# (`_table_kernel`, built once a plan and device), D's, then H's, then W's, each table T{D,H,W} wide.
@triton.jit
def _range(ix, n, i, WIDE: tl.constexpr):
    """Input i's readers from its dim's range table `ix` (n inputs): (first, count, whether some term is mixed),
    the first as int64 where WIDE (it multiplies a stride)."""
    lo = tl.load(ix + i)
    v = tl.load(ix + n + i)
    if WIDE:
        lo = lo.to(tl.int64)
    return lo, v & (_MIXED - 1), v >= _MIXED


@triton.jit
def _lead(ix, n, i):
    """Input i's leading readers of weight 0, left out of its range (`_table_kernel`'s LEAD; 0 without)."""
    return tl.load(ix + 2 * n + i)


@triton.jit
def _table_parts(idx, wt, mx, D, H, TD, TH):
    """H's and W's range tables and weight / mixed tables, past D's (and H's)."""
    ih = idx + 3 * D
    wh = wt + D * TD
    xh = mx + D * TD
    return ih, ih + 3 * H, wh, wh + H * TH, xh, xh + H * TH


@triton.jit
def _some(od_x, oh_x, ow_x):
    """Whether some term of the tile is mixed (its D plane's, a row's or a column's flag)."""
    return od_x | (tl.max(oh_x.to(tl.int32)) + tl.max(ow_x.to(tl.int32)) > 0)


@triton.jit
def _terms(acc, src, ww, xw, mw, cols, wt, mx, d, TD, od_lo, od_n, od_x, wH, xH, TH, h, oh_lo, oh_n, oh_x, kh, rm,
           gsD, gsH, ACC: tl.constexpr, MIXED: tl.constexpr):
    """acc plus the terms of a tile's chunk of W candidates (weights ww, mixed flags xw, mask mw, offsets cols,
    [., ., KW]) over its outputs along D (a scalar range) and H (ranges a row of the tile, [1, BH] or [1, 1]):
    w_d * w_h * sum_k(w_w * g), outputs ascending. MIXED: some term of the tile is mixed (border tiles of some
    problems), and its g * 0 is added besides; without, those flags are not loaded and the select not made (2x
    bilinear f32: a quarter of the kernel's instructions, ncu)."""
    for i in range(0, od_n):
        wd = tl.load(wt + d * TD + i)
        plane = src + (od_lo + i) * gsD
        if MIXED:
            xd = tl.load(mx + d * TD + i, mask=od_x, other=0) != 0
        for j in range(0, kh):
            mh = rm & (j < oh_n)
            wh = tl.load(wH + h * TH + j, mask=mh, other=0.0)
            g = tl.load((plane + (oh_lo + j) * gsH)[:, :, None] + cols, mask=mh[:, :, None] & mw,
                        other=0.0).to(ACC)
            term = ww * g
            if MIXED:
                xh = tl.load(xH + h * TH + j, mask=mh & oh_x, other=0) != 0
                term = tl.where(_or(xd, xh)[:, :, None] | xw, term + g * 0.0, term)
            acc += (wd * wh) * tl.sum(term, axis=2)
    return acc


@triton.jit
def _chunk_terms(acc, mixed, src, ww, xW, at, ow_x, mw, cols, wt, mx, d, TD, od_lo, od_n, od_x, wH, xH, TH, h, oh_lo,
                 oh_n, oh_x, kh, rm, gsD, gsH, ACC: tl.constexpr):
    """_terms of a chunk of W candidates (table entries `at`), with the mixed flags (W's loaded here) where the tile
    has a mixed term (`mixed`, _some), without them elsewhere."""
    if mixed:
        xw = tl.load(xW + at, mask=mw & ow_x[:, :, None], other=0) != 0
        acc = _terms(acc, src, ww, xw, mw, cols, wt, mx, d, TD, od_lo, od_n, od_x, wH, xH, TH, h, oh_lo, oh_n, oh_x,
                     kh, rm, gsD, gsH, ACC, True)
    else:
        acc = _terms(acc, src, ww, mw, mw, cols, wt, mx, d, TD, od_lo, od_n, od_x, wH, xH, TH, h, oh_lo, oh_n, oh_x,
                     kh, rm, gsD, gsH, ACC, False)
    return acc


# Layouts (Triton 3.6 measured): the gather's addresses show no contiguity, and where no axis of a block has more
# than another, Triton orders the block's axes first-fastest across threads. So the axis along which memory is
# contiguous comes first (W of a plane tile, C of a row tile) and the candidate axis last: each thread then holds
# its elements' KW candidates in registers and sums them itself, and a warp's lanes read and write along W (or C).
# (With the candidate axis first, as before, a warp spread over 4 candidates x 4 rows x 2 columns, and every (od, oh)
# paid a shuffle reduction.) gsW is never specialised for the same reason: as the constant 1 it would show the
# candidate axis contiguous in memory, and the candidates would go fastest across threads again.
@triton.jit(do_not_specialize=("gsW",))
def _upsample_backward_kernel(gi, go, idx, wt, mx, n_tiles, C, D, H, W, gsN, gsC, gsD, gsH, gsW,
                              isN, isC, isD, isH, isW, TD, TH, TW,
                              KW: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, LEAD: tl.constexpr,
                              ACC: tl.constexpr, I64: tl.constexpr, UNMIXED: tl.constexpr):
    iH, iW, wH, wW, xH, xW = _table_parts(idx, wt, mx, D, H, TD, TH)
    n_wb = tl.cdiv(W, BW)
    n_hb = tl.cdiv(H, BH)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        wb = t % n_wb
        hb = (t // n_wb) % n_hb
        s = t // n_wb // n_hb  # the (n, c, d) plane
        d = (s % D).to(tl.int64)
        c = ((s // D) % C).to(tl.int64)
        n = (s // D // C).to(tl.int64)
        w = wb * BW + tl.arange(0, BW)[:, None]  # a [BW, BH] tile: columns first (see Layouts above)
        h = hb * BH + tl.arange(0, BH)[None, :]
        cm = w < W
        rm = h < H
        w = tl.minimum(w, W - 1)  # (lanes past the plane: in-range index math, their loads and store masked)
        h = tl.minimum(h, H - 1)
        if I64:
            w = w.to(tl.int64)
            h = h.to(tl.int64)
        ow_lo, ow_n, ow_x = _range(iW, W, w, I64)  # the outputs that read each column / row / the plane
        oh_lo, oh_n, oh_x = _range(iH, H, h, I64)
        od_lo, od_n, od_x = _range(idx, D, d, True)  # (plane offsets are int64 always)
        kh = tl.max(oh_n)  # (the tile's longest ranges: the loops' trip counts)
        kw = tl.max(ow_n)
        src = go + n * gsN + c * gsC
        acc = tl.zeros([BW, BH], dtype=ACC)
        mixed = _some(od_x, oh_x, ow_x) | (UNMIXED == 0)
        for k0 in range(0, kw, KW):  # KW candidate columns at once, their weights loaded once a tile
            k = k0 + tl.arange(0, KW)[None, None, :]  # [1, 1, KW]
            mw = (k < ow_n[:, :, None]) & cm[:, :, None]
            at = w[:, :, None] * TW + k
            ww = tl.load(wW + at, mask=mw, other=0.0)
            cols = (ow_lo[:, :, None] + k) * gsW
            acc = _chunk_terms(acc, mixed, src, ww, xW, at, ow_x, mw, cols, wt, mx, d, TD, od_lo, od_n, od_x, wH, xH,
                               TH, h, oh_lo, oh_n, oh_x, kh, rm, gsD, gsH, ACC)
        if LEAD:  # each column's leading readers of weight 0, left out of its range: g * 0 each, for every (od, oh)
            ow_e = _lead(iW, W, w)
            cols = (ow_lo - ow_e) * gsW
            for q in range(0, tl.max(ow_e)):
                mq = (q < ow_e) & cm
                for i in range(0, od_n):
                    plane = src + (od_lo + i) * gsD
                    for j in range(0, kh):
                        g = tl.load(plane + (oh_lo + j) * gsH + cols, mask=mq & rm & (j < oh_n), other=0.0)
                        acc += g.to(ACC) * 0.0
                cols += gsW
        dst = gi + n * isN + c * isC + d * isD + h * isH + w * isW
        tl.store(dst, cast_out(acc, gi.dtype.element_ty), mask=cm & rm)


@triton.jit  # (gsW = C > 1 here: specialised, its divisibility vectorises C)
def _upsample_backward_rows_kernel(gi, go, idx, wt, mx, n_tiles, C, D, H, W, gsN, gsC, gsD, gsH, gsW,
                                   isN, isC, isD, isH, isW, TD, TH, TW,
                                   KW: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, LEAD: tl.constexpr,
                                   ACC: tl.constexpr, I64: tl.constexpr, UNMIXED: tl.constexpr):
    iH, iW, wH, wW, xH, xW = _table_parts(idx, wt, mx, D, H, TD, TH)
    n_cb = tl.cdiv(C, BC)
    n_wb = tl.cdiv(W, BW)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        cb = t % n_cb  # channel blocks fastest: consecutive programs write consecutive memory (channels_last)
        wb = (t // n_cb) % n_wb
        s = t // n_cb // n_wb  # the (n, d, h) row
        h = (s % H).to(tl.int64)
        d = ((s // H) % D).to(tl.int64)
        n = (s // H // D).to(tl.int64)
        c = cb * BC + tl.arange(0, BC)[:, None]  # a [BC, BW] tile: channels first (see Layouts above)
        w = wb * BW + tl.arange(0, BW)[None, :]
        m = (c < C) & (w < W)
        w = tl.minimum(w, W - 1)  # (columns past the row: in-range index math; every lane past it masked)
        # (c unclamped, < C + BC: a min would hide its contiguity from Triton and so the vector loads and stores)
        if I64:
            w = w.to(tl.int64)
            c = c.to(tl.int64)
        ow_lo, ow_n, ow_x = _range(iW, W, w, I64)  # per column; along H and D one range
        oh_lo, oh_n, oh_x = _range(iH, H, h, True)  # (row offsets are int64 always)
        od_lo, od_n, od_x = _range(idx, D, d, True)
        kw = tl.max(ow_n)
        src = go + n * gsN
        acc = tl.zeros([BC, BW], dtype=ACC)
        # (H's range as [1, 1] blocks: the plane kernel's per-row vectors, broadcast over the tile)
        one = tl.zeros([1, 1], dtype=tl.int32)
        h1, oh_lo1, oh_n1, oh_x1 = h + one, oh_lo + one, oh_n + one, _or(oh_x, one != 0)
        mixed = _some(od_x, oh_x1, ow_x) | (UNMIXED == 0)
        for k0 in range(0, kw, KW):  # (the plane kernel's loops and terms)
            k = k0 + tl.arange(0, KW)[None, None, :]
            mw = (k < ow_n[:, :, None]) & m[:, :, None]
            at = w[:, :, None] * TW + k
            ww = tl.load(wW + at, mask=mw, other=0.0)
            cols = (ow_lo[:, :, None] + k) * gsW + c[:, :, None] * gsC
            acc = _chunk_terms(acc, mixed, src, ww, xW, at, ow_x, mw, cols, wt, mx, d, TD, od_lo, od_n, od_x, wH, xH,
                               TH, h1, oh_lo1, oh_n1, oh_x1, oh_n, one == 0, gsD, gsH, ACC)
        if LEAD:  # (the plane kernel's terms of weight 0)
            ow_e = _lead(iW, W, w)
            cols = (ow_lo - ow_e) * gsW + c * gsC
            for q in range(0, tl.max(ow_e)):
                mq = (q < ow_e) & m
                for i in range(0, od_n):
                    for j in range(0, oh_n):
                        g = tl.load(src + (od_lo + i) * gsD + (oh_lo + j) * gsH + cols, mask=mq, other=0.0)
                        acc += g.to(ACC) * 0.0
                cols += gsW
        dst = gi + n * isN + d * isD + h * isH + w * isW + c * isC
        tl.store(dst, cast_out(acc, gi.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------- host
@dataclass(frozen=True)
class _Spec:
    name: str
    dims: int  # resized dims: 1 (W), 2 (H, W) or 3 (D, H, W)
    mode: int  # _LINEAR, _CUBIC or _ANTIALIAS
    keeps_layout: bool  # grad_input in grad_output's suggested memory format (else contiguous), as ATen's meta
    scale_names: tuple[str, ...]  # the scale arguments, in order (D, H, W)


@dataclass(frozen=True, eq=False)  # hashed by identity: keys the relaunch cache
class _Plan:
    shape: tuple[int, ...]  # grad_input's
    stride: tuple[int, ...] | None  # grad_input's where not contiguous
    grid: int
    args: tuple
    consts: dict
    kernel: object  # the plane or the row kernel; None: no dim resized, a copy
    dims: tuple  # per dim (D, H, W): its table's launch, (n_in, n_out, scale bits, width T, MODE, ALIGN, LEAD)
    acc: torch.dtype  # the math dtype (the weight tables')
    tables: dict = field(default_factory=dict)  # device -> (idx, wt, mx): built once (`_tables`)


def _sizes(spec: _Spec, arg: str, value, count: int) -> tuple[int, ...]:
    """`value` as a tuple of `count` ints, or the named error."""
    try:
        if any(isinstance(v, bool) for v in value):
            raise TypeError
        sizes = tuple(operator.index(v) for v in value)
    except TypeError:
        raise Unsupported(spec.name, arg, f"a sequence of {count} ints", repr(value)) from None
    if len(sizes) != count:
        raise InvalidProblem(spec.name, arg, f"{count} sizes", f"{len(sizes)}: {list(sizes)}")
    return sizes


def _check(spec: _Spec, grad_output, output_size, input_size, align_corners, scales) -> tuple:
    """Every check, as named errors, before anything is allocated or launched: (output sizes, input sizes)."""
    check_tensor(spec.name, "grad_output", grad_output)
    out_sizes = _sizes(spec, "output_size", output_size, spec.dims)
    in_sizes = _sizes(spec, "input_size", input_size, spec.dims + 2)
    if not isinstance(align_corners, bool):
        raise Unsupported(spec.name, "align_corners", "a bool", type(align_corners).__name__)
    for name, s in zip(spec.scale_names, scales, strict=True):
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float))):
            raise Unsupported(spec.name, name, "a float or None", type(s).__name__)
    if min(out_sizes) <= 0 or min(in_sizes[2:]) <= 0:  # (ATen's message: sizes should be greater than 0)
        raise InvalidProblem(spec.name, "input_size/output_size", "resized sizes greater than 0",
                             f"input_size {list(in_sizes)}, output_size {list(out_sizes)}")
    if min(in_sizes[:2]) < 0:
        raise InvalidProblem(spec.name, "input_size", "a batch and channel count of at least 0", list(in_sizes))
    expected = (*in_sizes[:2], *out_sizes)
    if tuple(grad_output.shape) != expected:
        raise InvalidProblem(spec.name, "grad_output", f"shape {expected} (input_size's batch and channels, then "
                             "output_size)", f"shape {tuple(grad_output.shape)}")
    return out_sizes, in_sizes


def _scale(n_in: int, n_out: int, align_corners: bool, scale, dtype: torch.dtype) -> float:
    """ATen's area_pixel_compute_scale in the kernel's math dtype (`dtype`'s accscalar_t): a float of that dtype."""
    acc = math_dtype(dtype)

    def r(x: float) -> float:
        return round_to_dtype(x, acc)

    if align_corners:
        return r(r(n_in - 1) / r(n_out - 1)) if n_out > 1 else 0.0
    if scale is not None and scale > 0:
        return r(1.0 / scale)
    return r(r(n_in) / r(n_out))


def _most_readers(mode: int, n_in: int, n_out: int, scale: float, align: bool, lead: bool = False) -> int:
    """The most outputs whose taps land on one input along a dim, counted from the forward's index math (in
    float64: the kernel's fp32 positions can move a count by one at an exact boundary, and then a tile takes a
    second chunk of candidates; the result does not depend on it). With `lead` (linear), without each input's
    leading readers of weight 0: those whose position is exactly one below it (taps f and f + 1 with weight 0 on
    f + 1; the clamped half-pixel outputs among them)."""
    o = np.arange(n_out, dtype=np.float64)
    if mode == _ANTIALIAS:
        support = max(scale, 1.0)
        center = scale * (o + 0.5)
        lo = np.clip(np.floor(center - support + 0.5), 0, n_in).astype(np.int64)
        hi = np.clip(np.floor(center + support + 0.5), 0, n_in).astype(np.int64)
        ends = np.bincount(lo, minlength=n_in + 1) - np.bincount(hi, minlength=n_in + 1)
        return int(np.cumsum(ends)[:n_in].max())
    src = scale * o if align else scale * (o + 0.5) - 0.5
    if mode == _LINEAR and not align:
        src = np.maximum(src, 0.0)
    first = np.minimum(np.floor(src), n_in - 1).astype(np.int64)
    taps = np.clip(first[:, None] + np.array((0, 1) if mode == _LINEAR else (-1, 0, 1, 2)), 0, n_in - 1)
    new = np.ones(taps.shape, dtype=bool)  # (an output's clamped taps that land on one input count once)
    new[:, 1:] = taps[:, 1:] != taps[:, :-1]
    counts = np.bincount(taps[new], minlength=n_in)
    if lead and mode == _LINEAR:
        zero = new[:, 1] & (src == first)  # (weight 0 on tap f + 1: a leading reader of it)
        counts = counts - np.bincount(taps[zero, 1], minlength=n_in)
    return int(counts.max())


def _most(mode: int, n_in: int, n_out: int, scale: float, align: bool, cfg: UpsampleConfig,
          lead: bool = False) -> int:
    """The most outputs that read one input along a dim: counted where that is cheap (`_most_readers`, up to
    `cfg.count_max` outputs), else a bound: the positions of the outputs that read input i lie in a half-open
    interval of `span` source units ([i-1, i+1) linear, [i-2, i+2) cubic, a window center's 2 * support) and sit
    `scale` apart. With `lead`, counted without each input's leading readers of weight 0 (the bound keeps them)."""
    if mode == _COPY:
        return 1
    if scale <= 0:  # (align_corners onto one output)
        return n_out
    if n_out <= cfg.count_max:
        return max(_most_readers(mode, n_in, n_out, scale, align, lead), 1)
    span = {int(_LINEAR): 2.0, int(_CUBIC): 4.0}.get(mode, 2.0 * max(scale, 1.0))
    return min(n_out, math.floor(span / scale * (1 + 2**-10)) + 1)


def _candidates(most: int, cfg: UpsampleConfig) -> int:
    """The candidate columns a program takes at once: the most outputs that read one input along W, a power of two
    up to `cfg.max_kw` (more are taken in turn: a tile loops over its own longest range). Each candidate is a masked
    load and its arithmetic for every element and row of outputs, so the count is exact where it is cheap to
    count: 2x linear upsampling takes 8 (input 0 of a half-pixel 2x has 5 readers), downsampling by 2 or more 1
    (linear), 2 (cubic), 4 (antialias)."""
    return min(triton.next_power_of_2(most), cfg.max_kw)


def _width(mode: int, most: int) -> int:
    """A dim's table width: its most readers, plus one at each end where the kernel's positions (fp32 for 16- and
    32-bit) can move a boundary output across an exact boundary against the float64 count."""
    return most if mode == _COPY else most + 2


def _plane_tile(kw: int, w_in: int, h_in: int, tile: int, cfg: UpsampleConfig) -> tuple[int, int, int]:
    """(BW, BH, warps) of a plane tile. A thread repeats the work of each row it holds (the row's output range and
    its weights for every row of outputs: ~100 instructions a row) and of each column (range, candidate weights):
    holding c columns x r rows, an element pays the row work / c and the column work / r, so c ~ r balances them
    (downsampling by 2: 4 x 4 where 1 x 16 took 1.5x the instructions). Columns spread over a warp's lanes first
    (the kernels' Layouts), so c columns a thread take 32 c columns a warp, and the block's warps all go along W:
    none along the candidate axis (a reduction across warps)."""
    w2, h2 = triton.next_power_of_2(w_in), triton.next_power_of_2(h_in)
    if h_in == 1 or w2 < 32:  # one row (the tile all along W), or planes narrower than a warp
        bw = min(w2, cfg.max_bw if h_in > 1 else tile)
        bh = min(h2, max(1, tile // bw))
        return bw, bh, tile_warps(bw * bh, 4)  # (as many warps as the tile's elements fill: KW in threads)
    pairs = max(cfg.min_elements, cfg.per_thread // kw)  # (w, h) elements a thread
    cols = min(1 << ((pairs.bit_length() - 1) // 2), w2 // 32)
    warps = tile_warps(w2, 4, cols)
    bw = min(32 * warps * cols, cfg.max_bw)
    bw = min(bw, tile)  # (a block smaller than the threads' share: tests)
    bh = min(h2, max(1, pairs // cols), max(1, tile // bw))
    if bh == 1 and bw >= 64:  # (a tile one row tall got the candidate axis laid out fastest by Triton 3.6, and a
        bh = 2  # layout conversion each (od, oh): two rows, on twice the warps, or on half the columns)
        if warps < 4:
            warps *= 2
        else:
            bw //= 2
    return bw, bh, tile_warps(bw * bh, warps)


def _tiling(cl: bool, c: int, forced: str | None) -> str:
    """"rows" for a channels_last grad_input of several channels (C its contiguous axis: row tiles coalesce),
    "planes" otherwise (W contiguous); `forced` (the config's `tiling`) overrides."""
    return forced or ("rows" if cl and c > 1 else "planes")


@plan_builder
def _plan(spec: _Spec, g_stride: tuple, in_sizes: tuple, out_sizes: tuple, align: bool, scales: tuple,
          fmt: torch.memory_format | None, dtype: torch.dtype) -> _Plan:
    """The launch of a validated, non-empty problem under the config in force: every shape as (N, C, D, H, W), D
    (and H) 1 for 2d (1d)."""
    cfg = CONFIG.current

    def ncdhw(values: tuple, fill: int) -> tuple:  # sizes (fill 1) or strides (fill 0)
        return values[:2] + (fill,) * (3 - spec.dims) + values[2:]

    meta = torch.empty(in_sizes, device="meta", memory_format=fmt or torch.contiguous_format)
    out_stride = meta.stride()
    n, c, d_in, h_in, w_in = ncdhw(in_sizes, 1)
    d_out, h_out, w_out = ncdhw((0, 0, *out_sizes), 1)[2:]
    gstr, istr = ncdhw(g_stride, 0), ncdhw(out_stride, 0)
    if tuple(in_sizes[2:]) == tuple(out_sizes):  # no dim resized: ATen's CUDA kernels copy, and so does this
        return _Plan(in_sizes, out_stride if fmt is not None else None, 0, (), {}, None, (), torch.float32)
    mode = spec.mode
    rows = _tiling(fmt is not None, c, cfg.tiling) == "rows"
    if spec.dims == 1 and not rows and c > 1:
        # 1d: the channels become the rows of one plane (H, which 1d does not resize), so that a tile spans several
        # and a thread's column work (ranges, weights) serves each
        c, h_in, h_out = 1, c, c
        gstr, istr = ((s[0], 0, s[2], s[1], s[4]) for s in (gstr, istr))
    per_dim = (None,) * (3 - spec.dims) + tuple(scales)  # (D, H, W)
    if not rows and spec.dims > 1 and 0 < gstr[3] < gstr[4]:
        # grad_output runs along H (transposed): H and W trade places, so that the plane tile's lanes, which read
        # along its W, read along grad_output's fastest axis (the 4x larger tensor at 2x); grad_input's stores go
        # strided instead. The tables follow the swap: the kernel knows the dims by their tables alone
        h_in, w_in, h_out, w_out = w_in, h_in, w_out, h_out
        gstr, istr = ((*s[:3], s[4], s[3]) for s in (gstr, istr))
        per_dim = (per_dim[0], per_dim[2], per_dim[1])
    acc = TL_MATH[math_dtype(dtype)]
    dims = []  # D, H, W: dims the op does not resize copy
    for k, (i, o, sc) in enumerate(zip((d_in, h_in, w_in), (d_out, h_out, w_out), per_dim, strict=True)):
        m = mode if k >= 3 - spec.dims else int(_COPY)
        ratio = _scale(i, o, align, sc, dtype)
        most = _most(m, i, o, ratio, align, cfg)
        dims.append((i, o, scalar_bits(ratio), _width(m, most), m, align))
    cl = fmt is not None
    kw = _candidates(most, cfg)  # (W's)
    # W's leading readers of weight 0 (linear: 2x half-pixel's input 1 has 5 readers, the first of weight 0) are left
    # out of its table and added apart (LEAD) where that takes fewer candidates: 4 instead of 8 there (m, ratio:
    # W's, the loop's last)
    kw_lead = _candidates(_most(m, w_in, w_out, ratio, align, cfg, lead=True), cfg) if m == _LINEAR else kw
    lead = kw_lead < kw
    kw = min(kw, kw_lead)
    dims = [dim + (lead and k == 2,) for k, dim in enumerate(dims)]
    tile = max(1, cfg.block // kw)
    table = sum(dim[0] * dim[3] for dim in dims) + 3 * (d_in + h_in + w_in)  # (the tables' offsets)
    if rows:
        bc = min(triton.next_power_of_2(c), cfg.max_bc)
        bw = min(triton.next_power_of_2(w_in), max(1, tile // bc))
        # a thread loads 16 bytes of channels at once where the strides let Triton prove them aligned (C a multiple
        # of 16: every stride is); as many warps as (channel vectors x columns) fill, so that none holds a share
        # of the candidate axis (a reduction across warps, through shared memory, each (od, oh))
        vec = 16 // torch.empty((), dtype=dtype).element_size() if c % 16 == 0 else 1
        warps = tile_warps(bc * bw, 4, vec)
        n_tiles = n * d_in * h_in * cdiv(w_in, bw) * cdiv(c, bc)
        # 32-bit in-row index math unless an in-row offset (a masked lane's too) can pass 2^31 (row offsets are
        # int64 always)
        reach = max(w_out * gstr[4] + (c + bc) * gstr[1], w_in * istr[4] + (c + bc) * istr[1], w_out + w_in,
                    table)
        consts = {"KW": kw, "BW": bw, "BC": bc, "LEAD": lead, "ACC": acc, "I64": reach > cfg.i32_max,
                  "UNMIXED": cfg.unmixed_loop}
        kernel = _upsample_backward_rows_kernel
    else:
        bw, bh, warps = _plane_tile(kw, w_in, h_in, tile, cfg)
        n_tiles = n * c * d_in * cdiv(h_in, bh) * cdiv(w_in, bw)
        # 32-bit in-plane index math unless an in-plane offset can pass 2^31 (plane offsets are int64 always)
        reach = max(h_out * gstr[3] + w_out * gstr[4], h_in * istr[3] + w_in * istr[4], h_out + h_in, w_out + w_in,
                    table)
        consts = {"KW": kw, "BH": bh, "BW": bw, "LEAD": lead, "ACC": acc, "I64": reach > cfg.i32_max,
                  "UNMIXED": cfg.unmixed_loop}
        kernel = _upsample_backward_kernel
    capped = (not rows and cfg.plane_maxnreg and spec.mode == _LINEAR and spec.dims > 1
              and h_in * w_in >= cfg.plane_maxnreg_min)
    cap = {"maxnreg": cfg.plane_maxnreg} if capped else {}
    consts = launch_consts(consts, warps, **cap)
    args = (n_tiles, c, d_in, h_in, w_in, *gstr, *istr, *(dim[3] for dim in dims))
    return _Plan(in_sizes, out_stride if cl else None, min(n_tiles, cfg.max_programs), args, consts, kernel,
                 tuple(dims), math_dtype(dtype))


# a table kernel program's inputs, and the candidates it takes at once (one launch a dim and plan: not tuned)
_TABLE_BLOCK = 128
_TABLE_CHUNK = 8


def _tables(plan: _Plan, like: torch.Tensor, device: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The plan's tables (idx, wt, mx: D's, H's, then W's, as the tile kernels read them) on `like`'s device
    (`device`: its index, -1 for the CPU under the interpreter), built by one launch a dim the first time and kept
    with the plan. Under CUDA graph capture a missing one is built into the graph and not kept (its memory is the
    graph's, valid only in replays)."""
    tables = plan.tables.get(device)
    if tables is not None:
        return tables
    n_idx = 3 * sum(dim[0] for dim in plan.dims)
    n_w = sum(dim[0] * dim[3] for dim in plan.dims)
    idx = empty((n_idx,), torch.int32, like.device)
    wt = empty((n_w,), plan.acc, like.device)
    mx = empty((n_w,), torch.int8, like.device)
    acc = TL_MATH[plan.acc]
    with torch.cuda.device(like.device) if like.is_cuda else contextlib.nullcontext():
        at_i = at_w = 0
        for n_in, n_out, bits, width, mode, align, lead in plan.dims:
            _table_kernel[(cdiv(n_in, _TABLE_BLOCK),)](
                idx[at_i:], wt[at_w:], mx[at_w:], n_in, n_out, bits, width, MODE=mode, ALIGN=align, ACC=acc,
                LEAD=lead, BI=_TABLE_BLOCK, BK=_TABLE_CHUNK)
            at_i, at_w = at_i + 3 * n_in, at_w + n_in * width
    if not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
        plan.tables[device] = idx, wt, mx
    return idx, wt, mx


# a problem (grad_output's layout, sizes, flags, scales) -> its plan, checked once


_VALIDATED = PlanCache("kernels.upsample._VALIDATED")



def _scales_key(scales: tuple):
    """The scales as a cache-key part: each with its type (1 and 1.0 and True differ; NaN never hits)."""
    return tuple((type(s), s) for s in scales)


def _backward(spec: _Spec, grad_output, output_size, input_size, align_corners, scales: tuple) -> torch.Tensor:
    """Validate (once per problem), allocate grad_input in ATen's layout, launch."""
    try:
        ok, ik = values_key(output_size), values_key(input_size)
        key = None if ok is None or ik is None else (
            spec, grad_output.shape, grad_output.stride(), grad_output.dtype, grad_output.device, grad_output.is_neg(),
            ok, ik, (type(align_corners), align_corners), _scales_key(scales))
        plan = _VALIDATED.get(key) if key is not None else None
    except (AttributeError, TypeError):  # not tensors or not sequences: validation names the argument
        key = plan = None
    if plan is None:
        out_sizes, in_sizes = _check(spec, grad_output, output_size, input_size, align_corners, scales)
        fmt = channels_last_format(grad_output) if spec.keeps_layout else None
        if math.prod(in_sizes) == 0:
            return torch.empty(in_sizes, dtype=grad_output.dtype, device=grad_output.device,
                               memory_format=fmt or torch.contiguous_format)
        for name, s, i, o in zip(spec.scale_names, scales, in_sizes[2:], out_sizes, strict=True):
            if not math.isfinite(_scale(i, o, align_corners, s, grad_output.dtype)):
                raise InvalidProblem(spec.name, name, "a scale whose reciprocal is finite in the math dtype", s)
        plan = _VALIDATED.remember(key, _plan(spec, grad_output.stride(), in_sizes, out_sizes, align_corners,
                                               tuple(scales), fmt, grad_output.dtype))
    out = empty(plan.shape, grad_output.dtype, grad_output.device, plan.stride)
    if plan.kernel is None:
        return out.copy_(grad_output)
    device = grad_output.get_device()
    ptrs = (out, grad_output, *_tables(plan, grad_output, device))
    launch(plan.kernel, (plan.grid,), ptrs, plan.args, plan.consts, device, (plan, device))
    return out


# ----------------------------------------------------------------------------------------------- cases
# (input sizes, output sizes, align_corners, scales or None, grad_output channels_last): up and down, one way or
# both, scales that differ from in/out, channels_last (row tiles where grad_input keeps it). "small" is what the
# interpreter runs: a plane or two each (it pays per candidate output and tile)
_SHAPES = {
    1: {
        "tiny": [((4, 8, 128), (256,), False, None, False)],
        "small": [((1, 2, 13), (29,), False, None, False), ((2, 1, 17), (6,), True, None, False),
                  ((1, 2, 7), (16,), False, (2.3,), False)],
        "check": [((16, 64, 1000), (2300,), False, None, False), ((8, 32, 4099), (1024,), True, None, False)],
        "large": [((32, 256, 4096), (8192,), False, None, False), ((64, 256, 8192), (2048,), False, None, False)],
    },
    2: {
        "tiny": [((1, 4, 32, 32), (64, 64), False, None, False)],
        "small": [((1, 2, 5, 7), (11, 9), False, (2.3, 1.3), False), ((1, 3, 6, 5), (4, 11), True, None, True)],
        "check": [((8, 32, 60, 61), (121, 180), False, None, False), ((4, 64, 80, 97), (33, 200), True, None, True),
                  ((16, 3, 128, 96), (50, 40), False, (0.4, 0.42), False)],
        "large": [((16, 64, 128, 128), (256, 256), False, None, False),
                  ((16, 64, 128, 128), (256, 256), False, None, True),
                  ((32, 64, 256, 256), (96, 96), True, None, False)],
    },
    3: {
        "tiny": [((1, 2, 8, 16, 16), (12, 24, 24), False, None, False)],
        "small": [((1, 1, 3, 4, 5), (5, 7, 4), False, (1.7, 1.9, 0.9), False),
                  ((1, 2, 2, 3, 4), (3, 5, 2), True, None, True)],
        "check": [((2, 16, 16, 28, 30), (32, 56, 61), False, None, False),
                  ((2, 8, 12, 20, 24), (25, 9, 50), True, None, True)],
        "large": [((4, 32, 32, 64, 64), (64, 128, 128), False, None, False),
                  ((4, 32, 32, 64, 64), (64, 128, 128), False, None, True)],
    },
}


def _example(spec: _Spec, in_sizes, out_sizes, align, scales, cl, device, dtype) -> tuple:
    """ATen's arguments for one case: (grad_output, output_size, input_size, align_corners, *scales)."""
    g = randn((*in_sizes[:2], *out_sizes), device, dtype)
    if cl:
        g = g.contiguous(memory_format=torch.channels_last if len(in_sizes) == 4 else torch.channels_last_3d)
    return (g, list(out_sizes), list(in_sizes), align, *(scales or (None,) * spec.dims))


def _samples(spec: _Spec):
    """samples(rng, device, dtype): up and down (1 to 7 inputs a dim, 3d 3; 1 to 9 outputs, 3d 4), align_corners
    or not, scales None or near output / input, batched with an empty batch too; grad_output in every layout, of
    finite values (special ones too)."""

    def samples(rng, device, dtype):
        d = Draw(rng, device, dtype)
        small = spec.dims == 3  # (the interpreter pays per plane and candidate)
        for edge in d.edges():
            lead = [0 if edge == "empty" else rng.randint(1, 2), rng.randint(1, 2 if small else 3)]
            in_sizes = d.sizes(spec.dims, "any" if edge == "empty" else edge, hi=3 if small else 7)
            out_sizes = d.sizes(spec.dims, "ones" if edge == "ones" else "any", hi=4 if small else 9)
            align = rng.random() < 0.4
            scales = [None] * spec.dims
            if rng.random() < 0.4:  # (none for a dim that keeps its size: stock's CPU kernel copies it whatever the
                # scale, its CUDA kernel (which gradkern follows) only where every dim keeps its size)
                scales = [None if i == o else round(o / i * rng.choice((1.0, 0.9, 1.1)), 2)
                          for i, o in zip(in_sizes, out_sizes)]
            # (finite: stock's CPU kernel multiplies g by the zero weights of taps CUDA's skips, NaN for NaN or inf)
            g = d.tensor((*lead, *out_sizes), kinds=("grid", "normal", "special"), huge=False, finite=True)
            yield Case(describe(grad_output=g, output_size=out_sizes, input_size=[*lead, *in_sizes],
                                align_corners=align, scales=scales),
                       (g, out_sizes, [*lead, *in_sizes], align, *scales))

    return samples


def _errors(spec: _Spec):
    def errors(device):
        ins, outs = [2, 3, *(4,) * spec.dims], [6] * spec.dims
        g = torch.randn(2, 3, *outs, device=device)
        nones = [None] * spec.dims
        return [
            refuse("output_size of another length", InvalidProblem, "output_size", g, outs + [6], ins, False,
                   *nones),
            refuse("input_size of another length", InvalidProblem, "input_size", g, outs, ins[1:], False, *nones),
            refuse("an output size of 0", InvalidProblem, "input_size/output_size", g[..., :0], outs[:-1] + [0],
                   ins, False, *nones),
            refuse("grad_output of another shape", InvalidProblem, "grad_output", g[:1], outs, ins, False, *nones),
            refuse("align_corners an int", Unsupported, "align_corners", g, outs, ins, 1, *nones),
            refuse("a scale given as a string", Unsupported, spec.scale_names[-1], g, outs, ins, False,
                   *nones[1:], "2"),
            refuse("output_size of floats", Unsupported, "output_size", g, [6.0] * spec.dims, ins, False, *nones),
            refuse("int grad_output", Unsupported, "grad_output", g.int(), outs, ins, False, *nones),
        ]

    return errors


_SPECS: dict[str, _Spec] = {}  # op name -> its spec


def _declare(spec: _Spec):
    """Register op `spec.name` with ATen's signature and name."""
    _SPECS[spec.name] = spec
    if spec.dims == 1:
        def fn(grad_output: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
               align_corners: bool, scales: float | None = None) -> torch.Tensor:
            return _backward(spec, grad_output, output_size, input_size, align_corners, (scales,))
    elif spec.dims == 2:
        def fn(grad_output: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
               align_corners: bool, scales_h: float | None = None, scales_w: float | None = None) -> torch.Tensor:
            return _backward(spec, grad_output, output_size, input_size, align_corners, (scales_h, scales_w))
    else:
        def fn(grad_output: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
               align_corners: bool, scales_d: float | None = None, scales_h: float | None = None,
               scales_w: float | None = None) -> torch.Tensor:
            return _backward(spec, grad_output, output_size, input_size, align_corners,
                             (scales_d, scales_h, scales_w))

    def cases(device, dtype, size: str) -> list[Case]:
        el = torch.empty((), dtype=dtype).element_size()
        out = []
        for in_sizes, out_sizes, align, scales, cl in _SHAPES[spec.dims][size]:
            args = _example(spec, in_sizes, out_sizes, align, scales, cl, device, dtype)
            label = (f"{'x'.join(map(str, in_sizes))} <- {'x'.join(map(str, out_sizes))}"
                     f"{' align_corners' if align else ''}{f' scales {scales}' if scales else ''}"
                     f"{' channels_last' if cl else ''}")
            out.append(Case(label, args, bytes=(args[0].numel() + math.prod(in_sizes)) * el,
                            elements=math.prod(in_sizes)))
        return out

    fn.__name__ = fn.__qualname__ = spec.name
    kind = {int(_LINEAR): "linear", int(_CUBIC): "bicubic", int(_ANTIALIAS): "antialiased bilinear"}[spec.mode]
    fn.__doc__ = (f"Gradient of {kind} upsampling over {spec.dims} dim(s): each grad_input element sums w * g over "
                  "the outputs that read it, in a fixed order (no atomics).")
    register_op(spec.name, aten=(spec.name,), accumulates=True, cases=cases, fake=getattr(torch.ops.aten, spec.name),
                samples=_samples(spec), errors=_errors(spec),
                route_doc="gradkern, for every problem: stock's CUDA kernels scatter with atomics "
                          "(nondeterministic, and raising under torch.use_deterministic_algorithms(True))")(fn)
    return fn


upsample_linear1d_backward = _declare(_Spec("upsample_linear1d_backward", 1, int(_LINEAR), False, ("scales",)))
upsample_bilinear2d_backward = _declare(_Spec("upsample_bilinear2d_backward", 2, int(_LINEAR), True,
                                              ("scales_h", "scales_w")))
upsample_trilinear3d_backward = _declare(_Spec("upsample_trilinear3d_backward", 3, int(_LINEAR), True,
                                               ("scales_d", "scales_h", "scales_w")))
upsample_bicubic2d_backward = _declare(_Spec("upsample_bicubic2d_backward", 2, int(_CUBIC), False,
                                             ("scales_h", "scales_w")))
_upsample_bilinear2d_aa_backward = _declare(_Spec("_upsample_bilinear2d_aa_backward", 2, int(_ANTIALIAS), True,
                                                  ("scales_h", "scales_w")))
