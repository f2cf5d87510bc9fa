"""Max pooling backward with indices: max_pool3d, adaptive_max_pool2d and adaptive_max_pool3d. A gather, no atomics.

The forward records, for each output o of an (n, c) plane (volume), the flat index over (D, H, W) of the input it
took (`indices[o]`, int64; (H, W) for 2d). The gradient of input i is the sum of g[o] over the outputs o whose
windows hold i and whose index is i's. ATen's CUDA kernels scatter each g[o] to grad_input[indices[o]] with
atomicAdd instead: max_pool3d's and adaptive_max_pool2d's raise under torch.use_deterministic_algorithms(True);
adaptive_max_pool3d's does not, and is silently nondeterministic where a size does not divide (overlapping
windows).

Along each dim the outputs whose windows hold input i form a short range, so each grad_input element visits its
few candidate outputs in one fixed order (od, oh, ow ascending), loads their indices, adds g[o] where the index is
its own (fp32 accumulation for f16/bf16/f32, fp64 for f64) and is written once:

* max_pool3d (kernel k, stride s, padding p, dilation d, span = (k - 1) d): output o's window is the inputs
  o s - p + j d, j in [0, k). It holds i iff o s <= i + p <= o s + span and d divides i + p - o s: the o in
  [ceil((i + p - span) / s), floor((i + p) / s)] within [0, O) (ceil(k / s) of them at most without dilation) with
  o s = i + p (mod d). Those form an arithmetic progression of step d / gcd(s, d) (none unless gcd(s, d) divides
  i + p), whose first term takes the inverse of s / gcd mod that step (a host constant): at most k a dim.
  Where span < s (k <= s without dilation: MaxPool3d(2), anisotropic (1, 2, 2)), one window at most holds i, the
  one of o = (i + p) // s, if i's offset in it is a tap: a "lean" dim, one candidate.
* adaptive pooling: output o's window is [floor(o I / O), ceil((o + 1) I / O)); the outputs holding i are
  [floor(i O / I), ceil((i + 1) O / I)), at most `adaptive_pool.max_outputs` a dim (exactly one where I divides
  by O: ResNet's 56 -> 7).

Where an input has several candidates and the outputs are few (overlapping windows: MaxPool3d(3, 2, 1), adaptive
sizes that do not divide), the same sums come from the outputs' side (`_outputs_side_kernel`): grad_input is zeroed,
and output o, whose index names input i, walks i's candidates as above (same order, same accumulator, so the same
bits) and writes the sum if it is the first candidate whose index is i: one writer an input, no atomics, and a
candidate walk an output instead of an input.

The forward's indices lie in their output's window, so a candidate's index test is all that selects. Indices that
do not are never followed: an index outside its window, or outside the plane, adds nothing anywhere, and no address
is formed from an index (ATen's kernels add g[o] wherever indices[o] points, out of bounds included). The forward
itself gives one such index: for a window that holds no input (a dilation stepping over the whole input, which
ATen accepts), -inf and the window's first grid point past the padding, outside it; that gradient goes nowhere.
grad_output and indices are read in place through their strides (stock's adaptive_max_pool3d_backward, CPU and
CUDA, reads indices as if contiguous, whatever their strides).

grad_input takes ATen's layout: max_pool3d channels_last_3d where a 5-D self suggests it, adaptive 2d channels_last
where a 4-D self suggests it, contiguous otherwise (adaptive 3d always). An unbatched max_pool3d gets contiguous
strides, as ATen's meta function declares (what compiled graphs assume); ATen's kernels disagree there: its CUDA
source resizes grad_input to a channels_last_3d (1, C, D, H, W) where self seen so is channels_last_3d-contiguous,
and its CPU kernel (torch 2.13) follows grad_output's layout.

A program owns a [BA, BB] tile of grad_input: BA consecutive lines (n, c, d, h) by a block of BB columns w
("lines", W contiguous), or, for a channels_last grad_input of several channels, BA consecutive positions
(n, d, h, w) by a block of BB channels ("channels": C contiguous, so stores and channels_last loads coalesce). A
tile spans planes and batch entries where they are small (a 7 x 7 plane pooled to (1, 1), a deep 3-D layer's 4^3
volume), so programs stay full; past 2^30 tiles each program takes several in turn. Both tilings sum the same terms
in the same order: same bits. A thread holds 4 columns of one row (`MaxPoolConfig.cols0`: the lines tile's
orientation that gives its gathers and its store one layout under the installed Triton): the row's index math (its
(n, c, d, h), the candidate ranges along the row axes, offsets) is done once a row, the column's once a column, and
a candidate costs an element two loads, a compare and an add. The column block is the power of two from 32 to 128
that wastes the fewest lanes past a row's end (W = 96: 32 columns, not 128).

Compile-time constants, as Inductor's pooling gathers have them: the window (kernel, stride, padding, dilation and
the progressions' constants per dim) and the candidate counts per dim (adaptive pooling: `max_outputs`, its window
bounds staying runtime values), so the candidate loops unroll and the divisions by the stride are by constants. The
cost is one compile per pooling configuration (times dtype, tiling and a few layout classes: the column block, the
strides' power-of-two factors, 32- or 64-bit indices, and Triton's own specialisations of sizes): a network has a
few configurations (MaxPool3d(2), (3, 2, 1); a classifier's AdaptiveMaxPool2d(1) or (7, 7)), a second or two of
compilation each, once per process (Triton's cache keeps them across processes). Divisions by runtime sizes (a
row index's, adaptive pooling's, the tile index's) are a multiply-high and shifts by host constants (`_runtime.magic`).
Where an input has one or two candidates, g is loaded together with its index (a select, no dependent load); with
more, g is loaded only where the index is the input's. Offsets are 32-bit unless a tensor or the index math can pass
2^31."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._cases import DENSE_LAYOUTS, Draw, describe, randn, refuse
from .._runtime import I32_MAX, cdiv, magics, math_dtype, pow2_dividing, values_key
from ..config import GridLimits, PlanCache, Tunable, plan_builder
from ..errors import InvalidProblem, Unsupported
from ..launch.alloc import channels_last_format, empty
from ..launch.checks import check_like, check_tensor, contiguous_strides
from ..launch.launcher import column_block, launch, launch_consts, tile_warps
from ..launch.tl_helpers import TL_MATH, below, cast_out, div, divmod_
from ..registry import Case, register_op
from .adaptive_pool import holding, max_outputs


@dataclass(frozen=True)
class MaxPoolConfig(GridLimits):
    """Max pooling's launch heuristics (max_pool3d and adaptive max pooling), read once per plan. Round-2
    register and SASS figures (sm_90 compiles, Triton 3.6) and the probe's variants: docs/tuning/max_pool.md."""

    #: elements a program owns: BA rows by BB columns, both powers of two (fewer for a smaller problem); 4 a
    #: thread at 4 warps (round 1 took 1024, 8 a thread; the probe sweeps 256 and 1024)
    tile: int = 512
    #: warps a program (fewer for a tile below 32 elements a warp)
    warps: int = 4
    #: a gather tile's elements a thread at most this many divided by the candidate slots an input (a power of two,
    #: at least 1): each slot is unrolled, so its loads and masks take registers for every element a thread; 27
    #: slots (3/1/1) one element (72 registers), 8 slots two. Figures: docs/tuning/max_pool.md, "Elements a thread
    #: by candidate slots"
    slot_budget: int = 16
    #: columns a "lines" tile spans at most (wider rows: several column blocks)
    max_bw: int = 128
    #: channels a "channels" tile spans at most (more channels: several channel blocks)
    max_bc: int = 128
    #: the narrowest column block `_block` picks to spare lanes past a row's end (narrower: a warp's access spans
    #: more rows, so more cache lines a load and store instruction)
    min_block: int = 32
    #: up to this many candidate slots an input, g is loaded with its index (see _gather's EAGER); past it, loaded
    #: only where the index matches: eager loads held ~90 registers for adaptive (1, 2, 2) slots, masked ones ~64
    eager_slots: int = 2
    #: the lines tiling's tile as [columns, rows] (under Triton 3.6 and older): their coalescing pass orders a load
    #: whose addresses are contiguous along no axis (the candidates' gathers) first axis fastest, Triton 3.7 on
    #: last axis fastest; so the tile's first axis is the columns there, and the loads and the store share one
    #: layout (4 consecutive columns a thread) where the other orientation puts a shared-memory layout conversion
    #: before the store and spreads a warp's loads down the rows
    cols0: bool = tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 7)
    #: "lines" or "channels" forces that tiling (tests); None: grad_input's layout chooses (`_tiling`)
    tiling: str | None = None
    #: the outputs' side (`_outputs_side_kernel`, grad_input zeroed first) where inputs have several candidates and
    #: are at least this many times the outputs: a candidate walk an output, not an input (H200, f32 / bf16:
    #: AdaptiveMaxPool2d 64 -> 7 0.39x / 0.31x ATen -> 0.94x / 1.00x; MaxPool3d(3, 2, 1) 0.45x / 0.66x -> 0.73x /
    #: 1.57x); tests set 0 (always, where inputs have several candidates) or a huge value (never)
    outputs_side_ratio: int = 2
    #: ... and where each input has one candidate, from this many inputs an output (the gather then reads one
    #: index an input, the outputs' side one an output after a memset): H100, AdaptiveMaxPool2d bf16 over the
    #: sweep, min 0.50x -> 1.01x ATen
    outputs_side_one_ratio: int = 16
    #: outputs a program of the outputs' side (128 to 1024 by 4 to 8 warps tried: 128 by 4 the fastest or level)
    outputs_block: int = 128
    #: the outputs' side divides an output's flat index and its index by runtime sizes as a multiply and shifts
    #: (`_div`), where 32-bit; else as divisions (some 20 instructions each, seven an output). H100, max_pool3d bf16
    #: 4x32x96^3 (3, 2, 1): 350-458 -> 337 us (two rounds)
    outputs_magic: bool = True
    #: the outputs' side only from this many inputs: below, a step is host-bound, and its second launch (the
    #: zeroing) costs more than the gather's extra device time (adaptive 2d at 4K elements: 1.32x -> 1.78x ATen's
    #: host time a call with it)
    outputs_side_min_inputs: int = 1 << 18
    #: ... and where each input has one candidate, from this many (MaxPool3d(8) on 1M inputs: 1.50x ATen gathering,
    #: 0.67x from the outputs' side, whose memset is a second launch)
    outputs_side_one_min_inputs: int = 1 << 22


CONFIG = Tunable("max_pool", MaxPoolConfig())


# ----------------------------------------------------------------------------------------------- kernel
@triton.jit
def _pool_range(i, n_out, SPAN: tl.constexpr, S: tl.constexpr, P: tl.constexpr, DIL: tl.constexpr,
                G: tl.constexpr, INV: tl.constexpr, STEP: tl.constexpr, LEAN: tl.constexpr):
    """(first, hi): max pooling's outputs whose windows hold input i along a dim are first, first + STEP, ... below
    hi (the window's constants: see `_progressions`)."""
    if LEAN:  # (span < stride: at most one window holds i, o = (i + P) // S, where i's offset in it is a tap)
        first = (i + P) // S
        ok = first < n_out
        if SPAN < S - 1 or DIL > 1:
            r = i + P - first * S
            ok = ok & (r <= SPAN)
            if DIL > 1:
                ok = ok & (r % DIL == 0)
        hi = tl.where(ok, first + 1, first)
    else:  # (numerators kept non-negative: integer division truncates)
        first = (tl.maximum(i + P - SPAN, 0) + S - 1) // S
        hi = tl.minimum((i + P) // S + 1, n_out)
        if DIL > 1:  # the first o >= first with o S = i + P (mod DIL), if any (else none: first = hi)
            r = (i + P) // G * INV % STEP
            first = tl.where((i + P) % G == 0, first + (r - first % STEP + STEP) % STEP, hi)
    return first, hi


@triton.jit
def _adaptive_range(i, n_in, n_out, m, sh, MAGIC: tl.constexpr, T: tl.constexpr):
    """(first, hi): adaptive pooling's outputs whose windows hold input i along a dim, [floor(i O / I),
    ceil((i + 1) O / I)); with one at most (T == 1), exactly one (the windows cover the input)."""
    if T == 1:
        first = div(i * n_out, n_in, m, sh, MAGIC)
        hi = first + 1
    else:
        first, hi = holding(i, n_in, n_out, m, sh, MAGIC)
    return first, hi


@triton.jit
def _range(i, n_in, n_out, m, sh, MAGIC: tl.constexpr, WIN: tl.constexpr, ADAPTIVE: tl.constexpr):
    """(first, hi) of max pooling's or adaptive pooling's candidates along a dim (WIN: its `_progressions`)."""
    if ADAPTIVE:
        first, hi = _adaptive_range(i, n_in, n_out, m, sh, MAGIC, WIN[7])
    else:
        first, hi = _pool_range(i, n_out, WIN[0], WIN[1], WIN[2], WIN[3], WIN[4], WIN[5], WIN[6], WIN[8])
    return first, hi


@triton.jit
def _gather(go, xi, n, c, d, h, w, rm, cm, SIZES, GS, XS, MAG, WD: tl.constexpr, WH: tl.constexpr,
            WW: tl.constexpr, TD: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr, MAGIC: tl.constexpr,
            ALIGN: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, COLS0: tl.constexpr, CHANNELS: tl.constexpr,
            ADAPTIVE: tl.constexpr, EAGER: tl.constexpr, SAME: tl.constexpr, ACC: tl.constexpr):
    """The gradient of the [BA, BB] inputs (n, c, d, h, w) (row or column vectors: c a column with CHANNELS, w
    one without; lanes outside rm & cm skipped): the sum of g over their candidate outputs (od, oh, ow ascending)
    whose index is theirs. Row-only terms (offsets, masks) are summed before a column's enters, so that each costs
    one operation per element."""
    D, H, W = SIZES[1], SIZES[2], SIZES[3]
    od0, od_hi = _range(d, D, SIZES[4], MAG[6], MAG[7], MAGIC[3], WD, ADAPTIVE)
    oh0, oh_hi = _range(h, H, SIZES[5], MAG[8], MAG[9], MAGIC[4], WH, ADAPTIVE)
    ow0, ow_hi = _range(w, W, SIZES[6], MAG[10], MAG[11], MAGIC[5], WW, ADAPTIVE)
    flat = (d * H + h) * W + w  # what indices hold for this input
    # pointers to the first candidate (od0, oh0, ow0); a slot's is that plus a scalar (its steps times the strides),
    # which the compiler adds to the address itself (a constant where the stride is 1: the load's immediate)
    if CHANNELS:  # (rows: n, d, h, w; columns: c, contiguous where GS[1] / XS[1] is 1)
        g_off = (n * GS[0] + od0 * GS[2] + oh0 * GS[3] + ow0 * GS[4]) * ALIGN[1] + c * GS[1]
        x_off = (n * XS[0] + od0 * XS[2] + oh0 * XS[3] + ow0 * XS[4]) * ALIGN[2] + c * XS[1]
    else:  # (rows: n, c, d, h; columns: w)
        g_off = (n * GS[0] + c * GS[1] + od0 * GS[2] + oh0 * GS[3]) + ow0 * GS[4]
        x_off = (n * XS[0] + c * XS[1] + od0 * XS[2] + oh0 * XS[3]) + ow0 * XS[4]
    if SAME:  # (grad_output's and indices' strides agree: one offset)
        x_off = g_off
    pg = go + g_off
    px = xi + x_off
    if COLS0:
        acc = tl.zeros([BB, BA], dtype=ACC)
    else:
        acc = tl.zeros([BA, BB], dtype=ACC)
    for jd in tl.static_range(TD):
        md = rm & (od0 + jd * WD[6] < od_hi)
        for jh in tl.static_range(TH):
            mdh = md & (oh0 + jh * WH[6] < oh_hi)
            for jw in tl.static_range(TW):
                mw = ow0 + jw * WW[6] < ow_hi
                if CHANNELS:
                    mo = (mdh & mw) & cm
                else:
                    mo = mdh & (cm & mw)
                dg = (jd * WD[6] * GS[2] + jh * WH[6] * GS[3] + jw * WW[6] * GS[4]) * ALIGN[1]
                dx = (jd * WD[6] * XS[2] + jh * WH[6] * XS[3] + jw * WW[6] * XS[4]) * ALIGN[2]
                hit = mo & (tl.load(px + dx, mask=mo) == flat)  # (masked lanes' idx: anything)
                if EAGER:  # (g loaded with its index, not after: no dependent load; a select instead of a mask)
                    acc += tl.where(hit, tl.load(pg + dg, mask=mo).to(ACC), 0.0)
                else:
                    acc += tl.load(pg + dg, mask=hit, other=0.0).to(ACC)
    return acc


@triton.jit
def _max_pool_backward_kernel(gi, go, xi, n_tiles, n_b, n_rows, SIZES, GS, XS, IS, MAG,
                              WD: tl.constexpr, WH: tl.constexpr, WW: tl.constexpr, MAGIC: tl.constexpr,
                              ALIGN: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, COLS0: tl.constexpr,
                              CHANNELS: tl.constexpr, ADAPTIVE: tl.constexpr, EAGER: tl.constexpr, SAME: tl.constexpr,
                              ACC: tl.constexpr, I64: tl.constexpr):
    # SIZES (C, D, H, W, Do, Ho, Wo). GS, XS, IS: the (N, C, D, H, W) strides of grad_output, indices, grad_input,
    # a row's (every axis but the column axis) divided by the tensor's ALIGN factor (a power of two dividing them
    # all), which the kernel multiplies back: Triton then knows a row's offset a multiple of it, and so makes the
    # store (and the channels tiling's loads) vector accesses where a stride is not a multiple of 16; ALIGN[3]
    # divides the column axis' size (`below`). MAG: `_div`'s (m, sh) for a row index's three divisions, adaptive
    # pooling's by D, H and W, and the tile index's by n_b; MAGIC: which of them `_div` uses. WD, WH, WW: the window's
    # constants per dim (`_progressions`), so one compile per pooling configuration (and dtype, tiling, layout class)
    C, D, H, W = SIZES[0], SIZES[1], SIZES[2], SIZES[3]
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        # (b, the column block, fastest: consecutive programs write consecutive memory)
        a, b = divmod_(t, n_b, MAG[12], MAG[13], MAGIC[6])
        if I64:
            a = a.to(tl.int64)
            b = b.to(tl.int64)
        if COLS0:  # (the tile as [columns, rows]: see MaxPoolConfig.cols0)
            r = a * BA + tl.arange(0, BA)[None, :]
            col = b * BB + tl.arange(0, BB)[:, None]
        else:
            r = a * BA + tl.arange(0, BA)[:, None]
            col = b * BB + tl.arange(0, BB)[None, :]
        rm = r < n_rows
        r = tl.minimum(r, n_rows - 1)  # (lanes past the end: in-range index math, their loads and store masked)
        if CHANNELS:  # rows (n, d, h, w), columns c
            q, w = divmod_(r, W, MAG[0], MAG[1], MAGIC[0])
            q, h = divmod_(q, H, MAG[2], MAG[3], MAGIC[1])
            n, d = divmod_(q, D, MAG[4], MAG[5], MAGIC[2])
            c = col  # (unclamped, < C + BB: a min would hide its contiguity from Triton and so the vector accesses)
            cm = below(c, C, ALIGN[3])
            acc = _gather(go, xi, n, c, d, h, w, rm, cm, SIZES, GS, XS, MAG, WD, WH, WW, WD[7], WH[7], WW[7],
                          MAGIC, ALIGN, BA, BB, COLS0, CHANNELS, ADAPTIVE, EAGER, SAME, ACC)
            dst = (n * IS[0] + d * IS[2] + h * IS[3] + w * IS[4]) * ALIGN[0] + c * IS[1]
        else:  # rows (n, c, d, h), columns w
            q, h = divmod_(r, H, MAG[0], MAG[1], MAGIC[0])
            q, d = divmod_(q, D, MAG[2], MAG[3], MAGIC[1])
            n, c = divmod_(q, C, MAG[4], MAG[5], MAGIC[2])
            w = col  # (unclamped for the store, as c above; clamped for the gather's index math)
            cm = below(w, W, ALIGN[3])
            acc = _gather(go, xi, n, c, d, h, tl.minimum(w, W - 1), rm, cm, SIZES, GS, XS, MAG, WD, WH, WW, WD[7],
                          WH[7], WW[7], MAGIC, ALIGN, BA, BB, COLS0, CHANNELS, ADAPTIVE, EAGER, SAME, ACC)
            dst = (n * IS[0] + c * IS[1] + d * IS[2] + h * IS[3]) * ALIGN[0] + w * IS[4]
        tl.store(gi + dst, cast_out(acc, gi.dtype.element_ty), mask=rm & cm)


@triton.jit
def _outputs_side_kernel(gi, go, xi, n_out, SIZES, GS, XS, IS, MAG, OMAG, WD: tl.constexpr, WH: tl.constexpr,
                         WW: tl.constexpr, TD: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr,
                         MAGIC: tl.constexpr, OMAGIC: tl.constexpr, ADAPTIVE: tl.constexpr, ACC: tl.constexpr,
                         BLOCK: tl.constexpr, CL: tl.constexpr, I64: tl.constexpr):
    """`_gather`'s sums from the outputs' side, for problems with few outputs and several candidates an input
    (overlapping windows): grad_input is zeroed before; output o takes input i = indices[o] where o's window holds
    it, sums g over i's candidates whose index is i (the gather's order and accumulator: the same bits) and writes
    the sum if o is the first of them. One writer an input (no atomics); an input no output took keeps its zero.
    SIZES (C, D, H, W, Do, Ho, Wo); GS, XS, IS the (N, C, D, H, W) strides of grad_output, indices, grad_input;
    CL: the outputs taken channels fastest (the indices' channels_last order), so that a warp's loads coalesce.
    OMAG, OMAGIC: `_div`'s constants for the divisions of an output's flat index (by C where CL, Wo, Ho, Do, then C
    where not CL) and of its index (by W, H)."""
    C, D, H, W = SIZES[0], SIZES[1], SIZES[2], SIZES[3]
    DO, HO, WO = SIZES[4], SIZES[5], SIZES[6]
    if I64:
        f = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        f = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = f < n_out
    f = tl.minimum(f, n_out - 1)
    if CL:
        q, c = divmod_(f, C, OMAG[0], OMAG[1], OMAGIC[0])
    else:
        q = f
    q, ow = divmod_(q, WO, OMAG[2], OMAG[3], OMAGIC[1])
    q, oh = divmod_(q, HO, OMAG[4], OMAG[5], OMAGIC[2])
    q, od = divmod_(q, DO, OMAG[6], OMAG[7], OMAGIC[3])
    if CL:
        n = q
    else:
        n, c = divmod_(q, C, OMAG[8], OMAG[9], OMAGIC[4])
    base_g = n * GS[0] + c * GS[1]
    base_x = n * XS[0] + c * XS[1]
    idx = tl.load(xi + base_x + od * XS[2] + oh * XS[3] + ow * XS[4], mask=m, other=-1)
    valid = m & (idx >= 0) & (idx < D * H * W)
    if I64:
        i = tl.where(valid, idx, 0)
    else:
        i = tl.where(valid, idx, 0).to(tl.int32)
    q, w = divmod_(i, W, OMAG[10], OMAG[11], OMAGIC[5])
    d, h = divmod_(q, H, OMAG[12], OMAG[13], OMAGIC[6])
    od0, od_hi = _range(d, D, DO, MAG[6], MAG[7], MAGIC[3], WD, ADAPTIVE)
    oh0, oh_hi = _range(h, H, HO, MAG[8], MAG[9], MAGIC[4], WH, ADAPTIVE)
    ow0, ow_hi = _range(w, W, WO, MAG[10], MAG[11], MAGIC[5], WW, ADAPTIVE)
    # o itself must be one of i's candidates (an index outside its window is never followed)
    valid = valid & (od >= od0) & (od < od_hi) & ((od - od0) % WD[6] == 0)
    valid = valid & (oh >= oh0) & (oh < oh_hi) & ((oh - oh0) % WH[6] == 0)
    valid = valid & (ow >= ow0) & (ow < ow_hi) & ((ow - ow0) % WW[6] == 0)
    acc = tl.zeros([BLOCK], dtype=ACC)
    found = tl.zeros([BLOCK], dtype=tl.int1)
    first = tl.zeros([BLOCK], dtype=tl.int1)  # (o is the first candidate whose index is i)
    for jd in tl.static_range(TD):
        cd = od0 + jd * WD[6]
        md = valid & (cd < od_hi)
        for jh in tl.static_range(TH):
            ch = oh0 + jh * WH[6]
            mdh = md & (ch < oh_hi)
            for jw in tl.static_range(TW):
                cw = ow0 + jw * WW[6]
                mo = mdh & (cw < ow_hi)
                hit = mo & (tl.load(xi + base_x + cd * XS[2] + ch * XS[3] + cw * XS[4], mask=mo) == idx)
                acc += tl.load(go + base_g + cd * GS[2] + ch * GS[3] + cw * GS[4], mask=hit, other=0.0).to(ACC)
                first = tl.where(hit & ~found, (cd == od) & (ch == oh) & (cw == ow), first)
                found = found | hit
    dst = n * IS[0] + c * IS[1] + d * IS[2] + h * IS[3] + w * IS[4]
    tl.store(gi + dst, cast_out(acc, gi.dtype.element_ty), mask=valid & first)


# ----------------------------------------------------------------------------------------------- host
@dataclass(frozen=True)
class _Spec:
    name: str
    dims: int  # pooled dims: 2 (H, W) or 3 (D, H, W)
    adaptive: bool


@dataclass(frozen=True, eq=False)  # hashed by identity: keys the relaunch cache
class _Plan:
    shape: tuple[int, ...]  # grad_input's
    stride: tuple[int, ...] | None  # grad_input's where not contiguous
    grid: int
    args: tuple
    consts: dict
    kernel: object = None  # None: `_max_pool_backward_kernel`; else `_outputs_side_kernel` (on a zeroed grad_input)


def _channels_last(spec: _Spec, self: torch.Tensor) -> bool:
    """Whether ATen's grad_input is channels_last(_3d) for this self (see the module docstring)."""
    if spec.dims == 2:
        return channels_last_format(self) is torch.channels_last
    return not spec.adaptive and channels_last_format(self) is torch.channels_last_3d


def _ints(spec: _Spec, arg: str, value, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """A sequence of ints (each below 2^31, as ATen's int casts need) of one of the lengths `allowed`, a bare int
    counting as one; else InvalidProblem."""
    try:
        vals = tuple(operator.index(v) for v in value) if isinstance(value, (list, tuple)) else \
            (operator.index(value),)
    except TypeError:
        vals = None
    if vals is None or len(vals) not in allowed or any(abs(v) > I32_MAX for v in vals):
        counts = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        raise InvalidProblem(spec.name, arg, f"{counts} ints below 2^31 (one for D, H and W alike, or one each"
                             f"{'; none: the kernel size' if 0 in allowed else ''})", repr(value))
    return vals


def _triple(vals: tuple[int, ...]) -> tuple[int, int, int]:
    return vals * 3 if len(vals) == 1 else vals


def output_size(i: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """ATen's pooling_output_shape: the outputs along a dim of i inputs; with ceil_mode, a last window that starts
    past the input and its left padding is dropped."""
    o = (i + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= i + p:
        o -= 1
    return o


def _check_tensors(spec: _Spec, grad_output, self, indices) -> None:
    check_tensor(spec.name, "grad_output", grad_output)
    check_tensor(spec.name, "self", self)
    check_like(spec.name, "grad_output", grad_output, "self", self)
    check_tensor(spec.name, "indices", indices, (torch.int64,))
    if indices.device != self.device:
        raise Unsupported(spec.name, "indices", f"a tensor on {self.device} (the device of self)", indices.device)


def _check_self(spec: _Spec, self) -> None:
    lo, hi = spec.dims + 1, spec.dims + 2
    x_shape = tuple(self.shape)
    if self.dim() not in (lo, hi):
        raise InvalidProblem(spec.name, "self", f"a {lo}-D or {hi}-D (batched) tensor",
                             f"a {self.dim()}-D tensor of shape {x_shape}")
    if spec.adaptive and 0 in x_shape[-spec.dims:]:  # (no window can be empty)
        raise InvalidProblem(spec.name, "self", "non-zero pooled sizes", f"shape {x_shape}")
    if not spec.adaptive and 0 in x_shape[-4:]:  # (ATen's check)
        raise InvalidProblem(spec.name, "self", "non-zero sizes in every dim but the batch dim", f"shape {x_shape}")


def _check_grad(spec: _Spec, grad_output, self, indices, out_sizes: tuple | None) -> None:
    """grad_output of self's leading sizes and `out_sizes` (None: any non-zero ones); indices of its shape."""
    x_shape, g_shape = tuple(self.shape), tuple(grad_output.shape)
    lead = self.dim() - spec.dims
    if grad_output.dim() != self.dim() or g_shape[:lead] != x_shape[:lead] or (
            out_sizes is not None and g_shape[lead:] != out_sizes):
        sizes = ", ".join(map(str, out_sizes)) if out_sizes else "<output sizes>"
        raise InvalidProblem(spec.name, "grad_output", f"a {self.dim()}-D tensor of shape "
                             f"({', '.join(map(str, x_shape[:lead]))}, {sizes})", f"shape {g_shape}")
    if 0 in g_shape[1:]:  # (ATen's check: only the first dim may be empty)
        raise InvalidProblem(spec.name, "grad_output", "non-zero sizes in every dim but the first", f"shape {g_shape}")
    if tuple(indices.shape) != g_shape:
        raise InvalidProblem(spec.name, "indices", f"grad_output's shape {g_shape}", f"shape {tuple(indices.shape)}")


def _window(spec: _Spec, self, kernel_size, stride, padding, dilation, ceil_mode) -> tuple:
    """max_pool3d's window parameters as ATen checks them -> ((k, s, p, d) per (D, H, W), the output sizes)."""
    k = _triple(_ints(spec, "kernel_size", kernel_size, (1, 3)))
    s = _triple(_ints(spec, "stride", stride, (0, 1, 3)) or k)
    p = _triple(_ints(spec, "padding", padding, (1, 3)))
    d = _triple(_ints(spec, "dilation", dilation, (1, 3)))
    if not isinstance(ceil_mode, bool):
        raise Unsupported(spec.name, "ceil_mode", "a bool", type(ceil_mode).__name__)
    for arg, vals, low in (("kernel_size", k, 1), ("stride", s, 1), ("dilation", d, 1), ("padding", p, 0)):
        if min(vals) < low:
            raise InvalidProblem(spec.name, arg, f"values >= {low}", vals)
    if any(pp > kk // 2 for pp, kk in zip(p, k, strict=True)):
        raise InvalidProblem(spec.name, "padding", f"at most half the kernel size {k}", p)
    out = tuple(output_size(i, *w, ceil_mode) for i, *w in zip(self.shape[-3:], k, s, p, d, strict=True))
    if min(out) < 1:
        raise InvalidProblem(spec.name, "self", f"spatial sizes that leave at least one output with kernel_size "
                             f"{k}, stride {s}, padding {p}, dilation {d}",
                             f"shape {tuple(self.shape)} (output sizes {out})")
    return (k, s, p, d), out


def _ncdhw(dims: int, values: tuple, fill: int) -> tuple:
    """Sizes (fill 1) or strides (fill 0) as (N, C, D, H, W): unbatched N = 1 (stride 0), 2d D = 1."""
    lead = (fill,) * (5 - len(values))
    return lead + values if dims == 3 else lead[1:] + values[:-2] + (fill,) + values[-2:]


def _out_stride(spec: _Spec, shape: tuple, cl: bool) -> tuple:
    fmt = (torch.channels_last if spec.dims == 2 else torch.channels_last_3d) if cl else torch.contiguous_format
    return torch.empty(shape, device="meta", memory_format=fmt).stride()


def _tiling(cl: bool, c: int, forced: str | None) -> str:
    """"channels" for a channels_last grad_input of several channels (C its contiguous axis: tiles of channels
    coalesce), "lines" otherwise (W contiguous); `forced` (the config's `tiling`) overrides."""
    return forced or ("channels" if cl and c > 1 else "lines")


def _pow2_floor(n: int) -> int:
    """The largest power of two at most n (0 where n < 1)."""
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def _progressions(window: tuple | None, ins: tuple, outs: tuple) -> tuple[tuple, tuple, int]:
    """(WINS, KS, the largest value the candidates' integer math can reach) for the kernel: per dim (D, H, W) of
    input sizes `ins` and output sizes `outs`, max pooling's (`window`: (k, s, p, d) triples) or adaptive pooling's
    (None) window constants and how many candidates an input has at most (KS). A dim's constants (its WD, WH or WW
    constexpr) are (span, stride, padding, dilation, gcd(stride, dilation), the inverse of stride / gcd mod step,
    step = dilation / gcd, KS, lean: span < stride, so one window at most holds an input); adaptive pooling's are
    only KS (and lean where it is 1), its windows' bounds are runtime values."""
    if window is None:
        ks = tuple(max_outputs(i, o) for i, o in zip(ins, outs, strict=True))
        arith = max(2 * (i + 2) * (o + 2) for i, o in zip(ins, outs, strict=True))  # (_adaptive_range's products)
        return tuple((0, 1, 0, 1, 1, 0, 1, kk, kk == 1) for kk in ks), ks, arith
    k, s, p, d = window
    span = tuple((kk - 1) * dd for kk, dd in zip(k, d, strict=True))
    g = tuple(math.gcd(ss, dd) for ss, dd in zip(s, d, strict=True))
    step = tuple(dd // gg for dd, gg in zip(d, g, strict=True))
    inv = tuple(pow(ss // gg, -1, st) if st > 1 else 0 for ss, gg, st in zip(s, g, step, strict=True))
    # (the range [lo, hi) holds floor(span / s) + 1 outputs at most, one in `step` of them on i's grid)
    ks = tuple(min(o, kk, cdiv(sp // ss + 1, st)) for o, kk, sp, ss, st in zip(outs, k, span, s, step, strict=True))
    arith = max(i + pp + ss + sp + (o + kk * st) * ss + (i + pp) * st + 2 * st
                for i, o, pp, ss, sp, kk, st in zip(ins, outs, p, s, span, ks, step, strict=True))
    wins = tuple((sp, ss, pp, dd, gg, iv, st, kk, sp < ss)
                 for sp, ss, pp, dd, gg, iv, st, kk in zip(span, s, p, d, g, inv, step, ks, strict=True))
    return wins, ks, arith


@plan_builder
def _plan(spec: _Spec, g_shape: tuple, g_stride: tuple, x_stride: tuple, shape: tuple, cl: bool,
          dtype: torch.dtype, window: tuple | None) -> _Plan:
    """The launch of a validated, non-empty problem under the config in force (`window`: max pooling's (k, s, p, d)
    per dim, else None)."""
    cfg = CONFIG.current
    out_stride = _out_stride(spec, shape, cl)
    size, gsize = _ncdhw(spec.dims, shape, 1), _ncdhw(spec.dims, g_shape, 1)
    # (a dim of size 1 is only ever at index 0, or a masked candidate past it: its stride 0, which keeps the
    # strides' common factors, see ALIGN)
    gstr, xstr, istr = (tuple(0 if x == 1 else st for x, st in zip(sz, _ncdhw(spec.dims, stv, 0), strict=True))
                        for sz, stv in ((gsize, g_stride), (gsize, x_stride), (size, out_stride)))
    n, c, *ins = size
    outs = gsize[2:]
    wins, ks, arith = _progressions(window, ins, outs)
    acc = TL_MATH[math_dtype(dtype)]
    d_in, h_in, w_in = ins
    channels = _tiling(cl, c, cfg.tiling) == "channels"
    if channels:
        bb = column_block(c, cfg.max_bc, cfg.min_block)
        n_rows, n_b = n * d_in * h_in * w_in, cdiv(c, bb)
        row_div = (w_in, h_in, d_in)  # (a row index's divisions: w, h, d, and n the quotient)
        col_axis = 1
    else:
        bb = column_block(w_in, cfg.max_bw, cfg.min_block)
        n_rows, n_b = n * c * d_in * h_in, cdiv(w_in, bb)
        row_div = (h_in, d_in, c)
        col_axis = 4
    # the factors of ALIGN (grad_input's; the channels tiling's grad_output's and indices', where their columns are
    # contiguous: the lines tiling's loads are not), and the strides of a row divided by them for the kernel
    aligns = [pow2_dividing(math.gcd(*[v for k, v in enumerate(st) if k != col_axis])) if use else 1
              for st, use in ((istr, True), (gstr, channels), (xstr, channels))]
    istr_k, gstr_k, xstr_k = (tuple(v if k == col_axis else v // a for k, v in enumerate(st))
                              for st, a in zip((istr, gstr, xstr), aligns, strict=True))
    align = (*aligns, pow2_dividing(c if channels else w_in))  # (and the column axis' size: see `below`)
    per_thread = max(1, min(cfg.tile // (32 * cfg.warps), _pow2_floor(cfg.slot_budget // math.prod(ks))))
    ba = min(triton.next_power_of_2(n_rows), max(1, min(cfg.tile, 32 * cfg.warps * per_thread) // bb))
    n_tiles = cdiv(n_rows, ba) * n_b
    # 32-bit index math unless a row index, the candidates' arithmetic, an input's flat index or an offset into a
    # tensor (a masked lane's too: candidates up to KS steps past the outputs or a lean dim's (i + p) // s, the
    # column axis up to BB past its size) can pass 2^31
    lanes = (n, c + bb) if channels else (n, c)
    cols = ins if channels else (d_in, h_in, w_in + bb)
    if window is None:
        reach_o = outs
    else:
        reach_o = [max(o + kk * w[6], (i + w[2]) // w[1] + 1) for o, kk, w, i in zip(outs, ks, wins, ins, strict=True)]
    reach = [n_rows + ba, arith, d_in * h_in * w_in] + [
        sum((x - 1) * st for x, st in zip((*lanes, *reach_o), strd)) for strd in (gstr, xstr)] + [
        sum((x - 1) * st for x, st in zip((*lanes, *cols), istr))]
    i64 = max(reach) > cfg.i32_max
    # divisions by runtime sizes as a multiply and shifts (`magics`): a row index's three, adaptive pooling's by D,
    # H and W (a window's are constants: a bound of 2^30 keeps those off), the tile's
    divs = [*row_div, *ins, n_b]
    bounds = [n_rows] * 3 + [(i + 1) * (o + 1) if window is None else 2**30
                             for i, o in zip(ins, outs, strict=True)] + [n_tiles]
    magic, mag = magics(divs, bounds, not i64)
    tile = ba * bb
    consts = launch_consts({"WD": wins[0], "WH": wins[1], "WW": wins[2], "MAGIC": magic, "ALIGN": align,
                            "BA": ba, "BB": bb, "COLS0": cfg.cols0 and not channels,
                            "CHANNELS": channels, "ADAPTIVE": window is None,
                            "EAGER": math.prod(ks) <= cfg.eager_slots,
                            "SAME": (gstr_k, aligns[1]) == (xstr_k, aligns[2]),
                            "ACC": acc, "I64": i64},
                           tile_warps(tile, cfg.warps))
    args = (n_tiles, n_b, n_rows, (c, *ins, *outs), gstr_k, xstr_k, istr_k, mag)
    contiguous = out_stride == contiguous_strides(shape)
    stride = None if contiguous else out_stride
    n_out = n * c * math.prod(outs)
    n_in = n_rows * (c if channels else w_in)
    ratio, least = (cfg.outputs_side_ratio, cfg.outputs_side_min_inputs) if math.prod(ks) > 1 else \
        (cfg.outputs_side_one_ratio, cfg.outputs_side_one_min_inputs)
    if n_out * ratio <= n_in and n_in >= least and n_out < cfg.max_programs:
        # few outputs: the same sums from the outputs' side (`_outputs_side_kernel`)
        cl_order = 0 < xstr[1] < xstr[4]
        # (an output's flat index: by C first where CL, Wo, Ho, Do, by C last where not; its index: by W, H)
        o_divs = (c if cl_order else 1, *outs[::-1], 1 if cl_order else c, w_in, h_in)
        o_bounds = (n_out,) * 5 + (d_in * h_in * w_in,) * 2
        o_magic, o_mag = magics(o_divs, o_bounds, cfg.outputs_magic and not i64)
        consts = launch_consts({"WD": wins[0], "WH": wins[1], "WW": wins[2], "TD": ks[0], "TH": ks[1], "TW": ks[2],
                                "MAGIC": magic, "OMAGIC": o_magic, "ADAPTIVE": window is None, "ACC": acc,
                                "BLOCK": cfg.outputs_block, "CL": cl_order, "I64": i64}, cfg.warps)
        args = (n_out, (c, *ins, *outs), gstr, xstr, istr, mag, o_mag)
        return _Plan(shape, stride, cdiv(n_out, cfg.outputs_block), args, consts, _outputs_side_kernel)
    return _Plan(shape, stride, min(n_tiles, cfg.max_programs), args, consts)


# a problem's (tensor layouts, window) -> its plan, checked once
_VALIDATED = PlanCache("kernels.max_pool._VALIDATED")


def _lookup(spec: _Spec, grad_output, self, indices, params: tuple) -> tuple:
    """(the problem's cache key, its plan if validated before); the key is None where the problem cannot be keyed
    (non-tensors, a tensor among the parameters, unhashable ones: validated on every call)."""
    try:
        values = [values_key(v) if isinstance(v, (list, tuple)) else (v, type(v)) for v in params]
        if None in values or any(isinstance(v[0], torch.Tensor) for v in values):
            return None, None
        key = (spec, *[(t.shape, t.stride(), t.dtype, t.device, t.is_neg()) for t in (grad_output, self, indices)],
               *values)
        return key, _VALIDATED.get(key)
    except (AttributeError, TypeError):
        return None, None


def _backward(spec: _Spec, grad_output, self, indices, params: tuple = ()) -> torch.Tensor:
    """Validate (once per problem), allocate grad_input in ATen's layout, launch. `params`: max pooling's
    (kernel_size, stride, padding, dilation, ceil_mode)."""
    key, plan = _lookup(spec, grad_output, self, indices, params)
    if plan is None:
        _check_tensors(spec, grad_output, self, indices)
        _check_self(spec, self)
        window, out_sizes = (None, None) if spec.adaptive else _window(spec, self, *params)
        _check_grad(spec, grad_output, self, indices, out_sizes)
        cl = _channels_last(spec, self)
        if self.numel() == 0:
            return torch.empty_strided(self.shape, _out_stride(spec, tuple(self.shape), cl), dtype=self.dtype,
                                       device=self.device)
        plan = _VALIDATED.remember(key, _plan(spec, tuple(grad_output.shape), grad_output.stride(),
                                               indices.stride(), tuple(self.shape), cl, self.dtype, window))
    out = empty(plan.shape, self.dtype, self.device, plan.stride)
    if plan.kernel is not None:
        out.zero_()
    device = self.get_device()
    launch(plan.kernel or _max_pool_backward_kernel, (plan.grid,), (out, grad_output, indices), plan.args,
           plan.consts, device, (plan, device))
    return out


# ----------------------------------------------------------------------------------------------- cases
# max_pool3d: (self shape, kernel_size, stride, padding, dilation, ceil_mode, channels_last_3d): 3-D segmentation
# nets' MaxPool3d(2) and (3, stride 2, padding 1), anisotropic (1, 2, 2), ceil_mode with odd sizes, dilation,
# overlapping windows (stride < kernel), unbatched
_MAX3D = {
    "tiny": [((1, 2, 8, 16, 16), 2, 2, 0, 1, False, False)],
    "small": [((1, 2, 4, 6, 8), 2, 2, 0, 1, False, False), ((1, 2, 5, 7, 6), 3, 2, 1, 1, False, False),
              ((2, 5, 6, 7), (1, 3, 3), (1, 2, 2), (0, 1, 1), 1, True, False),
              ((1, 3, 3, 5, 6), 2, 1, 1, 2, False, True)],
    "check": [((4, 16, 32, 48, 48), 2, 2, 0, 1, False, False), ((2, 32, 24, 40, 40), 3, 2, 1, 1, False, False),
              ((2, 8, 17, 33, 31), 3, 2, 0, 1, True, False), ((2, 32, 16, 32, 32), 2, 2, 0, 1, False, True),
              ((2, 8, 20, 24, 24), 3, 1, 1, 2, False, False),
              ((2, 16, 16, 32, 32), (1, 2, 2), (1, 2, 2), 0, 1, False, False)],
    "large": [((4, 32, 64, 128, 128), 2, 2, 0, 1, False, False), ((2, 64, 48, 96, 96), 3, 2, 1, 1, False, False),
              ((8, 64, 32, 64, 64), 2, 2, 0, 1, False, True)],
}
# adaptive: (self shape, output sizes, channels_last): global (1, 1), ResNet-like (7, 7), sizes that do not divide
# (overlapping windows), upsampling-like (O > I), batched and unbatched
_ADAPTIVE = {
    2: {
        "tiny": [((1, 4, 32, 32), (7, 7), False)],
        "small": [((2, 3, 9, 11), (4, 5), False), ((3, 7, 5), (10, 3), False), ((2, 4, 6, 5), (3, 1), True),
                  ((2, 3, 8, 8), (1, 1), False)],
        "check": [((8, 64, 56, 57), (7, 7), False), ((4, 96, 30, 41), (6, 45), True),
                  ((16, 512, 14, 14), (1, 1), False), ((64, 14, 14), (20, 3), False)],
        "large": [((128, 256, 56, 56), (7, 7), False), ((64, 512, 64, 64), (1, 1), True),
                  ((32, 512, 64, 64), (6, 6), False)],
    },
    3: {
        "tiny": [((1, 2, 8, 16, 16), (3, 5, 6), False)],
        "small": [((1, 2, 5, 6, 7), (2, 4, 3), False), ((2, 3, 4, 5), (5, 2, 7), False),
                  ((2, 2, 4, 6, 6), (1, 1, 1), False)],
        "check": [((2, 16, 16, 28, 30), (4, 7, 9), False), ((8, 10, 12, 13), (3, 20, 1), False),
                  ((4, 32, 8, 14, 14), (1, 1, 1), False)],
        "large": [((8, 64, 32, 64, 64), (4, 7, 7), False), ((4, 128, 16, 96, 96), (1, 1, 1), False)],
    },
}


def _as_list(v) -> list[int]:
    return list(v) if isinstance(v, tuple) else [v]


def max_pool3d_example(shape, k, s, p, d, ceil_mode, cl, device, dtype) -> tuple:
    """(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices): indices from stock's forward
    on random self (no ties), grad_output random in the forward output's layout."""
    x = randn(shape, device, dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    window = [_as_list(k), _as_list(s), _as_list(p), _as_list(d)]
    y, idx = torch.ops.aten.max_pool3d_with_indices(x, *window, ceil_mode)
    g = randn(y.shape, device, dtype)
    if cl:
        g = g.contiguous(memory_format=torch.channels_last_3d)
    return (g, x, *window, ceil_mode, idx)


def adaptive_example(shape, osize, cl, device, dtype) -> tuple:
    """(grad_output, self, indices) for adaptive max pooling of random self (no ties) to `osize`."""
    x = randn(shape, device, dtype)
    fwd = torch.ops.aten.adaptive_max_pool3d if len(osize) == 3 else torch.ops.aten.adaptive_max_pool2d
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    _, idx = fwd(x, list(osize))
    g = randn(idx.shape, device, dtype)
    if cl:
        g = g.contiguous(memory_format=torch.channels_last)
    return g, x, idx


def _moved_bytes(grad_output: torch.Tensor, self: torch.Tensor, *args) -> int:
    # self is not read: grad_output and the int64 indices read once, grad_input written once
    return (grad_output.numel() + self.numel()) * self.element_size() + grad_output.numel() * 8


def _case(label: str, args: tuple) -> Case:
    g, x = args[0], args[1]
    return Case(label, args, bytes=_moved_bytes(g, x), elements=x.numel())


def _dims(v) -> str:
    return "x".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _max_pool3d_cases(device, dtype, size: str) -> list[Case]:
    out = []
    for shape, k, s, p, d, ceil_mode, cl in _MAX3D[size]:
        label = (f"{_dims(shape)} k{_dims(k)} s{_dims(s)} p{_dims(p)}" + (f" d{_dims(d)}" if d != 1 else "")
                 + (" ceil_mode" if ceil_mode else "") + (" channels_last_3d" if cl else ""))
        out.append(_case(label, max_pool3d_example(shape, k, s, p, d, ceil_mode, cl, device, dtype)))
    return out


def _max_pool3d_samples(rng, device, dtype):
    """Kernels of 1 to 3 a dim, strides given or not, pads up to half the kernel, dilation 1 or 2, ceil_mode;
    batched (an empty batch too) and unbatched self (channels_last_3d too: grad_input follows it) of random values
    or values on the k/8 grid (ties); indices from stock's forward; grad_output in every layout."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        k = [rng.randint(1, 3) for _ in range(3)]
        st = [rng.randint(1, 3) for _ in range(3)] if rng.random() < 0.7 else []
        p = [rng.randint(0, n // 2) for n in k]
        dil = [rng.choice((1, 1, 2)) for _ in range(3)]
        ceil_mode = rng.random() < 0.5
        lead = d.sizes(rng.choice((1, 2)), "any", hi=2)
        if edge == "empty" and len(lead) == 2:
            lead[0] = 0
        # at least the window's span, so that every window holds an input (ATen's forward points a window of
        # padding alone outside it, where stock's backward adds g and gradkern's nothing), and a few more
        spatial = [dd * (kk - 1) + 1 + e for kk, dd, e in zip(k, dil, d.sizes(3, "any", hi=3, lo=0))]
        spatial = [n | 1 for n in spatial] if edge == "odd" else spatial
        # (stock's kernels take a contiguous or channels_last_3d self only)
        x = d.tensor((*lead, *spatial), kinds=("normal", "grid"), layouts=("contig", "cl")[:len(lead)])
        window = [list(v) for v in (k, st, p, dil)]
        with torch.no_grad():
            _, idx = torch.ops.aten.max_pool3d_with_indices(x, *window, ceil_mode)
        g = d.tensor(tuple(idx.shape), huge=False)
        yield Case(describe(grad_output=g, self=x, kernel_size=k, stride=st, padding=p, dilation=dil,
                            ceil_mode=ceil_mode), (g, x, *window, ceil_mode, d.place(idx, DENSE_LAYOUTS)))


def _adaptive_samples(spec: _Spec):
    """samples(rng, device, dtype): batched (an empty batch too) and unbatched self (2d channels_last too) of
    pooled sizes 1 to 7 (3d: 4) to output sizes 1 to 8 (3d: 5); indices from stock's forward; grad_output in every
    layout."""
    forward = getattr(torch.ops.aten, spec.name[: -len("_backward")])

    def samples(rng, device, dtype):
        d = Draw(rng, device, dtype)
        small = spec.dims == 3  # (the interpreter pays per plane)
        for edge in d.edges():
            lead = d.sizes(rng.choice((1, 2)), "any", hi=3)
            if edge == "empty" and len(lead) == 2:
                lead[0] = 0
            shape = (*lead, *d.sizes(spec.dims, "any" if edge == "empty" else edge, hi=4 if small else 7))
            out = d.sizes(spec.dims, "ones" if edge == "ones" else "any", hi=5 if small else 8)
            x = d.tensor(shape, kinds=("normal", "grid"), layouts=("contig", "cl", "t", "slice_rand"))
            with torch.no_grad():
                _, idx = forward(x, out)
            g = d.tensor(tuple(idx.shape), huge=False)
            # (indices in a dense layout: expanded ones would point outside their windows, where stock adds g and
            # gradkern adds nothing)
            yield Case(describe(grad_output=g, self=x, output_size=out), (g, x, d.place(idx, DENSE_LAYOUTS)))

    return samples


def _max_pool3d_reference(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Stock's backward on grad_output and indices in self's memory format, the only layouts its CPU kernel takes
    (the forward gives them so)."""
    cl = self.dim() == 5 and channels_last_format(self) is torch.channels_last_3d
    fmt = torch.channels_last_3d if cl else torch.contiguous_format
    g, idx = (torch.empty(t.shape, dtype=t.dtype, device=t.device, memory_format=fmt).copy_(t)
              for t in (grad_output, indices))
    return torch.ops.aten.max_pool3d_with_indices_backward(g, self, kernel_size, stride, padding, dilation,
                                                           ceil_mode, idx)


def _contiguous_indices(name: str):
    """Stock's backward with contiguous indices: ATen's adaptive_max_pool3d_backward (CPU and CUDA) reads indices as
    if contiguous, whatever their strides."""
    aten = getattr(torch.ops.aten, name)
    return lambda grad_output, self, indices: aten(grad_output, self, indices.contiguous())


def _errors(spec: _Spec):
    """errors(device): bad indices, grad_output and self; max_pool3d's window arguments."""
    def errors(device):
        x = torch.randn(2, 3, *(4,) * spec.dims, device=device)
        g = torch.randn(2, 3, *(2,) * spec.dims, device=device)
        idx = torch.zeros(g.shape, dtype=torch.int64, device=device)
        window = ([2], [2], [0], [1], False)

        def bad(label, error, arg, grad=g, self=x, indices=idx, **changes):
            if spec.adaptive:
                return refuse(label, error, arg, grad, self, indices)
            names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
            return refuse(label, error, arg, grad, self, *[changes.get(n, v) for n, v in zip(names, window)],
                          indices)

        out = [bad("int32 indices", Unsupported, "indices", indices=idx.int()),
               bad("indices of another shape", InvalidProblem, "indices", indices=idx[:1]),
               bad("grad_output of another batch", InvalidProblem, "grad_output", grad=g[:1], indices=idx[:1]),
               bad("self of another rank", InvalidProblem, "self", self=x[0, 0]),
               bad("grad_output of another dtype", Unsupported, "grad_output", grad=g.double())]
        if spec.adaptive:
            return out + [bad("a pooled size of 0", InvalidProblem, "self", self=x[..., :0])]
        return out + [bad("a dilation of 0", InvalidProblem, "dilation", dilation=[0]),
                      bad("ceil_mode an int", Unsupported, "ceil_mode", ceil_mode=1),
                      bad("a pad past half the kernel", InvalidProblem, "padding", padding=[2]),
                      bad("a kernel_size of two ints", InvalidProblem, "kernel_size", kernel_size=[2, 2])]

    return errors


_RAISES = ("gradkern, for every problem: stock's CUDA kernel scatters with atomics (nondeterministic, and raising "
           "under torch.use_deterministic_algorithms(True))")
_ROUTE_DOC = {"max_pool3d_with_indices_backward": _RAISES, "adaptive_max_pool2d_backward": _RAISES,
              "adaptive_max_pool3d_backward": "gradkern, for every problem: stock's CUDA kernel scatters with atomics "
                                              "where a size does not divide (silently nondeterministic: no error under "
                                              "torch.use_deterministic_algorithms(True))"}
_SPECS = {"max_pool3d_with_indices_backward": _Spec("max_pool3d_with_indices_backward", 3, False),
          "adaptive_max_pool2d_backward": _Spec("adaptive_max_pool2d_backward", 2, True),
          "adaptive_max_pool3d_backward": _Spec("adaptive_max_pool3d_backward", 3, True)}


@register_op("max_pool3d_with_indices_backward", aten=("max_pool3d_with_indices_backward",), accumulates=True,
             cases=_max_pool3d_cases, moved_bytes=_moved_bytes, reference=_max_pool3d_reference,
             fake=torch.ops.aten.max_pool3d_with_indices_backward, samples=_max_pool3d_samples,
             errors=_errors(_SPECS["max_pool3d_with_indices_backward"]),
             route_doc=_ROUTE_DOC["max_pool3d_with_indices_backward"])
def max_pool3d_with_indices_backward(grad_output: torch.Tensor, self: torch.Tensor, kernel_size: Sequence[int],
                                     stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                                     ceil_mode: bool, indices: torch.Tensor) -> torch.Tensor:
    """Gradient of max_pool3d with indices: each grad_input element sums g over the outputs whose windows hold it
    and whose index is its own, in a fixed order (no atomics)."""
    return _backward(_SPECS["max_pool3d_with_indices_backward"], grad_output, self, indices,
                     (kernel_size, stride, padding, dilation, ceil_mode))


def _declare_adaptive(spec: _Spec):
    """Register op `spec.name` with ATen's signature and name."""

    def fn(grad_output: torch.Tensor, self: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return _backward(spec, grad_output, self, indices)

    def cases(device, dtype, size: str) -> list[Case]:
        return [_case(f"{_dims(shape)} -> {_dims(osize)}{' channels_last' if cl else ''}",
                      adaptive_example(shape, osize, cl, device, dtype))
                for shape, osize, cl in _ADAPTIVE[spec.dims][size]]

    fn.__name__ = fn.__qualname__ = spec.name
    dims = "D, H, W" if spec.dims == 3 else "H, W"
    fn.__doc__ = (f"Gradient of adaptive_max_pool{spec.dims}d: each grad_input element sums g over the outputs "
                  f"whose windows hold it and whose index is its own, in a fixed order (no atomics); pooled dims "
                  f"({dims}).")
    register_op(spec.name, aten=(spec.name,), accumulates=True, cases=cases, moved_bytes=_moved_bytes,
                reference=_contiguous_indices(spec.name), fake=getattr(torch.ops.aten, spec.name),
                samples=_adaptive_samples(spec), errors=_errors(spec), route_doc=_ROUTE_DOC[spec.name])(fn)
    return fn


adaptive_max_pool2d_backward = _declare_adaptive(_SPECS["adaptive_max_pool2d_backward"])
adaptive_max_pool3d_backward = _declare_adaptive(_SPECS["adaptive_max_pool3d_backward"])
