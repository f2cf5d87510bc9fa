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
sources in place, through grad_output's strides. D sources are per program: a scalar loop over the source planes
(one for interior planes). Along H and W, the indices with extra sources form at most two short strips per dim
(replicate: 0 and n - 1; reflect: 1..lo and n-1-hi..n-2). Small problems gather each tile in one pass with every
source (reflect mirrors as masked loads, replicate's extra ranges summed in [PH, .] / [., PW] chunks): one phase,
latency first. From _SPLIT_MIN elements (per dims and mode: replicate 3d never) a tile is done in parts (SPLIT):

* the row strips, with every source, in [SH, BW] chunks;
* the other rows, whole, with their direct sources only: one load and one vector store per element;
* after a barrier, the column strips of those rows are rewritten with every W source, in [BH, SW] chunks.

So an interior element costs one read and one write, and border work is proportional to the border data. The grid
is 1-D (planes x row tiles x column tiles, at most 2^30 programs), plane offsets are int64, in-plane offsets int64
where a plane spans 2^31 elements or more.
"""

from __future__ import annotations

import functools
import importlib
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _runtime
from .._cases import randn
from ..dispatch import is_enabled
from ..elementwise import check_out_overlap, check_tensor, launch
from ..errors import InvalidProblem, Unsupported
from ..registry import Case, register_op
from ..tl_helpers import cast_out

_I32_MAX = 2**31 - 1
_MAX_PROGRAMS = 2**30
# grad_input elements from which the border strips are gathered apart (see the kernel), by (padded dims, reflect):
# replicate 3d never (measured on an H200 at 8x32x32x64x64 and 16x64x16x128x128: one pass 1.1-1.2x faster)
_SPLIT_MIN = {(1, False): 1 << 20, (2, False): 1 << 20, (3, False): 1 << 62,
              (1, True): 1 << 20, (2, True): 1 << 20, (3, True): 1 << 20}


# ----------------------------------------------------------------------------------------------- kernel
@triton.jit
def _w_sources(rowp, rmask, w, cmask, wlo, whi, sW, W_in, W_out, pw_lo, pw_hi,
               W_EXTRA: tl.constexpr, REFLECT: tl.constexpr, R: tl.constexpr, PW: tl.constexpr,
               ACC: tl.constexpr):
    """[R, C]: for R source rows (`rowp` [R, 1] row pointers, `rmask` [R, 1]) and input columns `w` ([1, C],
    `cmask`, all within [wlo, whi)), the sum over each column's W sources (only the direct one unless W_EXTRA)."""
    ow = w + pw_lo
    acc = tl.load(rowp + ow * sW, mask=rmask & cmask & (ow >= 0) & (ow < W_out), other=0.0).to(ACC)
    if W_EXTRA:
        if REFLECT:
            if wlo <= pw_lo:  # columns 1..pw_lo: left mirror
                ow = pw_lo - w
                m = rmask & cmask & (w >= 1) & (ow >= 0) & (ow < W_out)
                acc += tl.load(rowp + ow * sW, mask=m, other=0.0).to(ACC)
            if whi > W_in - 1 - pw_hi:  # columns W_in-1-pw_hi..W_in-2: right mirror
                ow = pw_lo + 2 * (W_in - 1) - w
                m = rmask & cmask & (w <= W_in - 2) & (ow >= 0) & (ow < W_out)
                acc += tl.load(rowp + ow * sW, mask=m, other=0.0).to(ACC)
        else:
            cols = tl.arange(0, PW)[None, :]
            if wlo == 0:  # column 0 also takes outputs [0, pw_lo)
                end = tl.minimum(pw_lo, W_out)
                part = tl.zeros([R, PW], ACC)
                for j in range(0, end, PW):
                    o = cols + j
                    part += tl.load(rowp + o * sW, mask=rmask & (o < end), other=0.0).to(ACC)
                acc += tl.where((w == 0) & cmask, tl.sum(part, axis=1)[:, None], 0.0)
            if whi >= W_in:  # column W_in-1 also takes outputs [W_in + pw_lo, W_out)
                part = tl.zeros([R, PW], ACC)
                for j in range(tl.maximum(W_in + pw_lo, 0), W_out, PW):
                    o = cols + j
                    part += tl.load(rowp + o * sW, mask=rmask & (o < W_out), other=0.0).to(ACC)
                acc += tl.where((w == W_in - 1) & cmask, tl.sum(part, axis=1)[:, None], 0.0)
    return acc


@triton.jit
def _hw_sources(base, h, rmask, hlo, hhi, w, cmask, wlo, whi, sH, sW, H_in, H_out, W_in, W_out,
                ph_lo, ph_hi, pw_lo, pw_hi, H_EXTRA: tl.constexpr, W_EXTRA: tl.constexpr, REFLECT: tl.constexpr,
                R: tl.constexpr, C: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, ACC: tl.constexpr):
    """[R, C]: for input rows `h` ([R, 1], `rmask`, within [hlo, hhi)) and columns `w`, the sum over their
    H x W sources in the source plane at `base` (only the direct ones along a dim without its EXTRA flag)."""
    oh = h + ph_lo
    acc = _w_sources(base + oh * sH, rmask & (oh >= 0) & (oh < H_out), w, cmask, wlo, whi, sW, W_in, W_out,
                     pw_lo, pw_hi, W_EXTRA, REFLECT, R, PW, ACC)
    if H_EXTRA:
        if REFLECT:
            if hlo <= ph_lo:  # rows 1..ph_lo: left mirror
                oh = ph_lo - h
                m = rmask & (h >= 1) & (oh >= 0) & (oh < H_out)
                acc += _w_sources(base + oh * sH, m, w, cmask, wlo, whi, sW, W_in, W_out, pw_lo, pw_hi,
                                  W_EXTRA, REFLECT, R, PW, ACC)
            if hhi > H_in - 1 - ph_hi:  # rows H_in-1-ph_hi..H_in-2: right mirror
                oh = ph_lo + 2 * (H_in - 1) - h
                m = rmask & (h <= H_in - 2) & (oh >= 0) & (oh < H_out)
                acc += _w_sources(base + oh * sH, m, w, cmask, wlo, whi, sW, W_in, W_out, pw_lo, pw_hi,
                                  W_EXTRA, REFLECT, R, PW, ACC)
        else:
            rows = tl.arange(0, PH)[:, None]
            if hlo == 0:  # row 0 also takes output rows [0, ph_lo)
                end = tl.minimum(ph_lo, H_out)
                part = tl.zeros([PH, C], ACC)
                for j in range(0, end, PH):
                    src = rows + j
                    part += _w_sources(base + src * sH, src < end, w, cmask, wlo, whi, sW, W_in, W_out,
                                       pw_lo, pw_hi, W_EXTRA, REFLECT, PH, PW, ACC)
                acc += tl.where((h == 0) & rmask, tl.sum(part, axis=0)[None, :], 0.0)
            if hhi >= H_in:  # row H_in-1 also takes output rows [H_in + ph_lo, H_out)
                part = tl.zeros([PH, C], ACC)
                for j in range(tl.maximum(H_in + ph_lo, 0), H_out, PH):
                    src = rows + j
                    part += _w_sources(base + src * sH, src < H_out, w, cmask, wlo, whi, sW, W_in, W_out,
                                       pw_lo, pw_hi, W_EXTRA, REFLECT, PH, PW, ACC)
                acc += tl.where((h == H_in - 1) & rmask, tl.sum(part, axis=0)[None, :], 0.0)
    return acc


@triton.jit
def _region(src, gsD, o0, o1, o2, v0, v01, count, dst, isH, isW, r_lo, r_hi, c_lo, c_hi,
            H_in, H_out, W_in, W_out, gsH, gsW, ph_lo, ph_hi, pw_lo, pw_hi, hs0, hs1, hs2, hs3,
            H_EXTRA: tl.constexpr, W_EXTRA: tl.constexpr, REFLECT: tl.constexpr, RB: tl.constexpr,
            CB: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, ACC: tl.constexpr, I64: tl.constexpr):
    """Gather and store grad_input rows [r_lo, r_hi) x columns [c_lo, c_hi) of one plane, in [RB, CB] chunks
    anchored at (r_lo, c_lo), summing over the source planes and, per dim, all sources (*_EXTRA) or only the
    direct one. Without H_EXTRA the rows of the row strips [hs0, hs1), [hs2, hs3) are left out (they are
    gathered apart); columns are never left out (masks along W would split vector stores)."""
    for r0 in range(r_lo, r_hi, RB):
        for c0 in range(c_lo, c_hi, CB):
            h = tl.arange(0, RB)[:, None]
            w = tl.arange(0, CB)[None, :]
            if I64:
                h = h.to(tl.int64)
                w = w.to(tl.int64)
            h += r0
            w += c0
            rmask = h < r_hi
            if not H_EXTRA:
                rmask = rmask & ((h < hs0) | (h >= hs1)) & ((h < hs2) | (h >= hs3))
            cmask = w < c_hi
            acc = tl.zeros([RB, CB], ACC)
            for k in range(count):  # the source planes, in a fixed order
                if REFLECT:
                    od = tl.where(k < v0, o0, tl.where(k < v01, o1, o2))
                else:
                    od = o0 + k
                acc += _hw_sources(src + od.to(tl.int64) * gsD, h, rmask, r0, r0 + RB, w, cmask, c0, c0 + CB,
                                   gsH, gsW, H_in, H_out, W_in, W_out, ph_lo, ph_hi, pw_lo, pw_hi,
                                   H_EXTRA, W_EXTRA, REFLECT, RB, CB, PH, PW, ACC)
            tl.store(dst + h * isH + w * isW, cast_out(acc, dst.dtype.element_ty), mask=rmask & cmask)


@triton.jit
def _pad_backward_kernel(
    gi, g, planes, per_program, n_hb, n_wb, Q1,
    D_in, H_in, W_in, D_out, H_out, W_out,
    gs0, gs1, gsD, gsH, gsW, is0, is1, isD, isH, isW,
    pd_lo, ph_lo, ph_hi, pw_lo, pw_hi, hs0, hs1, hs2, hs3, ws0, ws1, ws2, ws3,
    REFLECT: tl.constexpr, SPLIT: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, SH: tl.constexpr,
    SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, ACC: tl.constexpr, I64: tl.constexpr,
):
    pid = tl.program_id(0)
    wb = pid % n_wb
    t = pid // n_wb
    hb = t % n_hb
    pg = t // n_hb
    if I64:
        h0 = hb.to(tl.int64) * BH
        w0 = wb.to(tl.int64) * BW
    else:
        h0 = hb * BH
        w0 = wb * BW
    h1 = tl.minimum(h0 + BH, H_in)
    w1 = tl.minimum(w0 + BW, W_in)
    first = pg.to(tl.int64) * per_program
    for i in range(tl.minimum(planes - first, per_program)):
        p = first + i
        d = p % D_in
        q = p // D_in
        q1 = q % Q1
        q0 = q // Q1
        src = g + q0 * gs0 + q1 * gs1
        dst = gi + q0 * is0 + q1 * is1 + d * isD
        # the source planes of plane d: reflect takes the valid ones of (direct, left, right) in that order,
        # replicate the range [o0, o0 + count)
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
            hi = tl.minimum(tl.where(d == D_in - 1, D_out - 1, o0), D_out - 1)
            o0 = tl.maximum(tl.where(d == 0, 0, o0), 0)
            count = tl.maximum(hi - o0 + 1, 0)
        if SPLIT:
            # the row strips: every source, in [SH, BW] chunks (calls are skipped for empty parts: the
            # interpreter pays for each)
            r_lo = tl.maximum(h0, hs0)
            r_hi = tl.minimum(h1, hs1)
            if r_lo < r_hi:
                _region(src, gsD, o0, o1, o2, v0, v01, count, dst, isH, isW, r_lo, r_hi, w0, w1, H_in, H_out,
                        W_in, W_out, gsH, gsW, ph_lo, ph_hi, pw_lo, pw_hi, hs0, hs1, hs2, hs3,
                        True, True, REFLECT, SH, BW, PH, PW, ACC, I64)
            r_lo = tl.maximum(h0, hs2)
            r_hi = tl.minimum(h1, hs3)
            if r_lo < r_hi:
                _region(src, gsD, o0, o1, o2, v0, v01, count, dst, isH, isW, r_lo, r_hi, w0, w1, H_in, H_out,
                        W_in, W_out, gsH, gsW, ph_lo, ph_hi, pw_lo, pw_hi, hs0, hs1, hs2, hs3,
                        True, True, REFLECT, SH, BW, PH, PW, ACC, I64)
            # the other rows, whole: the bulk, one load and one (vector) store per element of direct sources
            _region(src, gsD, o0, o1, o2, v0, v01, count, dst, isH, isW, h0, h1, w0, w1, H_in, H_out,
                    W_in, W_out, gsH, gsW, ph_lo, ph_hi, pw_lo, pw_hi, hs0, hs1, hs2, hs3,
                    False, False, REFLECT, BH, BW, PH, PW, ACC, I64)
            # ... whose column-strip elements are then rewritten with all their W sources, once every thread's
            # store above is done
            c_lo0 = tl.maximum(w0, ws0)
            c_hi0 = tl.minimum(w1, ws1)
            c_lo1 = tl.maximum(w0, ws2)
            c_hi1 = tl.minimum(w1, ws3)
            if (c_lo0 < c_hi0) | (c_lo1 < c_hi1):
                tl.debug_barrier()
            if c_lo0 < c_hi0:
                _region(src, gsD, o0, o1, o2, v0, v01, count, dst, isH, isW, h0, h1, c_lo0, c_hi0, H_in, H_out,
                        W_in, W_out, gsH, gsW, ph_lo, ph_hi, pw_lo, pw_hi, hs0, hs1, hs2, hs3,
                        False, True, REFLECT, BH, SW, PH, PW, ACC, I64)
            if c_lo1 < c_hi1:
                _region(src, gsD, o0, o1, o2, v0, v01, count, dst, isH, isW, h0, h1, c_lo1, c_hi1, H_in, H_out,
                        W_in, W_out, gsH, gsW, ph_lo, ph_hi, pw_lo, pw_hi, hs0, hs1, hs2, hs3,
                        False, True, REFLECT, BH, SW, PH, PW, ACC, I64)
        else:  # the whole tile in one pass, every source (small problems: one phase, latency first)
            _region(src, gsD, o0, o1, o2, v0, v01, count, dst, isH, isW, h0, h1, w0, w1, H_in, H_out,
                    W_in, W_out, gsH, gsW, ph_lo, ph_hi, pw_lo, pw_hi, hs0, hs1, hs2, hs3,
                    True, True, REFLECT, BH, BW, PH, PW, ACC, I64)


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
    args: tuple  # the kernel's integer arguments after the two pointers
    consts: dict  # constexprs and num_warps, for `elementwise.launch`


# grad_input elements per program tile (fewer when the plane is smaller), by padded dims, and per warp: measured
# on an H200 (torch 2.11, triton 3.6); fewer elements per thread was slower everywhere
_TILE = {1: 4096, 2: 4096, 3: 2048}
_WARP_ELEMS = {1: 1024, 2: 1024, 3: 1024}
# 16-bit types: 3d 4096-element tiles, 512 per warp (H200: 1.1x the 4-byte types' choice at both 3d shapes)
_TILE_16 = {1: 4096, 2: 4096, 3: 4096}
_WARP_ELEMS_16 = {1: 1024, 2: 1024, 3: 512}
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


@functools.lru_cache(maxsize=4096)
def _plan(spec: _Spec, g_shape, g_strides, self_shape, pads, out_strides, dtype: torch.dtype) -> _Plan:
    """The launch for one layout (shapes already checked)."""
    merge = spec.dims == 1 and _mergeable(g_shape, g_strides) and _mergeable(self_shape, out_strides)
    gsize, gstr = _canonical(spec, g_shape, g_strides, merge)
    isize, istr = _canonical(spec, self_shape, out_strides, merge)
    q0, q1, d_in, h_in, w_in = isize
    pw_lo, pw_hi, ph_lo, ph_hi, pd_lo, _ = pads + (0,) * (6 - len(pads))
    hs = _strips(h_in, ph_lo, ph_hi, spec.reflect)
    ws = _strips(w_in, pw_lo, pw_hi, spec.reflect)
    narrow = dtype.itemsize == 2
    tile = (_TILE_16 if narrow else _TILE)[spec.dims]
    warp_elems = (_WARP_ELEMS_16 if narrow else _WARP_ELEMS)[spec.dims]
    bw = min(triton.next_power_of_2(w_in), 1024)
    bh = min(triton.next_power_of_2(h_in), max(1, tile // bw))
    # strips are gathered in [sh, .] / [., sw] chunks; replicate's extra rows / columns summed in [ph, .] / [., pw]
    sh = min(triton.next_power_of_2(max(hs[1] - hs[0], hs[3] - hs[2], 1)), bh)
    sw = min(triton.next_power_of_2(max(ws[1] - ws[0], ws[3] - ws[2], 1)), bw)
    ph = 1 if spec.reflect else min(triton.next_power_of_2(max(ph_lo, ph_hi, 1)), 16, max(1, tile // bw))
    pw = 1 if spec.reflect else min(triton.next_power_of_2(max(pw_lo, pw_hi, 1)), 16, max(1, tile // bh))
    n_wb, n_hb = triton.cdiv(w_in, bw), triton.cdiv(h_in, bh)
    planes = q0 * q1 * d_in
    per_program = triton.cdiv(planes * n_hb * n_wb, _MAX_PROGRAMS)
    grid = triton.cdiv(planes, per_program) * n_hb * n_wb
    # in-plane offsets and row/column indices (mirrors reach about twice the size, plus the pad, plus a tile)
    reach = max((gsize[3] - 1) * gstr[3] + (gsize[4] - 1) * gstr[4], (h_in - 1) * istr[3] + (w_in - 1) * istr[4],
                2 * max(gsize[3:] + isize[3:]) + max(map(abs, pads)) + 2 * max(bh, bw))
    i64 = reach > _I32_MAX
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    split = math.prod(self_shape) >= _SPLIT_MIN[spec.dims, spec.reflect]
    values = (spec.reflect, split, bh, bw, sh, sw, ph, pw, acc, i64)
    consts = dict(zip(("REFLECT", "SPLIT", "BH", "BW", "SH", "SW", "PH", "PW", "ACC", "I64"), values, strict=True))
    consts["num_warps"] = max(1, min(8, bh * bw // warp_elems))
    consts["__values__"] = values
    args = (planes, per_program, n_hb, n_wb, q1, d_in, h_in, w_in, *gsize[2:], *gstr, *istr,
            pd_lo, ph_lo, ph_hi, pw_lo, pw_hi, *hs, *ws)
    return _Plan(grid, args, consts)


def _check_out(spec: _Spec, out, self: torch.Tensor, grad_output: torch.Tensor, resize: bool) -> None:
    """`grad_input=` must be a tensor of self's dtype, device and shape whose elements do not overlap, sharing
    no memory with grad_output; with `resize` (ATen's `.grad_input` overload) one of another shape is first
    resized to self's, as ATen does."""
    check_tensor(spec.name, "grad_input", out, (self.dtype,))
    if out.device != self.device:
        raise Unsupported(spec.name, "grad_input", f"a tensor on {self.device} (the device of self)", out.device)
    if resize and out.shape != self.shape:
        out.resize_(self.shape)
    if out.shape != self.shape:
        raise InvalidProblem(spec.name, "grad_input", f"shape {tuple(self.shape)} (the shape of self)",
                             tuple(out.shape))
    # a gather reads other elements than the one it writes: no overlap with grad_output at all
    check_out_overlap(spec.name, "grad_input", out, {"grad_output": grad_output}, allow_same=False)


def _backward(spec: _Spec, grad_output, self, padding, grad_input=None, resize: bool = False) -> torch.Tensor:
    """Validate everything, then launch. `resize`: a grad_input of another shape is resized to self's first (the
    ATen `.grad_input` overload's behaviour); else it must have self's shape."""
    if isinstance(grad_output, torch.Tensor) and grad_output.is_complex():
        return _complex_backward(spec, grad_output, self, padding, grad_input, resize)
    check_tensor(spec.name, "grad_output", grad_output)
    check_tensor(spec.name, "self", self)
    if grad_output.dtype != self.dtype:
        raise Unsupported(spec.name, "grad_output", f"dtype {self.dtype} (the dtype of self)", grad_output.dtype)
    if grad_output.device != self.device:
        raise Unsupported(spec.name, "grad_output", f"a tensor on {self.device} (the device of self)",
                          grad_output.device)
    pads = _padding(spec, padding)
    g_shape, self_shape = tuple(grad_output.shape), tuple(self.shape)
    _check_shapes(spec, g_shape, self_shape, pads)
    if grad_input is None:
        out = torch.empty(self_shape, dtype=self.dtype, device=self.device)
    else:
        _check_out(spec, grad_input, self, grad_output, resize)
        out = grad_input
    if out.numel() == 0:
        return out
    plan = _plan(spec, g_shape, grad_output.stride(), self_shape, pads, out.stride(), self.dtype)
    spec_key = (plan, out.data_ptr() % 16 == 0, grad_output.data_ptr() % 16 == 0)
    launch(_pad_backward_kernel, (plan.grid,), (out, grad_output, *plan.args), plan.consts, self.get_device(),
           spec_key)
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
                cases=cases, aten_examples=aten_examples)(fn)
    return fn


replication_pad1d_backward = _declare(_Spec("replication_pad1d_backward", 1, False))
replication_pad2d_backward = _declare(_Spec("replication_pad2d_backward", 2, False))
replication_pad3d_backward = _declare(_Spec("replication_pad3d_backward", 3, False))
reflection_pad1d_backward = _declare(_Spec("reflection_pad1d_backward", 1, True))
reflection_pad2d_backward = _declare(_Spec("reflection_pad2d_backward", 2, True))
reflection_pad3d_backward = _declare(_Spec("reflection_pad3d_backward", 3, True))


# ----------------------------------------------------------------------------------------------- F.pad route
# In deterministic mode, F.pad(mode="replicate") on CUDA (nn.ReplicationPad*d included) does not call
# aten::replication_pad*d, whose backward gradkern replaces: it calls `torch._decomp.decompositions.
# _replication_pad`, an indexing decomposition whose backward is a sort-based index_put, ~34x slower. F.pad looks
# that function up on the module at every call, so gradkern puts a wrapper there: while gradkern is enabled it
# takes the path F.pad takes outside deterministic mode (`torch._C._nn.pad`, i.e. aten::replication_pad*d, whose
# forward is deterministic); when gradkern is disabled, while compiling, and for tensors of 2^31 elements or more
# (which ATen's CUDA kernel cannot index) it calls the original.
_decomp = importlib.import_module("torch._decomp.decompositions")
_original_replication_pad = getattr(_decomp, "_replication_pad", None)
_original_replication_pad = getattr(_original_replication_pad, "__gradkern_original__", _original_replication_pad)


def _replication_pad_routed(a, padding, *args, **kwargs):
    if not args and not kwargs and _routable(a, padding):
        return torch._C._nn.pad(a, padding, "replicate")
    return _original_replication_pad(a, padding, *args, **kwargs)


def _routable(a, padding) -> bool:
    if not (is_enabled() and isinstance(a, torch.Tensor) and a.device.type == _runtime.DEVICE_TYPE):
        return False
    if torch.compiler.is_compiling() or len(padding) > 2 * a.dim():  # the latter: let the original raise
        return False
    return max(a.numel(), math.prod(padded_shape(a.shape, padding))) <= _I32_MAX


if _original_replication_pad is not None:
    functools.update_wrapper(_replication_pad_routed, _original_replication_pad)
    _replication_pad_routed.__gradkern_original__ = _original_replication_pad
    _decomp._replication_pad = _replication_pad_routed
