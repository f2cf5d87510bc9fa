"""segment_max: per-segment max with its first argmax, forward and backward; and `torch.segment_reduce(...,
"max")`'s backward (`aten::_segment_reduce_backward`) with PyTorch's own tie rule.

Segments are CSR offsets along `axis`: segment s holds rows offsets[s] <= j < offsets[s+1]. The segment_reduce
backward, and the forward's tile kernel, run one program per (outer index, segment, block of inner columns) and
walk its segment's rows in tiles of BLOCK_L x BLOCK_D. The forward picks one of three kernels per problem, from
its shapes (SegmentConfig): that one; a lane kernel for narrow data of short segments (a lane a (segment, column));
or, for a few long segments, a row kernel (a program a tile of rows, with a second pass for the segments that
cross tiles and the empty ones). On large problems the tile and lane kernels leave segments longer than a chunk
of rows to the split: a map of the chunks each covers, a pass over each chunk's rows, then one combining a
segment's chunks, so that no program walks more than a chunk of one segment (power-law lengths). All are
gathers, so there are no atomics and the results do not depend on the kernel or the tiling (max, argmax and tie
counts are exact). segment_max's backward zeroes its result and writes each (segment, column)'s gradient to the
one row its index names: segments are disjoint, so no two lanes write one element. Offsets are clamped to [0, N]
in the kernels, so even invalid offsets never read or write out of bounds.

Semantics of `gradkern.segment_max` (first-argmax, like torch_scatter's segment_csr):
* values[s] = the max over the segment, as the element data[indices[s]] itself (so of two tied zeros the first
  one's sign); NaN counts as larger than every number: a segment holding NaN has its first NaN as value and index;
* indices[s] = the lowest row index (absolute, along `axis`) holding that value;
* an empty segment has value 0 and index N (= data.size(axis), one past the last row: out of range on purpose,
  so that it cannot alias a real row) and gets no gradient;
* backward: the gradient of values[s] goes to exactly one element, data[indices[s]]; every other element gets 0.

`_segment_reduce_backward` with reduce="max" (PyTorch's rule, CUDA and CPU kernels alike): every element equal to
its segment's output, or NaN, gets g; when a segment (column) has k >= 2 such elements, those whose g > 0 get
g / k instead (the division as ATen does it: in fp32 with k first rounded to the dtype for f16/bf16). Empty
segments give no gradient. gradkern's kernel reproduces this bit for bit.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _runtime
from .._cases import Draw, describe, refuse
from .._runtime import DEVICE_TYPE, FLOAT_DTYPES, I32_MAX, cdiv, magics, meta_key, next_pow2
from ..config import PlanCache, Tunable
from ..errors import InvalidProblem, Unsupported
from ..launch import alloc
from ..launch.checks import check_tensor, reach
from ..launch.launcher import launch, launch_consts, pdl_ok
from ..launch.tl_helpers import TL_MATH, cast_in, cast_out, divmod_, gdc_wait
from ..registry import Case, register_op
from ..routing import dispatch

_INDEX_DTYPES = (torch.int32, torch.int64)
_BITS = {2: tl.int16, 4: tl.int32, 8: tl.int64}  # an element's bits, by its size in bytes


# ----------------------------------------------------------------------------------------------- kernels
@triton.jit
def _segment(offs, soff_o, outer, seg, N, ENDS: tl.constexpr, LENS: tl.constexpr = 0):
    """The clamped row range [start, end) of segment `seg` of outer slice `outer`: `offs` holds S + 1 offsets;
    or with ENDS the S segment ends (the cumulative lengths; a segment starts where the one before ends); or with
    LENS (a power of two >= S) the S lengths themselves, the start summed here from the lengths before."""
    base = offs + outer * soff_o + seg
    if LENS > 0:
        r = tl.arange(0, LENS)
        start = tl.sum(tl.load(offs + outer * soff_o + r, mask=r < seg, other=0).to(tl.int64), axis=0)
        end = start + tl.load(base).to(tl.int64)
    elif ENDS:
        start = tl.load(base - 1, mask=seg > 0, other=0).to(tl.int64)
        end = tl.load(base).to(tl.int64)
    else:
        start = tl.load(base).to(tl.int64)
        end = tl.load(base + 1).to(tl.int64)
    start = tl.minimum(tl.maximum(start, 0), N)
    end = tl.minimum(tl.maximum(end, start), N)
    return start, end


@triton.jit
def _ids(n_dblk, S, PDL: tl.constexpr):
    """The program's (inner block, segment (or the row kernels' row block or job: S of them), outer index), or with
    S = 1 the lane kernels' (segment block, 0, outer index);
    launched as a programmatic dependent (PDL), it first waits until the kernel before it (the lengths' cumsum, say)
    is done."""
    if PDL:
        gdc_wait()
    pid = tl.program_id(0).to(tl.int64)
    dblk = pid % n_dblk
    t = pid // n_dblk
    return dblk, t % S, t // S


@triton.jit
def _offsets(outer, d, ST, O_LO, I_LO, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr):
    """Element offsets of outer index `outer` and inner indices `d` in a tensor of strides ST = (outer, axis, inner,
    outer high part, inner high part) whose outer (inner) dims form one strided run, stride ST[0] (ST[2]), or with
    SPLIT_O (SPLIT_I) two: index = hi * O_LO + lo, at hi * ST[3] + lo * ST[0] (hi * ST[4] + lo * ST[2])."""
    if SPLIT_O:
        o_off = (outer // O_LO) * ST[3] + (outer % O_LO) * ST[0]
    else:
        o_off = outer * ST[0]
    if SPLIT_I:
        i_off = (d // I_LO) * ST[4] + (d % I_LO) * ST[2]
    else:
        i_off = d * ST[2]
    return o_off, i_off


@triton.jit
def _row_segments(offs, S, rows, r_first, r_last, LOG_S):
    """The segment of each of `rows` (int64, all in [r_first, r_last]): the last s with offs[s] <= row, empty
    segments passed over (offs: one slice's S + 1 valid offsets, non-decreasing from 0; LOG_S: steps enough to
    search S segments, 2^LOG_S >= S). First the segments of r_first and r_last, searched over all S, then each row's
    between those two: a block of rows shares a few segments, so that second search is short and hits the cache."""
    two = tl.arange(0, 2)
    q = tl.where(two == 0, r_first, r_last)
    lo = tl.zeros([2], tl.int64)
    hi = tl.full([2], S - 1, tl.int64)
    for _ in range(LOG_S):
        lo, hi = _search_step(offs, q, lo, hi)
    s_lo = tl.min(lo, axis=0)
    s_hi = tl.max(lo, axis=0)
    # (one more step than the float log2 promises: a step past the answer changes nothing)
    steps = tl.ceil(tl.log2((s_hi - s_lo + 1).to(tl.float32))).to(tl.int32) + 1
    lo = tl.zeros_like(rows) + s_lo
    hi = tl.zeros_like(rows) + s_hi
    for _ in range(steps):
        lo, hi = _search_step(offs, rows, lo, hi)
    return lo


@triton.jit
def _search_step(offs, q, lo, hi):
    """One step of the search for the last s in [lo, hi] with offs[s] <= q (elementwise; done where lo == hi)."""
    active = lo < hi
    mid = (lo + hi + 1) // 2
    go = tl.load(offs + mid, mask=active, other=0).to(tl.int64) <= q
    return tl.where(active & go, mid, lo), tl.where(active & ~go, mid - 1, hi)


@triton.jit
def _zero_rows(out, lo, hi, d, dmask, so_n, dtype: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[lo:hi, d] = 0 (rows no segment covers; empty unless the offsets skip rows)."""
    zero = tl.zeros([BLOCK_L, BLOCK_D], dtype)
    for r0 in range(lo, hi, BLOCK_L):
        rows = r0 + tl.arange(0, BLOCK_L)
        tl.store(out + rows[:, None] * so_n + d[None, :], zero, mask=(rows < hi)[:, None] & dmask[None, :])


@triton.jit
def _order_key(bits, W: tl.constexpr, INF: tl.constexpr, KEY: tl.constexpr):
    """Integer keys (signed, `W` bits wide, in type KEY) whose order is the float order of the elements with these
    bits (INF: the bits of +inf), with both zeros equal (key 0) and every NaN above +inf (the largest key)."""
    mag = bits & ((1 << (W - 1)) - 1)  # the bits without the sign
    key = bits ^ ((bits >> (W - 1)) & ((1 << (W - 1)) - 1))  # negative numbers: the magnitude bits flipped
    key = tl.where(mag == 0, 0, key)
    key = tl.where(mag > INF, (1 << (W - 1)) - 1, key)
    return key.to(KEY)


@triton.jit
def _max_over_rows(xb, start, end, N, sx_n, dmask, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, BITS: tl.constexpr,
                   W: tl.constexpr, INF: tl.constexpr):
    """The max of rows [start, end) of columns xb (pointers, [BLOCK_D]) and its first row, a tile of BLOCK_L rows at
    a time: (indices, the element's bits; N and +0.0 for an empty segment). Per tile, the largest order key
    (_order_key: NaN on top) and the first row holding it: a max, then a min of the rows holding it
    (docs/tuning/segment_max.md, "The forward's max and its first row")."""
    lr = tl.arange(0, BLOCK_L)
    lowest = -(1 << (W - 1))  # below every key: rows past the segment's end
    best_key = tl.full([BLOCK_D], lowest, BITS)  # the lowest: no row seen yet
    best_idx = tl.full([BLOCK_D], 0, tl.int64)
    for r0 in range(start, end, BLOCK_L):
        m = (lr < end - r0)[:, None] & dmask[None, :]
        bits = tl.load(xb[None, :] + (r0 + lr)[:, None] * sx_n, mask=m, other=0.0).to(BITS, bitcast=True)
        key = tl.where(m, _order_key(bits, W, INF, BITS), lowest).to(BITS)  # (lowest is an int32 literal)
        ckey = tl.max(key, axis=0).to(BITS)  # (Triton's max of int16 is int32)
        crow = tl.min(tl.where(key == ckey[None, :], lr[:, None], BLOCK_L), axis=0)
        # a later tile wins only with a strictly larger key (ties, NaN included, keep the first)
        take = ckey > best_key
        best_key = tl.where(take, ckey, best_key)
        best_idx = tl.where(take, r0 + crow, best_idx)
    # the element's bits: the key inverted, except for zeros and NaN (sign and payload), loaded again (one element a
    # column) only where a column needs them, so no tile's bits outlive its keys
    empty = best_key == lowest
    bits = (best_key ^ ((best_key >> (W - 1)) & ((1 << (W - 1)) - 1))).to(BITS)
    special = ((best_key == 0) | (best_key == (1 << (W - 1)) - 1)) & dmask
    bits = tl.where(special, tl.load(xb + best_idx * sx_n, mask=special, other=0.0).to(BITS, bitcast=True), bits)
    return tl.where(empty, N, best_idx), tl.where(empty, 0, bits)


@triton.jit
def _chunks_max(w, n_w, row0, start, end, N, INNER, d, dmask, CH: tl.constexpr, BLOCK_T: tl.constexpr,
                BLOCK_D: tl.constexpr, BITS: tl.constexpr, W: tl.constexpr, INF: tl.constexpr):
    """The first row of the max of rows [start, end) of columns d, a segment longer than a chunk (CH rows), from
    the chunk pass's partial results (_segment_max_fwd_chunks_kernel; row0: its first workspace row of this outer
    slice), BLOCK_T chunks a step: the largest key, and of equal ones the first chunk's row."""
    lowest = -(1 << (W - 1))
    wb = (w + n_w).to(tl.pointer_type(BITS))
    ca = start // CH
    cb = (end - 1) // CH + 1
    lt = tl.arange(0, BLOCK_T)
    best_key = tl.full([BLOCK_D], lowest, BITS)
    best_c = tl.zeros([BLOCK_D], tl.int64) + ca
    for c0 in range(ca, cb, BLOCK_T):
        c = c0 + lt
        m = (c < cb)[:, None] & dmask[None, :]
        e = _chunk_entry(row0, c, start, CH)[:, None] * INNER + d[None, :]
        key = tl.where(m, _order_key(tl.load(wb + e, mask=m, other=0), W, INF, BITS), lowest).to(BITS)
        ck = tl.max(key, axis=0).to(BITS)  # (a reduction widens 16-bit integers)
        cc = tl.min(tl.where(key == ck[None, :], c[:, None], cb), axis=0)
        take = ck > best_key
        best_key = tl.where(take, ck, best_key)
        best_c = tl.where(take, cc, best_c)
    return tl.load(w + _chunk_entry(row0, best_c, start, CH) * INNER + d, mask=dmask, other=N)


@triton.jit
def _chunk_entry(row0, c, start, CH: tl.constexpr):
    """The workspace row (from row0, this outer slice's first) of chunks `c` of the segment starting at row
    `start`: two rows a chunk, the first chunk's slot 1 where the segment starts inside it, else slot 0."""
    ca = start // CH
    return row0 + 2 * c + tl.where(c == ca, (start > ca * CH).to(tl.int64), 0)


@triton.jit
def _chunk_block(n_chunk, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    """A split pass program's BLOCK_C chunks (a vector of chunk indices), which of them exist, its outer index."""
    _d, cb, outer = _ids(1, tl.cdiv(n_chunk, BLOCK_C), PDL)
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    return c, c < n_chunk, outer


@triton.jit
def _chunk_slot(w, at, outer, n_chunk, c, cmask, k: tl.constexpr, offs, soff_o, S, N, CH: tl.constexpr,
                ENDS: tl.constexpr):
    """Slot k of chunks c's map entries (the split's map at `at` entries into w), checked against the offsets:
    (the segments, their row ranges [a, b), whether each slot holds a segment longer than CH rows as the slot says:
    slot 0 holding the chunk's first row, slot 1 starting inside it)."""
    r0 = c * CH
    entry = _chunk_map(w, at, outer, n_chunk) + 2 * c + k
    seg = tl.minimum(tl.maximum(tl.load(entry, mask=cmask, other=0), 0), S - 1)
    a, b = _segment(offs, soff_o, outer, seg, N, ENDS)
    if k == 0:
        there = (a <= r0) & (b > r0)
    else:
        there = (a > r0) & (a < tl.minimum(r0 + CH, N))
    return seg, a, b, cmask & (b - a > CH) & there


@triton.jit
def _ending_segments(w, at, outer, n_chunk, c, cmask, offs, soff_o, S, N, CH: tl.constexpr, ENDS: tl.constexpr):
    """The segments chunks c's map slot 0 names, checked against the offsets: (segments, starts, ends, whether
    each is longer than CH rows and ends in its chunk: at most one can a chunk, and it holds the chunk's first
    row)."""
    seg, start, end, take = _chunk_slot(w, at, outer, n_chunk, c, cmask, 0, offs, soff_o, S, N, CH, ENDS)
    return seg, start, end, take & ((end - 1) // CH == c)


@triton.jit
def _ranks(take):
    """Each taken entry's rank among the taken ones (in order), and how many are taken: a loop over the taken
    entries one at a time (a split pass's chunks' slots, a lane kernel's long segments)."""
    t = take.to(tl.int32)
    return tl.cumsum(t, axis=0) - 1, tl.sum(t, axis=0)


@triton.jit
def _nth(pick, c, seg, a, b, N, CH: tl.constexpr):
    """The entry `pick` marks (one) of a slot's vectors, as scalars: (its chunk, segment, the segment's rows [a, b),
    and its rows within the chunk [lo, hi))."""
    cj = tl.max(tl.where(pick, c, -1), axis=0)
    aj = tl.max(tl.where(pick, a, -1), axis=0)
    bj = tl.max(tl.where(pick, b, -1), axis=0)
    r0 = cj * CH
    return (cj, tl.max(tl.where(pick, seg, -1), axis=0), aj, bj, tl.maximum(aj, r0),
            tl.minimum(bj, tl.minimum(r0 + CH, N)))


@triton.jit
def _walked(start, end, CH: tl.constexpr):
    """Where a main kernel stops walking rows [start, end): with the split (CH), a segment longer than CH rows is
    the split's passes', so none of its rows."""
    if CH > 0:
        end = tl.where(end - start > CH, start, end)
    return end


@triton.jit
def _chunk_map(w, at, outer, n_chunk):
    """Outer slice `outer`'s chunk map in the split's workspace w, after its partials (`at` entries): two entries
    a chunk."""
    return w + at + outer * n_chunk * 2


@triton.jit
def _mark_chunks(hs, seg, start, end, big, CH: tl.constexpr):
    """The split's chunk map (hs: this outer slice's, two entries a chunk), for segments `seg` (a vector) of rows
    [start, end) where `big` (longer than CH): each in slot 0 of every chunk whose first row it holds and in slot 1
    of the chunk it starts inside, if it does. Entries no long segment marks stay unwritten: the passes that read
    them check them against the offsets, and only a long segment holding the chunk's rows as the slot says passes
    (at most one can)."""
    ca = start // CH
    inside = start > ca * CH
    tl.store(hs + 2 * ca + 1, seg, mask=big & inside)
    c0 = ca + inside.to(tl.int64)
    c_end = (end - 1) // CH + 1
    for k in range(0, tl.max(tl.where(big, c_end - c0, 0), axis=0)):
        tl.store(hs + 2 * (c0 + k), seg, mask=big & (c0 + k < c_end))


@triton.jit
def _segment_max_fwd_kernel(x, offs, vals, idxs, S, N, INNER, n_dblk, SX, O_LO, I_LO, soff_o,
                            BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, BITS: tl.constexpr, W: tl.constexpr,
                            INF: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr, CH: tl.constexpr,
                            PDL: tl.constexpr):
    """A program a (segment, block of columns), its rows a tile at a time; with CH, a segment longer than CH rows
    is left to the split's passes, which store its result over what this stores (an empty segment's)."""
    dblk, seg, outer = _ids(n_dblk, S, PDL)
    start, end = _segment(offs, soff_o, outer, seg, N, False)
    walked = _walked(start, end, CH)
    d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < INNER
    xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
    idx, bits = _max_over_rows(x + xo + xi, start, walked, N, SX[1], dmask, BLOCK_L, BLOCK_D, BITS, W, INF)
    o = (outer * S + seg) * INNER + d
    tl.store(vals + o, bits.to(vals.dtype.element_ty, bitcast=True), mask=dmask)  # (an empty segment: +0.0)
    tl.store(idxs + o, idx, mask=dmask)


@triton.jit
def _lanes_max(p, n_r, valid, rows, sx, UNROLL: tl.constexpr, MATH: tl.constexpr):
    """(the max, its row) of each lane's rows 0 .. n_r - 1 at pointers p, rows sx elements apart (n_r and `valid`
    broadcast against p; a lane without rows or not valid gets +0.0 and row 0; `rows`: the most n_r), UNROLL rows
    a step, their loads independent. Rows counted in 32 bits (a lane's segment is short); each lane's first row
    loaded before the loop, later ones compared as floats: a row wins where it is not at most the best so far
    (larger, or NaN) and the best is not NaN (the keys' order: zeros equal, NaN on top, the first of equals kept;
    one unordered compare and one NaN test, two instructions), with no key and no bits kept apart from the best
    element itself; rows past a lane's end load -inf, which never wins."""
    best = tl.load(p, mask=(n_r > 0) & valid, other=0.0)
    best_r = tl.zeros(best.shape, tl.int32)
    for r0 in range(1, rows, UNROLL):
        for u in tl.static_range(UNROLL):
            r = r0 + u
            v = tl.load(p + r * sx, mask=(r < n_r) & valid, other=float("-inf"))
            vm, bm = cast_in(v, MATH), cast_in(best, MATH)  # (the interpreter and Triton 3.9 misorder 16-bit compares)
            take = ~(vm <= bm) & (bm == bm)
            best = tl.where(take, v, best)
            best_r = tl.where(take, r, best_r)
    return best, best_r


@triton.jit
def _segment_max_fwd_lanes_kernel(x, offs, vals, idxs, w, S, N, INNER, n_sblk, SX, O_LO, I_LO, soff_o, n_chunk,
                                  n_w, dm, dsh, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, CAP: tl.constexpr,
                                  BLOCK_L: tl.constexpr, UNROLL: tl.constexpr, BITS: tl.constexpr, W: tl.constexpr,
                                  INF: tl.constexpr, MATH: tl.constexpr, SPLIT_O: tl.constexpr,
                                  SPLIT_I: tl.constexpr, CH: tl.constexpr, FLAT: tl.constexpr, MAGIC: tl.constexpr,
                                  PDL: tl.constexpr):
    """A program a block of BLOCK_S segments (all BLOCK_D >= INNER columns): segments of at most CAP rows take a
    lane a (segment, column), looping over their rows together (_lanes_max); each longer one then takes the whole
    program, its rows a tile of BLOCK_L at a time (_max_over_rows), but with CH only up to CH rows: longer ones are
    marked in the split's chunk map (_mark_chunks), and the split's passes store their results. With FLAT, the
    BLOCK_S * BLOCK_D lanes are the next (segment, column) pairs of the slice in order instead, so that no lane
    idles where INNER is not a power of two (a segment may straddle two programs), and a long segment belongs to
    the program holding its first column (2 BLOCK_S segments at most, as INNER > BLOCK_D / 2; the lanes' segments
    and columns divide by INNER with dm, dsh where MAGIC: tl_helpers.div). The same results as the tile kernel: a
    row wins only where it is strictly larger in the keys' order (_order_key), so of equal ones (NaN too) the first
    row."""
    sblk, _, outer = _ids(n_sblk, 1, PDL)
    d = tl.arange(0, BLOCK_D)
    dmask = d < INNER
    xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
    xb = x + xo + xi
    if FLAT:
        first = sblk * (BLOCK_S * BLOCK_D)  # the block's first (segment, column) pair
        seg0 = first // INNER
        lanes = tl.arange(0, BLOCK_S * BLOCK_D)
        q, col = divmod_((first - seg0 * INNER).to(tl.int32) + lanes, INNER, dm, dsh, MAGIC)
        lseg = seg0 + q
        lmask = lseg < S
        lstart, lend = _segment(offs, soff_o, outer, tl.minimum(lseg, S - 1), N, False)  # (past S: S - 1's, unused)
        short = lmask & (lend - lstart <= CAP)
        n_r = tl.where(short, lend - lstart, 0).to(tl.int32)
        lo, li = _offsets(outer, col, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
        best, best_r = _lanes_max(x + lo + li + lstart * SX[1], n_r, lmask, tl.max(n_r, axis=0), SX[1], UNROLL,
                                  MATH)
        o = outer * S * INNER + first + lanes
        tl.store(vals + o, best, mask=short)  # (an empty segment's: the +0.0 loaded)
        tl.store(idxs + o, tl.where(n_r > 0, lstart + best_r, N), mask=short)
        segs = (first + INNER - 1) // INNER + tl.arange(0, 2 * BLOCK_S)  # the segments whose first column is here
        smask = (segs < S) & (segs * INNER < first + BLOCK_S * BLOCK_D)
    else:
        segs = sblk * BLOCK_S + tl.arange(0, BLOCK_S)
        smask = segs < S
    start, end = _segment(offs, soff_o, outer, tl.minimum(segs, S - 1), N, False)  # (past S: S - 1's, unused)
    lens = end - start
    if not FLAT:
        short = smask & (lens <= CAP)
        n_r = tl.where(short, lens, 0).to(tl.int32)
        best, best_r = _lanes_max(xb[None, :] + start[:, None] * SX[1], n_r[:, None], dmask[None, :],
                                  tl.max(n_r, axis=0), SX[1], UNROLL, MATH)
        o = (outer * S + segs)[:, None] * INNER + d[None, :]
        keep = short[:, None] & dmask[None, :]
        tl.store(vals + o, best, mask=keep)  # (an empty segment's: the +0.0 loaded)
        tl.store(idxs + o, tl.where((n_r > 0)[:, None], start[:, None] + best_r, N), mask=keep)
    long = smask & (lens > CAP)
    if CH > 0:
        long = long & (lens <= CH)
    rank, n_long = _ranks(long)
    for j in range(0, n_long):
        pick = long & (rank == j)
        seg = tl.max(tl.where(pick, segs, -1), axis=0)
        idx, bits1 = _max_over_rows(xb, tl.max(tl.where(pick, start, -1), axis=0),
                                    tl.max(tl.where(pick, end, -1), axis=0), N, SX[1], dmask, BLOCK_L, BLOCK_D,
                                    BITS, W, INF)
        o1 = (outer * S + seg) * INNER + d
        tl.store(vals + o1, bits1.to(vals.dtype.element_ty, bitcast=True), mask=dmask)
        tl.store(idxs + o1, idx, mask=dmask)
    if CH > 0:
        _mark_chunks(_chunk_map(w, 2 * n_w, outer, n_chunk), segs.to(tl.int64), start, end, smask & (lens > CH), CH)


@triton.jit
def _segment_mark_kernel(offs, w, S, N, n_sblk, soff_o, n_chunk, at, CH: tl.constexpr, BLOCK_S: tl.constexpr,
                         ENDS: tl.constexpr, PDL: tl.constexpr):
    """The split's chunk map (_mark_chunks; at `at` entries into w) for the kernels that do not write it
    themselves, the tile kernels (the code slowed the forward's loop even where it did not run: docs/tuning/
    segment_max.md, "The split"): a program a block of BLOCK_S segments, before the main kernel."""
    sblk, _, outer = _ids(n_sblk, 1, PDL)
    segs = sblk * BLOCK_S + tl.arange(0, BLOCK_S).to(tl.int64)
    smask = segs < S
    start, end = _segment(offs, soff_o, outer, tl.minimum(segs, S - 1), N, ENDS)
    _mark_chunks(_chunk_map(w, at, outer, n_chunk), segs, start, end, smask & (end - start > CH), CH)


@triton.jit
def _segment_max_fwd_chunks_kernel(x, offs, vals, idxs, w, S, N, INNER, n_chunk, n_dblk, SX, O_LO, I_LO, soff_o, n_w,
                                   CH: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
                                   BITS: tl.constexpr, W: tl.constexpr, INF: tl.constexpr, SPLIT_O: tl.constexpr,
                                   SPLIT_I: tl.constexpr, BLOCK_C: tl.constexpr,
                                   PDL: tl.constexpr):
    """The split forward's chunk pass, after the main kernel, on chunks of CH rows, BLOCK_C a program
    (_chunk_block): the segments the chunk map names for a chunk (_mark_chunks), where they are longer than CH rows
    and hold its rows as the map says, the one holding its first row (slot 0) and one starting inside it (slot 1),
    each get the max of their rows in the chunk and the first row holding it (_max_over_rows, every block of columns
    in turn) in the chunk's slot of the workspace w: rows (int64) in its first n_w entries, the elements' bits in
    the next n_w, then the map."""
    c, cmask, outer = _chunk_block(n_chunk, BLOCK_C, PDL)
    wb = (w + n_w).to(tl.pointer_type(BITS))
    for k in tl.static_range(2):
        seg, a, b, take = _chunk_slot(w, 2 * n_w, outer, n_chunk, c, cmask, k, offs, soff_o, S, N, CH, False)
        rank, n_take = _ranks(take)
        for j in range(0, n_take):
            cj, _s, _a, _b, lo, hi = _nth(take & (rank == j), c, seg, a, b, N, CH)
            for dblk in range(0, n_dblk):
                d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
                dmask = d < INNER
                xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
                idx, bits = _max_over_rows(x + xo + xi, lo, hi, N, SX[1], dmask, BLOCK_L, BLOCK_D, BITS, W, INF)
                e = ((outer * n_chunk + cj) * 2 + k) * INNER + d
                tl.store(w + e, idx, mask=dmask)
                tl.store(wb + e, bits, mask=dmask)


@triton.jit
def _segment_max_fwd_long_kernel(x, offs, vals, idxs, w, S, N, INNER, n_chunk, n_dblk, SX, O_LO, I_LO, soff_o, n_w,
                                 CH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BITS: tl.constexpr,
                                 W: tl.constexpr, INF: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr,
                                 BLOCK_C: tl.constexpr,
                                 PDL: tl.constexpr):
    """The split forward's last pass, BLOCK_C chunks a program: for each chunk c, the result of the segment longer
    than CH rows that ends in chunk c, if one does (at most one can, and it holds the chunk's first row: the map's
    slot 0), from its chunks' partials (_chunks_max), every block of columns in turn. Its element is loaded from its
    rows: a row the workspace names outside them (offsets that decrease) is clamped into them."""
    c, cmask, outer = _chunk_block(n_chunk, BLOCK_C, PDL)
    segs, starts, ends, take = _ending_segments(w, 2 * n_w, outer, n_chunk, c, cmask, offs, soff_o, S, N, CH, False)
    rank, n_take = _ranks(take)
    for j in range(0, n_take):
        _c, seg, start, end, _lo, _hi = _nth(take & (rank == j), c, segs, starts, ends, N, CH)
        for dblk in range(0, n_dblk):
            d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
            dmask = d < INNER
            row = _chunks_max(w, n_w, outer * n_chunk * 2, start, end, N, INNER, d, dmask, CH, BLOCK_T, BLOCK_D,
                              BITS, W, INF)
            row = tl.minimum(tl.maximum(row, start), end - 1)
            xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
            o = (outer * S + seg) * INNER + d
            tl.store(vals + o, tl.load(x + xo + xi + row * SX[1], mask=dmask), mask=dmask)
            tl.store(idxs + o, row, mask=dmask)


@triton.jit
def _first_max(sa, ka, ia, sb, kb, ib):
    """The segmented scan's step (a before b): within one segment the larger key, the earlier row of equal ones;
    across a segment boundary b's."""
    take = (sa != sb) | (kb > ka)
    return sb, tl.where(take, kb, ka), tl.where(take, ib, ia)


@triton.jit
def _segment_max_fwd_rows_kernel(x, offs, vals, idxs, wk, wi, hs, S, N, INNER, n_rblk, n_dblk, LOG_S, SX, O_LO,
                                 I_LO, soff_o, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BITS: tl.constexpr,
                                 W: tl.constexpr, INF: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr,
                                 PDL: tl.constexpr):
    """A program a tile of BLOCK_R rows x BLOCK_D columns, whatever the segments: each row's segment from the
    offsets (_row_segments), then one segmented scan down the rows (_first_max on order keys) gives each segment's
    max and first row within the tile. A segment inside the tile is stored here; one that crosses the tile's first
    row or its last leaves its partial result in slot 0 or 1 of the tile's workspace (wk: keys, wi: rows), and the
    segment of the tile's first row goes to hs, for _segment_max_fwd_fix_kernel."""
    dblk, rblk, outer = _ids(n_dblk, n_rblk, PDL)
    r0 = rblk * BLOCK_R
    r_last = tl.minimum(r0 + BLOCK_R, N) - 1
    lr = tl.arange(0, BLOCK_R)
    rows = tl.minimum(r0 + lr, N - 1)
    o_offs = offs + outer * soff_o
    seg = _row_segments(o_offs, S, rows, r0, r_last, LOG_S)
    start = tl.minimum(tl.maximum(tl.load(o_offs + seg).to(tl.int64), 0), N)
    end = tl.minimum(tl.maximum(tl.load(o_offs + seg + 1).to(tl.int64), start), N)
    live = (r0 + lr < N) & (rows >= start) & (rows < end)
    d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < INNER
    xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
    xb = x + xo + xi
    m = live[:, None] & dmask[None, :]
    bits = tl.load(xb[None, :] + rows[:, None] * SX[1], mask=m, other=0.0).to(BITS, bitcast=True)
    lowest = -(1 << (W - 1))
    key = tl.where(m, _order_key(bits, W, INF, BITS), lowest).to(BITS)
    s_lo = tl.min(seg, axis=0)
    sl = tl.broadcast_to((seg - s_lo).to(tl.int32)[:, None], [BLOCK_R, BLOCK_D])
    lr2 = tl.broadcast_to(lr[:, None], [BLOCK_R, BLOCK_D])
    _s, best_key, best_lr = tl.associative_scan((sl, key, lr2), 0, _first_max)
    best = r0 + best_lr.to(tl.int64)
    last = live & ((rows == end - 1) | (rows == r_last))  # a segment's last row in this tile
    done = last & (start >= r0) & (end <= r_last + 1)
    head = last & (start < r0)
    tail = live & (rows == r_last) & (end > r_last + 1)
    dm = dmask[None, :]
    o = (outer * S + seg)[:, None] * INNER + d[None, :]
    won = tl.load(xb[None, :] + best * SX[1], mask=done[:, None] & dm, other=0.0)
    tl.store(vals + o, won, mask=done[:, None] & dm)
    tl.store(idxs + o, best, mask=done[:, None] & dm)
    w = ((outer * n_rblk + rblk) * 2 * INNER + d)[None, :] + tl.zeros([BLOCK_R, 1], tl.int64)
    tl.store(wk + w, best_key, mask=head[:, None] & dm)
    tl.store(wi + w, best, mask=head[:, None] & dm)
    tl.store(wk + w + INNER, best_key, mask=tail[:, None] & dm)
    tl.store(wi + w + INNER, best, mask=tail[:, None] & dm)
    if dblk == 0:
        tl.store(hs + outer * n_rblk + rblk, s_lo)


@triton.jit
def _segment_max_fwd_fix_kernel(x, offs, vals, idxs, wk, wi, hs, S, N, INNER, n_rblk, n_dblk, n_jobs, SX, O_LO,
                                I_LO, soff_o, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
                                BLOCK_D: tl.constexpr, BITS: tl.constexpr, W: tl.constexpr,
                                SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr, PDL: tl.constexpr):
    """After _segment_max_fwd_rows_kernel: program j (of n_jobs) stores the result of the segment that crosses
    into row tile j and ends there, from the partials of the tiles it spans (BLOCK_T a step), and the results of
    the empty segments among j * BLOCK_S .. (j + 1) * BLOCK_S - 1 (value 0, index N): the segments no row tile
    stores."""
    dblk, j, outer = _ids(n_dblk, n_jobs, PDL)
    d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < INNER
    if (j > 0) & (j < n_rblk):
        seg = tl.load(hs + outer * n_rblk + j)
        start, end = _segment(offs, soff_o, outer, seg, N, False)
        r0 = j * BLOCK_R
        if (start < r0) & (end <= r0 + BLOCK_R):
            lowest = -(1 << (W - 1))
            first = start // BLOCK_R
            w0 = (outer * n_rblk + first) * 2 * INNER + d
            best_key = tl.load(wk + w0 + INNER, mask=dmask, other=lowest).to(BITS)
            best = tl.load(wi + w0 + INNER, mask=dmask, other=0)
            lt = tl.arange(0, BLOCK_T)
            for t0 in range(first + 1, j + 1, BLOCK_T):
                tm = (t0 + lt <= j)[:, None] & dmask[None, :]
                w = ((outer * n_rblk + t0 + lt) * 2)[:, None] * INNER + d[None, :]
                k = tl.load(wk + w, mask=tm, other=lowest).to(BITS)
                r = tl.load(wi + w, mask=tm, other=0)
                ck = tl.max(k, axis=0).to(BITS)  # (a reduction widens 16-bit integers)
                crow = tl.min(tl.where(tm & (k == ck[None, :]), r, N), axis=0)
                take = ck > best_key
                best_key = tl.where(take, ck, best_key)
                best = tl.where(take, crow, best)
            xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
            o = (outer * S + seg) * INNER + d
            tl.store(vals + o, tl.load(x + xo + xi + best * SX[1], mask=dmask), mask=dmask)
            tl.store(idxs + o, best, mask=dmask)
    segs = j * BLOCK_S + tl.arange(0, BLOCK_S)
    smask = segs < S
    base = offs + outer * soff_o + segs
    a = tl.minimum(tl.maximum(tl.load(base, mask=smask, other=0).to(tl.int64), 0), N)
    b = tl.minimum(tl.maximum(tl.load(base + 1, mask=smask, other=0).to(tl.int64), a), N)
    em = (smask & (a == b))[:, None] & dmask[None, :]
    o = (outer * S + segs)[:, None] * INNER + d[None, :]
    tl.store(vals + o, tl.zeros([BLOCK_S, BLOCK_D], vals.dtype.element_ty), mask=em)
    tl.store(idxs + o, tl.full([BLOCK_S, BLOCK_D], 0, tl.int64) + N, mask=em)


@triton.jit
def _segment_max_bwd_kernel(g, idxs, offs, gx, S, N, INNER, TOTAL, SG, O_LO, I_LO, soff_o, MAG,
                            BLOCK: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr, MAGIC: tl.constexpr,
                            I64: tl.constexpr, PDL: tl.constexpr):
    """segment_max's backward into a zeroed gx: lane l = (outer * S + seg) * INNER + d writes g[outer, seg, d] to
    row idxs[l] where that row lies in segment seg (an empty segment's N, or any index outside it, writes nothing).
    A lane a (segment, column), whatever the segments' lengths: the rows no index names are the zeros. The lane's
    split by INNER and S is 32-bit unless I64, a multiply-high and shifts where MAGIC (`div`'s constants in MAG):
    int64 divisions by runtime values, a software routine each, would be most of the kernel's instructions."""
    if PDL:
        gdc_wait()
    if I64:
        lane = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = lane < TOTAL
    t, d = divmod_(lane, INNER, MAG[0], MAG[1], MAGIC[0])
    outer, seg = divmod_(t, S, MAG[2], MAG[3], MAGIC[1])
    base = offs + outer * soff_o + seg
    start = tl.minimum(tl.maximum(tl.load(base, mask=m, other=0).to(tl.int64), 0), N)
    end = tl.minimum(tl.maximum(tl.load(base + 1, mask=m, other=0).to(tl.int64), start), N)
    iv = tl.load(idxs + lane, mask=m, other=-1)
    ok = m & (iv >= start) & (iv < end)
    go, gi = _offsets(outer, d, SG, O_LO, I_LO, SPLIT_O, SPLIT_I)
    gv = tl.load(g + go + seg * SG[1] + gi, mask=ok)
    tl.store(gx + (outer * N + iv) * INNER + d, gv, mask=ok)


@triton.jit
def _selected(xb, ov, r0, end, dmask, sx_n, BLOCK_L: tl.constexpr, MATH: tl.constexpr):
    """Rows r0 .. r0 + BLOCK_L of a segment ending at `end`: (rows, mask, the elements ATen's rule selects: equal
    to the segment's max `ov`, or NaN)."""
    rows = r0 + tl.arange(0, BLOCK_L)
    m = (rows < end)[:, None] & dmask[None, :]
    v = tl.load(xb[None, :] + rows[:, None] * sx_n, mask=m, other=0.0).to(MATH)
    return rows, m, ((v != v) | (v == ov[None, :])) & m


@triton.jit
def _segment_reduce_max_bwd_kernel(g, o, x, offs, gx, S, N, INNER, n_dblk, SG, SO, SX, O_LO, I_LO, soff_o,
                                   BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, MATH: tl.constexpr,
                                   ENDS: tl.constexpr, LENS: tl.constexpr, TWO_PASS: tl.constexpr,
                                   SKIP_EMPTY: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr,
                                   CH: tl.constexpr, PDL: tl.constexpr):
    """One program a (segment, inner block): _segred_segment. SKIP_EMPTY branches over empty segments (without,
    their masks do). With CH, a segment longer than CH rows is left to the split's passes."""
    dblk, seg, outer = _ids(n_dblk, S, PDL)
    start, end = _segment(offs, soff_o, outer, seg, N, ENDS, LENS)
    walked = _walked(start, end, CH)
    d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < INNER
    ob = gx + outer * N * INNER
    xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
    xb = x + xo + xi
    if (walked > start) or (not SKIP_EMPTY):
        _segred_segment(g, o, xb, ob, outer, seg, start, walked, d, dmask, SG, SO, SX[1], O_LO, I_LO, INNER, BLOCK_L,
                        BLOCK_D, MATH, TWO_PASS, SPLIT_O, SPLIT_I)
    if seg == 0:
        _zero_rows(ob, 0, start, d, dmask, INNER, gx.dtype.element_ty, BLOCK_L, BLOCK_D)
    if seg == S - 1:
        _zero_rows(ob, end, N, d, dmask, INNER, gx.dtype.element_ty, BLOCK_L, BLOCK_D)


@triton.jit
def _lanes_write(xb, ob, ov, val, start, n_r, rows, d, cm, sx_n, INNER, UNROLL: tl.constexpr, WRITE_R: tl.constexpr,
                 COUNT: tl.constexpr, ZEROS: tl.constexpr, MATH: tl.constexpr):
    """The lane kernel's writing pass over its short segments (n_r rows each, `rows` the most; columns where cm, a
    mask broadcast against [segments, columns]): val where a row's element ties the segment's max ov, and with ZEROS
    0 elsewhere (without: a rewrite of the selected elements), a lane a (segment, column) UNROLL rows a step or, with
    WRITE_R > 1, a [segments, WRITE_R rows, columns] tile a step. Returns the ties counted (with COUNT; else 0)."""
    cnt = tl.zeros(ov.shape, tl.int32)
    zero = tl.zeros(ov.shape, ob.dtype.element_ty)
    if WRITE_R == 1:
        for r0 in range(0, rows, UNROLL):
            for u in tl.static_range(UNROLL):
                r = r0 + u
                m = (r < n_r)[:, None] & cm
                v = tl.load(xb[None, :] + (start + r)[:, None] * sx_n, mask=m, other=0.0).to(MATH)
                sel = ((v != v) | (v == ov)) & m
                if COUNT:
                    cnt += sel.to(tl.int32)
                tl.store(ob + ((start + r) * INNER)[:, None] + d[None, :], tl.where(sel, val, zero),
                         mask=m if ZEROS else sel)
    else:
        for r0 in range(0, rows, WRITE_R):
            r = r0 + tl.arange(0, WRITE_R)
            m = (r[None, :] < n_r[:, None])[:, :, None] & cm[:, None, :]
            rr = start[:, None] + r[None, :]
            v = tl.load(xb[None, None, :] + (rr * sx_n)[:, :, None], mask=m, other=0.0).to(MATH)
            sel = ((v != v) | (v == ov[:, None, :])) & m
            if COUNT:
                cnt += tl.sum(sel.to(tl.int32), axis=1)
            tl.store(ob + (rr * INNER)[:, :, None] + d[None, None, :], tl.where(sel, val[:, None, :], zero[:, None, :]),
                     mask=m if ZEROS else sel)
    return cnt


@triton.jit
def _segment_reduce_max_bwd_lanes_kernel(g, o, x, offs, gx, w, S, N, INNER, n_sblk, SG, SO, SX, O_LO, I_LO, soff_o,
                                         n_chunk, n_w,
                                         BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, CAP: tl.constexpr,
                                         BLOCK_L: tl.constexpr, MATH: tl.constexpr, ENDS: tl.constexpr,
                                         TWO_PASS: tl.constexpr, UNROLL: tl.constexpr, WRITE_R: tl.constexpr,
                                         ONE_PASS: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr,
                                         CH: tl.constexpr, PDL: tl.constexpr):
    """A program a block of BLOCK_S segments (all BLOCK_D >= INNER columns): segments of at most CAP rows take a
    lane a (segment, column), which counts its ties over the segment's rows, then writes them (UNROLL rows a step,
    their loads independent; with WRITE_R > 1 the writing pass takes WRITE_R consecutive rows of a segment side by
    side across the lanes instead, so that a warp's stores fill sectors where a lane a segment wrote one element
    a sector); with ONE_PASS the writing pass counts and writes g, and only the segments whose ties divide g take
    a second (_lanes_write). Each longer one then takes the whole program, a tile of BLOCK_L rows at a time
    (_segred_segment), but with CH, one longer than CH rows is marked in the split's chunk map in w (_mark_chunks)
    and left to the split's passes. The first and last blocks zero the rows before the first segment and after the
    last. The same results as _segment_reduce_max_bwd_kernel."""
    sblk, _, outer = _ids(n_sblk, 1, PDL)
    segs = sblk * BLOCK_S + tl.arange(0, BLOCK_S)
    smask = segs < S
    start, end = _segment(offs, soff_o, outer, tl.minimum(segs, S - 1), N, ENDS)  # (past S: S - 1's, unused)
    lens = end - start
    short = smask & (lens <= CAP)
    long = smask & (lens > CAP) & (_walked(start, end, CH) > start)  # (the long segments' rows: reloaded after)
    if CH > 0:
        _mark_chunks(_chunk_map(w, n_w, outer, n_chunk), segs.to(tl.int64), start, end, smask & (lens > CH), CH)
    d = tl.arange(0, BLOCK_D)
    dmask = d < INNER
    ob = gx + outer * N * INNER
    xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
    xb = x + xo + xi
    oo, oi = _offsets(outer, d, SO, O_LO, I_LO, SPLIT_O, SPLIT_I)
    go, gi = _offsets(outer, d, SG, O_LO, I_LO, SPLIT_O, SPLIT_I)
    sd = short[:, None] & dmask[None, :]
    ov = tl.load(o + oo + (segs * SO[1])[:, None] + oi[None, :], mask=sd, other=0.0).to(MATH)
    gv = tl.load(g + go + (segs * SG[1])[:, None] + gi[None, :], mask=sd, other=0.0).to(MATH)
    n_r = tl.where(short, lens, 0).to(tl.int32)  # (a short segment's rows: 32 bits)
    rows = tl.max(n_r, axis=0)
    if ONE_PASS:  # g written where selected while counting; then the columns whose ties divide g rewritten
        cnt = _lanes_write(xb, ob, ov, cast_out(gv, gx.dtype.element_ty), start, n_r, rows, d, dmask[None, :],
                           SX[1], INNER, UNROLL, WRITE_R, True, True, MATH)
        fix = (cnt >= 2) & (gv > 0)
        n_f = tl.where(tl.max(fix.to(tl.int32), axis=1) > 0, n_r, 0)
        rows_f = tl.max(n_f, axis=0)
        if rows_f > 0:  # (rare in real data)
            tl.debug_barrier()  # every first-pass store of this program is done before its rewrite
            _lanes_write(xb, ob, ov, _tie_grad(gv, cnt, gx.dtype.element_ty, MATH), start, n_f, rows_f, d, fix,
                         SX[1], INNER, UNROLL, WRITE_R, False, False, MATH)
    else:
        cnt = tl.zeros([BLOCK_S, BLOCK_D], tl.int32)
        for r0 in range(0, rows, UNROLL):
            for u in tl.static_range(UNROLL):
                r = r0 + u
                m = (r < n_r)[:, None] & dmask[None, :]
                v = tl.load(xb[None, :] + (start + r)[:, None] * SX[1], mask=m, other=0.0).to(MATH)
                cnt += (((v != v) | (v == ov)) & m).to(tl.int32)
        _lanes_write(xb, ob, ov, _tie_grad(gv, cnt, gx.dtype.element_ty, MATH), start, n_r, rows, d, dmask[None, :],
                     SX[1], INNER, UNROLL, WRITE_R, False, True, MATH)
    rank, n_long = _ranks(long)
    for j in range(0, n_long):
        seg = tl.max(tl.where(long & (rank == j), segs, -1), axis=0)
        a, b = _segment(offs, soff_o, outer, seg, N, ENDS)
        _segred_segment(g, o, xb, ob, outer, seg, a, b, d, dmask, SG, SO, SX[1], O_LO, I_LO, INNER, BLOCK_L, BLOCK_D,
                        MATH, TWO_PASS, SPLIT_O, SPLIT_I)
    if sblk == 0:
        _zero_rows(ob, 0, _segment(offs, soff_o, outer, 0, N, ENDS)[0], d, dmask, INNER, gx.dtype.element_ty,
                   BLOCK_L, BLOCK_D)
    if sblk == n_sblk - 1:
        _zero_rows(ob, _segment(offs, soff_o, outer, S - 1, N, ENDS)[1], N, d, dmask, INNER, gx.dtype.element_ty,
                   BLOCK_L, BLOCK_D)


@triton.jit
def _segred_chunks_kernel(g, o, x, offs, gx, w, S, N, INNER, n_chunk, n_dblk, SG, SO, SX, O_LO, I_LO, soff_o, n_w,
                          CH: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, MATH: tl.constexpr,
                          ENDS: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr, BLOCK_C: tl.constexpr,
                          PDL: tl.constexpr):
    """The split segment_reduce backward's count pass, after the main kernel, BLOCK_C chunks of CH rows a program:
    each segment longer than CH rows that the chunk map names for a chunk (_chunk_slot) gets its ties over its rows
    in the chunk counted (every block of columns in turn) into the chunk's slot of the workspace w (n_w entries,
    then the map)."""
    c, cmask, outer = _chunk_block(n_chunk, BLOCK_C, PDL)
    for k in tl.static_range(2):
        seg, a, b, take = _chunk_slot(w, n_w, outer, n_chunk, c, cmask, k, offs, soff_o, S, N, CH, ENDS)
        rank, n_take = _ranks(take)
        for j in range(0, n_take):
            cj, sk, _a, _b, lo, hi = _nth(take & (rank == j), c, seg, a, b, N, CH)
            for dblk in range(0, n_dblk):
                d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
                dmask = d < INNER
                oo, oi = _offsets(outer, d, SO, O_LO, I_LO, SPLIT_O, SPLIT_I)
                ov = tl.load(o + oo + sk * SO[1] + oi, mask=dmask).to(MATH)
                xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
                cnt = tl.zeros([BLOCK_D], tl.int32)
                for r0 in range(lo, hi, BLOCK_L):
                    _rows, _m, sel = _selected(x + xo + xi, ov, r0, hi, dmask, SX[1], BLOCK_L, MATH)
                    cnt += tl.sum(sel.to(tl.int32), axis=0)
                tl.store(w + ((outer * n_chunk + cj) * 2 + k) * INNER + d, cnt, mask=dmask)


@triton.jit
def _segred_sum_kernel(g, o, x, offs, gx, w, S, N, INNER, n_chunk, n_dblk, SG, SO, SX, O_LO, I_LO, soff_o, n_w,
                       CH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ENDS: tl.constexpr,
                       BLOCK_C: tl.constexpr,
                       PDL: tl.constexpr):
    """The split segment_reduce backward's second pass, BLOCK_C chunks a program: for each chunk c, the tie counts
    of the segment longer than CH rows that ends in chunk c, if one does (the map's slot 0), over its chunks,
    BLOCK_T chunks a step, into its first chunk's entry (read by no other program)."""
    c, cmask, outer = _chunk_block(n_chunk, BLOCK_C, PDL)
    segs, starts, ends, take = _ending_segments(w, n_w, outer, n_chunk, c, cmask, offs, soff_o, S, N, CH, ENDS)
    rank, n_take = _ranks(take)
    row0 = outer * n_chunk * 2
    lt = tl.arange(0, BLOCK_T)
    for j in range(0, n_take):
        cj, _s, start, _e, _lo, _hi = _nth(take & (rank == j), c, segs, starts, ends, N, CH)
        for dblk in range(0, n_dblk):
            d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
            dmask = d < INNER
            total = tl.zeros([BLOCK_D], tl.int64)
            for c0 in range(start // CH, cj + 1, BLOCK_T):
                cs = c0 + lt
                m = (cs <= cj)[:, None] & dmask[None, :]
                e = _chunk_entry(row0, cs, start, CH)[:, None] * INNER + d[None, :]
                total += tl.sum(tl.load(w + e, mask=m, other=0), axis=0)
            tl.store(w + _chunk_entry(row0, start // CH, start, CH) * INNER + d, total, mask=dmask)


@triton.jit
def _segred_write_kernel(g, o, x, offs, gx, w, S, N, INNER, n_chunk, n_dblk, SG, SO, SX, O_LO, I_LO, soff_o, n_w,
                         CH: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, MATH: tl.constexpr,
                         ENDS: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr, BLOCK_C: tl.constexpr,
                         PDL: tl.constexpr):
    """The split segment_reduce backward's last pass, BLOCK_C chunks a program: the rows of each long segment the
    chunk map names for it (as the count pass) get g, or g / k with the segment's tie count k (_tie_grad), where
    selected, and zero elsewhere."""
    c, cmask, outer = _chunk_block(n_chunk, BLOCK_C, PDL)
    ob = gx + outer * N * INNER
    for k in tl.static_range(2):
        seg, a, b, take = _chunk_slot(w, n_w, outer, n_chunk, c, cmask, k, offs, soff_o, S, N, CH, ENDS)
        rank, n_take = _ranks(take)
        for j in range(0, n_take):
            _c, sk, start, _b, lo, hi = _nth(take & (rank == j), c, seg, a, b, N, CH)
            e = _chunk_entry(outer * n_chunk * 2, start // CH, start, CH)
            zero = tl.zeros([BLOCK_L, BLOCK_D], gx.dtype.element_ty)
            for dblk in range(0, n_dblk):
                d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
                dmask = d < INNER
                oo, oi = _offsets(outer, d, SO, O_LO, I_LO, SPLIT_O, SPLIT_I)
                ov = tl.load(o + oo + sk * SO[1] + oi, mask=dmask).to(MATH)
                go, gi = _offsets(outer, d, SG, O_LO, I_LO, SPLIT_O, SPLIT_I)
                gv = tl.load(g + go + sk * SG[1] + gi, mask=dmask).to(MATH)
                cnt = tl.load(w + e * INNER + d, mask=dmask, other=0).to(tl.int32)
                q = _tie_grad(gv, cnt, gx.dtype.element_ty, MATH)
                xo, xi = _offsets(outer, d, SX, O_LO, I_LO, SPLIT_O, SPLIT_I)
                for r0 in range(lo, hi, BLOCK_L):
                    rows, m, sel = _selected(x + xo + xi, ov, r0, hi, dmask, SX[1], BLOCK_L, MATH)
                    tl.store(ob + rows[:, None] * INNER + d[None, :], tl.where(sel, q[None, :], zero), mask=m)


@triton.jit
def _segred_segment(g, o, xb, ob, outer, seg, start, end, d, dmask, SG, SO, sx_n, O_LO, I_LO, INNER,
                    BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, MATH: tl.constexpr, TWO_PASS: tl.constexpr,
                    SPLIT_O: tl.constexpr, SPLIT_I: tl.constexpr):
    """The segment_reduce backward of rows [start, end) of segment `seg` (columns d: of x at xb, of the result at
    ob), a tile of BLOCK_L rows at a time. A segment longer than a tile: with TWO_PASS, one pass counts the ties and
    a second (from L2) writes; without, one pass writes g where selected while counting, and only columns whose
    ties divide g are rewritten. TWO_PASS holds fewer registers (the short-tile path runs more programs an SM)."""
    oo, oi = _offsets(outer, d, SO, O_LO, I_LO, SPLIT_O, SPLIT_I)
    ov = tl.load(o + oo + seg * SO[1] + oi, mask=dmask).to(MATH)
    go, gi = _offsets(outer, d, SG, O_LO, I_LO, SPLIT_O, SPLIT_I)
    gv = tl.load(g + go + seg * SG[1] + gi, mask=dmask).to(MATH)
    zero = tl.zeros([BLOCK_L, BLOCK_D], ob.dtype.element_ty)
    if end - start <= BLOCK_L:  # one tile: load it once
        rows, m, sel = _selected(xb, ov, start, end, dmask, sx_n, BLOCK_L, MATH)
        cnt = tl.sum(sel.to(tl.int32), axis=0)
        q = _tie_grad(gv, cnt, ob.dtype.element_ty, MATH)
        tl.store(ob + rows[:, None] * INNER + d[None, :], tl.where(sel, q[None, :], zero), mask=m)
    elif TWO_PASS:
        cnt = tl.zeros([BLOCK_D], tl.int32)
        for r0 in range(start, end, BLOCK_L):
            _rows, _m, sel = _selected(xb, ov, r0, end, dmask, sx_n, BLOCK_L, MATH)
            cnt += tl.sum(sel.to(tl.int32), axis=0)
        q = _tie_grad(gv, cnt, ob.dtype.element_ty, MATH)
        for r0 in range(start, end, BLOCK_L):
            rows, m, sel = _selected(xb, ov, r0, end, dmask, sx_n, BLOCK_L, MATH)
            tl.store(ob + rows[:, None] * INNER + d[None, :], tl.where(sel, q[None, :], zero), mask=m)
    else:  # write g where selected while counting the ties; where a column has ties that divide g (k >= 2
        # and g > 0, rare in real data), rewrite its selected elements with g / k (a second read, from L2)
        g1 = cast_out(gv, ob.dtype.element_ty)
        cnt = tl.zeros([BLOCK_D], tl.int32)
        for r0 in range(start, end, BLOCK_L):
            rows, m, sel = _selected(xb, ov, r0, end, dmask, sx_n, BLOCK_L, MATH)
            cnt += tl.sum(sel.to(tl.int32), axis=0)
            tl.store(ob + rows[:, None] * INNER + d[None, :], tl.where(sel, g1[None, :], zero), mask=m)
        fix = (cnt >= 2) & (gv > 0)
        if tl.max(fix.to(tl.int32), axis=0) > 0:
            q = _tie_grad(gv, cnt, ob.dtype.element_ty, MATH)
            tl.debug_barrier()  # every first-pass store of this program is done before its rewrite
            for r0 in range(start, end, BLOCK_L):
                rows, _m, sel = _selected(xb, ov, r0, end, dmask & fix, sx_n, BLOCK_L, MATH)
                tl.store(ob + rows[:, None] * INNER + d[None, :], q[None, :] + zero, mask=sel)


@triton.jit
def _tie_grad(gv, cnt, DT: tl.constexpr, MATH: tl.constexpr):
    """ATen's rule: g, or g / k (k = the tie count, as the dtype) where k >= 2 and g > 0; in the output dtype."""
    k = cast_out(cnt.to(MATH), DT).to(MATH)
    if MATH == tl.float32:
        div = tl.math.div_rn(gv, k)
    else:
        div = gv / k
    q = tl.where((cnt >= 2) & (gv > 0), div, gv)
    return cast_out(q, DT)


# ----------------------------------------------------------------------------------------------- host helpers
_INF_BITS = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80, torch.float32: 0x7F800000,  # the bits of +inf
             torch.float64: 0x7FF0000000000000}



def _runs(sizes, strides) -> list[tuple[int, int]]:
    """The (size, stride) runs that dims of these sizes and strides merge into, outermost first (size-1 dims
    dropped; a run steps evenly over its elements)."""
    runs: list[tuple[int, int]] = []
    for size, stride in zip(sizes, strides, strict=True):
        if size == 1:
            continue
        if runs and runs[-1][1] == stride * size:
            runs[-1] = (runs[-1][0] * size, stride)
        else:
            runs.append((size, stride))
    return runs


def _split(side: list[list[tuple[int, int]]]) -> tuple[int, list[bool]]:
    """For one side (the dims before or after the axis) of several tensors, given as each tensor's runs: the size
    of the low part of a two-part index shared by all (0: no split needed) and which tensors must be copied (more
    than two runs, or two split elsewhere)."""
    lo = next((runs[1][0] for runs in side if len(runs) == 2), 0)
    return lo, [len(runs) > 2 or (len(runs) == 2 and runs[1][0] != lo) for runs in side]


def _strides(runs: list[tuple[int, int]], lo: int) -> tuple[int, int]:
    """(low, high) strides of a side with these runs for the index split hi * lo + lo_part (lo 0: no split)."""
    if len(runs) == 2:
        return runs[1][1], runs[0][1]
    stride = runs[0][1] if runs else 0
    return stride, stride * max(lo, 1)


@dataclass(frozen=True)
class SegmentConfig:
    """The segment kernels' tiles [BLOCK_L rows of a segment, BLOCK_D of the inner dims], warps and register caps,
    and where the segment_reduce backward reads lengths itself (docs/tuning/segment_max.md; H200, N = 2^20, D = 64,
    segments of 16 and of 1-256 rows). Results never depend on them: max, argmax and tie counts are exact."""

    # a tile's columns at most, its elements at most, its rows at most (at most 2^16: the forward packs a row in 16
    # bits); BLOCK_L follows the mean segment length up to these (no recorded sweep)
    bd_max: int = 64
    tile: int = 4096
    bl_max: int = 256
    # tiles of at most this many elements run the kernel's few warps below, larger ones large_warps
    small_tile: int = 2048
    large_warps: int = 4
    # a small tile's warps: the forward 1.2-3.4x faster with one than with four
    fwd_warps: int = 1
    # the forward tile kernel's columns at most (0: bd_max): a tile row of fwd_row_bytes (one 128-byte line, so a
    # warp's loads of a row fill it), or more where segments are too short to fill fwd_min_tile elements a program
    # (unit lengths: 128 columns). Figures and the variants that lost: docs/tuning/segment_max.md, "A line a tile row"
    fwd_row_bytes: int = 128
    fwd_min_tile: int = 128
    # segment_max's backward: lanes (segment, column) a program, and its warps (first values, not searched; the
    # sweep's f32 cases at 0.86-3.6x stock on an H200: docs/tuning/segment_max.md)
    bwd_block: int = 1024
    bwd_warps: int = 4
    # segment_max's backward: 32-bit lane math unless a value can pass this (int32's limit; tests lower it to run
    # the int64 path)
    i32_max: int = I32_MAX
    # the forward's lane kernel, for inner widths up to lanes_max_inner and a mean segment length (rows / segments,
    # known from the shapes) up to lanes_max_mean: lanes (segment, column) a program, the most rows a lane takes (a
    # longer segment takes the program, a tile at a time), warps (first values, not searched). The segment_reduce
    # backward's lane kernel takes the same fields where it reads no lengths itself (docs/tuning/segment_max.md).
    lanes_max_inner: int = 8
    lanes_max_mean: int = 8
    lanes: int = 1024
    lanes_cap: int = 64
    lanes_warps: int = 4
    # (_lane_block) lanes_few lanes a program, a lane a thread: where `lanes` would leave fewer than
    # lanes_min_programs programs, and for mean lengths up to lanes_few_max_mean on grids of at least
    # lanes_few_min_programs (where the tile kernel's program a segment idles; 2048: forward 1.4M x 3 empty-heavy
    # 0.70x stock). Rows a lane takes a loop step (loads in flight together): lanes_unroll with `lanes`,
    # lanes_few_unroll with lanes_few (the forward's: fwd_lanes_few_unroll where a program holds two segments or
    # more; H200, 8 rows: 1M x 40 in segments of 1-63 0.55x -> 0.65x stock, 22M x 3 0.56x -> 0.68x). Figures and the
    # variants that lost: docs/tuning/segment_max.md, "Fewer lanes a program, more rows a step" and "Short tiles,
    # more rows in flight"
    lanes_few: int = 128
    lanes_min_programs: int = 1024
    lanes_few_max_mean: int = 64
    lanes_few_min_programs: int = 2048
    lanes_unroll: int = 1
    lanes_few_unroll: int = 4
    fwd_lanes_few_unroll: int = 8
    # the forward at mean lengths past lanes_max_mean: fwd_lanes_wider lanes a program where the column block is
    # within fwd_lanes_wider_cols (two lanes a thread: more loads in flight; at one column a block would loop to
    # the longest of 256 segments) and its grid keeps lanes_few_min_programs; where a program holds one segment
    # (rows of 128 columns and more), fwd_lanes_one_min_programs programs suffice (docs/tuning/segment_max.md,
    # "Wider lane blocks")
    fwd_lanes_wider: int = 256
    fwd_lanes_wider_cols: tuple[int, int] = (4, 64)
    fwd_lanes_one_min_programs: int = 1024
    # the forward's lane kernel takes a block's lanes as the next (segment, column) pairs in order, none idle,
    # where a [segments, next_pow2(inner)] block holds several segments (with one, a program's loop would run to
    # the longer of two) and would idle at least 1 / k of its lanes: k the first entry at mean lengths up to
    # lanes_max_mean (a row or so a lane, which must pay for the lane's own division and offsets), the second past
    # it; 0: never (docs/tuning/segment_max.md, "Flat lanes")
    fwd_lanes_flat_idle: tuple[int, int] = (3, 8)
    # lanes a warp of the forward's lane kernel: a block of L lanes on min(lanes_warps, L // this) warps, at least
    # one (fewer lanes a program, so that its loop ends with its own segments'); 0: lanes_warps whatever the block.
    # None of tune group segwarp's settings wins over the sweep (docs/tuning/segment_max.md, "Lane blocks on fewer
    # warps")
    fwd_lanes_a_warp: int = 0
    # the lane kernels' tile (elements) for a segment longer than lanes_cap, which takes the program: few programs
    # loop over one, but its registers bound every program's occupancy, where no segment is that long too
    # (docs/tuning/segment_max.md, "Float compares" and "The segment_reduce backward's lane kernel: its long tile
    # and the split")
    lanes_long_tile: int = 256
    # the forward's lane kernel also for inner widths past lanes_max_inner up to this many, but only at mean lengths
    # past lanes_max_mean (at lower means a few long segments hold a program in the long loop, whose tile is a few
    # wide rows). H200, the forward's D >= 40 sweep cases, bf16: 0.33x / 0.86x stock (min / geomean); the variants:
    # docs/tuning/segment_max.md, "Wide rows in the lane kernel"; 1024 (from 256): a program a segment of up to
    # 1024 columns where fwd_lanes_one_min_programs programs remain ("Wider lane blocks")
    fwd_lanes_max_inner: int = 1024
    # ... and at means up to fwd_lanes_unit_mean (unit lengths, or emptier): there the tile kernel's program holds a
    # row, and its programs wait on their loads one row each (H200, 1.7M unit rows of 40: 1.04 -> 0.58 ms, 0.53x ->
    # 0.95x stock; docs/tuning/segment_max.md, "Unit lengths at wide rows")
    fwd_lanes_unit_mean: int = 1
    # rows of a segment side by side in the segment_reduce backward lane kernel's writing pass with lanes_few lanes,
    # by element size (else 1: a lane a (segment, column)), so that a warp's stores fill sectors; 16-bit's 8 (from 4)
    # since that pass also counts (segred_lanes_one_pass); f64's is not measured. Figures: docs/tuning/
    # segment_max.md, "Writing rows side by side" and "One pass in the lane kernel"
    lanes_write_rows: tuple[tuple[int, int], ...] = ((2, 8), (4, 8), (8, 4))
    # the element sizes whose segment_reduce backward lane kernel writes g while counting its short segments' ties
    # (one read of their rows), rewriting only the segments whose ties divide g, where the others count in one pass
    # and write in a second: H200, 5.6M x 3 unit 297 -> 230 us f32, 22M x 3 lengths 1-63 bf16 405 -> 363, the
    # power-law case 4-6% slower; f64 not measured (docs/tuning/segment_max.md, "One pass in the lane kernel")
    segred_lanes_one_pass: frozenset[int] = frozenset({2, 4, 8})
    # the segment_reduce backward's lane kernel also for inner widths up to this many at means up to
    # fwd_lanes_unit_mean (unit lengths, or emptier), where the tile kernel's program a segment holds a row: H200
    # GPU time, 1.7M x 40 unit 1051 -> 911 us; 64, as wider rows split between gains and losses (docs/tuning/
    # segment_max.md, "Wide rows at unit lengths")
    segred_lanes_unit_inner: int = 64
    # the row-parallel forward (a program a tile of rows, whatever the segments) serves problems the tile kernel
    # would give fewer than rows_max_programs programs of at least rows_min_mean rows on average (a few long
    # segments: one program looping over each); where segments are many or short it is slower than the tile
    # kernel (docs/tuning/segment_max.md). Then its tile's elements, its columns at most, warps (first values)
    rows_max_programs: int = 264
    rows_min_mean: int = 1024
    rows_tile: int = 2048
    rows_bd_max: int = 64
    rows_warps: int = 4
    # the split for long segments: where a slice has more rows than a chunk of about split_chunk elements and the
    # problem at least split_min_elems, the forward's and the segment_reduce backward's tile and lane kernels
    # leave segments longer than a chunk to passes a chunk (combining chunks split_combine elements a
    # step). H200, the power-law sweep cases: forward 0.33-0.68x stock -> 1.8-12.5x, segment_reduce backward
    # 1.19-2.49x -> 6.4-24x; the others a few us slower, small problems more (their passes' launches; docs/tuning/
    # segment_max.md, "The split" and "The segment_reduce backward's split")
    split_chunk: int = 16384
    split_min_elems: int = 1 << 20
    split_combine: int = 1024
    # the split passes' programs check split_block chunks' map entries at once and walk only the long segments'
    # chunks among them (most problems have none, and a program a chunk spent a few dependent loads on each), as
    # long as split_min_programs programs stay for problems whose chunks are mostly long ones (figures:
    # docs/tuning/segment_max.md, "The split passes' chunks a program")
    split_block: int = 16
    split_min_programs: int = 2048
    # the tile kernels (forward, segment_reduce backward) take tiles of short_tile elements where segments are
    # shorter than long_mean rows on average, else `tile` (a long segment walks fewer, taller tiles); the
    # segment_reduce backward widens its columns to fill segred_min_tile elements at short means. H200, x stock:
    # the backward's D >= 24 cases with lengths 1-63 0.65-0.90x -> 1.95-2.37x f32, the forward's D = 1000 0.57x ->
    # 0.66x f32, 0.33x -> 0.51x bf16 (docs/tuning/segment_max.md, "Short tiles, more rows in flight")
    short_tile: int = 512
    long_mean: int = 256
    segred_min_tile: int = 128
    # the segment_reduce backward's warps, by element size: f32 1.08x faster with two than one, f16 1.8x slower
    segred_warps: tuple[tuple[int, int], ...] = ((2, 1), (4, 2), (8, 2))
    # the segment_reduce backward by tile class (small tile?, element size). Register caps, for more programs an SM:
    # f16 segments of 16 3.29x -> 3.91x stock with 56; large f32 tiles stay uncapped (they spill)
    segred_maxnreg: tuple[tuple[tuple[bool, int], int], ...] = (((True, 2), 56), ((True, 4), 40), ((False, 2), 64))
    # the classes that write g while counting a segment longer than a tile, where the others count in one pass and
    # write in a second (fewer registers): large f32 tiles, 143.9 us against 197.6 with two passes
    segred_one_pass: frozenset[tuple[bool, int]] = frozenset({(False, 4), (False, 8)})
    # the classes that do not branch over empty segments (their masks do): bf16 segments of 16, 94.2 against 99.4 us
    segred_no_skip: frozenset[tuple[bool, int]] = frozenset({(True, 2)})
    # with lengths, up to lens_max_s segments and while all programs together re-read at most lens_max_reads
    # lengths, each program sums its start from them (no cumsum kernel first): N = 4096, S = 64, 6.8 against 9.4 us
    lens_max_s: int = 1024
    lens_max_reads: int = 1 << 20


CONFIG = Tunable("segment_max", SegmentConfig())


def _blocks(cfg: SegmentConfig, inner: int, n: int, s: int, small_warps: int, cols: int, min_tile: int,
            tile: int) -> tuple[int, int, int]:
    """(BLOCK_L, BLOCK_D, num_warps) from the inner size and the mean segment length: at most `cols` columns, more
    where segments are too short to fill `min_tile` elements a program (0: never), and rows up to `tile` elements;
    `small_warps` for a small tile."""
    mean = max(1, n // max(s, 1))
    bd = min(next_pow2(max(inner, 1)), max(cols, min_tile // next_pow2(mean)))
    bl = max(1, min(next_pow2(mean), max(1, tile // bd), cfg.bl_max))
    return bl, bd, small_warps if bl * bd <= cfg.small_tile else cfg.large_warps


def _tile(cfg: SegmentConfig, n: int, s: int) -> int:
    """The tile kernels' elements a tile for `s` segments of `n` rows: short_tile, or `tile` at long means."""
    return cfg.tile if n >= cfg.long_mean * max(s, 1) else cfg.short_tile


def _norm_axis(op: str, axis, ndim: int) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool) or not -max(ndim, 1) <= axis < max(ndim, 1) or ndim == 0:
        raise InvalidProblem(op, "axis", f"an int in [{-ndim}, {ndim - 1}] for data of rank {ndim}"
                             if ndim else "data of rank >= 1", axis)
    return axis % ndim


def _check_offsets_tensor(op: str, name: str, t, device, *, ndim: int | None = 1) -> None:
    if not isinstance(t, torch.Tensor):
        raise InvalidProblem(op, name, "an int32/int64 tensor", type(t).__name__)
    if t.dtype not in _INDEX_DTYPES:
        raise InvalidProblem(op, name, "an int32/int64 tensor", t.dtype)
    if ndim is not None and t.dim() != ndim:
        raise InvalidProblem(op, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if t.device != device:
        raise InvalidProblem(op, name, f"a tensor on {device} (data's device)", t.device)


def _offsets_stride(offsets: torch.Tensor) -> int:
    """The stride between outer slices of offsets (or lengths) once made contiguous: 0 when one row is shared."""
    return offsets.shape[-1] if offsets.dim() > 1 else 0


# ----------------------------------------------------------------------------------------------- launch plans
@dataclass(frozen=True)
class _Plan:
    """A segment kernel's launch for one problem (shapes, strides, dtypes, device, PDL), made once: after the first
    launch the compiled kernel is called directly, keyed by the kernel, the plan (which fixes every int argument, so its
    specialisation, and the pointers' dtypes), the device and (launch adds it) the pointers' 16-byte alignment."""

    grid: int
    ints: tuple  # the kernel's int arguments (each tensor's strides as one tuple)
    copies: tuple[bool, ...]  # the strided operands made contiguous first (layouts the kernel cannot walk)
    consts: dict
    uid: int
    kernel: object = None  # where an op has several kernels: the one this problem runs
    then: _Plan | None = None  # the next launch after this one (its kernel, grid and arguments)
    work: tuple = ()  # the workspaces the launches share: (elements, dtype) each, made before the first
    picks: tuple[int, ...] | None = None  # the pointers this launch takes of the operands and workspaces (None: all)


_plans = PlanCache("kernels.segment_max._plans")
_plan_uids = itertools.count(1)


def _planned(key, make) -> _Plan:
    plan = _plans.get(key)
    return plan if plan is not None else _plans.remember(key, make())


def _new_plan(grid: int, ints: tuple, copies: tuple, consts: dict, warps: int, pdl: bool, kernel=None,
              **options) -> _Plan:
    """`consts` are the kernel's constexprs before PDL (its last), in parameter order; `options` compile options."""
    return _Plan(grid, ints, copies, launch_consts(consts, warps, pdl=pdl, **options), next(_plan_uids), kernel)


def _layouts(tensors, axis: int) -> tuple[tuple, tuple[bool, ...], dict]:
    """How the kernels walk `tensors` (of one shape on each side of `axis`) in place: each one's strides as a
    tuple (outer, axis, inner, outer high part, inner high part), then the low parts' sizes O_LO and I_LO; which of
    them must be made contiguous first (a side whose dims merge into more than two strided runs, or into two split
    elsewhere than another tensor's: rare); and the SPLIT_O / SPLIT_I constexprs (a side indexed in two parts)."""
    def runs(t):
        return _runs(t.shape[:axis], t.stride()[:axis]), _runs(t.shape[axis + 1:], t.stride()[axis + 1:])

    # (a tensor without elements is never read: walked as contiguous)
    walked = [t if t.numel() else torch.empty(t.shape, device="meta") for t in tensors]
    sides = [runs(t) for t in walked]
    o_lo, o_copy = _split([o for o, _ in sides])
    i_lo, i_copy = _split([i for _, i in sides])
    copies = tuple(a or b for a, b in zip(o_copy, i_copy, strict=True))
    ints: list[tuple[int, ...]] = []
    for t, copy, (o_runs, i_runs) in zip(walked, copies, sides, strict=True):
        if copy:  # walked as the contiguous copy `_walk` makes
            t = torch.empty(t.shape, device="meta")
            o_runs, i_runs = runs(t)
        s_o, s_oh = _strides(o_runs, o_lo)
        s_i, s_ih = _strides(i_runs, i_lo)
        ints.append((s_o, t.stride(axis) if t.dim() else 0, s_i, s_oh, s_ih))
    return (*ints, o_lo or 1, i_lo or 1), copies, {"SPLIT_O": o_lo > 0, "SPLIT_I": i_lo > 0}


def _walk(tensors, plan: _Plan) -> list[torch.Tensor]:
    return [t.contiguous() if copy else t for t, copy in zip(tensors, plan.copies, strict=True)]


def _run(kernel, plan: _Plan, ptrs: tuple, device: int) -> None:
    launch(kernel, (plan.grid,), ptrs, plan.ints, plan.consts, device, (kernel, plan.uid, device))


def _run_all(plan: _Plan, ptrs: tuple, device: int, spare: torch.Tensor) -> None:
    """A plan's launches in turn, on operands `ptrs` and the plan's workspaces, made here (or `spare`, never read,
    for a kernel that takes a workspace it does not use)."""
    args = ptrs + (tuple(alloc.empty((k,), dtype, spare.device) for k, dtype in plan.work) or (spare,))
    while plan is not None:
        _run(plan.kernel, plan, args if plan.picks is None else tuple(args[i] for i in plan.picks), device)
        plan = plan.then


# ----------------------------------------------------------------------------------------------- the ops
def _fwd(data: torch.Tensor, offsets: torch.Tensor, axis: int, op: str):
    n = data.shape[axis]
    s = offsets.shape[-1] - 1
    out_shape = (*data.shape[:axis], s, *data.shape[axis + 1:])
    vals = alloc.empty(out_shape, data.dtype, data.device)
    idxs = alloc.empty(out_shape, torch.int64, data.device)
    if vals.numel() == 0:
        return vals, idxs
    device = data.get_device()
    pdl = pdl_ok(device)

    def make():
        cfg = CONFIG.current
        strides, copies, split = _layouts((data,), axis)
        outer, inner = math.prod(data.shape[:axis]), math.prod(data.shape[axis + 1:])
        bits = {"BITS": _BITS[data.element_size()], "W": 8 * data.element_size(), "INF": _INF_BITS[data.dtype]}
        # the tile kernel's: a line a tile row (fwd_row_bytes), or bd_max columns
        row = cfg.fwd_row_bytes // data.element_size()
        bl, bd, warps = _blocks(cfg, inner, n, s, cfg.fwd_warps, row or cfg.bd_max, cfg.fwd_min_tile if row else 0,
                                _tile(cfg, n, s))
        n_dblk = cdiv(inner, bd)
        soff = _offsets_stride(offsets)
        if n >= cfg.rows_min_mean * s and outer * s * n_dblk < cfg.rows_max_programs:
            return _rows_plan(cfg, bits, strides, copies, split, outer, n, s, inner, soff, pdl)
        ch = _chunk_rows(cfg, outer, n, inner)
        lo, hi = cfg.fwd_lanes_wider_cols
        lanes, unroll = _lane_block(cfg, outer, n, s, inner, cfg.fwd_lanes_max_inner, cfg.fwd_lanes_few_unroll,
                                    (cfg.fwd_lanes_wider,) if lo <= next_pow2(inner) <= hi else (),
                                    cfg.fwd_lanes_one_min_programs)
        if lanes:
            # a lane a (segment, column); long segments a program each, in turn
            bd = next_pow2(inner)
            bs = max(1, lanes // bd)
            idle = cfg.fwd_lanes_flat_idle[n > cfg.lanes_max_mean * s]
            flat = bs > 1 and idle > 0 and (bd - inner) * idle >= bd
            n_sblk = cdiv(s * inner, bs * bd) if flat else cdiv(s, bs)
            (magic,), dmsh = magics((inner,), (inner + bs * bd,), flat)
            a_warp = cfg.fwd_lanes_a_warp
            lane_warps = min(cfg.lanes_warps, max(1, bs * bd // a_warp)) if a_warp else cfg.lanes_warps
            bl = max(1, min(cfg.lanes_long_tile // bd, cfg.bl_max))
            main = _new_plan(outer * n_sblk, (s, n, inner, n_sblk, *strides, soff, *_split_ints(ch, outer, n, inner),
                                              *dmsh), copies,
                             {"BLOCK_S": bs, "BLOCK_D": bd, "CAP": cfg.lanes_cap, "BLOCK_L": bl,
                              "UNROLL": unroll, "MATH": TL_MATH[_runtime.math_dtype(data.dtype)], **bits, **split,
                              "CH": ch, "FLAT": flat, "MAGIC": magic}, lane_warps, pdl,
                             kernel=_segment_max_fwd_lanes_kernel)
        else:
            main = dataclasses.replace(_new_plan(outer * s * n_dblk, (s, n, inner, n_dblk, *strides, soff), copies,
                                                 {"BLOCK_L": bl, "BLOCK_D": bd, **bits, **split, "CH": ch}, warps,
                                                 pdl, kernel=_segment_max_fwd_kernel), picks=(0, 1, 2, 3))
        if not ch:
            return main
        passes = [(_segment_max_fwd_chunks_kernel, "BLOCK_L", {**bits, **split}),
                  (_segment_max_fwd_long_kernel, "BLOCK_T", {**bits, **split})]
        return _split_plan(cfg, main, ch, strides, copies, outer, n, s, inner, soff, pdl, passes, at=2, offs=1,
                           ends=False)

    plan = _planned(("forward", data.shape, data.stride(), data.dtype, offsets.shape, offsets.dtype, axis, device,
                     pdl), make)
    (data,) = _walk((data,), plan)
    offsets = offsets.contiguous()
    _run_all(plan, (data, offsets, vals, idxs), device, idxs)
    return vals, idxs


_KEY_DTYPES = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _rows_block(cfg, inner: int) -> int:
    """The row-parallel kernels' column block (the row kernel's, the split's passes'): at most rows_bd_max."""
    return min(next_pow2(max(inner, 1)), cfg.rows_bd_max)


def _chunk_rows(cfg, outer: int, n: int, inner: int) -> int:
    """The split's chunk (rows: about split_chunk elements of at most rows_bd_max columns, a power of two),
    or 0 (no split) where a slice has no more rows than a chunk or the problem fewer than split_min_elems
    elements: there the longest segment a program can walk costs less than the split's passes."""
    bd = _rows_block(cfg, inner)
    ch = max(1, cfg.rows_tile // bd, cfg.split_chunk // bd)
    return ch if outer * n * inner >= cfg.split_min_elems and n > ch else 0


def _split_ints(ch: int, outer: int, n: int, inner: int) -> tuple[int, int]:
    """The split's (n_chunk, n_w): its chunks a slice, and its partials' entries (0, 0 without the split)."""
    n_chunk = cdiv(n, ch) if ch else 0
    return n_chunk, outer * n_chunk * 2 * inner


def _chunks_a_program(cfg, chunks: int) -> int:
    """The split passes' chunks a program (a power of two): up to split_block, while the passes keep at least
    split_min_programs programs for the work of many long segments."""
    bc = 1
    while 2 * bc <= cfg.split_block and chunks >= 2 * bc * cfg.split_min_programs:
        bc *= 2
    return bc


def _split_plan(cfg, main: _Plan, ch: int, strides: tuple, copies: tuple, outer: int, n: int, s: int, inner: int,
                soff: int, pdl: bool, passes: list, at: int, offs: int, ends: bool) -> _Plan:
    """The split for long segments: the main kernel (`main`, which leaves segments longer than ch rows alone; the
    lane kernels write their chunk map, the tile kernels' is _segment_mark_kernel's, `lanes` segments a program,
    before it), then `passes`, a program BLOCK_C chunks each (_chunks_a_program), rows_bd_max columns a
    block: (kernel, its step's constexpr, its constexprs after BLOCK_D) each, the step BLOCK_L (rows_tile elements, a
    chunk's rows) or BLOCK_T (split_combine elements, a segment's chunks). The workspace: the chunks' partials
    (`at` times n_w entries), then the chunk map, two entries a chunk. The map launch takes the operand `offs`
    (offsets, or with `ends` the segments' ends) and the workspace (after the operands)."""
    bd = _rows_block(cfg, inner)
    n_chunk, n_w = _split_ints(ch, outer, n, inner)
    ints = (s, n, inner, n_chunk, cdiv(inner, bd), *strides, soff, n_w)
    steps = {"BLOCK_L": max(1, cfg.rows_tile // bd), "BLOCK_T": max(1, cfg.split_combine // bd)}
    bc = _chunks_a_program(cfg, outer * n_chunk)
    then = None
    for kernel, step, consts in reversed(passes):
        then = dataclasses.replace(_new_plan(outer * cdiv(n_chunk, bc), ints, copies,
                                             {"CH": ch, step: steps[step], "BLOCK_D": bd, **consts, "BLOCK_C": bc},
                                             cfg.rows_warps, pdl, kernel=kernel), then=then)
    work = ((at * n_w + outer * n_chunk * 2, torch.int64),)
    if main.kernel in (_segment_max_fwd_lanes_kernel, _segment_reduce_max_bwd_lanes_kernel):
        return dataclasses.replace(main, then=then, work=work)
    n_sblk = cdiv(s, cfg.lanes)
    mark = _new_plan(outer * n_sblk, (s, n, n_sblk, soff, n_chunk, at * n_w), copies,
                     {"CH": ch, "BLOCK_S": cfg.lanes, "ENDS": ends}, cfg.rows_warps, pdl, kernel=_segment_mark_kernel)
    return dataclasses.replace(mark, then=dataclasses.replace(main, then=then), work=work,
                               picks=(offs, len(main.picks or ())))


def _rows_plan(cfg, bits: dict, strides: tuple, copies: tuple, split: dict, outer: int, n: int, s: int, inner: int,
               soff: int, pdl: bool) -> _Plan:
    """The row-parallel forward: _segment_max_fwd_rows_kernel over tiles of rows, then
    _segment_max_fwd_fix_kernel for the segments that cross tiles and the empty ones."""
    bd = _rows_block(cfg, inner)
    br = max(1, cfg.rows_tile // bd)
    n_rblk, n_dblk = cdiv(n, br), cdiv(inner, bd)
    n_jobs = max(n_rblk, cdiv(s, br))
    fix = _new_plan(outer * n_jobs * n_dblk, (s, n, inner, n_rblk, n_dblk, n_jobs, *strides, soff), copies,
                    {"BLOCK_R": br, "BLOCK_T": br, "BLOCK_S": br, "BLOCK_D": bd, "BITS": bits["BITS"],
                     "W": bits["W"], **split}, cfg.rows_warps, pdl, kernel=_segment_max_fwd_fix_kernel)
    rows = _new_plan(outer * n_rblk * n_dblk, (s, n, inner, n_rblk, n_dblk, (s - 1).bit_length(), *strides, soff),
                     copies, {"BLOCK_R": br, "BLOCK_D": bd, **bits, **split}, cfg.rows_warps, pdl,
                     kernel=_segment_max_fwd_rows_kernel)
    # the row tiles' partial results (two a tile and column): keys (as the data's bits), rows; the segment of each
    # tile's first row
    partials = outer * n_rblk * 2 * inner
    return dataclasses.replace(rows, then=fix, work=((partials, _KEY_DTYPES[bits["W"] // 8]), (partials, torch.int64),
                                     (outer * n_rblk, torch.int64)))


def _bwd(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, num_rows: int, axis: int):
    s = offsets.shape[-1] - 1
    out_shape = (*grad.shape[:axis], num_rows, *grad.shape[axis + 1:])
    outer = math.prod(grad.shape[:axis])
    inner = math.prod(grad.shape[axis + 1:])
    gx = alloc.zeros(out_shape, grad.dtype, grad.device)
    if s == 0 or outer * inner == 0 or num_rows == 0:
        return gx
    device = grad.get_device()
    pdl = pdl_ok(device)

    def make():
        cfg = CONFIG.current
        strides, copies, split = _layouts((grad,), axis)
        total = outer * s * inner
        soff = _offsets_stride(offsets)
        # 32-bit lanes unless a lane (masked ones too), an offset into grad or offsets can pass 2^31 (gx's offsets
        # are formed from the int64 indices)
        i64 = max(total + cfg.bwd_block, outer * soff + s + 1, 1 + reach(grad.shape, grad.stride())) > cfg.i32_max
        magic, mag = magics((inner, s), (total + cfg.bwd_block,) * 2, not i64)
        return _new_plan(cdiv(total, cfg.bwd_block), (s, num_rows, inner, total, *strides, soff, mag), copies,
                         {"BLOCK": cfg.bwd_block, **split, "MAGIC": magic, "I64": i64}, cfg.bwd_warps, pdl)

    plan = _planned(("backward", grad.shape, grad.stride(), grad.dtype, offsets.shape, offsets.dtype, num_rows,
                     axis, device, pdl), make)
    (grad,) = _walk((grad,), plan)
    _run(_segment_max_bwd_kernel, plan, (grad, indices.contiguous(), offsets.contiguous(), gx), device)
    return gx


def _check_data(op: str, data, axis) -> int:
    check_tensor(op, "data", data)
    return _norm_axis(op, axis, data.dim())


def segment_max_forward(data: torch.Tensor, offsets: torch.Tensor, axis: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment max over CSR `offsets` (S+1 int32/int64, assumed valid: starts at 0, non-decreasing, ends at
    data.size(axis)) along `axis`: (values, indices) with the first argmax (absolute row index); NaN wins; empty
    segments give value 0 and index data.size(axis)."""
    op = "segment_max_forward"
    axis = _check_data(op, data, axis)
    _check_offsets_tensor(op, "offsets", offsets, data.device)
    if offsets.numel() < 1:
        raise InvalidProblem(op, "offsets", "S + 1 >= 1 entries", 0)
    return _fwd(data, offsets, axis, op)


def segment_max_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, num_rows: int,
                         axis: int = 0) -> torch.Tensor:
    """Gradient of segment_max: grad[s] goes to row indices[s] of segment s (exactly one element); every other
    element, and every element of an empty segment, gets 0. Result: grad's shape with num_rows along axis."""
    op = "segment_max_backward"
    check_tensor(op, "grad", grad)
    axis = _norm_axis(op, axis, grad.dim())
    _check_offsets_tensor(op, "offsets", offsets, grad.device)
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int64:
        raise InvalidProblem(op, "indices", "an int64 tensor (segment_max_forward's indices)",
                             getattr(indices, "dtype", type(indices).__name__))
    if tuple(indices.shape) != tuple(grad.shape) or indices.device != grad.device:
        raise InvalidProblem(op, "indices", f"a tensor of grad's shape {tuple(grad.shape)} on {grad.device}",
                             f"{tuple(indices.shape)} on {indices.device}")
    if grad.shape[axis] != offsets.numel() - 1:
        raise InvalidProblem(op, "grad", f"size {offsets.numel() - 1} (the number of segments) along axis {axis}",
                             grad.shape[axis])
    if not isinstance(num_rows, int) or isinstance(num_rows, bool) or num_rows < 0:
        raise InvalidProblem(op, "num_rows", "a non-negative int", num_rows)
    return _bwd(grad, indices, offsets, int(num_rows), axis)


def _segment_reduce_backward(grad: torch.Tensor, output: torch.Tensor, data: torch.Tensor, reduce: str,
                             lengths: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
                             axis: int = 0, initial: float | None = None) -> torch.Tensor:
    """aten::_segment_reduce_backward for reduce="max": PyTorch's tie rule (every element equal to its segment's
    max, or NaN, gets g; with k >= 2 such elements, those with g > 0 get g / k), bit for bit."""
    device = data.get_device() if isinstance(data, torch.Tensor) else -1
    pdl = pdl_ok(device)
    try:  # a plan found under this key skips validation: the key holds everything validation reads
        key = ("segment_reduce", reduce, axis, type(axis), *meta_key((grad, output, data, lengths, offsets)),
               data.stride(), grad.stride(), output.stride(), pdl)
        plan = _plans.get(key)
    except (AttributeError, TypeError):
        key, plan = None, None
    ends = offsets is None  # lengths: the kernel reads them or their cumulative sums (one scan, no concatenation)
    seg = lengths if ends else offsets
    if plan is None:
        s = _check_segment_reduce(grad, output, data, reduce, lengths, offsets, axis)
        if s == 0 or data.numel() == 0:
            return alloc.zeros(data.shape, data.dtype, data.device)
        if torch.compiler.is_compiling():  # not remembered: check_tensor lets negative-bit views pass there
            key = None
        plan = _planned(key, lambda: _segment_reduce_plan(data, seg, s, ends, grad, output, pdl))
    axis = seg.dim() - 1  # as ATen: the segments run along lengths/offsets' last dim (axis itself is not read)
    gx = alloc.empty(data.shape, data.dtype, data.device)
    grad, output, data = _walk((grad, output, data), plan)
    if ends and not plan.consts.get("LENS"):  # lengths the kernel does not read itself: it reads their cumsum
        seg = lengths.cumsum(-1)
    seg = (seg.reshape(-1, seg.shape[-1]) if axis else seg).contiguous()
    _run_all(plan, (grad, output, data, seg, gx), device, gx)
    return gx


def _check_segment_reduce(grad, output, data, reduce, lengths, offsets, axis) -> int:
    """_segment_reduce_backward's validation; the number of segments."""
    op = "_segment_reduce_backward"
    if reduce != "max":
        raise Unsupported(op, "reduce", "'max' (other reductions run stock PyTorch)", repr(reduce))
    check_tensor(op, "data", data)
    check_tensor(op, "grad", grad)
    check_tensor(op, "output", output)
    if (lengths is None) == (offsets is None):
        raise InvalidProblem(op, "lengths/offsets", "exactly one of lengths and offsets", "both" if lengths
                             is not None else "neither")
    seg = offsets if offsets is not None else lengths
    _check_offsets_tensor(op, "offsets" if offsets is not None else "lengths", seg, data.device, ndim=None)
    _norm_axis(op, axis, max(data.dim(), 1))  # (checked as ATen checks it; not read)
    axis = seg.dim() - 1
    if seg.dim() < 1 or data.dim() <= axis or tuple(seg.shape[:-1]) != tuple(data.shape[:axis]):
        raise InvalidProblem(op, "lengths/offsets", f"leading dims equal to data's {tuple(data.shape[:axis])}",
                             tuple(seg.shape))
    s = seg.shape[-1] - (1 if lengths is None else 0)
    expected = (*data.shape[:axis], s, *data.shape[axis + 1:])
    for name, t in (("grad", grad), ("output", output)):
        if tuple(t.shape) != expected or t.dtype != data.dtype or t.device != data.device:
            raise InvalidProblem(op, name, f"shape {expected}, dtype {data.dtype} on {data.device}",
                                 f"{tuple(t.shape)}, {t.dtype} on {t.device}")
    return s


def _lane_block(cfg, outer: int, n: int, s: int, inner: int, max_inner: int, few_unroll: int, wider: tuple = (),
                one_min_programs: int = 0) -> tuple[int, int]:
    """(lanes a program, rows a lane takes a loop step) of the lane kernels (forward, segment_reduce backward) for
    `outer` x `s` segments of `n` rows and `inner` columns, up to `max_inner` (past lanes_max_inner, only at means
    past lanes_max_mean or up to fwd_lanes_unit_mean), `few_unroll` rows a step with lanes_few where a program holds
    two segments or more (else lanes_few_unroll); at means past lanes_max_mean, blocks of `wider` lanes first, each
    where its grid keeps lanes_few_min_programs programs (one_min_programs where a program holds one segment, if
    given); (0, 0) where the tile kernel serves. From the shapes alone (a plan's descriptor)."""
    wide_short = cfg.fwd_lanes_unit_mean * s < n <= cfg.lanes_max_mean * s
    if inner > max_inner or inner > cfg.lanes_max_inner and wide_short:
        return 0, 0
    bd = next_pow2(inner)

    def programs(lanes: int) -> int:
        return outer * cdiv(s, max(1, lanes // bd))

    def few(lanes: int) -> tuple[int, int]:
        return lanes, few_unroll if lanes >= 2 * bd else cfg.lanes_few_unroll
    if n <= cfg.lanes_max_mean * s:
        return (cfg.lanes, cfg.lanes_unroll) if programs(cfg.lanes) >= cfg.lanes_min_programs else few(cfg.lanes_few)
    if n <= cfg.lanes_few_max_mean * s:
        for lanes in (*wider, cfg.lanes_few):
            least = one_min_programs if one_min_programs and lanes <= bd else cfg.lanes_few_min_programs
            if programs(lanes) >= least:
                return few(lanes)
    return 0, 0


def _segment_reduce_plan(data, seg, s: int, ends: bool, grad, output, pdl: bool) -> _Plan:
    """The segment_reduce backward's launch for a validated problem of `s` segments (`seg`: lengths or offsets)."""
    cfg = CONFIG.current
    axis = seg.dim() - 1
    n = data.shape[axis]
    outer, inner = math.prod(data.shape[:axis]), math.prod(data.shape[axis + 1:])
    strides, copies, split = _layouts((grad, output, data), axis)
    esize = data.element_size()
    bl, bd, warps = _blocks(cfg, inner, n, s, dict(cfg.segred_warps)[esize], cfg.bd_max, cfg.segred_min_tile,
                            _tile(cfg, n, s))
    n_dblk = cdiv(inner, bd)
    unit = n <= cfg.fwd_lanes_unit_mean * s  # (the forward's rule for its wide lanes at unit lengths)
    max_inner = max(cfg.lanes_max_inner, cfg.segred_lanes_unit_inner if unit else 0)
    lanes, unroll = _lane_block(cfg, outer, n, s, inner, max_inner, cfg.lanes_few_unroll)
    ch = _chunk_rows(cfg, outer, n, inner)
    lens = ends and not ch and _reads_lengths(cfg, data, axis, s)  # (the split's passes read the ends)
    if lens:
        lanes, unroll = 0, 0
    math_dt = TL_MATH[_runtime.math_dtype(data.dtype)]
    soff = _offsets_stride(seg)
    write_rows = dict(cfg.lanes_write_rows).get(esize, 1) if lanes == cfg.lanes_few else 1
    if lanes:
        # a lane a (segment, column), as the forward's lane kernel; long segments a program each, in turn (those
        # longer than a chunk: the split's)
        bd = next_pow2(inner)
        bl = max(1, min(cfg.lanes_long_tile // bd, cfg.bl_max))
        n_sblk = cdiv(s, max(1, lanes // bd))
        consts = {"BLOCK_S": max(1, lanes // bd), "BLOCK_D": bd, "CAP": cfg.lanes_cap, "BLOCK_L": bl,
                  "UNROLL": unroll, "WRITE_R": write_rows, "MATH": math_dt, "ENDS": ends,
                  "TWO_PASS": (bl * bd <= cfg.small_tile, esize) not in cfg.segred_one_pass,
                  "ONE_PASS": esize in cfg.segred_lanes_one_pass, **split, "CH": ch}
        main = _new_plan(outer * n_sblk, (s, n, inner, n_sblk, *strides, soff, *_split_ints(ch, outer, n, inner)),
                         copies, consts, cfg.lanes_warps, pdl, kernel=_segment_reduce_max_bwd_lanes_kernel)
    else:
        tiles = (bl * bd <= cfg.small_tile, esize)  # the tile class
        consts = {"BLOCK_L": bl, "BLOCK_D": bd, "MATH": math_dt, "ENDS": ends,
                  "LENS": next_pow2(s) if lens else 0, "TWO_PASS": tiles not in cfg.segred_one_pass,
                  "SKIP_EMPTY": tiles not in cfg.segred_no_skip, **split, "CH": ch}
        cap = dict(cfg.segred_maxnreg).get(tiles)
        main = dataclasses.replace(  # (no workspace: the map kernel writes the map)
            _new_plan(outer * s * n_dblk, (s, n, inner, n_dblk, *strides, soff), copies, consts, warps, pdl,
                      kernel=_segment_reduce_max_bwd_kernel, **({"maxnreg": cap} if cap else {})),
            picks=(0, 1, 2, 3, 4))
    if not ch:
        return main
    # the split: tie counts a chunk, their sums a segment, then the rows written
    rows = {"MATH": math_dt, "ENDS": ends, **split}
    passes = [(_segred_chunks_kernel, "BLOCK_L", rows), (_segred_sum_kernel, "BLOCK_T", {"ENDS": ends}),
              (_segred_write_kernel, "BLOCK_L", rows)]
    return _split_plan(cfg, main, ch, strides, copies, outer, n, s, inner, soff, pdl, passes, at=1, offs=3, ends=ends)


def _reads_lengths(cfg: SegmentConfig, data: torch.Tensor, axis: int, s: int) -> bool:
    """Whether the kernel sums each segment's start from the lengths itself (no cumsum: one launch and its host
    time less) rather than reading the lengths' cumsum: where S is small and all programs together re-read at
    most cfg.lens_max_reads lengths."""
    if not 0 < s <= cfg.lens_max_s:
        return False
    programs = math.prod(data.shape[:axis]) * s * cdiv(math.prod(data.shape[axis + 1:]), cfg.bd_max)
    return programs * next_pow2(s) <= cfg.lens_max_reads


# ----------------------------------------------------------------------------------------------- user API
# check=True reads its figures back in one synchronisation, from as few launches as give them: the minimum step of
# offsets or ids, the minimum and sum of lengths, each form's ends, gathered into one copy (docs/tuning/
# segment_max.md counts them)
def _min_step(t: torch.Tensor) -> torch.Tensor:
    """The smallest difference between neighbours of 1-D `t` (negative where it decreases) as a 1-element tensor,
    empty for one entry. In int64: an int32 difference can wrap (-2^31 after 2^31 - 1 reads as a step of +1)."""
    return t.long().diff().amin(0, keepdim=True) if t.numel() > 1 else t.new_empty(0, dtype=torch.int64)


def _read_back(*parts: torch.Tensor) -> list[int]:
    """1-D tensors of at most one element read back to the host in one copy."""
    return torch.cat(parts).tolist()


def _offsets_from(op: str, n: int, device, offsets, lengths, segment_ids, num_segments, check: bool):
    given = [name for name, v in (("offsets", offsets), ("lengths", lengths), ("segment_ids", segment_ids))
             if v is not None]
    if len(given) != 1:
        raise InvalidProblem(op, "offsets/lengths/segment_ids", "exactly one of them", given or "none")
    if num_segments is not None and (not isinstance(num_segments, int) or isinstance(num_segments, bool)
                                     or num_segments < 0):
        raise InvalidProblem(op, "num_segments", "a non-negative int", num_segments)
    if offsets is not None:
        _check_offsets_tensor(op, "offsets", offsets, device)
        if offsets.numel() < 1:
            raise InvalidProblem(op, "offsets", "S + 1 >= 1 entries (CSR offsets)", "an empty tensor")
        if check:
            first, last, *step = _read_back(offsets[:1], offsets[-1:], _min_step(offsets))
            mono = not step or step[0] >= 0
            if first != 0 or last != n or not mono:
                raise InvalidProblem(op, "offsets", f"non-decreasing offsets from 0 to N = {n}",
                                     f"first {first}, last {last}" + ("" if mono else ", decreasing somewhere"))
        result = offsets
    elif lengths is not None:
        _check_offsets_tensor(op, "lengths", lengths, device)
        if check and lengths.numel():
            least, total = _read_back(lengths.amin(0, keepdim=True), lengths.sum(0, keepdim=True, dtype=torch.int64))
            neg = least < 0
            if neg or total != n:
                raise InvalidProblem(op, "lengths", f"non-negative lengths summing to N = {n}",
                                     f"sum {total}" + (", a negative length" if neg else ""))
        elif check and n != 0:
            raise InvalidProblem(op, "lengths", f"non-negative lengths summing to N = {n}", "no segments")
        result = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), lengths.long().cumsum(0)])
    else:
        _check_offsets_tensor(op, "segment_ids", segment_ids, device)
        if segment_ids.numel() != n:
            raise InvalidProblem(op, "segment_ids", f"one id per row (N = {n})", segment_ids.numel())
        if num_segments is None:
            num_segments = int(segment_ids[-1].item()) + 1 if n else 0
        if check and n:
            lo, hi, *step = _read_back(*(t.view(1) for t in torch.aminmax(segment_ids)), _min_step(segment_ids))
            if step and step[0] < 0:
                raise InvalidProblem(op, "segment_ids", "sorted (non-decreasing) ids; sort data and ids first, or "
                                     "pass check=False to promise they are", "unsorted ids")
            if lo < 0 or hi >= num_segments:
                raise InvalidProblem(op, "segment_ids", f"ids in [0, {num_segments})", f"ids in [{lo}, {hi}]")
        bounds = torch.arange(num_segments + 1, device=device, dtype=segment_ids.dtype)
        result = torch.searchsorted(segment_ids.contiguous(), bounds)
    if num_segments is not None and result.numel() - 1 != num_segments:
        raise InvalidProblem(op, "num_segments", f"{result.numel() - 1} (the segments given)", num_segments)
    return result


class _SegmentMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, data, offsets, axis):
        from .. import ops  # the compile-aware entry points (custom ops while torch.compile traces)

        vals, idxs = ops.segment_max_forward(data, offsets, axis)
        ctx.save_for_backward(idxs, offsets)
        ctx.num_rows, ctx.axis = data.shape[axis], axis
        ctx.mark_non_differentiable(idxs)
        return vals, idxs

    @staticmethod
    def backward(ctx, g, _gi):
        idxs, offsets = ctx.saved_tensors
        if g is None:
            return None, None, None
        if torch.is_grad_enabled():  # create_graph: a differentiable composite of the same map
            return _backward_composite(g, idxs, ctx.num_rows, ctx.axis), None, None
        if g.dtype not in FLOAT_DTYPES or g.device.type != DEVICE_TYPE:
            return _backward_composite(g, idxs, ctx.num_rows, ctx.axis), None, None
        from .. import ops

        return ops.segment_max_backward(g, idxs, offsets, ctx.num_rows, ctx.axis), None, None


def _backward_composite(g: torch.Tensor, idxs: torch.Tensor, num_rows: int, axis: int) -> torch.Tensor:
    """grad_data = scatter of g to rows idxs, each g as it is (-0.0 too: a scatter, not a sum onto zeros; the rows
    are distinct), empty segments (idx == num_rows) into one extra row, dropped; differentiable."""
    shape = (*g.shape[:axis], num_rows, *g.shape[axis + 1:])
    if num_rows == 0 or g.numel() == 0:
        return g.new_zeros(shape)
    extra = (*g.shape[:axis], num_rows + 1, *g.shape[axis + 1:])
    return g.new_zeros(extra).scatter(axis, idxs, g).narrow(axis, 0, num_rows).contiguous()


def segment_max(data: torch.Tensor, offsets: torch.Tensor | None = None, *, lengths: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None, num_segments: int | None = None, axis: int = 0,
                check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Max of each segment of `data` along `axis`, and the index of its first maximum: `(values, indices)`, like
    `torch.max(dim=...)`, with autograd (the gradient of values[s] goes to exactly data[indices[s]]).

    Segments are given by exactly one of: CSR `offsets` (S+1 entries, from 0 to N = data.size(axis),
    non-decreasing), `lengths` (S non-negative entries summing to N) or `segment_ids` (one int per row, sorted
    non-decreasing, in [0, num_segments); `num_segments` defaults to the last id + 1 and may add trailing empty
    segments). `indices` are absolute row indices along `axis` (int64). NaN counts as larger than any number (a
    segment holding NaN gives NaN and the first NaN's index). An empty segment gives value 0 and index N (out of
    range on purpose) and no gradient.

    `check=True` (default) verifies the segment description on the device before any kernel runs (one
    synchronisation) and raises `InvalidProblem` for offsets that do not run from 0 to N or decrease, lengths
    that are negative or do not sum to N, and unsorted or out-of-range segment ids. With `check=False` that is a
    precondition: invalid segments give unspecified values (the kernels still never touch memory out of bounds);
    unsorted ids in particular are not grouped - sort them (and data) first. Inside `torch.compile` the check is
    skipped (it needs a host synchronisation), and `segment_ids` need `num_segments`."""
    op = "segment_max"
    axis = _check_data(op, data, axis)
    check = check and not torch.compiler.is_compiling()  # the check synchronises; a compiled graph cannot
    offs = _offsets_from(op, data.shape[axis], data.device, offsets, lengths, segment_ids, num_segments, check)
    return _SegmentMax.apply(data, offs, axis)


# ----------------------------------------------------------------------------------------------- references
def _segment_ids(offsets: torch.Tensor, n: int) -> torch.Tensor:
    lengths = offsets.diff()
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths, output_size=n)


def _reference_forward(data: torch.Tensor, offsets: torch.Tensor, axis: int = 0):
    """A torch composite: stock segment_reduce's max, then the first row holding it (or the first NaN)."""
    axis = axis % data.dim()
    n = data.shape[axis]
    # segment_reduce wants offsets with data's leading dims (the segments run along their last dim)
    per_outer = offsets.long().expand(*data.shape[:axis], offsets.numel()).contiguous()
    vals = torch.segment_reduce(data, "max", offsets=per_outer, axis=axis, unsafe=True)
    lengths = offsets.long().diff()
    shape = [1] * data.dim()
    shape[axis] = -1
    empty = (lengths == 0).view(shape)
    ids = _segment_ids(offsets.long(), n)
    per_row = vals.index_select(axis, ids)
    match = (data == per_row) | (torch.isnan(data) & torch.isnan(per_row))
    rows = torch.arange(n, device=data.device).view(shape).expand_as(data)
    cand = torch.where(match, rows, torch.full_like(rows, n))
    idx = torch.full(vals.shape, n, dtype=torch.int64, device=data.device)
    idx = idx.scatter_reduce(axis, ids.view(shape).expand_as(data), cand, "amin", include_self=True)
    idx = torch.where(empty, torch.full_like(idx, n), idx)
    vals = data.gather(axis, idx.clamp(max=max(n - 1, 0))) if n else vals
    vals = torch.where(empty, torch.zeros((), dtype=vals.dtype, device=vals.device), vals)
    return vals, idx


def _reference_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, num_rows: int,
                        axis: int = 0) -> torch.Tensor:
    return _backward_composite(grad, indices, num_rows, axis % grad.dim())


def _fake_forward(data, offsets, axis=0):
    axis = axis % data.dim()
    shape = (*data.shape[:axis], offsets.shape[-1] - 1, *data.shape[axis + 1:])
    return data.new_empty(shape), data.new_empty(shape, dtype=torch.int64)


def _fake_backward(grad, indices, offsets, num_rows, axis=0):
    axis = axis % grad.dim()
    return grad.new_empty((*grad.shape[:axis], num_rows, *grad.shape[axis + 1:]))


def _fake_segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    return data.new_empty(data.shape)  # contiguous, as the kernel writes it (empty_like would keep data's layout)


# ----------------------------------------------------------------------------------------------- cases
_SIZES = {"tiny": (256, 16), "small": (2048, 8), "check": (1 << 16, 64), "large": (1 << 20, 64)}


def _offset_sets(n: int, device, generator) -> list[tuple[str, torch.Tensor]]:
    fixed = torch.arange(0, n + 1, 16, device=device)
    if fixed[-1] != n:
        fixed = torch.cat([fixed, torch.tensor([n], device=device)])
    lens = torch.randint(1, 257, (n,), generator=generator)
    cum = torch.cumsum(lens, 0)
    cut = int((cum <= n).sum())
    lens = lens[:cut].tolist()
    if sum(lens) < n:
        lens.append(n - sum(lens))
    rand = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=device)
    return [("len 16", fixed), ("len 1-256", rand)]


def _make(device, dtype, size):
    n, d = _SIZES[size]
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(n, d, generator=gen).to(dtype).to(device)
    return n, d, data, _offset_sets(n, device, gen)


def _fwd_cases(device, dtype, size: str) -> list[Case]:
    n, d, data, sets = _make(device, dtype, size)
    el = data.element_size()
    # (minimum bytes: data and the offsets read, values and int64 indices written)
    return [Case(f"N={n} D={d} {label}", (data, offs, 0), {},
                 bytes=n * d * el + (offs.numel() - 1) * d * (el + 8) + offs.numel() * offs.element_size(),
                 elements=n * d) for label, offs in sets]


def _bwd_cases(device, dtype, size: str) -> list[Case]:
    n, d, data, sets = _make(device, dtype, size)
    el = data.element_size()
    out = []
    for label, offs in sets:
        _vals, idx = _fwd(data, offs, 0, "cases")
        g = torch.randn(idx.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
        out.append(Case(f"N={n} D={d} {label}", (g, idx, offs, n, 0), {},
                        bytes=n * d * el + idx.numel() * (el + 8) + offs.numel() * offs.element_size(),
                        elements=n * d))
    return out


def _segred_cases(device, dtype, size: str) -> list[Case]:
    n, d, data, sets = _make(device, dtype, size)
    el = data.element_size()
    out = []
    if size != "large":  # ties, so that the tie rule is exercised
        data = (data * 2).round() / 2
    for label, offs in sets:
        lengths = offs.diff()
        output = _stock_segment_reduce_max(data, lengths)
        g = torch.randn(output.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
        out.append(Case(f"N={n} D={d} {label}", (g, output, data, "max"), {"lengths": lengths},
                        bytes=2 * n * d * el + 2 * output.numel() * el + lengths.numel() * lengths.element_size(),
                        elements=n * d))
    return out


def _stock_segment_reduce_max(data, lengths):
    with dispatch.use(False):
        return torch.segment_reduce(data, "max", lengths=lengths)


def _segred_examples(device, dtype) -> dict:
    data = torch.randn(10, 3, device=device, dtype=dtype)
    lengths = torch.tensor([3, 0, 7], device=device)
    output = _stock_segment_reduce_max(data, lengths)
    return {"_segment_reduce_backward": ((torch.ones_like(output), output, data, "max"), {"lengths": lengths})}


def _segments(d: Draw, edge: str, lead: tuple = ()) -> torch.Tensor:
    """Lengths (int64, CPU) of 0 to 5 segments of 0 to 5 rows, one row of them for each index of `lead`, every row
    summing to the same N (the last segment takes up the difference); "empty": no rows at all, or no segments."""
    s = 0 if edge == "empty" and d.rng.random() < 0.5 else d.rng.randint(1, 5)
    lengths = d.ints(0, 1 if edge == "empty" else 6, (*lead, s))
    if s:
        lengths[..., -1] += lengths.sum(-1).max() - lengths.sum(-1)
    return lengths


def _data(d: Draw, shape) -> torch.Tensor:
    """Values on the k/8 grid (ties, so the first argmax and the tie rule matter), some NaN, +-inf, -0.0."""
    x = d.values(shape, "grid")
    if x.numel() and d.rng.random() < 0.5:
        for _ in range(d.rng.randint(1, 3)):
            x.view(-1)[d.rng.randrange(x.numel())] = d.rng.choice((math.nan, math.inf, -math.inf, -0.0))
    return x


def _fwd_samples(rng, device, dtype):
    """Data of 0 to 2 other dims (sizes 1 to 4) around the segment axis, int32 or int64 offsets, empty segments."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        other = d.sizes(rng.randint(0, 2), "any", hi=4)
        axis = rng.randint(0, len(other))
        lengths = _segments(d, edge)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        data = d.place(_data(d, (*other[:axis], int(offsets[-1]), *other[axis:])))
        axis_arg = axis - data.dim() if rng.random() < 0.5 else axis
        offsets = offsets.to(device, rng.choice((torch.int32, torch.int64)))
        yield Case(describe(data=data, offsets=offsets.tolist(), axis=axis_arg), (data, offsets, axis_arg))


def _bwd_samples(rng, device, dtype):
    """The forward samples' problems, with the reference forward's indices and a grad in any layout."""
    d = Draw(rng, device, dtype)
    for case in _fwd_samples(rng, device, dtype):
        data, offsets, axis = case.args
        _, idx = _standard_strides(_reference_forward)(data, offsets, axis)
        g = d.tensor(tuple(idx.shape))
        yield Case(describe(grad=g, offsets=offsets.tolist(), num_rows=data.shape[axis], axis=axis),
                   (g, idx, offsets, data.shape[axis], axis))


def _segred_samples(rng, device, dtype):
    """Lengths or offsets (int32 or int64) with up to two leading dims (one row of segments for each), trailing
    dims, empty segments; output stock's max, or random values (any output is a valid problem); `initial` too."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        lead = tuple(d.sizes(rng.choice((0, 0, 1, 2)), "any", hi=3))
        axis = len(lead)
        lengths = _segments(d, edge, lead)
        trail = d.sizes(rng.choice((0, 1, 1, 2)), "any", hi=3)
        data = d.place(_data(d, (*lead, int(lengths.sum(-1).max()) if lengths.numel() else 0, *trail)))
        seg = {"lengths": lengths}
        if rng.random() < 0.4:
            seg = {"offsets": torch.cat([lengths.new_zeros((*lead, 1)), lengths.cumsum(-1)], -1)}
        seg = {k: v.to(device, rng.choice((torch.int32, torch.int64))) for k, v in seg.items()}
        initial = rng.choice((None, None, 0.0, -1.0, 100.0))
        out_shape = (*lead, lengths.shape[-1], *trail)
        if rng.random() < 0.2 or data.numel() == 0:
            output = d.tensor(out_shape, "grid")
        else:
            with dispatch.use(False):
                output = d.place(torch.segment_reduce(data, "max", axis=axis, unsafe=True, initial=initial, **seg))
        g = d.tensor(out_shape)
        kwargs = {**seg, "axis": axis, "initial": initial}
        yield Case(describe(grad=g, output=output, data=data, **{k: v.tolist() for k, v in seg.items()},
                            axis=axis, initial=initial), (g, output, data, "max"), kwargs)


def _standard_strides(fn):
    """`fn` on copies of its tensor arguments with standard strides: stock segment_reduce and its backward read a
    tensor that PyTorch counts as contiguous through its literal strides, so a size-1 dim of another stride (the
    samples' strided layouts make them) misplaces their reads (torch 2.13, CPU)."""
    def standard(x):
        return x.clone(memory_format=torch.contiguous_format) if isinstance(x, torch.Tensor) else x

    def reference(*args, **kwargs):
        return fn(*map(standard, args), **{k: standard(v) for k, v in kwargs.items()})
    return reference


@_standard_strides
def _segred_reference(grad, output, data, reduce, **kwargs):
    """Stock's backward, but zeros where data is empty (where ATen's CPU kernel crashes the process)."""
    if data.numel() == 0:
        return torch.zeros(data.shape, dtype=data.dtype, device=data.device)
    return torch.ops.aten._segment_reduce_backward(grad, output, data, reduce, **kwargs)


def _fwd_errors(device):
    x = torch.randn(6, 3, device=device)
    offs = torch.tensor([0, 2, 6], device=device)
    return [refuse("float offsets", InvalidProblem, "offsets", x, offs.float()),
            refuse("2-D offsets", InvalidProblem, "offsets", x, offs.view(1, 3)),
            refuse("empty offsets", InvalidProblem, "offsets", x, offs[:0]),
            refuse("axis out of range", InvalidProblem, "axis", x, offs, 2),
            refuse("int data", Unsupported, "data", x.int(), offs)]


def _bwd_errors(device):
    g = torch.randn(2, 3, device=device)
    idx = torch.zeros(2, 3, dtype=torch.int64, device=device)
    offs = torch.tensor([0, 2, 6], device=device)
    return [refuse("int32 indices", InvalidProblem, "indices", g, idx.int(), offs, 6),
            refuse("indices of another shape", InvalidProblem, "indices", g, idx[:1], offs, 6),
            refuse("grad of another segment count", InvalidProblem, "grad", g[:1], idx[:1], offs, 6),
            refuse("negative num_rows", InvalidProblem, "num_rows", g, idx, offs, -1),
            refuse("axis out of range", InvalidProblem, "axis", g, idx, offs, 6, 3)]


def _segred_errors(device):
    data = torch.randn(6, 3, device=device)
    lengths = torch.tensor([2, 4], device=device)
    g = torch.randn(2, 3, device=device)
    return [refuse("reduce sum", Unsupported, "reduce", g, g, data, "sum", lengths=lengths),
            refuse("both lengths and offsets", InvalidProblem, "lengths/offsets", g, g, data, "max",
                   lengths=lengths, offsets=torch.tensor([0, 2, 6], device=device)),
            refuse("float lengths", InvalidProblem, "lengths", g, g, data, "max", lengths=lengths.float()),
            refuse("grad of another shape", InvalidProblem, "grad", g[:1], g, data, "max", lengths=lengths),
            refuse("output of another dtype", InvalidProblem, "output", g, g.double(), data, "max",
                   lengths=lengths),
            refuse("axis out of range", InvalidProblem, "axis", g, g, data, "max", lengths=lengths, axis=2)]


# ----------------------------------------------------------------------------------------------- registration
def _segment_reduce_backward_aten(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """aten::_segment_reduce_backward at the backend key (below autograd, so a differentiable call keeps stock's
    graph): reduce="max" on float tensors of one dtype runs gradkern's kernel; anything else (other reductions,
    dtypes) returns NotImplemented, which runs ATen's own kernel."""
    if reduce != "max" or data.dtype not in FLOAT_DTYPES or grad.dtype != data.dtype or output.dtype != data.dtype:
        return NotImplemented
    return _segment_reduce_backward(grad, output, data, reduce, lengths, offsets, axis, initial)


def _bench_segment_reduce_max(data, offsets, axis=0):
    """The bench baseline: stock torch.segment_reduce(..., "max") over the same CSR offsets (values only; it
    has no argmax output, so it moves less than segment_max_forward, which also writes the indices)."""
    return torch.segment_reduce(data, "max", offsets=offsets.to(torch.int64), axis=axis)


register_op("segment_max_forward", exact=True, reference=_standard_strides(_reference_forward), cases=_fwd_cases,
            fake=_fake_forward, baseline=_bench_segment_reduce_max, samples=_fwd_samples,
            errors=_fwd_errors)(segment_max_forward)
register_op("segment_max_backward", exact=True, reference=_reference_backward, cases=_bwd_cases,
            fake=_fake_backward, samples=_bwd_samples, errors=_bwd_errors)(segment_max_backward)
register_op("_segment_reduce_backward", aten={"_segment_reduce_backward": _segment_reduce_backward_aten},
            exact=True, reference=_segred_reference, cases=_segred_cases, aten_examples=_segred_examples,
            fake=_fake_segment_reduce_backward, samples=_segred_samples, errors=_segred_errors,
            route_doc="gradkern for reduce=\"max\" (H200 sweep: less GPU time than stock's kernel on every f32 "
                      "case and all bf16 cases but one, 0.93x, and less host time replayed: "
                      "docs/tuning/segment_max.md); stock for the other reductions")(_segment_reduce_backward)
