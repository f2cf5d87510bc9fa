"""Adaptive average pooling backward, 2d and 3d: a gather, no atomics.

ATen pools output o along a dim of input size I and output size O over the window [floor(o*I/O), ceil((o+1)*I/O))
and averages it; the gradient of input i is the sum of g[o] / (its window's volume) over the outputs whose windows
hold i. Along a dim those outputs are the range [floor(i*O/I), ceil((i+1)*O/I)) (start(o) <= i <=> o*I < (i+1)*O;
end(o) > i <=> (o+1)*I > i*O), at most ceil(O/I) + 1 of them, so each grad_input element sums its few terms in one
fixed order in fp32 (fp64 for f64) and is written once: per output column ow, the terms g / (kd kh) over (od, oh)
ascending, that sum times 1 / kw, the columns ascending (`_term`). ATen's CUDA kernels scatter each g[o] over its
window with atomicAdd instead (nondeterministic; raising under torch.use_deterministic_algorithms). The windows'
bounds divide by runtime sizes as a multiply-high and shifts (`tl_helpers.div`).

A program owns a [BR, BW] tile of grad_input's rows by columns w (past 2^30 tiles, several in turn): rows of one
(n, c, d) plane where a plane's rows fill a tile (the D range a scalar), else rows (n, c, d, h) flattened, so that
a tile spans several small planes (the D range per row). The output ranges and window sizes along H are per-row
vectors, along W per-column ones; grad_output is read in place through its strides. grad_input takes ATen's
layout: 2d channels_last where a 4-D self's strides suggest it (ATen's CUDA and CPU kernels both do), contiguous
otherwise (3d always, as ATen's CUDA kernel).

A channels_last grad_input (C > 1) is tiled by rows instead: a program owns one (n, d, h) row and a [BW, BC] block
of its (w, c), C the fastest axis, so its stores (and channels_last grad_output's loads) are contiguous along C where
a plane tile's would stride by C. The H and D ranges are then scalars; the terms and their order are the plane
kernel's, so both give the same bits."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._cases import Draw, describe, rand_on, randn, refuse, stand_in
from .._runtime import cdiv, magics, math_dtype, pow2_dividing
from ..config import GridLimits, PlanCache, Tunable, plan_builder
from ..errors import InvalidProblem, Unsupported
from ..launch.alloc import channels_last_format, empty
from ..launch.checks import check_like, check_tensor
from ..launch.launcher import launch, launch_consts
from ..launch.tl_helpers import TL_MATH, below, cast_out, div, divmod_
from ..registry import Case, register_op


@dataclass(frozen=True)
class AdaptivePoolConfig(GridLimits):
    """Adaptive average pooling's launch heuristics, read once per plan."""

    #: elements a program owns (rows of W rounded up to a power of two, as many rows as fit, of several planes where
    #: planes are small; a problem smaller than that: its rows); warps follow from it (4 from 512 elements, 2 from
    #: 128, else 1)
    tile: int = 1024
    #: ... halved (down to a warp's 32 elements) until tiles over several planes give this many programs: small problems
    #: with many terms an element (1x1 planes pooled to 7x7: 49) are latency-bound, and 1024-element tiles left
    #: most SMs idle (32 programs)
    min_programs: int = 1024
    #: columns a plane tile spans at most (wider planes: several column tiles)
    max_bw: int = 128
    #: channels a row tile spans at most (more channels: several channel blocks)
    max_bc: int = 128
    #: "planes" or "rows" forces that tiling (tests); None: grad_input's layout chooses (`_tiling`)
    tiling: str | None = None
    #: plane tiles: tell the kernel a power of two dividing W and the strides (`ALIGN`) and keep the stored
    #: columns unclamped, so that stores along a row are vector stores (8 scalar stores a thread became 2 of 16
    #: bytes at W = 56 and 64; H200, 2d f32 30x40 -> 1x7 0.84x -> 1.10x stock; docs/tuning/avg_pool.md)
    row_align: bool = True
    #: divide by the sizes (the windows' bounds, a flat row index's split) as a multiply-high and shifts
    #: (`_runtime.magics`; where 32-bit): a runtime division is some 20 instructions, and each term took two (H200,
    #: 3d f32 prime 17x31x37 -> 3x5x7 0.71x -> 1.07x stock; docs/tuning/avg_pool.md)
    magic: bool = True
    #: sum a column's terms g / (kd kh) with a reciprocal a row, and multiply the sum by 1 / kw (`_term`), where a
    #: term was divided by kd kh kw (3d f32 geomean 3.28x -> 3.51x, the prime case 1.07x -> 1.20x)
    reciprocals: bool = True


CONFIG = Tunable("adaptive_avg_pool", AdaptivePoolConfig())


# ----------------------------------------------------------------------------------------------- kernel
@triton.jit
def _window(o, n_in, n_out, m, sh, MAGIC: tl.constexpr):
    """The size of output o's window along a dim of n_in inputs and n_out outputs: ceil((o+1)n_in/n_out) -
    floor(o n_in/n_out) (the divisions by n_out: `div`, m, sh and MAGIC n_out's)."""
    return div((o + 1) * n_in + n_out - 1, n_out, m, sh, MAGIC) - div(o * n_in, n_out, m, sh, MAGIC)


@triton.jit
def holding(i, n_in, n_out, m, sh, MAGIC: tl.constexpr):
    """The outputs whose windows hold input i along a dim of n_in inputs and n_out outputs: [lo, hi) (the divisions
    by n_in: `div`, m, sh and MAGIC n_in's). Adaptive max pooling's candidates too (`max_pool._adaptive_range`)."""
    return div(i * n_out, n_in, m, sh, MAGIC), div((i + 1) * n_out + n_in - 1, n_in, m, sh, MAGIC)


@triton.jit
def _term(col, g, kdh, kw, RECIP: tl.constexpr):
    """A column's sum so far, plus g[od, oh, ow]'s term: g / (kd kh kw), or with RECIP, g * (1 / (kd kh)), the
    column's 1 / kw applied once to its sum (`_column`): a reciprocal a row, where a division is some 8 instructions
    a term."""
    if RECIP:
        return col + g * (1.0 / kdh)
    else:
        return col + g / (kdh * kw)


@triton.jit
def _column(col, kw, RECIP: tl.constexpr):
    """A column's sum of terms (`_term`), its window size along W kw applied where RECIP."""
    if RECIP:
        return col * (1.0 / kw)
    else:
        return col


@triton.jit
def _adaptive_avg_pool_backward_kernel(gi, go, n_tiles, n_wb, n_hb, n_rows, C, D, H, W, Do, Ho, Wo,
                                       GS, isN, isC, isD, isH, isW, KH, KW, MAG,
                                       BR: tl.constexpr, BW: tl.constexpr, ACC: tl.constexpr, I64: tl.constexpr,
                                       ALIGN: tl.constexpr, FLAT_ROWS: tl.constexpr, MAGIC: tl.constexpr,
                                       RECIP: tl.constexpr):
    # GS: grad_output's (N, C, D, H, W) strides. FLAT_ROWS: a tile's rows are rows (n, c, d, h) flattened, so that
    # it spans several small planes (n_hb unused); else they are BR rows of one plane (n_rows unused). isN, isC,
    # isD, isH: grad_input's strides divided by ALIGN,
    # a power of two dividing them and W, which the kernel multiplies back: Triton then knows a row's start a
    # multiple of it, and makes the stores vector stores where W is not a multiple of 16. MAG, MAGIC: `div`'s
    # constants and flags for D, H, W (`holding`), Do, Ho, Wo (`_window`), then H, D, C (a flat row index's split)
    gsN, gsC, gsD, gsH, gsW = GS
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        wb = t % n_wb
        w = wb * BW + tl.arange(0, BW)[None, :]
        cm = below(w, W, ALIGN)
        wc = tl.minimum(w, W - 1)  # (w unclamped for the store: a min would hide its contiguity from Triton)
        if FLAT_ROWS:
            r = (t // n_wb) * BR + tl.arange(0, BR)[:, None]
            rm = r < n_rows
            r = tl.minimum(r, n_rows - 1)  # (lanes past the end: in-range index math, their loads and store masked)
            if I64:
                r = r.to(tl.int64)
            s, h = divmod_(r, H, MAG[12], MAG[13], MAGIC[6])  # each row's (n, c, d) plane and h
        else:
            h = ((t // n_wb) % n_hb) * BR + tl.arange(0, BR)[:, None]
            rm = h < H
            h = tl.minimum(h, H - 1)
            s = t // n_wb // n_hb  # the tile's (n, c, d) plane
            if I64:
                h = h.to(tl.int64)
        if I64:
            wc = wc.to(tl.int64)
        q, d = divmod_(s, D, MAG[14], MAG[15], MAGIC[7])
        n, c = divmod_(q, C, MAG[16], MAG[17], MAGIC[8])
        c = c.to(tl.int64)  # (plane offsets are int64 always)
        n = n.to(tl.int64)
        od_lo, od_hi = holding(d, D, Do, MAG[0], MAG[1], MAGIC[0])  # the outputs whose windows hold each plane / row
        oh_lo, oh_hi = holding(h, H, Ho, MAG[2], MAG[3], MAGIC[1])  # / column
        ow_lo, ow_hi = holding(wc, W, Wo, MAG[4], MAG[5], MAGIC[2])
        src = go + n * gsN + c * gsC
        acc = tl.zeros([BR, BW], dtype=ACC)
        n_od = od_hi - od_lo
        if FLAT_ROWS:
            n_od = tl.max(n_od)  # (the tile's longest D range: rows past theirs masked)
        for k in range(0, KW):  # (ow, then od, oh ascending; the row kernel sums the same terms in the same order)
            ow = ow_lo + k
            mw = cm & (ow < ow_hi)
            kw = _window(ow, W, Wo, MAG[10], MAG[11], MAGIC[5]).to(ACC)
            col = tl.zeros([BR, BW], dtype=ACC)
            for i in range(0, n_od):
                od = od_lo + i
                md = rm
                if FLAT_ROWS:
                    md = rm & (od < od_hi)  # (past the range: a window's size is positive still; its loads masked)
                kd = _window(od, D, Do, MAG[6], MAG[7], MAGIC[3]).to(ACC)
                plane = src + od.to(tl.int64) * gsD
                for j in range(0, KH):
                    oh = oh_lo + j
                    kdh = kd * _window(oh, H, Ho, MAG[8], MAG[9], MAGIC[4]).to(ACC)
                    g = tl.load(plane + oh * gsH + ow * gsW, mask=md & (oh < oh_hi) & mw, other=0.0).to(ACC)
                    col = _term(col, g, kdh, kw, RECIP)
            acc += _column(col, kw, RECIP)
        dst = gi + (n * isN + c * isC + d.to(tl.int64) * isD + h * isH) * ALIGN + w * isW
        tl.store(dst, cast_out(acc, gi.dtype.element_ty), mask=rm & cm)


@triton.jit
def _adaptive_avg_pool_backward_rows_kernel(gi, go, n_tiles, n_wb, n_cb, C, D, H, W, Do, Ho, Wo,
                                            GS, isN, isC, isD, isH, isW, KW, MAG,
                                            BW: tl.constexpr, BC: tl.constexpr, ACC: tl.constexpr,
                                            I64: tl.constexpr, MAGIC: tl.constexpr, RECIP: tl.constexpr):
    gsN, gsC, gsD, gsH, gsW = GS  # (grad_output's (N, C, D, H, W) strides)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        cb = t % n_cb  # channel blocks fastest: consecutive programs write consecutive memory (channels_last)
        wb = (t // n_cb) % n_wb
        s = t // n_cb // n_wb  # the (n, d, h) row
        h = s % H
        d = (s // H) % D
        n = (s // H // D).to(tl.int64)
        if I64:
            h = h.to(tl.int64)
            d = d.to(tl.int64)
        w = wb * BW + tl.arange(0, BW)[:, None]
        c = cb * BC + tl.arange(0, BC)[None, :]
        m = (w < W) & (c < C)
        w = tl.minimum(w, W - 1)  # (columns past the row: in-range index math; every lane past it masked)
        # (c unclamped, < C + BC: a min would hide its contiguity from Triton and so the vector loads and stores)
        if I64:
            w = w.to(tl.int64)
            c = c.to(tl.int64)
        ow_lo, ow_hi = holding(w, W, Wo, MAG[4], MAG[5], MAGIC[2])  # the outputs whose windows hold each column;
        oh_lo, oh_hi = holding(h, H, Ho, MAG[2], MAG[3], MAGIC[1])  # along H and D one range
        od_lo, od_hi = holding(d, D, Do, MAG[0], MAG[1], MAGIC[0])
        src = go + n * gsN + c * gsC
        acc = tl.zeros([BW, BC], dtype=ACC)
        for k in range(0, KW):  # (ow, then od, oh ascending, each term as the plane kernel forms it: same bits)
            ow = ow_lo + k
            mk = m & (ow < ow_hi)
            kw = _window(ow, W, Wo, MAG[10], MAG[11], MAGIC[5]).to(ACC)
            col = tl.zeros([BW, BC], dtype=ACC)
            for od in range(od_lo, od_hi):
                kd = _window(od, D, Do, MAG[6], MAG[7], MAGIC[3]).to(ACC)
                for oh in range(oh_lo, oh_hi):
                    kdh = kd * _window(oh, H, Ho, MAG[8], MAG[9], MAGIC[4]).to(ACC)
                    row = src + tl.cast(od, tl.int64) * gsD + tl.cast(oh, tl.int64) * gsH  # (od, oh: 32-bit)
                    g = tl.load(row + ow * gsW, mask=mk, other=0.0).to(ACC)
                    col = _term(col, g, kdh, kw, RECIP)
            acc += _column(col, kw, RECIP)
        dst = gi + n * isN + d.to(tl.int64) * isD + h.to(tl.int64) * isH + w * isW + c * isC
        tl.store(dst, cast_out(acc, gi.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------- host
@dataclass(frozen=True)
class _Spec:
    name: str
    dims: int  # pooled dims: 2 (H, W) or 3 (D, H, W)


@dataclass(frozen=True, eq=False)  # hashed by identity: keys the relaunch cache
class _Plan:
    shape: tuple[int, ...]  # grad_input's
    stride: tuple[int, ...] | None  # grad_input's where not contiguous
    grid: int
    args: tuple
    consts: dict
    kernel: object  # the plane or the row kernel


def max_outputs(i: int, o: int) -> int:
    """An upper bound (exact where one size divides the other) on how many outputs' windows hold one input, along
    a dim of input size i and output size o: ceil((x+1)o/i) - floor(xo/i) < o/i + 2."""
    if i % o == 0:
        return 1
    if o % i == 0:
        return o // i
    return min(o, -(-o // i) + 1)


def _check(spec: _Spec, grad_output, self) -> None:
    """Every check, as named errors, before anything is allocated or launched."""
    check_tensor(spec.name, "grad_output", grad_output)
    check_tensor(spec.name, "self", self)
    check_like(spec.name, "grad_output", grad_output, "self", self)
    lo, hi = spec.dims + 1, spec.dims + 2
    if self.dim() not in (lo, hi):
        raise InvalidProblem(spec.name, "self", f"a {lo}-D or {hi}-D (batched) tensor",
                             f"a {self.dim()}-D tensor of shape {tuple(self.shape)}")
    g_shape, x_shape = tuple(grad_output.shape), tuple(self.shape)
    lead = self.dim() - spec.dims
    if grad_output.dim() != self.dim() or g_shape[:lead] != x_shape[:lead]:
        raise InvalidProblem(spec.name, "grad_output", f"a {self.dim()}-D tensor of shape "
                             f"({', '.join(map(str, x_shape[:lead]))}, <output sizes>) (self's leading sizes)",
                             f"shape {g_shape}")
    if 0 in g_shape[1:]:  # (ATen's check: only the first dim may be empty)
        raise InvalidProblem(spec.name, "grad_output", "non-zero sizes in every dim but the first", f"shape {g_shape}")
    if 0 in x_shape[-spec.dims:]:  # (no window can be empty: ATen's CPU kernel writes out of bounds there)
        raise InvalidProblem(spec.name, "self", "non-zero pooled sizes", f"shape {x_shape}")


def _tiling(cl: bool, c: int, forced: str | None) -> str:
    """The tiling: "rows" for a channels_last grad_input of several channels (C its contiguous axis: row tiles
    coalesce), "planes" otherwise (W contiguous); `forced` (the config's `tiling`) overrides."""
    return forced or ("rows" if cl and c > 1 else "planes")


@plan_builder
def _plan(spec: _Spec, g_shape: tuple, g_stride: tuple, x_shape: tuple, cl: bool, dtype: torch.dtype) -> _Plan:
    """The launch of a validated, non-empty problem under the config in force: every shape as (N, C, D, H, W),
    unbatched N = 1 with stride 0, 2d with D = 1."""
    cfg = CONFIG.current

    def ncdhw(values: tuple, fill: int) -> tuple:  # sizes (fill 1) or strides (fill 0) as (N, C, D, H, W)
        lead = (fill,) * (5 - len(values))
        return lead + values if spec.dims == 3 else lead[1:] + values[:-2] + (fill,) + values[-2:]

    meta = torch.empty(x_shape, device="meta", memory_format=torch.channels_last if cl else torch.contiguous_format)
    out_stride = meta.stride()
    size, gsize, gstr, istr = ncdhw(x_shape, 1), ncdhw(g_shape, 1), ncdhw(g_stride, 0), ncdhw(out_stride, 0)
    n, c, d_in, h_in, w_in = size
    d_out, h_out, w_out = gsize[2:]
    kh, kw = max_outputs(h_in, h_out), max_outputs(w_in, w_out)
    acc = TL_MATH[math_dtype(dtype)]
    sizes = (d_in, h_in, w_in, d_out, h_out, w_out)
    # per dim, a bound on `holding`'s and `_window`'s dividends and products (an output index runs up to o + k)
    windows = tuple(2 * (i + 2) * (o + 2) for i, o in zip(sizes[:3], sizes[3:], strict=True))
    if _tiling(cl, c, cfg.tiling) == "rows":
        bc = min(triton.next_power_of_2(c), cfg.max_bc)
        bw = min(triton.next_power_of_2(w_in), max(1, cfg.tile // bc))
        n_wb, n_cb = cdiv(w_in, bw), cdiv(c, bc)
        n_tiles = n * d_in * h_in * n_wb * n_cb
        # 32-bit in-row index math unless a D/row/column product or an in-row offset (a masked lane's too) can pass
        # 2^31 (row offsets are int64 always)
        reach = max(*windows, (w_out + kw) * gstr[4] + (c + bc) * gstr[1], w_in * istr[4] + (c + bc) * istr[1])
        i64 = reach > cfg.i32_max
        magic, mag = magics(sizes, windows * 2, cfg.magic and not i64)
        tile = bw * bc
        consts = launch_consts({"BW": bw, "BC": bc, "ACC": acc, "I64": i64, "MAGIC": magic, "RECIP": cfg.reciprocals},
                               4 if tile >= 512 else 2 if tile >= 128 else 1)
        args = (n_tiles, n_wb, n_cb, c, *sizes, tuple(gstr), *istr, kw, mag)
        return _Plan(x_shape, out_stride if cl else None, min(n_tiles, cfg.max_programs), args, consts,
                     _adaptive_avg_pool_backward_rows_kernel)
    bw = min(triton.next_power_of_2(w_in), cfg.max_bw)
    n_rows = n * c * d_in * h_in
    planes = h_in < cfg.tile // bw  # (tiles over several planes only where a plane's rows do not fill one)
    br = min(triton.next_power_of_2(n_rows if planes else h_in), max(1, cfg.tile // bw))
    n_wb, n_hb = cdiv(w_in, bw), cdiv(h_in, br)
    if planes:
        while br > 1 and br * bw > 32 and cdiv(n_rows, br) * n_wb < cfg.min_programs:
            br //= 2
    n_tiles = cdiv(n_rows, br) * n_wb if planes else n * c * d_in * n_hb * n_wb
    # 32-bit index math unless a flattened row index (FLAT_ROWS only), a D/row/column product or an in-plane offset
    # (a masked lane's too) can pass 2^31 (plane offsets are int64 always)
    reach = max(n_rows + br if planes else 0, *windows, (h_out + kh) * gstr[3] + (w_out + kw) * gstr[4],
                h_in * istr[3] + w_in * istr[4])
    i64 = reach > cfg.i32_max
    # (then a flat row index split into h, d, c and n: its bound, then its quotients')
    rows = n_rows + br
    magic, mag = magics((*sizes, h_in, d_in, c), (*windows * 2, rows, cdiv(rows, h_in), cdiv(rows, h_in * d_in)),
                        cfg.magic and not i64)
    tile = br * bw
    align = pow2_dividing(math.gcd(w_in, *istr[:4])) if cfg.row_align else 1
    consts = launch_consts({"BR": br, "BW": bw, "ACC": acc, "I64": i64, "ALIGN": align,
                            "FLAT_ROWS": planes, "MAGIC": magic, "RECIP": cfg.reciprocals},
                           4 if tile >= 512 else 2 if tile >= 128 else 1)
    args = (n_tiles, n_wb, n_hb, n_rows, c, *sizes, tuple(gstr), *(st // align for st in istr[:4]), istr[4], kh, kw,
            mag)
    return _Plan(x_shape, out_stride if cl else None, min(n_tiles, cfg.max_programs), args, consts,
                 _adaptive_avg_pool_backward_kernel)


_VALIDATED = PlanCache("kernels.adaptive_pool._VALIDATED")  # a problem's (tensor layouts) -> its plan, checked once



def _backward(spec: _Spec, grad_output, self) -> torch.Tensor:
    """Validate (once per problem), allocate grad_input in ATen's layout, launch."""
    try:
        key = (spec, grad_output.shape, grad_output.stride(), grad_output.dtype, grad_output.device,
               grad_output.is_neg(), self.shape, self.stride(), self.dtype, self.device, self.is_neg())
        plan = _VALIDATED.get(key)
    except (AttributeError, TypeError):  # not tensors: validation names the argument
        key = plan = None
    if plan is None:
        _check(spec, grad_output, self)
        cl = spec.dims == 2 and channels_last_format(self) is torch.channels_last
        if self.numel() == 0:
            fmt = torch.channels_last if cl else torch.contiguous_format
            return torch.empty(self.shape, dtype=self.dtype, device=self.device, memory_format=fmt)
        plan = _VALIDATED.remember(key, _plan(spec, tuple(grad_output.shape), grad_output.stride(),
                                               tuple(self.shape), cl, self.dtype))
    out = empty(plan.shape, self.dtype, self.device, plan.stride)
    device = self.get_device()
    launch(plan.kernel, (plan.grid,), (out, grad_output), plan.args, plan.consts, device, (plan, device))
    return out


# ----------------------------------------------------------------------------------------------- cases
# (self shape, output sizes, channels_last): downsampling with and without remainders, upsampling-like (O > I),
# global along a dim, batched and unbatched
_SHAPES = {
    2: {
        "tiny": [((1, 4, 32, 32), (7, 5), False)],
        "small": [((2, 3, 9, 11), (4, 5), False), ((3, 5, 7), (8, 3), False), ((2, 4, 6, 5), (3, 1), True)],
        "check": [((8, 64, 56, 57), (7, 9), False), ((4, 96, 30, 41), (6, 45), True), ((64, 14, 14), (20, 3), False)],
        "large": [((128, 256, 56, 56), (7, 7), False), ((32, 512, 64, 64), (6, 6), False),
                  ((32, 512, 64, 64), (3, 3), True)],
    },
    3: {
        "tiny": [((1, 2, 8, 16, 16), (3, 5, 6), False)],
        "small": [((1, 2, 5, 6, 7), (2, 4, 3), False), ((3, 4, 5, 6), (5, 2, 8), False)],
        "check": [((2, 16, 16, 28, 30), (4, 7, 9), False), ((8, 10, 12, 13), (3, 20, 1), False)],
        "large": [((8, 64, 32, 64, 64), (4, 7, 7), False), ((4, 128, 16, 96, 96), (2, 5, 5), False)],
    },
}


def _example(shape, out, cl, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_output, self); self only lends its shape, dtype and layout: a broadcast zero unless channels_last."""
    g_shape = (*shape[:len(shape) - len(out)], *out)
    if cl:
        fmt = torch.channels_last
        return randn(g_shape, device, dtype).contiguous(memory_format=fmt), \
            torch.zeros(shape, device=device, dtype=dtype).contiguous(memory_format=fmt)
    return randn(g_shape, device, dtype), stand_in(shape, device, dtype)


def _samples(spec: _Spec):
    """samples(rng, device, dtype): batched (an empty batch too) and unbatched, pooled sizes of 1 to 7 (3d: 4) to
    output sizes of 1 to 8 (3d: 5), dividing or not, larger than the input too; grad_output in every layout; self a
    broadcast stand-in, or channels_last (2d: grad_input follows it) or another layout."""

    def samples(rng, device, dtype):
        d = Draw(rng, device, dtype)
        for edge in d.edges():
            lead = d.sizes(rng.choice((1, 2)), "any", hi=3)
            if edge == "empty" and len(lead) == 2:
                lead[0] = 0
            small = spec.dims == 3  # (the interpreter pays per plane)
            shape = (*lead, *d.sizes(spec.dims, "any" if edge == "empty" else edge, hi=4 if small else 7))
            out = d.sizes(spec.dims, "ones" if edge == "ones" else "any", hi=5 if small else 8)
            g = d.tensor((*lead, *out), kinds=("grid", "normal", "special"), huge=False)
            x = stand_in(shape, device, dtype) if rng.random() < 0.5 else d.tensor(shape)
            yield Case(describe(grad_output=g, self=x), (g, x))

    return samples


def _errors(spec: _Spec):
    def errors(device):
        t = rand_on(device)
        x = t(2, 3, *(5,) * spec.dims)
        g = t(2, 3, *(2,) * spec.dims)
        return [
            refuse("self of another rank", InvalidProblem, "self", t(3, *(2,) * spec.dims), t(3, *(5,) * spec.dims)[0]),
            refuse("grad_output of another batch", InvalidProblem, "grad_output", t(1, 3, *(2,) * spec.dims), x),
            refuse("an output size of 0", InvalidProblem, "grad_output", t(2, 3, *(0,) * spec.dims), x),
            refuse("a pooled size of 0", InvalidProblem, "self", g, t(2, 3, *(0,) * spec.dims)),
            refuse("grad_output of another dtype", Unsupported, "grad_output", g.double(), x),
            refuse("int self", Unsupported, "self", g, x.int()),
        ]

    return errors


def _moved_bytes(grad_output: torch.Tensor, self: torch.Tensor) -> int:
    # self is not read: grad_output read once, grad_input written once
    return (grad_output.numel() + self.numel()) * self.element_size()


def _declare(spec: _Spec):
    """Register op `spec.name` with ATen's signature and name."""

    def fn(grad_output: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
        return _backward(spec, grad_output, self)

    def cases(device, dtype, size: str) -> list[Case]:
        el = torch.empty((), dtype=dtype).element_size()
        out = []
        for shape, osize, cl in _SHAPES[spec.dims][size]:
            g, x = _example(shape, osize, cl, device, dtype)
            label = f"{'x'.join(map(str, shape))} -> {'x'.join(map(str, osize))}{' channels_last' if cl else ''}"
            out.append(Case(label, (g, x), bytes=(g.numel() + x.numel()) * el, elements=x.numel()))
        return out

    fn.__name__ = fn.__qualname__ = spec.name
    dims = "D, H, W" if spec.dims == 3 else "H, W"
    fn.__doc__ = (f"Gradient of adaptive_avg_pool{spec.dims}d: each grad_input element sums g / window size over "
                  f"the outputs whose windows hold it, in a fixed order (no atomics); pooled dims ({dims}).")
    register_op(spec.name, aten=(spec.name,), accumulates=True, cases=cases, moved_bytes=_moved_bytes,
                samples=_samples(spec), errors=_errors(spec),
                route_doc="gradkern, for every problem: stock's CUDA kernels scatter with atomics "
                          "(nondeterministic, and raising under torch.use_deterministic_algorithms(True))")(fn)
    return fn


_adaptive_avg_pool2d_backward = _declare(_Spec("_adaptive_avg_pool2d_backward", 2))
_adaptive_avg_pool3d_backward = _declare(_Spec("_adaptive_avg_pool3d_backward", 3))
