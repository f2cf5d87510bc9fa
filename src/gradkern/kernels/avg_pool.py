"""Average pooling 3d backward: a gather, no atomics.

avg_pool3d's output o along a dim of input size I (kernel k, stride s, padding p) averages the window
[o*s - p, o*s - p + k) of the zero-padded input, so the gradient of input i is the sum of g[o] / divisor(o) over
the outputs whose windows hold i. Along a dim those are o in [lo, hi) with lo = 0 if i + p < k else
(i + p - k) // s + 1 and hi = min((i + p) // s + 1, O): at most ceil(k / s) of them (the "taps"). Each grad_input
element sums its terms in one fixed order (od, oh, ow ascending) in fp32 (fp64 for f64) and is written once: the
avg_pool2d backward gather, and Inductor's avg_pool3d_backward lowering. ATen's CUDA kernel scatters each
g[o] / divisor(o) over its window with atomicAdd where windows overlap (nondeterministic; raising under
torch.use_deterministic_algorithms).

The divisor is ATen's (AveragePool3d.cu, AvgPoolKernel.cpp), per output: `divisor_override` where given, else the
product over the three dims of the window's extent, clipped as ATen clips it. With count_include_pad the window is
clipped to the padded input only, end = min(start + k, I + p) (its part past that, which ceil_mode can add, is not
counted), and the extent is end - start; without it, to the input itself: min(end, I) - max(start, 0). ATen's
output size rule (ceil_mode: the last window must start inside the input or its left padding) keeps every window's
extent positive.

A program owns a [BR, BW] tile of grad_input: BR rows (n, c, d, h) by BW columns w (wide rows: several column
blocks), so the D and H output ranges and extents are per-row vectors, the W ones per-column vectors, and a term
costs one load and a multiply-add: g times its column's reciprocal extent, each (d, h) output row's sum then times
that row's reciprocal (so g / divisor up to float32 rounding, as ATen's kernels, which divide). The window (kernel,
stride, padding per dim) is compile-time, as Inductor's avg_pool3d_backward gather has it: the taps unroll, the
divisions by the stride are by constants, and a pooling configuration compiles once per dtype (a 3-D net has a few:
AvgPool3d(2), (3, 2, 1), ...). grad_output is read in place through its strides (strided, channels_last_3d,
broadcast). grad_input is contiguous whatever self's layout, as ATen's: avg_pool3d_backward's meta function
allocates it with input.sizes() and no strides on both CUDA and CPU (ATen's CUDA kernels have no channels_last_3d
path: the forward makes its input contiguous, and the backward reshapes grad_input to (N*C, D, H, W))."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._cases import Draw, describe, rand_on, randn, refuse, stand_in
from .._runtime import cdiv, magics, math_dtype, pow2_dividing, values_key
from ..config import GridLimits, PlanCache, Tunable, plan_builder
from ..errors import InvalidProblem, Unsupported
from ..launch.alloc import empty
from ..launch.checks import check_like, check_tensor
from ..launch.launcher import column_block, launch, launch_consts, tile_warps
from ..launch.tl_helpers import TL_MATH, cast_out, divmod_
from ..registry import Case, register_op

OP = "avg_pool3d_backward"


@dataclass(frozen=True)
class AvgPoolConfig(GridLimits):
    """avg_pool3d_backward's launch heuristics, read once per plan. Figures: H100, torch 2.11, Triton 3.6; the
    variants measured: docs/tuning/avg_pool.md."""

    #: grad_input elements a program owns where windows overlap (rows of W rounded up to a power of two, as many as
    #: fit): up to 27 terms an element take registers; at (3, 1, 1) 1024 is 1.6x slower
    tile: int = 512
    #: ... where each input has one term (kernel <= stride along every dim): AvgPool3d(2) f32 at 65% of copy, where
    #: 512 is 1.3x slower
    tile_one_term: int = 1024
    #: ... for 16-bit dtypes (half the bytes an element): H100, bf16 over the sweep, min / geomean vs ATen 0.83x /
    #: 1.48x, against 0.76x / 1.35x at 1024
    tile_one_term_16: int = 2048
    #: ... where windows overlap along W at stride 1 (a term's loads are runs shifted by a column, so unaligned):
    #: this many bytes a thread (one f32 element, two 16-bit): several columns a thread would load as scalars 16
    #: bytes apart a lane and saturate the L1 (H200, 3/1/1 f32: 1.53x stock). Figures: docs/tuning/avg_pool.md,
    #: "Shifted runs"
    shifted_thread_bytes: int = 4
    #: columns a tile spans at most (wider rows: several column blocks)
    max_bw: int = 128
    #: ... and at least, where narrower blocks pad a row less (rows of 96: 3 blocks of 32, not one of 128 with a
    #: quarter of its lanes idle; H200, (3, 2, 1) over 4x32x96^3 f32 1.19x -> 1.50x stock, bf16 0.88x -> 1.18x)
    min_bw: int = 32
    #: tell the kernel the power of two dividing W (`W_DIV`), so that stores along a row are vector stores where W
    #: is not a multiple of 16 (rows of 56: 16 two-byte stores a thread became 2 of 16 bytes; H200, bf16 video
    #: (1, 2, 2) 0.83x -> 1.65x stock)
    row_align: bool = True
    #: a term as g times its column's reciprocal extent, each (d, h) output row's sum times that row's reciprocal:
    #: a reciprocal a row and a column, not a division a term, where windows overlap the kernel is instruction-bound
    #: (H200, (3, 2, 1) over 4x32x96^3 f32 0.96x -> 1.16x stock, video (3, 3, 3) 1.46x -> 1.86x)
    reciprocals: bool = True
    #: split a row index into (n, c, d, h) as multiplies and shifts (`_runtime.magics`; where 32-bit), where six
    #: divisions and mods by runtime sizes (some 20 instructions each) were a row's (H200, sweep min / geomean:
    #: f32 1.01x / 1.69x -> 1.08x / 1.84x, bf16 0.87x / 1.65x -> 1.02x / 1.75x stock; docs/tuning/avg_pool.md)
    magic: bool = True
    #: warps a program (fewer for a tile below 32 elements a warp)
    warps: int = 4


CONFIG = Tunable("avg_pool", AvgPoolConfig())

# how the divisor is formed (the kernel's MODE): divisor_override, or the window's extent clipped to the padded
# input (count_include_pad) or to the input
_OVERRIDE, _INCLUDE_PAD, _EXCLUDE_PAD = 0, 1, 2


# ----------------------------------------------------------------------------------------------- kernel
@triton.jit
def _holding(i, n_out, K: tl.constexpr, S: tl.constexpr, P: tl.constexpr):
    """The outputs whose windows hold input i along a dim of n_out outputs (kernel K, stride S, padding P):
    [lo, hi)."""
    lo = tl.where(i + P >= K, (i + P - K) // S + 1, 0)
    hi = tl.minimum((i + P) // S + 1, n_out)
    return lo, hi


@triton.jit
def _extent(o, n_in, K: tl.constexpr, S: tl.constexpr, P: tl.constexpr, MODE: tl.constexpr):
    """Output o's window extent along a dim of n_in inputs as its divisor counts it (see the module docstring)."""
    start = o * S - P
    end = tl.minimum(start + K, n_in + P)
    if MODE == 2:
        end = tl.minimum(end, n_in)
        start = tl.maximum(start, 0)
    return end - start


@triton.jit(do_not_specialize=["divisor"])  # (a divisor of 1 compiled in as a constant would have no .to)
def _avg_pool3d_backward_kernel(gi, go, n_tiles, n_cb, n_rows, C, SIZE, OUT, GS, divisor, MAG,
                                K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,
                                S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr,
                                P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr,
                                BR: tl.constexpr, BW: tl.constexpr, MODE: tl.constexpr, ACC: tl.constexpr,
                                I64: tl.constexpr, W_DIV: tl.constexpr, RECIP: tl.constexpr, MAGIC: tl.constexpr):
    # SIZE (D, H, W / W_DIV) and OUT (Do, Ho, Wo): input and output sizes, W_DIV a power of two dividing W (so that
    # stores along a row vectorise); GS: grad_output's (N, C, D, H, W) strides; K, S, P: the window per dim (D, H, W);
    # MAG, MAGIC: `tl_helpers.div`'s constants and flags for a row index's split by H, D and C
    D = SIZE[0]
    H = SIZE[1]
    W = SIZE[2] * W_DIV  # (a product by the constexpr: Triton sees that rows start on multiples of W_DIV)
    div = divisor.to(ACC)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        cb = t % n_cb
        r = (t // n_cb) * BR + tl.arange(0, BR)[:, None]  # the rows (n, c, d, h)
        w = cb * BW + tl.arange(0, BW)[None, :]
        rm = r < n_rows
        r = tl.minimum(r, n_rows - 1)  # (rows past the end: in-range index math, their loads and stores masked)
        if I64:
            r = r.to(tl.int64)
            w = w.to(tl.int64)
        m = rm & (w < W)
        wc = tl.minimum(w, W - 1)  # (the store's w unclamped: its contiguity stays visible)
        q, h = divmod_(r, H, MAG[0], MAG[1], MAGIC[0])
        q, d = divmod_(q, D, MAG[2], MAG[3], MAGIC[1])
        n, c = divmod_(q, C, MAG[4], MAG[5], MAGIC[2])
        od_lo, od_hi = _holding(d, OUT[0], K0, S0, P0)
        oh_lo, oh_hi = _holding(h, OUT[1], K1, S1, P1)
        ow_lo, ow_hi = _holding(wc, OUT[2], K2, S2, P2)
        base = n * GS[0] + c * GS[1]
        acc = tl.zeros([BR, BW], dtype=ACC)
        for a in tl.static_range((K0 + S0 - 1) // S0):  # (at most ceil(K / S) outputs hold an input, per dim)
            od = od_lo + a
            md = m & (od < od_hi)
            od = tl.minimum(od, OUT[0] - 1)  # (past the range: a real window, so a positive extent; loads masked)
            ed = _extent(od, D, K0, S0, P0, MODE).to(ACC)
            for b in tl.static_range((K1 + S1 - 1) // S1):
                oh = oh_lo + b
                mh = md & (oh < oh_hi)
                oh = tl.minimum(oh, OUT[1] - 1)
                edh = ed * _extent(oh, H, K1, S1, P1, MODE).to(ACC)
                row = base + od * GS[2] + oh * GS[3]
                part = tl.zeros([BR, BW], dtype=ACC)
                for e in tl.static_range((K2 + S2 - 1) // S2):
                    ow = ow_lo + e
                    mw = mh & (ow < ow_hi)
                    ow = tl.minimum(ow, OUT[2] - 1)
                    g = tl.load(go + (row + ow * GS[4]), mask=mw, other=0.0).to(ACC)
                    if RECIP:  # (a column's reciprocal is the same for every (a, b): computed once)
                        if MODE == 0:
                            part += g
                        else:
                            part += g * (1.0 / _extent(ow, W, K2, S2, P2, MODE).to(ACC))
                    elif MODE == 0:
                        acc += g / div
                    else:
                        acc += g / (edh * _extent(ow, W, K2, S2, P2, MODE).to(ACC))
                if RECIP:
                    acc += part * (1.0 / (div if MODE == 0 else edh))
        tl.store(gi + (r * W + w), cast_out(acc, gi.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------- host
@dataclass(frozen=True)
class _Window:
    """The pooling window per dim (D, H, W), as ATen normalises kernel_size, stride and padding."""

    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    ceil_mode: bool


@dataclass(frozen=True, eq=False)  # hashed by identity: keys the relaunch cache
class _Plan:
    shape: tuple[int, ...]  # grad_input's (contiguous)
    grid: int
    args: tuple
    consts: dict


def output_size(i: int, k: int, s: int, p: int, ceil_mode: bool) -> int:
    """ATen's pooling_output_shape (dilation 1): the number of windows along a dim of input size i; with ceil_mode
    a last partial window is kept only where it starts inside the input or its left padding."""
    o = (i + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= i + p:
        o -= 1
    return o


def taps(k: int, s: int) -> int:
    """The most outputs whose windows hold one input along a dim: ceil(k / s) (windows of k every s)."""
    return cdiv(k, s)


def _triple(arg: str, value, lengths: tuple[int, ...]) -> tuple[int, int, int]:
    """One of kernel_size / stride / padding as ATen takes it: a single int for all three dims, or three
    (stride also empty: the kernel size, which the caller fills in)."""
    if isinstance(value, int):
        value = (value,)
    try:
        ints = tuple(operator.index(v) for v in value)
    except TypeError:
        ints = None
    if ints is None or len(ints) not in lengths:
        want = "a single int or three ints" + (", or empty (the kernel size)" if 0 in lengths else "")
        raise InvalidProblem(OP, arg, want, repr(value))
    return ints * 3 if len(ints) == 1 else ints


def _window(kernel_size, stride, padding, ceil_mode) -> _Window:
    """ATen's checks of the window arguments, as named errors."""
    k = _triple("kernel_size", kernel_size, (1, 3))
    s = _triple("stride", stride, (0, 1, 3)) or k
    p = _triple("padding", padding, (1, 3))
    if min(k) <= 0:
        raise InvalidProblem(OP, "kernel_size", "sizes greater than zero", k)
    if min(s) <= 0:
        raise InvalidProblem(OP, "stride", "strides greater than zero", s)
    if min(p) < 0 or any(pi > ki // 2 for pi, ki in zip(p, k, strict=True)):
        raise InvalidProblem(OP, "padding", f"pads >= 0 and at most half the kernel size (kernel_size {k})", p)
    return _Window(k, s, p, bool(ceil_mode))


def _divisor(divisor_override) -> int | None:
    if divisor_override is None:
        return None
    try:
        value = operator.index(divisor_override)
    except TypeError:
        value = 0
    if value == 0 or isinstance(divisor_override, bool):
        raise InvalidProblem(OP, "divisor_override", "None or a non-zero int", repr(divisor_override))
    return value


def _check(grad_output, self, win: _Window) -> None:
    """The tensors' checks, as named errors, before anything is allocated or launched."""
    check_tensor(OP, "grad_output", grad_output)
    check_tensor(OP, "self", self)
    check_like(OP, "grad_output", grad_output, "self", self)
    x_shape, g_shape = tuple(self.shape), tuple(grad_output.shape)
    if self.dim() not in (4, 5):
        raise InvalidProblem(OP, "self", "a 4-D (C, D, H, W) or 5-D (N, C, D, H, W) tensor",
                             f"a {self.dim()}-D tensor of shape {x_shape}")
    if 0 in x_shape[-4:]:  # (ATen's check: only the batch may be empty)
        raise InvalidProblem(OP, "self", "non-zero sizes in every dim but the batch", f"shape {x_shape}")
    spatial = x_shape[-3:]
    if any(i < k for i, k in zip(spatial, win.kernel, strict=True)):
        raise InvalidProblem(OP, "self", f"(D, H, W) sizes at least the kernel size {win.kernel}",
                             f"shape {x_shape}")
    out = tuple(output_size(i, k, s, p, win.ceil_mode)
                for i, k, s, p in zip(spatial, win.kernel, win.stride, win.padding, strict=True))
    want = (*x_shape[:-3], *out)
    if g_shape != want:
        raise InvalidProblem(OP, "grad_output", f"shape {want} (the pooled shape of self)", f"shape {g_shape}")


@plan_builder
def _plan(g_shape: tuple, g_stride: tuple, x_shape: tuple, win: _Window, mode: int, divisor: int,
          dtype: torch.dtype) -> _Plan:
    """The launch of a validated, non-empty problem under the config in force; an unbatched one as a batch of one
    (N's stride 0)."""
    cfg = CONFIG.current
    lead = (1,) * (5 - len(x_shape))
    n, c, d_in, h_in, w_in = lead + x_shape
    g_shape, g_stride = lead + g_shape, (0,) * len(lead) + g_stride
    out = g_shape[2:]
    n_rows = n * c * d_in * h_in
    bw = column_block(w_in, cfg.max_bw, cfg.min_bw)
    one_term = all(k <= st for k, st in zip(win.kernel, win.stride, strict=True))
    if one_term:
        tile = cfg.tile_one_term_16 if dtype.itemsize == 2 else cfg.tile_one_term
    elif win.kernel[2] > 1 and win.stride[2] == 1:
        tile = min(cfg.tile, 32 * cfg.warps * max(1, cfg.shifted_thread_bytes // dtype.itemsize))
    else:
        tile = cfg.tile
    br = min(triton.next_power_of_2(n_rows), max(1, tile // bw))
    n_cb = cdiv(w_in, bw)
    w_div = pow2_dividing(w_in) if cfg.row_align else 1
    n_tiles = cdiv(n_rows, br) * n_cb
    # 32-bit index math unless a row index, an offset into either tensor (a masked lane's too) or the window
    # arithmetic (sizes plus kernel, stride and padding) can pass 2^31
    g_reach = sum((size - 1) * abs(st) for size, st in zip(g_shape, g_stride, strict=True)) + 1
    reach = max((n_rows + br) * w_in + bw, g_reach, max(d_in, h_in, w_in) + 2 * max(win.kernel) + max(win.stride))
    i64 = reach > cfg.i32_max
    rows = n_rows + br  # (a row index's bound, then its quotients')
    magic, mag = magics((h_in, d_in, c), (rows, cdiv(rows, h_in), cdiv(rows, h_in * d_in)), cfg.magic and not i64)
    window = {f"{name}{i}": v for name, vals in (("K", win.kernel), ("S", win.stride), ("P", win.padding))
              for i, v in enumerate(vals)}
    consts = launch_consts({**window, "BR": br, "BW": bw, "MODE": mode,
                            "ACC": TL_MATH[math_dtype(dtype)], "I64": i64, "W_DIV": w_div,
                            "RECIP": cfg.reciprocals, "MAGIC": magic},
                           tile_warps(br * bw, cfg.warps))
    args = (n_tiles, n_cb, n_rows, c, (d_in, h_in, w_in // w_div), tuple(out), tuple(g_stride), divisor, mag)
    return _Plan(x_shape, min(n_tiles, cfg.max_programs), args, consts)


# a problem (grad_output's layout, self's shape, the window arguments) -> its plan


_VALIDATED = PlanCache("kernels.avg_pool._VALIDATED")



def avg_pool3d_backward(grad_output: torch.Tensor, self: torch.Tensor, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None) -> torch.Tensor:
    """Gradient of avg_pool3d: each grad_input element sums g / divisor over the outputs whose windows hold it, in
    a fixed order (no atomics)."""
    try:
        ks, ss, ps = values_key(kernel_size), values_key(stride), values_key(padding)
        key = None if None in (ks, ss, ps) else (
            grad_output.shape, grad_output.stride(), grad_output.dtype, grad_output.device, grad_output.is_neg(),
            self.shape, self.dtype, self.device, self.is_neg(), ks, ss, ps, ceil_mode, count_include_pad,
            divisor_override, type(divisor_override))
        plan = _VALIDATED.get(key)
    except (AttributeError, TypeError):  # not tensors, or a window argument that is not a sequence
        key = plan = None
    if plan is None:
        win = _window(kernel_size, stride, padding, ceil_mode)
        divisor = _divisor(divisor_override)
        _check(grad_output, self, win)
        if self.numel() == 0:
            return torch.empty(self.shape, dtype=self.dtype, device=self.device)
        mode = _OVERRIDE if divisor is not None else _INCLUDE_PAD if count_include_pad else _EXCLUDE_PAD
        plan = _VALIDATED.remember(key, _plan(tuple(grad_output.shape), grad_output.stride(), tuple(self.shape),
                                               win, mode, 1 if divisor is None else divisor, self.dtype))
    out = empty(plan.shape, self.dtype, self.device)
    device = self.get_device()
    launch(_avg_pool3d_backward_kernel, (plan.grid,), (out, grad_output), plan.args, plan.consts, device,
           (plan, device))
    return out


# ----------------------------------------------------------------------------------------------- cases
# (self shape, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, grad_output
# channels_last_3d): the layers of 3-D nets: AvgPool3d(2) (DenseNet-3D / 3-D U-Net transitions), (3, stride 1,
# padding 1) (Inception-3D branches), (3, stride 2, padding 1, ceil_mode) without counting the pads, a divisor
# override; odd sizes, unbatched
_CASES = {
    "tiny": [((1, 2, 8, 16, 16), (2, 2, 2), (), (0, 0, 0), False, True, None, False)],
    "small": [((2, 3, 6, 7, 8), (2, 2, 2), (), (0, 0, 0), False, True, None, False),
              ((3, 5, 6, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), False, True, None, False),
              ((1, 2, 7, 9, 8), (3, 3, 3), (2, 2, 2), (1, 1, 1), True, False, None, True),
              ((2, 2, 5, 6, 7), (2, 3, 2), (1, 2, 2), (0, 1, 1), False, True, 5, False)],
    "check": [((2, 16, 16, 28, 30), (2, 2, 2), (), (0, 0, 0), False, True, None, False),
              ((4, 32, 8, 14, 14), (3, 3, 3), (1, 1, 1), (1, 1, 1), False, True, None, True),
              ((2, 24, 9, 17, 17), (3, 3, 3), (2, 2, 2), (1, 1, 1), True, False, None, False),
              ((8, 10, 12, 13), (1, 3, 3), (1, 2, 2), (0, 1, 1), True, True, 7, False)],
    "large": [((8, 64, 32, 64, 64), (2, 2, 2), (), (0, 0, 0), False, True, None, False),
              ((16, 64, 16, 56, 56), (3, 3, 3), (1, 1, 1), (1, 1, 1), False, True, None, False),
              ((16, 128, 19, 41, 41), (3, 3, 3), (2, 2, 2), (1, 1, 1), True, False, None, False),
              ((32, 256, 8, 32, 32), (2, 2, 2), (), (0, 0, 0), False, True, 6, False)],
}


def _label(shape, k, s, p, ceil_mode, count_include_pad, divisor, cl) -> str:
    words = [f"{'x'.join(map(str, shape))} k{''.join(map(str, k))}"]
    for text, shown in ((f"s{''.join(map(str, s))}", bool(s)), (f"p{''.join(map(str, p))}", any(p)),
                        ("ceil", ceil_mode), ("excl. pad", not count_include_pad), (f"div {divisor}", divisor),
                        ("grad_output channels_last_3d", cl)):
        if shown:
            words.append(text)
    return " ".join(words)


def _cases(device, dtype, size: str) -> list[Case]:
    el = torch.empty((), dtype=dtype).element_size()
    out = []
    for shape, k, s, p, ceil_mode, cip, divisor, cl in _CASES[size]:
        win = _window(k, s, p, ceil_mode)
        g_shape = (*shape[:-3], *(output_size(i, *w, ceil_mode) for i, *w in
                                  zip(shape[-3:], win.kernel, win.stride, win.padding, strict=True)))
        g = randn(g_shape, device, dtype)
        if cl:
            g = g.contiguous(memory_format=torch.channels_last_3d)
        x = stand_in(shape, device, dtype)  # (self lends its shape and dtype only)
        out.append(Case(_label(shape, k, s, p, ceil_mode, cip, divisor, cl),
                        (g, x, list(k), list(s), list(p), ceil_mode, cip, divisor),
                        bytes=(g.numel() + x.numel()) * el, elements=x.numel()))
    return out


def _window_arg(rng, per_dim: list[int]) -> list[int]:
    """A window argument as ATen takes it: one int for the three dims where they agree (sometimes), else as given
    (three, or none for a stride: the kernel size)."""
    return per_dim[:1] if len(set(per_dim)) == 1 and rng.random() < 0.5 else per_dim


def _samples(rng, device, dtype):
    """Kernels of 1 to 3 a dim (overlapping windows, stride < kernel, too), strides given or not, pads up to half
    the kernel, ceil_mode, count_include_pad or not, divisor_override; batched (an empty batch too) and unbatched;
    grad_output in every layout (channels_last_3d too); self a broadcast stand-in or a tensor."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        k = [rng.randint(1, 3) for _ in range(3)]
        s = [rng.randint(1, 3) for _ in range(3)] if rng.random() < 0.7 else []
        p = [rng.randint(0, n // 2) for n in k]
        ceil_mode, include_pad = rng.random() < 0.5, rng.random() < 0.5
        divisor = rng.choice((None, None, None, 1, 5, -3))
        lead = d.sizes(rng.choice((1, 2)), "any", hi=2)
        if edge == "empty" and len(lead) == 2:
            lead[0] = 0
        spatial = [n + e for n, e in zip(k, d.sizes(3, "any", hi=3, lo=0))]  # (at least the kernel)
        if edge == "odd":
            spatial = [n | 1 for n in spatial]
        elif edge == "ones":
            spatial = [1 if kk == 1 else n for kk, n in zip(k, spatial)]
        out = [output_size(i, kk, ss, pp, ceil_mode) for i, kk, ss, pp in zip(spatial, k, s or k, p)]
        g = d.tensor((*lead, *out), kinds=("grid", "normal", "special"), huge=False)
        x = stand_in((*lead, *spatial), device, dtype) if rng.random() < 0.7 else d.tensor((*lead, *spatial))
        window = [_window_arg(rng, v) for v in (k, s, p)]
        yield Case(describe(grad_output=g, self=x, kernel_size=window[0], stride=window[1], padding=window[2],
                            ceil_mode=ceil_mode, count_include_pad=include_pad, divisor_override=divisor),
                   (g, x, *window, ceil_mode, include_pad, divisor))


def _errors(device):
    t = rand_on(device)
    g, x = t(2, 3, 2, 2, 2), t(2, 3, 4, 4, 4)
    ok = ([2, 2, 2], [], [0, 0, 0], False, True, None)

    def bad(label, error, arg, grad=g, self=x, **changes):
        names = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
        window = [changes.get(n, v) for n, v in zip(names, ok)]
        return refuse(label, error, arg, grad, self, *window)

    return [bad("a kernel size of 0", InvalidProblem, "kernel_size", kernel_size=[0, 2, 2]),
            bad("a kernel_size of two ints", InvalidProblem, "kernel_size", kernel_size=[2, 2]),
            bad("a stride of 0", InvalidProblem, "stride", stride=[0]),
            bad("a pad past half the kernel", InvalidProblem, "padding", padding=[2, 0, 0]),
            bad("divisor_override 0", InvalidProblem, "divisor_override", divisor_override=0),
            bad("self smaller than the kernel", InvalidProblem, "self", self=t(2, 3, 1, 4, 4)),
            bad("a 3-D self", InvalidProblem, "self", grad=t(3, 2, 2), self=t(3, 4, 4)),
            bad("grad_output of another shape", InvalidProblem, "grad_output", grad=t(2, 3, 2, 2, 3)),
            bad("grad_output of another dtype", Unsupported, "grad_output", grad=g.double())]


def _moved_bytes(grad_output: torch.Tensor, self: torch.Tensor, *_) -> int:
    # self is not read: grad_output read once, grad_input written once
    return (grad_output.numel() + self.numel()) * self.element_size()


register_op(OP, aten=(OP,), accumulates=True, cases=_cases, moved_bytes=_moved_bytes, samples=_samples,
            errors=_errors,
            route_doc="gradkern, for every problem: stock's CUDA kernel scatters with atomics where windows "
                      "overlap (nondeterministic, and raising under torch.use_deterministic_algorithms(True))")(
    avg_pool3d_backward)
