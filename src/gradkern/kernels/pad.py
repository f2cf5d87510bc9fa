"""Replication and reflection pad backward, 1d/2d/3d: gather-based, no atomics.

Each grad_input element sums the grad_output elements that the forward copied from it, in a fixed order, so the
result is deterministic and bit-stable. Per padded dim, input index i (n inputs, pads lo/hi, n + lo + hi outputs)
receives from (semantics.md):

* replicate, o -> clamp(o - lo, 0, n - 1): the direct o = i + lo, plus for i = 0 the outputs [0, lo) and for
  i = n - 1 the outputs [n + lo, n + lo + hi);
* reflect, o -> (n - 1) - |(n - 1) - |o - lo||: the direct o = i + lo, the left mirror o = lo - i (i >= 1) and the
  right mirror o = lo + 2(n - 1) - i (i <= n - 2);

each kept only where 0 <= o < n + lo + hi (negative pads crop). A gradient element is the sum over the product of
its per-dim source sets.

The kernel sees every problem as (Q0, Q1, D, H, W): 3d is (N, C, D, H, W); 2d is (N, C, 1, H, W); 1d is
(N, 1, 1, C, W), with N·C merged into H where the strides allow (H is then just rows, unpadded). A program owns a
[BH, BW] tile of one (q0, q1, d) plane of grad_input (or, past 2^30 tiles, several planes in turn) and reads its
sources in place, through grad_output's strides. D sources are per program: a loop over the source planes (one
for all but the border planes). Along H and W, the indices with extra sources form at most two short strips per dim
(replicate: 0 and n - 1; reflect: 1..lo and n-1-hi..n-2). A tile is done in two steps:

* the bulk: every element with its direct H, W sources only (one load per source plane, one vector store), so an
  interior element costs one read and one write, in a few instructions; the loads are VEC elements wide where
  grad_output's strides and the left W pad allow (`_vec`);
* if the tile holds part of a strip, after a barrier, its strip elements are rewritten in three disjoint parts:
  strip rows x other columns with all their H sources ([SH, BW] chunks), other rows x strip columns with all
  their W sources ([BH, SW]), and the corners with all sources ([SH, SW]). The loads of a part are unrolled
  (replicate's extra rows and columns up to `PadConfig.unroll` per side), so they are in flight together; replicate's
  corners, and every part of its wider pads, are summed a source a lane, each element's lanes in a fixed order
  (`_strip_lanes`; a wide pad's lanes take their sources a chunk at a time).
  The pad rows they read (which no bulk load touched) were asked of L2 before the bulk (a prefetch, on a GPU).
  Where a tile is its whole plane (so it holds every strip), the strip parts' values are gathered before the bulk
  store and only stored after the barrier (but reflect's with GEOM below). Where a tile holds every column and the
  column strips are one column a side (replicate; reflect with pads of 1; with GEOM below, up to four columns),
  those are selected into the bulk tile before its store instead (f32, and 16-bit 3d: `PadConfig.edges`). Where a
  tile is exactly its plane (16-bit 3d: `PadConfig.geom`), the bulk loads and stores without masks, and the plane's
  sizes, pads and strips are compile-time constants (GEOM).

Border work is thus proportional to the border data, and never widens the bulk's per-element work (the kernel is
instruction-bound where every element carries border masks: measured on an H200). The grid is 1-D (planes x row
tiles x column tiles, at most 2^30 programs), plane offsets are int64, in-plane offsets int64 where a plane spans
2^31 elements or more.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _runtime
from .._cases import Draw, describe, rand_on, randn, refuse, stand_in
from .._runtime import I32_MAX, cdiv, magics, math_dtype, values_key
from ..config import GridLimits, PlanCache, Tunable, plan_builder
from ..errors import InvalidProblem, Unsupported
from ..launch.alloc import empty, empty_contiguous_like
from ..launch.checks import check_like, check_out_overlap, check_tensor, contiguous_strides
from ..launch.launcher import launch, launch_consts, tile_warps
from ..launch.tl_helpers import TL_MATH, cast_out, divmod_
from ..registry import Case, register_op


# ----------------------------------------------------------------------------------------------- kernel
# The helpers pass these tuples (unpacked where they are read):
#   a padded dim, DD / HD / WD = (input size, output size, grad_output stride, pad before)
#   a dim's strips (`_strips`), HS / WS = (a0, a1, b0, b1): the input ranges [a0, a1) and [b0, b1)
#   a tile's part of them (`_tile_strips`), RL (rows) / CL (columns) = (n_a, n_b, a, b): n_a indices from a, n_b from b
#   a plane's source planes (`_source_planes`), PL = (o0, o1, o2, v0, v01, count)
#   the tile, T = (h, rm, w, cm, h0, w0): its rows ([BH, 1]) and columns ([1, BW]) with their masks, its first row
#   and column
#   (constexpr, from the plan) the unrolled loads, UNROLL = (ND, NXH, NXW, SIDES_H, SIDES_W)
@triton.jit
def _source_planes(d, DD, REFLECT: tl.constexpr):
    """The source planes of input plane d, as PL: reflect the valid ones of (direct o0, left mirror o1, right mirror
    o2) in that order (k < v0: o0, k < v01: o1, else o2), replicate the range [o0, o0 + count)."""
    D_in, D_out, _gsD, pd_lo = DD
    o0 = d + pd_lo
    o1 = pd_lo - d
    o2 = pd_lo + 2 * (D_in - 1) - d
    if REFLECT:
        v0 = ((o0 >= 0) & (o0 < D_out)).to(tl.int32)
        v01 = v0 + ((d >= 1) & (o1 >= 0) & (o1 < D_out)).to(tl.int32)
        count = v01 + ((d <= D_in - 2) & (o2 >= 0) & (o2 < D_out)).to(tl.int32)
    else:
        v0 = 0
        v01 = 0
        o0, count = _replicate_range(d, D_in, D_out, pd_lo)
        count = tl.maximum(count, 0)
    return o0, o1, o2, v0, v01, count


@triton.jit
def _replicate_range(x, n_in, n_out, lo):
    """Replicate's sources of index x along one dim, as the outputs [start, start + count) (count < 0: none): the
    direct one, and for the first / last index the pad before / after it."""
    start = tl.maximum(tl.where(x == 0, 0, x + lo), 0)
    return start, tl.minimum(tl.where(x == n_in - 1, n_out, x + lo + 1), n_out) - start


@triton.jit
def _plane_k(k, PL, REFLECT: tl.constexpr):
    """The k-th of the source planes PL."""
    o0, o1, o2, v0, v01, _count = PL
    if REFLECT:
        return tl.where(k < v0, o0, tl.where(k < v01, o1, o2))
    else:
        return o0 + k


@triton.jit
def _extra(first, last, z, j, lo_n, hi_0, n_out, S: tl.constexpr, SIDES: tl.constexpr):
    """Replicate's j-th extra source (index, mask) along a dim: the first index takes the outputs [0, lo_n), the
    last [hi_0, n_out). SIDES == 1: one load serves both (no index is first and last: the dim's size is > 1);
    SIDES == 2: side S alone."""
    lo_ok = first & (z + j < lo_n)
    hi_ok = last & (z + hi_0 + j < n_out)
    if SIDES == 1:
        return tl.where(first, z + j, z + hi_0 + j), lo_ok | hi_ok
    elif S == 0:
        return z + j, lo_ok
    else:
        return z + hi_0 + j, hi_ok


@triton.jit
def _w_sources(rowp, rm, w, cm, WD, W_ALL: tl.constexpr, NX: tl.constexpr, SIDES_W: tl.constexpr,
               LOOPS: tl.constexpr, REFLECT: tl.constexpr, CROP: tl.constexpr, ACC: tl.constexpr):
    """For source rows `rowp` ([R, 1] pointers at output column 0, `rm`) and input columns `w` ([1, C], `cm`):
    each column's direct W source, plus (W_ALL) all its others. Replicate's extra columns are unrolled NX at a
    time (every load in flight at once), the rest of a wide pad in a loop."""
    W_in, W_out, sW, pw_lo = WD
    ow = w + pw_lo
    m = rm & cm
    if CROP:
        m = m & (ow >= 0) & (ow < W_out)
    acc = tl.load(rowp + ow * sW, mask=m, other=0.0).to(ACC)
    if W_ALL:
        if REFLECT:
            ow = pw_lo - w  # columns 1..pw_lo: left mirror
            acc += tl.load(rowp + ow * sW, mask=rm & cm & (w >= 1) & (ow >= 0) & (ow < W_out), other=0.0).to(ACC)
            ow = pw_lo + 2 * (W_in - 1) - w  # columns W_in-1-pw_hi..W_in-2: right mirror
            acc += tl.load(rowp + ow * sW, mask=rm & cm & (w <= W_in - 2) & (ow >= 0) & (ow < W_out),
                           other=0.0).to(ACC)
        else:  # column 0 also takes outputs [0, pw_lo), column W_in-1 [W_in + pw_lo, W_out)
            lo_n = tl.minimum(pw_lo, W_out)
            hi_0 = tl.maximum(W_in + pw_lo, 0)
            left = rm & cm & (w == 0)
            right = rm & cm & (w == W_in - 1)
            z = w * 0  # (bool tensors for every mask: the interpreter rejects masks & scalar bools)
            for j in tl.static_range(NX):
                for side in tl.static_range(SIDES_W):
                    ow, mk = _extra(left, right, z, j, lo_n, hi_0, W_out, side, SIDES_W)
                    acc += tl.load(rowp + ow * sW, mask=mk, other=0.0).to(ACC)
            if LOOPS:
                for j in range(NX, tl.maximum(lo_n, W_out - hi_0)):  # (own names: only acc is carried)
                    for side in tl.static_range(SIDES_W):
                        owj, mkj = _extra(left, right, z, j, lo_n, hi_0, W_out, side, SIDES_W)
                        acc += tl.load(rowp + owj * sW, mask=mkj, other=0.0).to(ACC)
    return acc


@triton.jit
def _hw_sources(plane, h, rm, w, cm, HD, WD, H_ALL: tl.constexpr, W_ALL: tl.constexpr, UNROLL: tl.constexpr,
                LOOPS: tl.constexpr, REFLECT: tl.constexpr, CROP: tl.constexpr, ACC: tl.constexpr):
    """For input rows `h` ([R, 1], `rm`) and columns `w`: each element's sum over its sources in the source plane
    at `plane`, direct row first: along H the direct one, or (H_ALL) all; along W likewise (W_ALL)."""
    NXH: tl.constexpr = UNROLL[1]
    NXW: tl.constexpr = UNROLL[2]
    SIDES_H: tl.constexpr = UNROLL[3]
    SIDES_W: tl.constexpr = UNROLL[4]
    H_in, H_out, sH, ph_lo = HD
    oh = h + ph_lo
    m = rm
    if CROP:
        m = m & (oh >= 0) & (oh < H_out)
    acc = _w_sources(plane + oh * sH, m, w, cm, WD, W_ALL, NXW, SIDES_W, LOOPS, REFLECT, CROP, ACC)
    if H_ALL:
        if REFLECT:
            oh = ph_lo - h
            acc += _w_sources(plane + oh * sH, rm & (h >= 1) & (oh >= 0) & (oh < H_out), w, cm, WD, W_ALL, NXW,
                              SIDES_W, LOOPS, REFLECT, CROP, ACC)
            oh = ph_lo + 2 * (H_in - 1) - h
            acc += _w_sources(plane + oh * sH, rm & (h <= H_in - 2) & (oh >= 0) & (oh < H_out), w, cm, WD, W_ALL,
                              NXW, SIDES_W, LOOPS, REFLECT, CROP, ACC)
        else:
            lo_n = tl.minimum(ph_lo, H_out)
            hi_0 = tl.maximum(H_in + ph_lo, 0)
            top = rm & (h == 0)
            bottom = rm & (h == H_in - 1)
            z = h * 0
            for j in tl.static_range(NXH):
                for side in tl.static_range(SIDES_H):
                    oh, mk = _extra(top, bottom, z, j, lo_n, hi_0, H_out, side, SIDES_H)
                    acc += _w_sources(plane + oh * sH, mk, w, cm, WD, W_ALL, NXW, SIDES_W, LOOPS, REFLECT, CROP, ACC)
            if LOOPS:
                for j in range(NXH, tl.maximum(lo_n, H_out - hi_0)):  # (own names: only acc is carried)
                    for side in tl.static_range(SIDES_H):
                        ohj, mkj = _extra(top, bottom, z, j, lo_n, hi_0, H_out, side, SIDES_H)
                        acc += _w_sources(plane + ohj * sH, mkj, w, cm, WD, W_ALL, NXW, SIDES_W, LOOPS, REFLECT, CROP,
                                          ACC)
    return acc


@triton.jit
def _sources(src, gsD, PL, h, rm, w, cm, HD, WD, H_ALL: tl.constexpr, W_ALL: tl.constexpr, UNROLL: tl.constexpr,
             LOOPS: tl.constexpr, REFLECT: tl.constexpr, CROP: tl.constexpr, ACC: tl.constexpr):
    """The sum over the source planes PL (a fixed order) of `_hw_sources`: one plane for all but the border planes;
    those unroll ND planes at a time."""
    ND: tl.constexpr = UNROLL[0]
    count = PL[5]
    if count == 1:
        od = _plane_k(0, PL, REFLECT).to(tl.int64)
        acc = _hw_sources(src + od * gsD, h, rm, w, cm, HD, WD, H_ALL, W_ALL, UNROLL, LOOPS, REFLECT, CROP, ACC)
    else:
        acc = (h * 0 + w * 0).to(ACC)  # zeros of the region's [R, C] shape
        for k in tl.static_range(ND):
            od = _plane_k(k, PL, REFLECT).to(tl.int64)
            valid = rm & (h * 0 + k < count)  # (a bool tensor: the interpreter rejects masks & scalar bools)
            acc += _hw_sources(src + od * gsD, h, valid, w, cm, HD, WD, H_ALL, W_ALL, UNROLL, LOOPS, REFLECT, CROP,
                               ACC)
        if LOOPS:
            for k in range(ND, count):
                od = _plane_k(k, PL, REFLECT).to(tl.int64)
                acc += _hw_sources(src + od * gsD, h, rm, w, cm, HD, WD, H_ALL, W_ALL, UNROLL, LOOPS, REFLECT, CROP,
                                   ACC)
    return acc


@triton.jit
def _overlap(lo, hi, a, b):
    """The part [max(lo, a), min(hi, b)) of [a, b) inside [lo, hi), as (start, length >= 0)."""
    s = tl.maximum(lo, a)
    return s, tl.maximum(tl.minimum(hi, b) - s, 0)


@triton.jit
def _tile_strips(lo, hi, S):
    """The parts inside [lo, hi) (a tile's rows or columns) of a dim's strips S, as the list RL / CL."""
    a, n_a = _overlap(lo, hi, S[0], S[1])
    b, n_b = _overlap(lo, hi, S[2], S[3])
    return n_a, n_b, a, b


@triton.jit
def _strip_index(t, L):
    """Positions t of the list L of two ranges: [a, a + n_a) then [b, ...)."""
    n_a, _n_b, a, b = L
    return tl.where(t < n_a, a + t, b + (t - n_a))


@triton.jit
def _outside(i, S):
    """Whether indices i are outside both strips S."""
    return ((i < S[0]) | (i >= S[1])) & ((i < S[2]) | (i >= S[3]))


@triton.jit
def _strip_chunk(src, dst, gsD, PL, t0, c0, T, RL, CL, HS, WS, HD, WD, isH, isW, ROWS: tl.constexpr,
                 COLS: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, UNROLL: tl.constexpr, LOOPS: tl.constexpr,
                 REFLECT: tl.constexpr, CROP: tl.constexpr, ACC: tl.constexpr):
    """One chunk of a strip part: the tile's strip rows [t0, t0 + SH) of its list (ROWS; else its rows outside the
    strips) x its strip columns [c0, c0 + SW) (COLS; else its columns outside the strips), each element with all
    its sources along the strip dims and its direct one along the others, as (values, grad_input pointers, mask)."""
    h, rm, w, cm, _h0, _w0 = T
    if ROWS:
        ts = t0 + tl.arange(0, SH)[:, None]
        hh = _strip_index(ts, RL)
        rmk = ts < RL[0] + RL[1]
    else:
        hh = h
        rmk = rm & _outside(h, HS)
    if COLS:
        tc = c0 + tl.arange(0, SW)[None, :]
        ww = _strip_index(tc, CL)
        cmk = tc < CL[0] + CL[1]
    else:
        ww = w
        cmk = cm & _outside(w, WS)
    val = _sources(src, gsD, PL, hh, rmk, ww, cmk, HD, WD, ROWS, COLS, UNROLL, LOOPS, REFLECT, CROP, ACC)
    return cast_out(val, dst.dtype.element_ty), dst + hh * isH + ww * isW, rmk & cmk


@triton.jit
def _lane_sources(src, gsD, o0, count, h0, nh, w0, nw, em, s, NH, NW, sH, sW, ACC: tl.constexpr):
    """Lanes s ([1, L]) of elements em ([E, 1]): lane s loads source s (plane k, row j, column i) of the NH x NW
    sources a source plane at most, where the element has it (rows [h0, h0 + nh), columns [w0, w0 + nw), planes
    [o0, o0 + count)); 0 elsewhere."""
    k = s // (NH * NW)
    j = (s // NW) % NH  # (its row and column among the element's sources)
    i = s % NW
    m = em & (j < nh) & (i < nw) & (k < count)  # (a lane past its element's sources fails one of these)
    return tl.load(src + (o0 + k).to(tl.int64) * gsD + (h0 + j) * sH + (w0 + i) * sW, mask=m, other=0.0).to(ACC)


@triton.jit
def _strip_lanes(src, dst, gsD, PL, t0, c0, T, RL, CL, HS, WS, HD, WD, isH, isW, ROWS: tl.constexpr,
                 COLS: tl.constexpr, R: tl.constexpr, C: tl.constexpr, L: tl.constexpr, NH: tl.constexpr,
                 NW: tl.constexpr, LOOPS: tl.constexpr, ACC: tl.constexpr):
    """Replicate's chunk of a strip part, as `_strip_chunk` (R strip rows from t0 of the list (ROWS), else the
    tile's R rows outside the strips; likewise C columns), each element with all its sources, a source a lane:
    element e owns L lanes, and its lanes are summed (a reduction in one fixed order). Where a pad is wide (LOOPS),
    lane l takes sources l, l + L, ... in turn, so a chunk's loads are in flight together where the per-element
    loops wait for each source in turn. As (values, grad_input pointers, mask), each [R * C, 1]."""
    H_in, H_out, sH, ph_lo = HD
    W_in, W_out, sW, pw_lo = WD
    o0, _o1, _o2, _v0, _v01, count = PL
    e = tl.arange(0, R * C)[:, None]
    if ROWS:
        ts = t0 + e // C
        hh = _strip_index(ts, RL)
        rmk = ts < RL[0] + RL[1]
    else:
        hh = T[4] + e // C  # (the tile's rows, from its first)
        rmk = (hh < H_in) & _outside(hh, HS)
    if COLS:
        tc = c0 + e % C
        ww = _strip_index(tc, CL)
        cmk = tc < CL[0] + CL[1]
    else:
        ww = T[5] + e % C
        cmk = (ww < W_in) & _outside(ww, WS)
    em = rmk & cmk
    h0, nh = _replicate_range(hh, H_in, H_out, ph_lo)
    w0, nw = _replicate_range(ww, W_in, W_out, pw_lo)
    s = tl.arange(0, L)[None, :]
    NH_: tl.constexpr = 1 + ROWS * (NH - 1)  # (a lane's source index strides: along H and W, NH and NW a plane)
    NW_: tl.constexpr = 1 + COLS * (NW - 1)
    if LOOPS:
        acc = tl.zeros([R * C, L], ACC)
        for s0 in range(0, count * (NH_ * NW_), L):
            acc += _lane_sources(src, gsD, o0, count, h0, nh, w0, nw, em, s0 + s, NH_, NW_, sH, sW, ACC)
    else:  # L lanes hold every source
        acc = _lane_sources(src, gsD, o0, count, h0, nh, w0, nw, em, s, NH_, NW_, sH, sW, ACC)
    val = tl.sum(acc, axis=1, keep_dims=True)
    return cast_out(val, dst.dtype.element_ty), dst + hh * isH + ww * isW, em


@triton.jit
def _chunk(src, dst, gsD, PL, t0, c0, T, RL, CL, HS, WS, HD, WD, isH, isW, ROWS: tl.constexpr, COLS: tl.constexpr,
           SH: tl.constexpr, SW: tl.constexpr, UNROLL: tl.constexpr, LOOPS: tl.constexpr, LANES: tl.constexpr,
           PART: tl.constexpr, REFLECT: tl.constexpr, CROP: tl.constexpr, ACC: tl.constexpr):
    """A chunk of a strip part (PART: 0 rows, 1 columns, 2 corners): a source a lane where the plan gives it lanes
    (LANES[PART] > 0: replicate, `_strip_lanes`), else `_strip_chunk`'s per-element form."""
    if LANES[PART] > 0:
        R: tl.constexpr = SH if ROWS else T[0].shape[0]
        C: tl.constexpr = SW if COLS else T[2].shape[1]
        return _strip_lanes(src, dst, gsD, PL, t0, c0, T, RL, CL, HS, WS, HD, WD, isH, isW, ROWS, COLS, R, C,
                            LANES[PART], LANES[3], LANES[4], LOOPS, ACC)
    else:
        return _strip_chunk(src, dst, gsD, PL, t0, c0, T, RL, CL, HS, WS, HD, WD, isH, isW, ROWS, COLS, SH, SW, UNROLL,
                            LOOPS, REFLECT, CROP, ACC)


@triton.jit
def _prefetch_pad_rows(plane, ok, h0, h1, w0, HD, W_out, BW: tl.constexpr):
    """Ask L2 for the pad rows of a source plane that only the strip part reads (the outputs above input row 0 and
    below row H_in - 1, at most 4 a side), over the tile's columns and pads, one prefetch every 8 elements: they
    arrive while the bulk's own loads are in flight (where the strip part would wait for them after the barrier).
    A hint only: PTX prefetch, compiled for the GPU, never run by the interpreter."""
    H_in, H_out, gsH, ph_lo = HD
    j = tl.arange(0, 8)[:, None]
    row = tl.where(j < 4, j, H_in + ph_lo + (j - 4)).to(tl.int64)  # (row * gsH may pass 2^31 in a huge plane)
    want = tl.where(j < 4, (h0 == 0) & (j < ph_lo), h1 == H_in) & (row >= 0) & (row < H_out)
    c = w0 + tl.arange(0, (2 * BW + 7) // 8)[None, :] * 8  # (one column group at least: BW may be 1, 2 or 4)
    m = (want & ok & (c < W_out)).to(tl.int32)
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                              "=r,l,r", [plane + row * gsH + c, m], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _with_edges(out, vc, w, CL, SW: tl.constexpr):
    """The bulk tile `out` with the values of the tile's column strips (their SW columns in `vc`, [rows, SW], SW 2 or
    4) selected into it (EDGES), so that they need no store of their own after the barrier (a 2- or 4-byte store a
    row, each an L2 request). Where the columns are constants (GEOM: a tile that is exactly its plane), the compiler
    keeps the selects only for the registers that can hold them."""
    if SW == 2:
        v0, v1 = tl.split(vc)
        out = _with_column(out, v0, w, 0, CL)
        return _with_column(out, v1, w, 1, CL)
    else:
        a, b = tl.split(tl.reshape(vc, [vc.shape[0], 2, 2]))  # (positions 0 and 2, 1 and 3)
        v0, v2 = tl.split(a)
        v1, v3 = tl.split(b)
        out = _with_column(out, v0, w, 0, CL)
        out = _with_column(out, v1, w, 1, CL)
        out = _with_column(out, v2, w, 2, CL)
        return _with_column(out, v3, w, 3, CL)


@triton.jit
def _with_column(out, v, w, t, CL):
    """`out` with the column at position t of the strip list CL (none past its end) replaced by v ([rows])."""
    col = tl.where(t < CL[0] + CL[1], _strip_index(t, CL), -1)
    return tl.where(w == col, v[:, None], out)


@triton.jit
def _plane_at(gi, g, p, DIV, gs0, gs1, ISTR, MAGIC: tl.constexpr):
    """Plane p of grad_input, p = (q0 * Q1 + q1) * D_in + d (DIV = (D_in, D_m, D_s, Q1, Q_m, Q_s): the divisors and
    their magic numbers), as (grad_output at (q0, q1), grad_input at (q0, q1, d), d)."""
    D_in, D_m, D_s, Q1, Q_m, Q_s = DIV
    is0, is1, isD, _isH, _isW = ISTR
    q, d = divmod_(p, D_in, D_m, D_s, MAGIC[0])
    q0, q1 = divmod_(q, Q1, Q_m, Q_s, MAGIC[1])
    q0 = q0.to(tl.int64)  # (p, and so its indices, is 32-bit but in the planes loop)
    q1 = q1.to(tl.int64)
    return g + q0 * gs0 + q1 * gs1, gi + q0 * is0 + q1 * is1 + d.to(tl.int64) * isD, d


@triton.jit
def _tile(src, dst, d, T, h0, h1, w0, RL, CL, DD, HD, WD, HS, WS, isH, isW, REFLECT: tl.constexpr,
          CROP: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, UNROLL: tl.constexpr, LOOPS: tl.constexpr,
          ACC: tl.constexpr, BW: tl.constexpr, PREFETCH: tl.constexpr, EARLY: tl.constexpr, EDGES: tl.constexpr,
          LANES: tl.constexpr):
    """The tile T (rows [h0, h1), columns from w0) of plane d of grad_input (at `dst`; its grad_output planes at
    `src`): the bulk, then the strip parts."""
    h, rm, w, cm, _h0, _w0 = T
    gsD = DD[2]
    PL = _source_planes(d, DD, REFLECT)
    if PREFETCH:  # (the first source plane's; 3d pad 2 1.00-1.05x)
        od = _plane_k(0, PL, REFLECT).to(tl.int64)
        _prefetch_pad_rows(src + od * gsD, (PL[5] > 0) & (od >= 0) & (od < DD[1]), h0, h1, w0, HD, WD[1], BW)
    # the bulk: every element with its direct H, W sources only (one load a source plane, a vector store)
    acc = _sources(src, gsD, PL, h, rm, w, cm, HD, WD, False, False, UNROLL, LOOPS, REFLECT, CROP, ACC)
    if EARLY:
        # the tile is its whole plane: it holds every strip, each part in one chunk, whose values come first, so
        # that their loads are in flight with the bulk's (after the barrier, each part waited for its own)
        vr, pr, mr = _chunk(src, dst, gsD, PL, 0, 0, T, RL, CL, HS, WS, HD, WD, isH, isW, True, False, SH, SW,
                            UNROLL, LOOPS, LANES, 0, REFLECT, CROP, ACC)
        vx, px, mx = _chunk(src, dst, gsD, PL, 0, 0, T, RL, CL, HS, WS, HD, WD, isH, isW, True, True, SH, SW,
                            UNROLL, LOOPS, LANES, 2, REFLECT, CROP, ACC)
        vc, pc, mc = _chunk(src, dst, gsD, PL, 0, 0, T, RL, CL, HS, WS, HD, WD, isH, isW, False, True, SH, SW,
                            UNROLL, LOOPS, LANES, 1, REFLECT, CROP, ACC)
        out = cast_out(acc, dst.dtype.element_ty)
        if EDGES:
            out = _with_edges(out, vc, w, CL, SW)
        tl.store(dst + h * isH + w * isW, out, mask=rm & cm)
        tl.debug_barrier()  # every thread's bulk store is done: the strips below overwrite some of them
        tl.store(pr, vr, mask=mr)
        tl.store(px, vx, mask=mx)
        if not EDGES:
            tl.store(pc, vc, mask=mc)
    else:
        out = cast_out(acc, dst.dtype.element_ty)
        if EDGES:
            vc, _pc, _mc = _strip_chunk(src, dst, gsD, PL, 0, 0, T, RL, CL, HS, WS, HD, WD, isH, isW, False, True, SH,
                                        SW, UNROLL, LOOPS, REFLECT, CROP, ACC)
            out = _with_edges(out, vc, w, CL, SW)
        tl.store(dst + h * isH + w * isW, out, mask=rm & cm)
        n_rows = RL[0] + RL[1]
        n_cols = CL[0] + CL[1]
        if (n_rows + (0 if EDGES else n_cols)) > 0:
            tl.debug_barrier()  # as above
            # three disjoint parts: strip rows x other columns (all H sources), other rows x strip columns (all W
            # sources; unless EDGES), strip rows x strip columns (all sources). (Two parts, the strip rows over every
            # column with all their sources, were 0.87-0.93x)
            for t0 in range(0, n_rows, SH):
                vs, ps, ms = _chunk(src, dst, gsD, PL, t0, 0, T, RL, CL, HS, WS, HD, WD, isH, isW, True, False, SH,
                                    SW, UNROLL, LOOPS, LANES, 0, REFLECT, CROP, ACC)
                tl.store(ps, vs, mask=ms)
                for c0 in range(0, n_cols, SW):
                    vx, px, mx = _chunk(src, dst, gsD, PL, t0, c0, T, RL, CL, HS, WS, HD, WD, isH, isW, True, True,
                                        SH, SW, UNROLL, LOOPS, LANES, 2, REFLECT, CROP, ACC)
                    tl.store(px, vx, mask=mx)
            if not EDGES:
                for c0 in range(0, n_cols, SW):
                    vs, ps, ms = _chunk(src, dst, gsD, PL, 0, c0, T, RL, CL, HS, WS, HD, WD, isH, isW, False, True,
                                        SH, SW, UNROLL, LOOPS, LANES, 1, REFLECT, CROP, ACC)
                    tl.store(ps, vs, mask=ms)


@triton.jit
def _pad_backward_kernel(gi, g, GRID, PLANE, SIZES, GSTR, ISTR, PADS, HS, WS, REFLECT: tl.constexpr,
                         CROP: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                         UNROLL: tl.constexpr, LOOPS: tl.constexpr, PLANES_LOOP: tl.constexpr, ACC: tl.constexpr,
                         I64: tl.constexpr, VEC: tl.constexpr, PREFETCH: tl.constexpr, EARLY: tl.constexpr,
                         EDGES: tl.constexpr, LANES: tl.constexpr, GEOM: tl.constexpr, MAGIC: tl.constexpr):
    """GRID = (planes, planes a program, row tiles, column tiles), PLANE = (Q1 and the magic numbers of D_in and Q1,
    `_runtime.magic`), SIZES = (D, H, W of grad_input, then of grad_output), GSTR / ISTR = grad_output's / grad_input's
    (Q0, Q1, D, H, W) strides, PADS = (D's front, H's top and bottom, W's left and right pads), HS / WS = the H / W
    strips (`_strips`); the constexprs as `_plan` sets them."""
    planes, per_program, n_hb, n_wb = GRID
    Q1, D_m, D_s, Q_m, Q_s = PLANE
    D_in, H_in, W_in, D_out, H_out, W_out = SIZES
    gs0, gs1, gsD, gsH, gsW = GSTR
    pd_lo, ph_lo, _ph_hi, pw_lo, _pw_hi = PADS
    # grad_output's plane and row strides and the left W pad come divided by VEC, a power of two that divides them
    # all: multiplied back here, the compiler knows every direct source row starts VEC-aligned and loads VEC
    # elements at once (pad 2: 2; with odd pads or strides, VEC is 1)
    gs0 = gs0 * VEC
    gs1 = gs1 * VEC
    gsD = gsD * VEC
    gsH = gsH * VEC
    pw_lo = pw_lo * VEC
    if GEOM is not None:  # the tile is exactly its plane: the plane's sizes, pads and strips as constants
        H_in, W_in, H_out, W_out = GEOM[0], GEOM[1], GEOM[2], GEOM[3]
        ph_lo, pw_lo = GEOM[4], GEOM[6]
        HS = (GEOM[8], GEOM[9], GEOM[10], GEOM[11])
        WS = (GEOM[12], GEOM[13], GEOM[14], GEOM[15])
    pid = tl.program_id(0)
    wb = pid % n_wb
    t = pid // n_wb
    hb = t % n_hb
    pg = t // n_hb
    if I64:  # before multiplying: the last column tile of a 2^31-element row starts at 2^31
        hb = hb.to(tl.int64)
        wb = wb.to(tl.int64)
    h0 = hb * BH
    w0 = wb * BW
    h1 = tl.minimum(h0 + BH, H_in)
    w1 = tl.minimum(w0 + BW, W_in)
    h = h0 + tl.arange(0, BH)[:, None]
    w = w0 + tl.arange(0, BW)[None, :]
    if GEOM is not None:  # and masks that are constant true, which the compiler drops (`PadConfig.unmasked`)
        rm = tl.full([BH, 1], 1, tl.int1)
        cm = tl.full([1, BW], 1, tl.int1)
    else:
        rm = h < H_in
        cm = w < W_in
    T = (h, rm, w, cm, h0, w0)
    # the tile's parts of the border strips (input rows / columns with more than their direct source)
    RL = _tile_strips(h0, h1, HS)
    CL = _tile_strips(w0, w1, WS)
    DIV = (D_in, D_m, D_s, Q1, Q_m, Q_s)
    DD = (D_in, D_out, gsD, pd_lo)
    HD = (H_in, H_out, gsH, ph_lo)
    WD = (W_in, W_out, gsW, pw_lo)
    if PLANES_LOOP:  # past 2^30 tiles, several planes a program (a loop: its invariants then hold registers)
        first = pg.to(tl.int64) * per_program
        for i in range(tl.minimum(planes - first, per_program)):
            src, dst, d = _plane_at(gi, g, first + i, DIV, gs0, gs1, ISTR, MAGIC)
            _tile(src, dst, d, T, h0, h1, w0, RL, CL, DD, HD, WD, HS, WS, ISTR[3], ISTR[4], REFLECT, CROP, SH, SW,
                  UNROLL, LOOPS, ACC, BW, PREFETCH, EARLY, EDGES, LANES)
    else:
        src, dst, d = _plane_at(gi, g, pg, DIV, gs0, gs1, ISTR, MAGIC)
        _tile(src, dst, d, T, h0, h1, w0, RL, CL, DD, HD, WD, HS, WS, ISTR[3], ISTR[4], REFLECT, CROP, SH, SW, UNROLL,
              LOOPS, ACC, BW, PREFETCH, EARLY, EDGES, LANES)


# ----------------------------------------------------------------------------------------------- host
@dataclass(frozen=True)
class _Spec:
    """One of the six ops: its name, padded dims and mode."""

    name: str
    dims: int
    reflect: bool


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: plans are cached, one per layout
class _Plan:
    grid: int
    args: tuple  # the kernel's arguments after the two pointers: GRID, PLANE, SIZES, GSTR, ISTR, PADS, HS, WS
    consts: dict  # constexprs and num_warps, for `launcher.launch`


@dataclass(frozen=True)
class PadConfig(GridLimits):  # (max_programs: past it, a program does several planes in turn, PLANES_LOOP)
    """pad's launch heuristics, read once per plan. A (dims, size) pair is (padded dims, element size in bytes).
    Figures: H200, torch 2.11, Triton 3.6; their measurements and the variants tried: docs/tuning/pad.md."""

    #: grad_input elements a program tile, for 1, 2 and 3 padded dims (fewer where the plane is smaller): 3d 4096 is
    #: 1.2-1.4x 2048 in replicate
    tile: tuple[int, int, int] = (2048, 2048, 4096)
    #: the widest column tile
    max_bw: int = 1024
    #: warps a program (8: 0.57-1.01x)
    warps: int = 4
    #: fewer warps where a tile would give a thread fewer than this many elements (small planes: more programs
    #: resident a SM); 0: always `warps`. 8^3 volumes f32 replicate 0.61x -> 1.64x ATen, 7x7 planes 0.55x -> 1.12x
    min_thread_elements: int = 2
    #: replicate pads up to this many a side unrolled (their loads in flight together), wider ones in loops
    unroll: int = 4
    #: ... and where a 3-D pad is wider and takes per-element loops (`loop_lanes` 0), this many a side unrolled
    #: before them: they nest (planes, rows, columns) and every unrolled source is inlined at each level, multiplying
    #: the code (3-D pad 7: 48 registers, 2 s to compile for sm_90). Figures: docs/tuning/pad.md, "Wide 3-D pads'
    #: loops"
    loop_unroll_3d: int = 0
    #: registers a thread (ptxas --maxrregcount) by (dims, size, reflect), none where absent: only 16-bit 3d gains
    #: (reflect 96: 1.02-1.04x against none; replicate 80, which early_strips needs), elsewhere caps lose
    maxnreg: tuple[tuple[tuple[int, int, bool], int], ...] = (((3, 2, False), 80), ((3, 2, True), 96))
    #: the cap where the plane's geometry is constant (GEOM), both modes: reflect bf16 pad 2 46.2-46.6 us against
    #: 47.0-48.1 at 96
    maxnreg_geom: int = 80
    #: a tile that is its whole plane gathers its strip parts' values before the bulk store (their loads in flight
    #: with the bulk's), but reflect's under GEOM: bf16 3d replicate pad 2 49.3 -> 47.7 us
    early_strips: bool = True
    #: (dims, size) where a tile holding every column selects its column strips into the bulk tile before its store
    #: (one column a side; under GEOM up to four columns): f32 3d replicate pad 1 0.5777 -> 0.5577 ms
    edges: frozenset[tuple[int, int]] = frozenset({(1, 4), (2, 4), (3, 4), (3, 2)})
    #: EDGES without GEOM only where the row's width is a multiple of this: elsewhere the selects took 80-221
    #: registers a thread against 32-40 without (offline sm_90 compile); H100, 2-D f32 256x100x100 pad (2, 1, 3, 2):
    #: 30 -> 14 us
    edges_width: int = 16
    #: replicate's corner chunk is summed a source a lane (`_strip_lanes`) where its lanes (elements x sources, a
    #: power of two each) are at most this many: 16-bit 3d pad 2 48.6 -> 46.1 us; reflect's larger chunks lose
    corner_lanes: int = 1024
    #: lanes a chunk where a replicate pad is wide (loops): every strip part a source a lane, the sources past a
    #: chunk's lanes in turn; 0: per-element loops, which wait for each source in turn. 3-D pad 7 f32: 0.79x stock
    #: (docs/tuning/pad.md, "Wide pads' strip parts a source a lane")
    loop_lanes: int = 1024
    #: (dims, size) where a tile that is exactly its plane (H and W powers of two, within `tile`) runs without masks
    #: and with the plane's sizes, pads and strips as constants (GEOM: a compile per plane shape and pads): bf16 3d
    #: replicate pad 2 46.9 -> 43.1 us; f32 and split tiles lose
    geom: frozenset[tuple[int, int]] = frozenset({(3, 2)})


CONFIG = Tunable("pad", PadConfig())
_WAYS = ("left", "right", "top", "bottom", "front", "back")


def padded_shape(shape: Sequence[int], padding: Sequence[int]) -> tuple[int, ...]:
    """`shape` with its last len(padding) // 2 dims padded (padding lists the last dim first)."""
    out = list(shape)
    for k in range(len(padding) // 2):
        out[-1 - k] += padding[2 * k] + padding[2 * k + 1]
    return tuple(out)


def _padding(spec: _Spec, padding) -> tuple[int, ...]:
    want = 2 * spec.dims
    try:
        pads = tuple(operator.index(p) for p in padding)
    except TypeError:
        pads = ()
    if len(pads) != want:
        shown = repr(tuple(padding)) if isinstance(padding, (list, tuple)) else repr(padding)
        raise InvalidProblem(spec.name, "padding", f"{want} ints ({', '.join(_WAYS[:want])})", shown)
    return pads


def _canonical(spec: _Spec, shape: tuple[int, ...], strides: tuple[int, ...], merge: bool):
    """(Q0, Q1, D, H, W) sizes and strides of a tensor of this op (see the module docstring); `merge`: 1d's N*C
    as rows (valid where `_mergeable` holds for every tensor)."""
    size, stride = list(shape), list(strides)
    if len(shape) == spec.dims + 1:  # unbatched
        size, stride = [1, *size], [0, *stride]
    n, c, *spatial = size
    sn, sc, *sspatial = stride
    if spec.dims == 3:
        return [n, c, *spatial], [sn, sc, *sspatial]
    if spec.dims == 2:
        return [n, c, 1, *spatial], [sn, sc, 0, *sspatial]
    if merge:
        return [1, 1, 1, n * c, *spatial], [0, 0, 0, sc if c != 1 else sn, *sspatial]
    return [n, 1, 1, c, *spatial], [sn, 0, 0, sc, *sspatial]


def _mergeable(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a 1d op's (N, C) dims are one row dim of stride C's."""
    if len(shape) == 2:
        return True
    (n, c, _), (sn, sc, _) = shape, strides
    return n == 1 or c == 1 or sn == c * sc


@functools.lru_cache(maxsize=1024)
def _check_shapes(spec: _Spec, g_shape: tuple[int, ...], self_shape: tuple[int, ...], pads: tuple[int, ...]) -> None:
    rank = len(self_shape)
    if rank not in (spec.dims + 1, spec.dims + 2):
        dims = ("W", "H, W", "D, H, W")[spec.dims - 1]
        raise InvalidProblem(spec.name, "self", f"a {spec.dims + 1}-D (C, {dims}) or {spec.dims + 2}-D "
                             f"(N, C, {dims}) tensor", f"a {rank}-D tensor of shape {self_shape}")
    for k in range(spec.dims):
        n, lo, hi = self_shape[-1 - k], pads[2 * k], pads[2 * k + 1]
        if spec.reflect and (lo >= n or hi >= n):
            raise InvalidProblem(spec.name, "padding", f"reflection pads smaller than the input size {n} of dim "
                                 f"{rank - 1 - k} (self shape {self_shape})", f"({lo}, {hi}) for that dim")
        if n + lo + hi < 0:
            raise InvalidProblem(spec.name, "padding", f"pads that leave dim {rank - 1 - k} (size {n}, self shape "
                                 f"{self_shape}) a size >= 0", f"({lo}, {hi}) for that dim")
    expected = padded_shape(self_shape, pads)
    if g_shape != expected:
        raise InvalidProblem(spec.name, "grad_output", f"shape {expected} (self {self_shape} padded by {pads})",
                             g_shape)


def _strips(n: int, lo: int, hi: int, reflect: bool) -> tuple[int, int, int, int]:
    """The input indices of one dim with sources beyond the direct one, as two disjoint ranges [a, b), [c, e)
    (empty ones as (0, 0)): replicate 0 (if lo > 0) and n - 1 (if hi > 0); reflect 1..lo and n-1-hi..n-2."""
    if reflect:
        a, b = (1, min(lo, n - 1) + 1) if lo > 0 else (0, 0)
        c, e = (max(n - 1 - hi, 0), n - 1) if hi > 0 else (0, 0)
    else:
        a, b = (0, 1) if lo > 0 else (0, 0)
        c, e = (n - 1, n) if hi > 0 else (0, 0)
    if a < b and c < e and c <= b and a <= e:  # they meet: one range
        return min(a, c), max(b, e), 0, 0
    return a, b, c, e


def _vec(gstr, pw_lo: int, esize: int) -> int:
    """The widest load of direct sources the alignment allows: a power of two (at most 16 bytes) dividing
    grad_output's (Q0, Q1, D, H) strides and the left W pad, where W is contiguous; else 1. (Without it every load
    was one element: the row strides, and so the rows' alignment, were unknown to the compiler. VEC 2 at pad 2: 3d
    bf16 replicate 60.4 -> 52.6 us, H200.)"""
    if gstr[4] != 1 or max(gstr[:4]) > I32_MAX:  # (the kernel multiplies back in the argument's width: a stride
        return 1  # past 2^31 divided to fit 32 bits would wrap there)
    vec = 16 // esize
    while vec > 1 and any(v % vec for v in (*gstr[:4], pw_lo)):
        vec //= 2
    return vec


@plan_builder
def _plan(spec: _Spec, g_shape, g_strides, self_shape, pads, out_strides, dtype: torch.dtype) -> _Plan:
    """The launch for one layout (shapes already checked), under the config in force."""
    cfg = CONFIG.current
    merge = spec.dims == 1 and _mergeable(g_shape, g_strides) and _mergeable(self_shape, out_strides)
    gsize, gstr = _canonical(spec, g_shape, g_strides, merge)
    isize, istr = _canonical(spec, self_shape, out_strides, merge)
    q0, q1, d_in, h_in, w_in = isize
    pw_lo, pw_hi, ph_lo, ph_hi, pd_lo, pd_hi = pads + (0,) * (6 - len(pads))
    hs = _strips(h_in, ph_lo, ph_hi, spec.reflect)
    ws = _strips(w_in, pw_lo, pw_hi, spec.reflect)
    bw = min(triton.next_power_of_2(w_in), cfg.max_bw)
    bh = min(triton.next_power_of_2(h_in), max(1, cfg.tile[spec.dims - 1] // bw))
    # the strips are rewritten in [sh, bw] / [bh, sw] chunks
    sh = min(triton.next_power_of_2(max(hs[1] - hs[0] + hs[3] - hs[2], 1)), bh)
    sw = min(triton.next_power_of_2(max(ws[1] - ws[0] + ws[3] - ws[2], 1)), bw)
    n_wb, n_hb = cdiv(w_in, bw), cdiv(h_in, bh)
    planes = q0 * q1 * d_in
    per_program = cdiv(planes * n_hb * n_wb, cfg.max_programs)
    grid = cdiv(planes, per_program) * n_hb * n_wb
    # in-plane offsets and row/column indices (mirrors reach about twice the size, plus the pad, plus a tile)
    reach = max((gsize[3] - 1) * gstr[3] + (gsize[4] - 1) * gstr[4], (h_in - 1) * istr[3] + (w_in - 1) * istr[4],
                2 * max(gsize[3:] + isize[3:]) + max(map(abs, pads)) + 2 * max(bh, bw))
    # a program's plane index split by D_in and Q1 as multiplies where one plane a program (`magics`; not in the
    # planes loop, whose index is 64-bit)
    magic, mag = magics((d_in, q1), (planes, cdiv(planes, d_in)), per_program == 1)
    i64 = reach > cfg.i32_max
    acc = TL_MATH[math_dtype(dtype)]
    crop = min(pads) < 0
    # loads unrolled (in flight together): source planes, and replicate's extra rows / columns per side
    if spec.reflect:  # at most three source planes; one mirror a side along H and W
        nd, nxh, nxw, loops = 3, 0, 0, False
    else:  # replicate: the most source planes, extra rows and columns a side; past cfg.unroll, the rest in loops
        planes_max = 1 + (max(pd_lo, 0) + max(pd_hi, 0) if d_in == 1 else max(pd_lo, pd_hi, 0))
        loops = planes_max > 1 + cfg.unroll or max(pads) > cfg.unroll  # (compiled only where needed)
        # (with `loop_lanes`, only the bulk's source planes unroll: the strip parts take lanes)
        unroll = cfg.loop_unroll_3d if loops and spec.dims == 3 and not cfg.loop_lanes else cfg.unroll
        nd = min(planes_max, 1 + unroll)
        nxh, nxw = min(max(ph_lo, ph_hi, 0), unroll), min(max(pw_lo, pw_hi, 0), unroll)
    # replicate's extra sources of both ends along a dim share one load per source, but in a dim of size 1
    sides_h, sides_w = 2 if h_in == 1 else 1, 2 if w_in == 1 else 1
    vec = _vec(gstr, pw_lo, dtype.itemsize)
    # the strip parts' lanes an element (rows, columns, corners; 0: the per-element form) and a lane's source index
    # strides along H and W (`_strip_lanes`): with loops (`loop_lanes`), every part's, at most that many lanes a
    # chunk, the strides the most sources an index has, to a power of two (a shift: a division took most of the
    # lanes' instructions); else replicate's corners where every source is unrolled and the chunk's lanes stay few
    if loops and cfg.loop_lanes:
        most_h = gsize[3] if h_in == 1 else 1 + max(ph_lo, ph_hi, 0)  # (a dim of size 1: every output)
        most_w = gsize[4] if w_in == 1 else 1 + max(pw_lo, pw_hi, 0)
        nh, nw = triton.next_power_of_2(most_h), triton.next_power_of_2(most_w)
        lanes = (*(min(triton.next_power_of_2(planes_max * n), max(1, cfg.loop_lanes // (r * c)))
                   for r, c, n in ((sh, bw, nh), (bh, sw, nw), (sh, sw, nh * nw))), nh, nw)
    else:
        nh, nw = 1 + sides_h * nxh, 1 + sides_w * nxw
        corner = triton.next_power_of_2(nd * nh * nw)
        lanes = (0, 0, 0 if spec.reflect or loops or sh * sw * corner > cfg.corner_lanes else corner, nh, nw)
    # GEOM: the tile is exactly its plane, so it runs unmasked with its plane's geometry as constants
    geom = (spec.dims, dtype.itemsize) in cfg.geom and h_in == bh and w_in == bw
    early = (cfg.early_strips and n_hb == n_wb == 1 and hs[1] + hs[3] > 0 and ws[1] + ws[3] > 0
             and not (geom and spec.reflect))
    # EDGES: a tile holds every column (so both strips) and they are one column a side (so sw == 2), or with GEOM
    # (where the selects cost little) at most four columns in all; without GEOM on `edges_width` rows only
    edges = (spec.dims, dtype.itemsize) in cfg.edges and n_wb == 1 and not lanes[1] and (
        ws[1] - ws[0] == 1 and ws[3] - ws[2] == 1 and w_in % cfg.edges_width == 0 or geom and sw == 4)
    cap = cfg.maxnreg_geom if geom else dict(cfg.maxnreg).get((spec.dims, dtype.itemsize, spec.reflect))
    warps = tile_warps(bh * bw, cfg.warps, cfg.min_thread_elements) if cfg.min_thread_elements else cfg.warps
    consts = launch_consts({
        "REFLECT": spec.reflect, "CROP": crop, "BH": bh, "BW": bw, "SH": sh, "SW": sw,
        "UNROLL": (nd, nxh, nxw, sides_h, sides_w), "LOOPS": loops, "PLANES_LOOP": per_program > 1, "ACC": acc,
        "I64": i64, "VEC": vec, "PREFETCH": not _runtime.INTERPRET and (ph_lo > 0 or ph_hi > 0), "EARLY": early,
        "EDGES": edges, "LANES": lanes,
        "GEOM": (h_in, w_in, *gsize[3:], ph_lo, ph_hi, pw_lo, pw_hi, *hs, *ws) if geom else None,
        "MAGIC": magic,
    }, warps, **({"maxnreg": cap} if cap else {}))
    args = ((planes, per_program, n_hb, n_wb), (q1, *mag), (d_in, h_in, w_in, *gsize[2:]),
            (*(s // vec for s in gstr[:4]), gstr[4]), tuple(istr), (pd_lo, ph_lo, ph_hi, pw_lo // vec, pw_hi), hs, ws)
    return _Plan(grid, args, consts)


def _check_out(spec: _Spec, out, self: torch.Tensor, grad_output: torch.Tensor, resize: bool) -> None:
    """`grad_input=` must be a tensor of self's dtype, device and shape whose elements do not overlap, sharing
    no memory with grad_output; with `resize` (ATen's `.grad_input` overload) one of another shape is first
    resized to self's, as ATen does."""
    check_tensor(spec.name, "grad_input", out, (self.dtype,))
    if out.device != self.device:
        raise Unsupported(spec.name, "grad_input", f"a tensor on {self.device} (the device of self)", out.device)
    after = out  # grad_input as the kernel will see it
    if resize and out.shape != self.shape:
        # resize_ keeps the storage where it is large enough, the offset, and makes the strides contiguous: check
        # that layout first, and resize only once every check has passed (a rejected call changes nothing)
        if (out.storage_offset() + math.prod(self.shape)) * out.element_size() <= out.untyped_storage().nbytes():
            after = out.as_strided(self.shape, contiguous_strides(self.shape))
        else:  # (new memory: what else shares the storage cannot overlap the part resize_ adds)
            after = None
    elif out.shape != self.shape:
        raise InvalidProblem(spec.name, "grad_input", f"shape {tuple(self.shape)} (the shape of self)",
                             tuple(out.shape))
    # a gather reads other elements than the one it writes: no overlap with grad_output at all
    if after is not None:
        check_out_overlap(spec.name, "grad_input", after, {"grad_output": grad_output}, allow_same=False)
    if after is not out:
        out.resize_(self.shape)


# a problem with a fresh grad_input (its tensors' layouts, padding) -> its plan, checked once


_VALIDATED = PlanCache("kernels.pad._VALIDATED")



def _backward(spec: _Spec, grad_output, self, padding, grad_input=None, resize: bool = False) -> torch.Tensor:
    """Validate everything, then launch. `resize`: a grad_input of another shape is resized to self's first (the
    ATen `.grad_input` overload's behaviour); else it must have self's shape."""
    key = None
    if grad_input is None:  # the hot path: a problem validated before is a lookup and a launch
        try:
            pk = values_key(padding)
            key = None if pk is None else (
                spec, grad_output.shape, grad_output.stride(), grad_output.dtype, grad_output.device,
                grad_output.is_neg(), self.shape, self.dtype, self.device, self.is_neg(), pk)
            plan = _VALIDATED.get(key)
        except (AttributeError, TypeError):
            key = plan = None
        if plan is not None:
            out = empty_contiguous_like(self)
            device = self.get_device()
            launch(_pad_backward_kernel, (plan.grid,), (out, grad_output), plan.args, plan.consts, device,
                   (plan, device))
            return out
    if isinstance(grad_output, torch.Tensor) and grad_output.is_complex():
        return _complex_backward(spec, grad_output, self, padding, grad_input, resize)
    check_tensor(spec.name, "grad_output", grad_output)
    check_tensor(spec.name, "self", self)
    check_like(spec.name, "grad_output", grad_output, "self", self)
    pads = _padding(spec, padding)
    g_shape, self_shape = tuple(grad_output.shape), tuple(self.shape)
    _check_shapes(spec, g_shape, self_shape, pads)
    if grad_input is None:
        out = empty(self_shape, self.dtype, self.device)
    else:
        _check_out(spec, grad_input, self, grad_output, resize)
        out = grad_input
    if out.numel() == 0:
        return out
    plan = _plan(spec, g_shape, grad_output.stride(), self_shape, pads, out.stride(), self.dtype)
    if grad_input is None:
        _VALIDATED.remember(key, plan)
    device = self.get_device()
    launch(_pad_backward_kernel, (plan.grid,), (out, grad_output), plan.args, plan.consts, device, (plan, device))
    return out


def _complex_backward(spec: _Spec, grad_output, self, padding, grad_input, resize):
    """Complex tensors (which ATen also takes) as their real and imaginary parts: two strided real problems."""
    check_tensor(spec.name, "self", self, (grad_output.dtype,))
    _check_shapes(spec, tuple(grad_output.shape), tuple(self.shape), _padding(spec, padding))
    if grad_input is None:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
    else:
        _check_out(spec, grad_input, self, grad_output, resize)
        out = grad_input
    g, o = torch.view_as_real(grad_output), torch.view_as_real(out)
    for part in (0, 1):  # the part of grad_input stands in for self (only its shape, dtype and device are read)
        _backward(spec, g[..., part], o[..., part], padding, o[..., part])
    return out


# ----------------------------------------------------------------------------------------------- cases
_LARGE = {  # the benchmark's shapes: (self shape, padding); the last of each is the small-input case
    3: [((8, 32, 32, 64, 64), (2,) * 6), ((16, 64, 16, 128, 128), (1,) * 6), ((2, 16, 8, 16, 16), (2,) * 6)],
    2: [((16, 128, 128, 128), (2,) * 4), ((32, 64, 128, 128), (1,) * 4), ((2, 16, 64, 64), (2,) * 4)],
    1: [((64, 256, 2048), (2, 2)), ((128, 128, 2048), (1, 1)), ((2, 16, 2048), (2, 2))],
}
_CHECK = {  # the GPU tests' size: the first of each is split (but replicate 3d: never), the second not
    3: [((4, 8, 16, 64, 65), (2, 1, 3, 2, 1, 2)), ((6, 9, 40, 50), (1, -2, 0, 3, -1, 2))],
    2: [((8, 16, 96, 100), (3, 2, 1, 4)), ((12, 130, 257), (-3, 5, 2, -1))],
    1: [((16, 64, 1100), (5, 3)), ((96, 4099), (-7, 9))],
}
_SMALL = {  # what the interpreter runs (few planes: it pays per plane): batched and unbatched, asymmetric, zero and
    # negative pads
    3: [((1, 2, 4, 5, 6), (2, 1, 1, 3, 2, 1)), ((2, 3, 4, 7), (1, -1, 0, 2, -2, 3)), ((1, 2, 3, 4, 5), (0,) * 6)],
    2: [((2, 3, 7, 9), (2, 1, 3, 2)), ((3, 6, 5), (-2, 3, 1, -1)), ((2, 2, 5, 4), (0,) * 4)],
    1: [((2, 3, 17), (3, 2)), ((4, 9), (-3, 5)), ((3, 2, 6), (0, 0))],
}
_TINY = {3: [((1, 1, 4, 32, 32), (1,) * 6)], 2: [((1, 2, 32, 64), (1,) * 4)], 1: [((2, 16, 128), (2, 2))]}
_SHAPES = {"tiny": _TINY, "small": _SMALL, "check": _CHECK, "large": _LARGE}


def _example(spec: _Spec, shape, pads, device, dtype) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(grad_output, self, padding); reflect ops clamp each pad below its input size."""
    if spec.reflect:
        pads = tuple(min(p, shape[-1 - k // 2] - 1) for k, p in enumerate(pads))
    x = torch.zeros((), device=device, dtype=dtype).expand(shape)  # only its shape and dtype are read
    return randn(padded_shape(shape, pads), device, dtype), x, list(pads)


def _samples(spec: _Spec):
    """samples(rng, device, dtype): batched and unbatched, zero, negative (down to an empty grad_output) and
    asymmetric pads (reflection pads below their dim's size), grad_output in every layout, mostly on the k/8 grid
    (exact sums); self a broadcast stand-in or a tensor (only its shape and dtype are read)."""

    def samples(rng, device, dtype):
        d = Draw(rng, device, dtype)
        for edge in d.edges():
            # (the interpreter pays per plane and per source: 3-D problems stay smaller)
            small = spec.dims == 3
            lead = d.sizes(rng.choice((1, 2)), "empty" if edge == "empty" else "any", hi=2 if small else 3)
            shape = (*lead, *d.sizes(spec.dims, "any" if edge == "empty" else edge, hi=3 if small else 5))
            pads, most = [], 2 if small else 5
            for n in reversed(shape[-spec.dims:]):  # padding lists the last dim first; sizes stay >= 0
                lo = rng.randint(-n, n - 1 if spec.reflect else most)
                pads += [lo, rng.randint(-(n + lo) if lo < 0 else -n, n - 1 if spec.reflect else most)]
            g = d.tensor(padded_shape(shape, pads), kinds=("grid", "grid", "special"), huge=False)
            x = stand_in(shape, device, dtype) if rng.random() < 0.7 else d.tensor(shape)
            yield Case(describe(grad_output=g, self=x, padding=pads), (g, x, pads))

    return samples


def _errors(spec: _Spec):
    """errors(device): self of another rank, a padding of another length, a reflection pad as large as its dim, a
    crop past a dim's size, grad_output of another shape or dtype, and bad grad_input= buffers."""

    def errors(device):
        t = rand_on(device)
        shape = (2, 3, 4, 5, 6)[-spec.dims - 2:]
        pads = [1] * (2 * spec.dims)
        g, x = t(*padded_shape(shape, pads)), t(*shape)
        big = list(pads)
        big[0] = shape[-1] if spec.reflect else -shape[-1] - 2  # (replicate: the dim's padded size -1)
        kind = "a reflection pad as large as its dim" if spec.reflect else "a crop past its dim"
        return [
            refuse("self of another rank", InvalidProblem, "self", t(*shape[-spec.dims:]), t(*shape[-spec.dims:]),
                   [0] * (2 * spec.dims)),
            refuse("a padding of another length", InvalidProblem, "padding", g, x, pads + [1, 1]),
            refuse("a padding of floats", InvalidProblem, "padding", g, x, [1.0] * (2 * spec.dims)),
            refuse(kind, InvalidProblem, "padding", t(*[max(n, 0) for n in padded_shape(shape, big)]), x, big),
            refuse("grad_output of another shape", InvalidProblem, "grad_output", t(*shape), x, pads),
            refuse("grad_output of another dtype", Unsupported, "grad_output", g.double(), x, pads),
            refuse("int grad_output", Unsupported, "grad_output", g.int(), x.int(), pads),
            refuse("grad_input of another dtype", Unsupported, "grad_input", g, x, pads,
                   grad_input=t(*shape, dtype=torch.float64)),
            refuse("grad_input of another shape", InvalidProblem, "grad_input", g, x, pads, grad_input=t(3)),
            refuse("grad_input expanded", InvalidProblem, "grad_input", g, x, pads,
                   grad_input=t(*shape[:-1], 1).expand(shape)),
            refuse("grad_input overlapping grad_output", InvalidProblem, "grad_input", g, x, pads,
                   grad_input=g.view(-1)[:x.numel()].view(shape)),
        ]

    return errors


def _reference(spec: _Spec):
    """Stock's backward, but zeros where grad_output is empty: ATen's CPU reflection_pad1d/3d backwards return
    grad_input uninitialised there, and reflection_pad2d's crashes the process."""
    aten = getattr(torch.ops.aten, spec.name)

    def reference(grad_output, self, padding, **kwargs):
        if grad_output.numel() == 0:
            return torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        return aten(grad_output, self, padding, **kwargs)

    return reference


def _declare(spec: _Spec):
    """Register op `spec.name` with ATen's signature, routing both ATen overloads to it."""

    def fn(grad_output: torch.Tensor, self: torch.Tensor, padding: Sequence[int], *,
           grad_input: torch.Tensor | None = None) -> torch.Tensor:
        return _backward(spec, grad_output, self, padding, grad_input)

    def grad_input_overload(grad_output, self, padding, *, grad_input):
        return _backward(spec, grad_output, self, padding, grad_input, resize=True)

    def cases(device, dtype, size: str) -> list[Case]:
        el = torch.empty((), dtype=dtype).element_size()
        out = []
        for shape, pads in _SHAPES[size][spec.dims]:
            g, x, p = _example(spec, shape, pads, device, dtype)
            out.append(Case(f"{'x'.join(map(str, shape))} pad {tuple(p)}", (g, x, p),
                            bytes=(g.numel() + x.numel()) * el, elements=x.numel()))
        return out

    def aten_examples(device, dtype):
        g, x, p = _example(spec, *_TINY[spec.dims][0], device, dtype)
        return {f"{spec.name}.grad_input": ((g, x, p), {"grad_input": torch.empty(0, device=device, dtype=dtype)})}

    kind = "reflection" if spec.reflect else "replication"
    fn.__name__ = fn.__qualname__ = spec.name
    fn.__doc__ = (f"Gradient of {kind}_pad{spec.dims}d: each grad_input element sums the grad_output elements "
                  f"copied from it, in a fixed order (no atomics). padding = ({', '.join(_WAYS[:2 * spec.dims])}); "
                  "negative pads crop.")
    register_op(spec.name, aten={spec.name: fn, f"{spec.name}.grad_input": grad_input_overload}, accumulates=True,
                cases=cases, aten_examples=aten_examples, reference=_reference(spec),
                fake=getattr(torch.ops.aten, spec.name), samples=_samples(spec), errors=_errors(spec))(fn)
    return fn


replication_pad1d_backward = _declare(_Spec("replication_pad1d_backward", 1, False))
replication_pad2d_backward = _declare(_Spec("replication_pad2d_backward", 2, False))
replication_pad3d_backward = _declare(_Spec("replication_pad3d_backward", 3, False))
reflection_pad1d_backward = _declare(_Spec("reflection_pad1d_backward", 1, True))
reflection_pad2d_backward = _declare(_Spec("reflection_pad2d_backward", 2, True))
reflection_pad3d_backward = _declare(_Spec("reflection_pad3d_backward", 3, True))
