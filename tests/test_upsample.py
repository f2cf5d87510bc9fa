"""Upsampling backward (linear 1d, bilinear 2d, trilinear 3d, bicubic 2d, antialiased bilinear 2d): the per-dim
output ranges exactly against the forward's own taps, every op against stock PyTorch (align_corners both ways, sizes
and scales, up and down, sizes of 1, every dtype), strided and channels_last grad_output read in place, ATen's
output layouts, CUDA's copy when nothing is resized, NaN/inf propagation, tilings and index widths, bad inputs,
and training through F.interpolate under enable()."""

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import gradkern
from _det_helpers import check_refusals, check_registry_entries, check_training_step
from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import config, ops
from gradkern.kernels import upsample as up
from gradkern.launch.alloc import channels_last_format
from gradkern.registry import REGISTRY
from gradkern.testing import (
    assert_bitwise_equal,
    assert_close,
    assert_repeats_bitwise,
    check_case,
    layouts_nd,
    record_launches,
    run_reference,
    spy_on_ops,
)

LINEAR1D, BILINEAR, TRILINEAR, BICUBIC, AA = OPS = [
    "upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_trilinear3d_backward",
    "upsample_bicubic2d_backward", "_upsample_bilinear2d_aa_backward"]
GPU = DEVICE == "cuda"
MODES = {"linear": int(up._LINEAR), "cubic": int(up._CUBIC), "antialias": int(up._ANTIALIAS)}


def _dims(op: str) -> int:
    return 1 if "1d" in op else 3 if "3d" in op else 2


def _args(op, in_sizes, out_sizes, align=False, scales=None, dtype=torch.float32, fmt=None) -> tuple:
    """ATen's arguments: (grad_output, output_size, input_size, align_corners, *scales)."""
    g = torch.randn(*in_sizes[:2], *out_sizes, device=DEVICE).to(dtype)
    if fmt is not None:
        g = g.contiguous(memory_format=fmt)
    return (g, list(out_sizes), list(in_sizes), align, *(scales or (None,) * _dims(op)))


def _plan(op, in_sizes, out_sizes, fmt=None, align=False):
    """The op's f32 plan for a grad_output of `out_sizes` in layout `fmt` (grad_input in ATen's layout)."""
    g = torch.empty((*in_sizes[:2], *out_sizes), device="meta", memory_format=fmt or torch.contiguous_format)
    spec = up._SPECS[op]
    keep = channels_last_format(g) if spec.keeps_layout else None
    return up._plan(spec, g.stride(), tuple(in_sizes), tuple(out_sizes), align, (None,) * len(out_sizes), keep,
                    torch.float32)


# ----------------------------------------------------------------------------------------------- ranges
@triton.jit
def _ranges_kernel(n_in_ptr, n_out_ptr, scale_ptr, i_ptr, lo_ptr, hi_ptr, hit_ptr, n, MAXO: tl.constexpr,
                   MODE: tl.constexpr, ALIGN: tl.constexpr, BLOCK: tl.constexpr):
    """Per lane (n_in, n_out, scale, i): the kernel's range of outputs reading input i, and for every output
    whether one of its taps lands on i (the forward's own index math)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    n_in = tl.load(n_in_ptr + offs, mask=m, other=1)
    n_out = tl.load(n_out_ptr + offs, mask=m, other=1)
    scale = tl.load(scale_ptr + offs, mask=m, other=1.0)
    i = tl.load(i_ptr + offs, mask=m, other=0)
    lo, hi = up._readers(i, n_in, n_out, scale, MODE, ALIGN)
    tl.store(lo_ptr + offs, lo, mask=m)
    tl.store(hi_ptr + offs, hi, mask=m)
    for o in range(0, MAXO):
        oo = tl.zeros_like(i) + o
        _w, hit, _z = up._weight(oo, i, n_in, scale, MODE, ALIGN)
        tl.store(hit_ptr + offs * MAXO + o, hit.to(tl.int8), mask=m & (oo < n_out))


def _lanes(align: bool):
    """(n_in, n_out, scale) for every size pair in 1..16, sizes from scale factors (F.interpolate's floor(in * s),
    the factor passed on), and factors that do not match the sizes at all (the forward's sources overshoot)."""
    problems = [(i, o, None) for i in range(1, 17) for o in range(1, 17)]
    problems += [(i, math.floor(i * s), s) for i in range(1, 17) for s in (0.3, 0.55, 1.04, 1.7, 2.6, 3.3, 5.0)
                 if math.floor(i * s) >= 1]
    problems += [(5, 11, 0.9), (9, 4, 0.1), (7, 7, 0.6), (3, 12, 0.2), (12, 3, 9.0)]
    return [(i, o, up._scale(i, o, align, s, torch.float32)) for i, o, s in problems]


@pytest.mark.parametrize("align", [False, True], ids=["half_pixel", "align_corners"])
@pytest.mark.parametrize("mode", MODES)
def test_each_input_gets_exactly_the_outputs_whose_taps_land_on_it(mode, align):
    """Along a dim, the outputs whose taps (linear 2, cubic 4 clamped, antialias window) land on input i form the
    range the kernel computes (the inverse's estimate corrected against the forward's index math): for every size
    pair in 1..16, scale factors, and scales inconsistent with the sizes."""
    lanes = [(n_in, n_out, s, i) for n_in, n_out, s in _lanes(align) for i in range(n_in)]
    n_in, n_out, scale, idx = (torch.tensor(c, device=DEVICE) for c in zip(*lanes, strict=True))
    n_in, n_out, idx, scale = n_in.int(), n_out.int(), idx.int(), scale.float()
    maxo = int(n_out.max())
    lo, hi = torch.empty_like(idx), torch.empty_like(idx)
    hits = torch.zeros(len(lanes), maxo, dtype=torch.int8, device=DEVICE)
    block = 1024
    _ranges_kernel[(triton.cdiv(len(lanes), block),)](n_in, n_out, scale, idx, lo, hi, hits, len(lanes),
                                                      MAXO=maxo, MODE=MODES[mode], ALIGN=align, BLOCK=block)
    hits, lo, hi = hits.cpu().numpy().astype(bool), lo.cpu().numpy(), hi.cpu().numpy()
    outputs = np.arange(maxo)
    expected = (outputs[None, :] >= lo[:, None]) & (outputs[None, :] < hi[:, None])
    bad = np.nonzero((hits != expected).any(axis=1))[0]
    assert not len(bad), [(lanes[k], (lo[k], hi[k]), np.nonzero(hits[k])[0].tolist()) for k in bad[:5]]
    assert (hits.sum(axis=0) > 0).any()


def test_downsampling_takes_few_candidates_whatever_the_factor():
    """Downsampling reads each input from at most a few outputs (2 linear, 4 cubic, 3 antialias), so the candidate
    axis and the tables stay short even for large factors: cost tracks the outputs per input, not the factor."""
    cfg = up.CONFIG.current
    for mode, most in ((up._LINEAR, 2), (up._CUBIC, 4), (up._ANTIALIAS, 4)):
        for n_in, n_out in ((1000, 3), (512, 7), (97, 13)):
            readers = up._most(int(mode), n_in, n_out, up._scale(n_in, n_out, False, None, torch.float32), False, cfg)
            assert up._candidates(readers, cfg) <= most and up._width(int(mode), readers) <= most + 2
    # (8x up: 17 candidates, taken 16 at a time)
    assert up._candidates(up._most(int(up._LINEAR), 8, 64, 0.125, False, cfg), cfg) == 16


@pytest.mark.parametrize("op", [LINEAR1D, BILINEAR, TRILINEAR])
def test_leading_readers_of_weight_zero_take_no_candidate_slot(op, monkeypatch):
    """2x linear upsampling: input 1's first reader has weight 0 on it (half-pixel: output 0, clamped onto input 0;
    align_corners: output 0 at position 0 exactly), a fifth reader where the others have 4. The W table leaves such
    leading readers out and the kernels add their g * 0 apart (LEAD), so 2x takes 4 candidates, not 8; an infinite
    g at output 0 still gives stock's NaN on input 1. Scales whose counts do not shrink keep the plain kernel."""
    d = _dims(op)
    launches = record_launches(monkeypatch, up)
    cases = [((1, 2, *(3, 4, 6)[-d:]), (6, 8, 12)[-d:], False, None, None),
             ((1, 2, *(2, 3, 64)[-d:]), (3, 5, 128)[-d:], True, None, None),  # (63/127: 4 readers but at 1)
             ((2, 16, *(2, 3, 5)[-d:]), (4, 6, 10)[-d:], False, None, "cl")]
    for in_sizes, out_sizes, align, scales, fmt in cases:
        if fmt and d == 1:
            continue
        layout = fmt and (torch.channels_last if d == 2 else torch.channels_last_3d)
        args = _args(op, in_sizes, out_sizes, align, scales, fmt=layout)
        g = args[0]
        g[..., 0] = math.inf  # (output 0 along W: input 1's reader of weight 0)
        g[0, -1, ..., 3] = -math.inf
        launches.clear()
        check_case(op, args, what=f"{op} {in_sizes} <- {out_sizes} align={align} {fmt}")
        tile = launches[-1].consts
        assert (tile["KW"], tile["LEAD"]) == (4, True), (in_sizes, out_sizes, align, tile)
        assert ("BC" in tile) is bool(fmt)
    launches.clear()
    check_case(op, _args(op, (1, 2, *(3, 4, 6)[-d:]), (5, 7, 10)[-d:]), what=f"{op} x1.7")
    assert not launches[-1].consts["LEAD"]


# ----------------------------------------------------------------------------------------------- vs stock
# (input sizes, output sizes, align_corners, scales): up, down and both at once, scales that differ from in/out
# (F.interpolate's floor(in * s)), sizes of 1 on either side, a downsampling by a large factor
SEMANTICS = {
    1: [((2, 3, 9), (20,), False, None), ((1, 2, 13), (5,), True, None), ((2, 1, 7), (16,), False, (2.3,)),
        ((1, 2, 1), (6,), False, None), ((1, 2, 6), (1,), True, None), ((1, 1, 300), (4,), False, None),
        ((1, 2, 10), (3,), False, (0.37,))],
    2: [((1, 2, 5, 7), (11, 4), False, None), ((1, 1, 6, 4), (9, 9), True, None),
        ((1, 2, 5, 6), (11, 13), False, (2.3, 2.2)), ((1, 1, 1, 5), (3, 1), False, None),
        ((1, 1, 4, 1), (1, 7), True, None), ((1, 1, 40, 6), (3, 13), False, (0.08, 2.2))],
    3: [((1, 1, 3, 4, 5), (5, 2, 9), False, None), ((1, 2, 2, 3, 4), (3, 5, 2), True, None),
        ((1, 1, 3, 2, 4), (7, 4, 3), False, (2.5, 2.1, 0.9)), ((1, 1, 1, 3, 2), (2, 1, 5), False, None)],
}


@pytest.mark.parametrize("op", OPS)
def test_matches_stock(op):
    for in_sizes, out_sizes, align, scales in SEMANTICS[_dims(op)]:
        args = _args(op, in_sizes, out_sizes, align, scales)
        res = check_case(op, args, what=f"{op} {in_sizes} <- {out_sizes} align={align} scales={scales}")
        assert res.shape == in_sizes and res.dtype == torch.float32


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_every_dtype_matches_stock(op, dtype):
    """fp32 math for 16-bit inputs (within their tolerance of the float64 result), fp64 for f64."""
    for in_sizes, out_sizes, align, scales in SEMANTICS[_dims(op)][:2]:
        res = check_case(op, _args(op, in_sizes, out_sizes, align, scales, dtype), what=f"{op} {in_sizes}")
        assert res.dtype == dtype


@pytest.mark.parametrize("op", OPS)
def test_strided_grad_output_is_read_in_place(op, monkeypatch):
    in_sizes, out_sizes, align, scales = SEMANTICS[_dims(op)][0]
    in_sizes = (2, 2, *in_sizes[2:])
    g0, *rest = _args(op, in_sizes, out_sizes, align, scales)
    launches = record_launches(monkeypatch, up)
    for name, g in layouts_nd(g0, transpose=(0, 1), plane=1):
        launches.clear()
        check_case(op, (g, *rest), what=f"{op} grad_output {name}")
        read = launches[0].ptrs[1]  # the kernel's grad_output argument
        assert read.data_ptr() == g.data_ptr() and read.stride() == g.stride(), f"{name}: grad_output was copied"


@pytest.mark.parametrize("op", [BILINEAR, TRILINEAR, BICUBIC, AA])
def test_grad_output_along_h_is_tiled_with_h_and_w_swapped(op, monkeypatch):
    """A grad_output whose fastest axis is H (transposed H and W) is tiled with the two swapped, so that the plane
    tile's lanes read along it: the kernel's W stride is grad_output's 1. The values are stock's, and grad_input
    keeps stock's layout."""
    d = _dims(op)
    in_sizes, out_sizes = (2, 3, *(2, 5, 6)[-d:]), (3, 9, 13)[-d:]
    g = torch.randn(*in_sizes[:2], *out_sizes[:-2], out_sizes[-1], out_sizes[-2], device=DEVICE).transpose(-1, -2)
    launches = record_launches(monkeypatch, up)
    res = check_case(op, (g, list(out_sizes), list(in_sizes), False, *(None,) * d), what=f"{op} transposed")
    assert res.is_contiguous()
    ints = launches[-1].ints  # (n_tiles, C, D, H, W, grad_output's strides N, C, D, H, W, ...)
    assert (ints[3], ints[4], ints[8], ints[9]) == (in_sizes[-1], in_sizes[-2], out_sizes[-2], 1), ints


def _grads():
    """(label, op, grad_output, input sizes) over the layouts that decide ATen's grad_input layout."""
    cl, cl3 = torch.channels_last, torch.channels_last_3d

    def g(*shape, fmt=None):
        t = torch.randn(shape, device=DEVICE)
        return t.contiguous(memory_format=fmt) if fmt is not None else t

    for op in (BILINEAR, BICUBIC, AA):
        yield "contiguous", op, g(2, 3, 3, 2), (2, 3, 2, 3)
        yield "channels_last", op, g(2, 3, 3, 2, fmt=cl), (2, 3, 2, 3)
        yield "channels_last C=1", op, g(2, 1, 3, 2, fmt=cl), (2, 1, 2, 3)
        yield "channels_last 1x1 planes", op, g(2, 3, 1, 1, fmt=cl), (2, 3, 2, 3)
        yield "transposed", op, g(2, 3, 2, 3).transpose(-1, -2), (2, 3, 2, 3)
        yield "permuted N, C", op, g(3, 2, 3, 2).transpose(0, 1), (2, 3, 2, 3)
    yield "3d contiguous", TRILINEAR, g(1, 3, 2, 2, 3), (1, 3, 3, 2, 2)
    yield "3d channels_last_3d", TRILINEAR, g(2, 3, 2, 2, 3, fmt=cl3), (2, 3, 3, 2, 2)
    yield "3d channels_last_3d C=1", TRILINEAR, g(2, 1, 2, 2, 3, fmt=cl3), (2, 1, 3, 2, 2)
    yield "1d transposed", LINEAR1D, g(3, 2, 6).transpose(0, 1), (2, 3, 4)


def test_output_layout_is_atens():
    """grad_input takes grad_output's suggested memory format for bilinear, trilinear and antialiased bilinear
    (their meta functions), contiguous for bicubic and linear: the strides stock PyTorch returns."""
    for label, op, g, in_sizes in _grads():
        ours = getattr(ops, op)(g, list(g.shape[2:]), list(in_sizes), False)  # (values: the other tests)
        stock = getattr(torch.ops.aten, op)(g.cpu(), list(g.shape[2:]), list(in_sizes), False)
        assert ours.stride() == stock.stride(), (op, label, ours.stride(), stock.stride())
        if g.dim() >= 4:
            from torch._prims_common import suggest_memory_format
            fmt = channels_last_format(g)
            assert (fmt or torch.contiguous_format) == suggest_memory_format(g), label


@pytest.mark.parametrize("op", OPS)
def test_empty_batch_or_channels(op, monkeypatch):
    """N = 0 or C = 0: an empty grad_input of stock's shape and strides, nothing launched."""
    d = _dims(op)
    spatial, out = (5, 6, 7)[-d:], (2, 3, 4)[-d:]
    launches = record_launches(monkeypatch, up)
    fmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(d)
    for lead, memory_format in (((0, 3), None), ((0, 3), fmt), ((2, 0), None)):
        args = _args(op, (*lead, *spatial), out, fmt=memory_format)
        ours = getattr(ops, op)(*args)
        stock = getattr(torch.ops.aten, op)(args[0].cpu(), *args[1:])
        assert ours.shape == stock.shape == (*lead, *spatial) and ours.stride() == stock.stride()
    assert not launches


# ----------------------------------------------------------------------------------------------- CUDA's semantics
@pytest.mark.parametrize("op", OPS)
def test_no_dim_resized_copies_grad_output_whatever_the_scales(op):
    """ATen's CUDA kernels copy grad_output when no dim is resized, scales or not (stock CPU's antialias kernel
    applies the scales instead; its other kernels agree with the copy)."""
    d = _dims(op)
    sizes = (2, 3, *(4, 5, 6)[-d:])
    for scales in (None, (0.7, 1.4, 2.0)[-d:]):
        args = _args(op, sizes, sizes[2:], False, scales)
        assert_bitwise_equal(getattr(ops, op)(*args), args[0], f"{op} scales {scales}")


def _padded_reference(op, args):
    """Stock PyTorch (float64, CPU) with CUDA's semantics for dims that keep their size but have a scale: with one
    extra output along each (whose gradient is zero) stock applies the scale, and the extra output reads nothing
    the others do not (an output's taps depend on its own index alone)."""
    g, out_sizes, in_sizes, align, *scales = args
    kept = [d for d in range(2, g.dim()) if in_sizes[d] == out_sizes[d - 2]]
    pad = [p for d in reversed(range(2, g.dim())) for p in (0, int(d in kept))]
    out_sizes = [o + (d + 2 in kept) for d, o in enumerate(out_sizes)]
    return run_reference(lambda t: getattr(torch.ops.aten, op)(F.pad(t, pad), out_sizes, in_sizes, align, *scales),
                         (g,))


@pytest.mark.parametrize("op", [BILINEAR, TRILINEAR])
def test_a_dim_that_keeps_its_size_uses_its_scale(op):
    """Where a dim keeps its size and another is resized, ATen's CUDA kernels compute the kept dim with its scale
    (1 / scale, as any other); stock CPU's linear kernels take it as the identity there. gradkern follows CUDA."""
    in_sizes, out_sizes, scales = ((1, 2, 5, 4), (5, 7), (0.7, None)) if op == BILINEAR else \
        ((1, 2, 3, 4, 5), (3, 6, 5), (0.8, 1.5, 0.6))
    args = _args(op, in_sizes, out_sizes, False, scales)
    ours = getattr(ops, op)(*args)
    assert_close(ours, _padded_reference(op, args), torch.float32, op, summed_from=args[0].numel())
    assert (ours.double().cpu() - run_reference(getattr(torch.ops.aten, op), args)).abs().max() > 1e-3


@pytest.mark.parametrize("op", OPS)
def test_infinities_give_stocks_nans(op):
    """Stock adds w * g for every tap, weight zero included (0 * inf = NaN), also where two taps of one output land
    on the same input (a border: the align_corners corner, clamped cubic taps); each input's NaN, inf or finite
    value is stock's."""
    d = _dims(op)
    for align in (False, True):
        args = _args(op, (1, 2, *(3, 4, 5)[-d:]), (5, 7, 9)[-d:], align)
        g = args[0]
        g.view(-1)[[0, 7, g.numel() // 2 - 1, g.numel() - 1]] = torch.tensor([math.inf, -math.inf, math.nan,
                                                                                math.inf], device=g.device)
        check_case(op, args, what=f"{op} align={align}")


def _mixed_inputs(op, n_in, n_out, align=False) -> list[list[int]]:
    """Per resized dim (D, H, W as the op has them), the inputs whose table marks some term mixed."""
    d = _dims(op)
    plan = _plan(op, (1, 1, *(n_in,) * d), (n_out,) * d, align=align)
    like = torch.empty(1, device=DEVICE)
    idx = up._tables(plan, like, like.get_device())[0]
    found, at = [], 0
    for n, *_ in plan.dims:
        counts = idx[at + n:at + 2 * n].cpu()
        found.append([i for i in range(n) if int(counts[i]) >= int(up._MIXED)])
        at += 3 * n
    return found[-d:]


def test_terms_are_mixed_only_where_their_weight_is_not_zero():
    """A term gets its g * 0 added apart (and its tile the loop with the mixed flags) only where the taps landing on
    an input include a zero weight or both signs and their sum is not 0: a sum of 0 gives stock's NaN by itself
    (0 * inf). Linear: input 1's reader of weight 0 (output 0 clamped onto input 0) sums to 0, so no input of a
    dim resized without align_corners is mixed; cubic: the clamped border taps of both signs are."""
    assert _mixed_inputs(TRILINEAR, 40, 52) == [[], [], []]
    assert _mixed_inputs(BILINEAR, 7, 9) == [[], []]
    # (align_corners' corner: the last output's taps are both the last input, weights 1 and 0)
    assert _mixed_inputs(BILINEAR, 7, 9, align=True) == [[6], [6]]
    assert all(dim for dim in _mixed_inputs(BICUBIC, 8, 16))


@pytest.mark.parametrize("op", [BILINEAR, TRILINEAR, BICUBIC])
def test_infinities_in_tiles_with_and_without_mixed_terms(op):
    """Tiles of one problem take the loop with the mixed flags or the one without (`_some`): infinities and NaNs
    spread over both kinds give stock's values (small tiles, so that a plane has several)."""
    d = _dims(op)
    args = _args(op, (1, 2, *(5, 11, 13)[-d:]), (7, 16, 20)[-d:])
    g = args[0].view(-1)
    g[torch.arange(0, g.numel(), 37, device=g.device)] = math.inf
    g[torch.arange(5, g.numel(), 53, device=g.device)] = -math.inf
    g[torch.arange(11, g.numel(), 97, device=g.device)] = math.nan
    for unmixed_loop in (True, False):
        with config.override(up.CONFIG, block=32, max_bw=8, unmixed_loop=unmixed_loop):
            check_case(op, args, what=f"{op} unmixed_loop={unmixed_loop}")


# ----------------------------------------------------------------------------------------------- tilings
@pytest.mark.parametrize("op", [BILINEAR, TRILINEAR, BICUBIC, AA])
def test_tilings_chunks_and_index_widths(op, monkeypatch):
    """Repeats, programs that take several tiles in turn (normally past 2^30 tiles) and int64 index math (normally
    past 2^31) give the same bits; other tile shapes, row tiles (channels_last's) of a contiguous grad_input and
    candidates taken a few at a time (normally past 16) sum the same terms in another grouping: stock's values."""
    in_sizes, out_sizes, align, scales = SEMANTICS[_dims(op)][2]
    args = _args(op, (1, 2 if len(out_sizes) < 3 else 1, *in_sizes[2:]), out_sizes, align, scales)  # (2+ planes)
    fn = getattr(ops, op)
    first = fn(*args)
    assert_bitwise_equal(fn(*args), first, f"{op} run twice")
    launches = record_launches(monkeypatch, up)
    for knobs in ({"max_programs": 1}, {"i32_max": 4}):
        launches.clear()
        with config.override(up.CONFIG, **knobs):
            assert_bitwise_equal(fn(*args), first, f"{op} {knobs}")
        ints, consts = launches[0].ints, launches[0].consts
        assert ints[0] > 1 if "max_programs" in knobs else consts["I64"], knobs  # (tiles > programs)
    for knobs in ({"block": 8}, {"max_bw": 2}, {"max_kw": 2}, {"tiling": "rows", "max_bc": 1}):
        launches.clear()
        with config.override(up.CONFIG, **knobs):
            ours = fn(*args)
        assert_close(ours, run_reference(getattr(torch.ops.aten, op), args), torch.float32, f"{op} {knobs}",
                     summed_from=args[0].numel())
        assert ("BC" in launches[0].consts) is ("tiling" in knobs), knobs


@pytest.mark.parametrize("op", [BILINEAR, TRILINEAR, AA])
def test_channels_last_takes_row_tiles(op, monkeypatch):
    """A channels_last grad_input of several channels (C not a multiple of the channel block: several blocks) is
    written by row tiles, C fastest; a single channel, or a contiguous grad_input, by plane tiles."""
    d = _dims(op)
    fmt = torch.channels_last if d == 2 else torch.channels_last_3d
    launches = record_launches(monkeypatch, up)
    with config.override(up.CONFIG, max_bc=2):
        for c, memory_format, rows in ((5, fmt, True), (1, fmt, False), (5, None, False)):
            launches.clear()
            args = _args(op, (1, c, *(3, 4, 5)[-d:]), (5, 2, 9)[-d:], True, fmt=memory_format)
            check_case(op, args, what=f"{op} C={c} {memory_format}")
            assert ("BC" in launches[0].consts) is rows, (c, memory_format)


# ----------------------------------------------------------------------------------------------- compiled
_COMPILE = textwrap.dedent("""
    import json, sys
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gradkern.kernels import upsample as up

    failures = []
    for spec in json.load(open(sys.argv[1])):
        kernel = getattr(up, spec["kernel"])
        names, fixed = kernel.arg_names, set(kernel.do_not_specialize or ())
        ptrs = dict(zip(names, spec["ptrs"]))
        values = dict(zip(names, [None] * len(ptrs) + spec["ints"]))
        sig, consts = {}, {}
        for i, name in enumerate(names):
            v = values.get(name)
            if name in spec["consts"]:
                c = spec["consts"][name]
                sig[name], consts[(i,)] = "constexpr", tl.dtype(c[1:]) if isinstance(c, str) and c[0] == "~" else c
            elif name in ptrs:
                sig[name] = ptrs[name]
            elif v == 1 and name not in fixed:  # (what the JIT does with an integer argument equal to 1)
                sig[name], consts[(i,)] = "constexpr", 1
            else:
                sig[name] = "i32" if -2**31 <= v < 2**31 else "i64"
        try:
            triton.compile(ASTSource(kernel, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": spec["warps"]})
        except Exception as e:  # noqa: BLE001 - every failure is reported with its problem
            failures.append(f"{spec['label']}: {type(e).__name__}: {str(e)[-1500:]}")
    print(json.dumps(failures))
""")


TABLE_PTRS = ["*i32", "*fp32", "*i8"]  # (idx, wt, mx in float32 math)


def test_kernels_compile_with_sizes_of_one(tmp_path):
    """Compiled Triton specialises an integer argument equal to 1 to a constexpr (a Python int in the kernel),
    which the interpreter never does: sizes of 1 (a 2-d problem's D, 1x1 pyramid bins, N = C = 1, a dim resized
    from or to 1) reached `.to()` on an int and failed to compile on the GPU (Triton 3.6). Here each kernel is
    compiled for sm_90 with its problem's ones specialised as the JIT does, in a process without the
    interpreter."""
    specs = []
    cl, cl3 = torch.channels_last, torch.channels_last_3d
    for op, in_sizes, out_sizes, fmt in (
            (LINEAR1D, (1, 1, 1), (6,), None), (LINEAR1D, (1, 2, 6), (1,), None),
            (BILINEAR, (2, 8, 1, 1), (16, 16), None), (BILINEAR, (1, 1, 3, 1), (1, 7), None),
            (BILINEAR, (2, 8, 1, 1), (16, 16), cl), (BICUBIC, (1, 1, 1, 1), (5, 1), None),
            (AA, (1, 3, 1, 1), (4, 4), cl), (AA, (1, 1, 9, 1), (1, 5), None),
            (TRILINEAR, (1, 1, 1, 1, 1), (1, 1, 5), None), (TRILINEAR, (1, 4, 1, 2, 1), (3, 1, 2), cl3)):
        plan = _plan(op, in_sizes, out_sizes, fmt)
        consts = {k: (f"~{v.name}" if isinstance(v, tl.dtype) else v) for k, v in plan.consts.items()
                  if k not in ("__values__", "num_warps")}
        label = f"{op} {in_sizes} <- {out_sizes} {fmt}"
        specs.append({"label": label, "kernel": plan.kernel.fn.__name__, "ptrs": ["*fp32"] * 2 + TABLE_PTRS,
                      "ints": list(plan.args), "consts": consts, "warps": plan.consts["num_warps"]})
        for n_in, n_out, bits, width, mode, align, lead in plan.dims:  # (the table kernel, one launch a dim)
            specs.append({"label": f"{label} table {n_in} <- {n_out}", "kernel": "_table_kernel",
                          "ptrs": TABLE_PTRS, "ints": [n_in, n_out, bits, width], "warps": 4,
                          "consts": {"MODE": mode, "ALIGN": align, "ACC": "~fp32", "LEAD": lead,
                                     "BI": up._TABLE_BLOCK, "BK": up._TABLE_CHUNK}})
    path = tmp_path / "specs.json"
    path.write_text(json.dumps(specs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(path)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------------------------- errors
def test_bad_inputs_raise_named_errors_and_launch_nothing(monkeypatch):
    g, out, inp, align, sh, sw = _args(BILINEAR, (2, 3, 4, 5), (7, 9))
    g3 = _args(TRILINEAR, (1, 2, 3, 4, 5), (4, 5, 6))[0]
    bl, tri, lin = ops.upsample_bilinear2d_backward, ops.upsample_trilinear3d_backward, ops.upsample_linear1d_backward
    before = g.clone()
    launches = record_launches(monkeypatch, up)
    cases = [
        (gradkern.InvalidProblem, r"output_size.*2 sizes.*3", lambda: bl(g, [7, 9, 1], inp, False)),
        (gradkern.InvalidProblem, r"input_size.*4 sizes.*3", lambda: bl(g, out, inp[1:], False)),
        (gradkern.InvalidProblem, r"input_size.*5 sizes.*4", lambda: tri(g3, [4, 5, 6], inp, False)),
        (gradkern.InvalidProblem, r"greater than 0.*\[2, 3, 0, 5\]", lambda: bl(g, out, [2, 3, 0, 5], False)),
        (gradkern.InvalidProblem, r"greater than 0.*output_size \[0, 9\]", lambda: bl(g[:, :, :0], [0, 9], inp,
                                                                                        False)),
        (gradkern.InvalidProblem, r"input_size.*batch and channel.*-1", lambda: bl(g, out, [-1, 3, 4, 5], False)),
        (gradkern.InvalidProblem, r"grad_output.*shape \(2, 3, 7, 9\).*\(2, 3, 7, 8\)",
         lambda: bl(g[..., :8], out, inp, False)),
        (gradkern.InvalidProblem, r"grad_output.*shape \(2, 3, 7, 9\).*\(3, 7, 9\)", lambda: bl(g[0], out, inp,
                                                                                             False)),
        (gradkern.InvalidProblem, r"grad_output.*shape \(3, 3, 7, 9\)", lambda: bl(g, out, [3, 3, 4, 5], False)),
        (gradkern.InvalidProblem, r"scales_w.*reciprocal.*1e-300", lambda: bl(g, out, inp, False, None, 1e-300)),
        (gradkern.Unsupported, r"grad_output.*dtype.*torch.int32", lambda: bl(g.int(), out, inp, False)),
        (gradkern.Unsupported, r"grad_output.*torch.Tensor.*list", lambda: bl(g.tolist(), out, inp, False)),
        (gradkern.Unsupported, r"grad_output.*device", lambda: bl(g.to("meta"), out, inp, False)),
        (gradkern.Unsupported, r"align_corners.*a bool.*int", lambda: bl(g, out, inp, 1)),
        (gradkern.Unsupported, r"scales_h.*float or None.*str", lambda: bl(g, out, inp, False, "2")),
        (gradkern.Unsupported, r"output_size.*ints.*7.0", lambda: bl(g, [7.0, 9], inp, False)),
        (gradkern.Unsupported, r"input_size.*sequence.*int", lambda: lin(g[0], [9], 5, False)),
    ]
    check_refusals(cases, launches, OPS, (g,), (before,))


def test_registry_entries():
    check_registry_entries(OPS, "small")


# ----------------------------------------------------------------------------------------------- training
def _interpolations():
    """(label, function, input shape, channels_last, the op its backward runs, 16-bit stock on CPU)."""
    cl = torch.channels_last
    return [
        ("linear size", lambda t: F.interpolate(t, size=13, mode="linear"), (2, 3, 6), None, LINEAR1D, True),
        ("linear scale align_corners", lambda t: F.interpolate(t, scale_factor=0.6, mode="linear",
                                                               align_corners=True), (1, 2, 11), None, LINEAR1D,
         True),
        ("bilinear scale", lambda t: F.interpolate(t, scale_factor=2.3, mode="bilinear"), (1, 2, 4, 5), None,
         BILINEAR, True),
        ("bilinear channels_last align_corners", lambda t: F.interpolate(t, size=(7, 3), mode="bilinear",
                                                                         align_corners=True), (2, 3, 4, 6), cl,
         BILINEAR, True),
        ("trilinear", lambda t: F.interpolate(t, scale_factor=(1.5, 2.0, 0.7), mode="trilinear"), (1, 2, 2, 3, 6),
         None, TRILINEAR, True),
        ("bicubic", lambda t: F.interpolate(t, size=(9, 5), mode="bicubic", align_corners=False), (1, 2, 4, 7),
         None, BICUBIC, True),
        ("bilinear antialias down", lambda t: F.interpolate(t, size=(3, 4), mode="bilinear", antialias=True),
         (1, 2, 10, 9), None, AA, False),
        ("bilinear antialias scale", lambda t: F.interpolate(t, scale_factor=0.45, mode="bilinear", antialias=True,
                                                             align_corners=True), (1, 2, 9, 7), cl, AA, False),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_training_through_interpolate_runs_gradkern(dtype, monkeypatch):
    """One training step through F.interpolate (every mode, sizes and scale factors, channels_last) under
    gradkern.use(mode="always"): the backward runs gradkern's op and gives stock's gradients (layout included).
    (Deterministic mode is left off: there, F.interpolate on CUDA takes a Python decomposition before dispatch.)"""
    torch.manual_seed(0)
    calls = spy_on_ops(monkeypatch, OPS)
    for label, fn, shape, fmt, op, half in _interpolations():
        if dtype != torch.float32 and not half:
            continue  # (stock's antialias kernels take no 16-bit tensors on CPU)
        x = torch.randn(shape, device=DEVICE).to(dtype)
        if fmt is not None:
            x = x.contiguous(memory_format=fmt)
        check_training_step(fn, x, calls, op, label, mode="always", deterministic=False,
                            summed_from=fn(x).numel())


# ----------------------------------------------------------------------------------------------- GPU only
@gpu_only
def test_stock_raises_in_deterministic_mode_and_gradkern_does_not():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for op in OPS:
            args = _args(op, *SEMANTICS[_dims(op)][0][:2])
            with pytest.raises(RuntimeError, match="deterministic"):
                getattr(torch.ops.aten, op)(*args)
            with gradkern.use():
                ours = getattr(torch.ops.aten, op)(*args)
            assert_bitwise_equal(ours, getattr(ops, op)(*args), op)
    finally:
        torch.use_deterministic_algorithms(was)


# a bound on a tap weight's slope in its source position: linear 1; cubic 1.35 a tap, 2.7 where clamped taps land
# together; antialias: a triangle's slope over the window's sum, and the sum's own move
_SLOPE = {"linear": 1.0, "cubic": 2.7, "antialias": 4.0}


def _dim_weights(op: str, n_in: int, n_out: int, align: bool, scale) -> torch.Tensor:
    """Stock's weights along one dim, float64 on CPU: [n_out, n_in], output o's weight on input i (the op's
    backward of the identity, the other dims of size 1)."""
    eye = torch.eye(n_out, dtype=torch.float64)
    if op in (LINEAR1D, BILINEAR, TRILINEAR):
        return torch.ops.aten.upsample_linear1d_backward(eye[:, None], [n_out], [n_out, 1, n_in], align,
                                                         scale)[:, 0]
    return getattr(torch.ops.aten, op)(eye[:, None, None], [1, n_out], [n_out, 1, 1, n_in], align, None,
                                       scale)[:, 0, 0]


def _positions_bound(op: str, args: tuple) -> torch.Tensor:
    """Per grad_input element, a bound on how far fp32 source positions alone move it from the float64 reference.
    ATen computes positions and weights in the op's accscalar_t (fp32 for 16- and 32-bit inputs: CUDA's kernels
    and CPU's alike), and so does gradkern: three roundings (the scale, the product, the offset) put position p
    up to 3 * 2^-24 * (|p| + 1) off, and a weight that much times its slope, where the float64 reference is exact.
    Summed over the outputs whose taps land on the element (one output either way: a position that rounds across
    an integer moves a tap of weight ~0), dim by dim, times the other dims' weights:
    sum_d sum_o |g_o| err_d(o_d, i_d) prod_(e != d) |w_e(o_e, i_e)|."""
    g, out_sizes, in_sizes, align, *scales = args
    mode = "cubic" if op == BICUBIC else "antialias" if op == AA else "linear"
    unit = 3 * 2.0 ** (-53 if g.dtype == torch.float64 else -24) * _SLOPE[mode]
    weights, errs = [], []
    for n_in, n_out, scale in zip(in_sizes[2:], out_sizes, scales, strict=True):
        if align:
            r = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            r = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
        o = torch.arange(n_out, dtype=torch.float64)
        p = r * (o + 0.5) if mode == "antialias" else r * o if align else r * (o + 0.5) - 0.5
        w = _dim_weights(op, n_in, n_out, align, scale)
        lands = (w != 0).double()
        lands = (lands + F.pad(lands, (0, 0, 1, 0))[:-1] + F.pad(lands, (0, 0, 0, 1))[1:]).clamp(max=1)
        weights.append(w.abs().to(g.device))
        errs.append((lands * unit * (p.abs() + 1.0)[:, None]).to(g.device))
    a = torch.where(torch.isfinite(g), g, 0).double().abs()
    total = 0
    for d in range(len(weights)):
        t = a
        for e in range(len(weights)):  # contract the next output dim; its input dim goes last
            t = torch.tensordot(t, errs[e] if e == d else weights[e], dims=([2], [0]))
        total = total + t
    return total


def _check_positions(op: str, args: tuple, what: str, fn=None) -> None:
    """gradkern (or `fn`) against the float64 reference, the reference first moved toward the result by at most
    _positions_bound (what fp32 positions account for), the rest within the dtype's tolerance."""
    ours = (fn or getattr(ops, op))(*args)
    ref = run_reference(getattr(torch.ops.aten, op), args)
    bound = _positions_bound(op, args).cpu()
    mine = ours.detach().cpu().double()
    ok = torch.isfinite(ref) & torch.isfinite(mine)
    moved = torch.where(ok, ref + (mine - ref).clamp(-bound, bound), ref)
    assert_close(ours, moved, None, what, summed_from=args[0].numel())


def test_fp32_positions_bound_what_they_move():
    """The bound of _check_positions holds for stock PyTorch itself: stock CPU in float32 (fp32 positions and
    weights, as ATen's CUDA kernels) against its own float64 result, on positions up to ~300 (the GPU's large
    problems reach 4099). And it is needed: there stock is off by more than the dtype's tolerance alone."""
    torch.manual_seed(0)
    for op, in_sizes, out_sizes, align in ((LINEAR1D, (1, 2, 300), (700,), False),
                                           (BICUBIC, (1, 1, 40, 300), (81, 13), False),
                                           (AA, (1, 1, 9, 300), (4, 130), True)):
        args = _args(op, in_sizes, out_sizes, align)
        stock = getattr(torch.ops.aten, op)(args[0].cpu(), *args[1:])
        _check_positions(op, args, f"stock float32 {op}", fn=lambda *a, _s=stock: _s)
        worst = (stock.double() - run_reference(getattr(torch.ops.aten, op), args)).abs().max()
        if op == LINEAR1D:
            assert worst > 1e-5, worst  # (the position errors are real: more than the base tolerance)



def test_plane_kernel_register_cap_on_large_planes_only():
    """The plane kernel is capped at `plane_maxnreg` registers in bilinear and trilinear problems whose grad_input
    planes hold at least `plane_maxnreg_min` elements (small planes lost with the cap), never in linear 1-D,
    bicubic or the rows tiling (untimed there)."""
    def cap(op, in_sizes, out_sizes, fmt=None):
        return _plan(op, in_sizes, out_sizes, fmt).consts.get("maxnreg")
    with config.override(up.CONFIG, plane_maxnreg=128, plane_maxnreg_min=1024):
        assert cap(BILINEAR, (2, 4, 32, 32), (64, 64)) == 128
        assert cap(BILINEAR, (2, 4, 31, 32), (62, 64)) is None
        assert cap(TRILINEAR, (1, 2, 4, 8, 128), (8, 16, 256)) == 128
        assert cap(TRILINEAR, (1, 2, 8, 8, 8), (16, 16, 16)) is None
        assert cap(LINEAR1D, (2, 4, 4096), (8192,)) is None
        assert cap(BICUBIC, (2, 4, 32, 32), (64, 64)) is None
        assert cap(BILINEAR, (2, 16, 32, 32), (64, 64), torch.channels_last) is None  # (the rows tiling)
    with config.override(up.CONFIG, plane_maxnreg=0):
        assert cap(BILINEAR, (2, 4, 32, 32), (64, 64)) is None

@gpu_only
@pytest.mark.parametrize("op", OPS)
def test_large_problems_match_stock(op):
    """The registry's larger problems (positions up to ~4000): fp32 positions and weights, as ATen's (CUDA's
    accscalar_t is float), move results from the float64 reference by more than the base tolerance where positions
    are large (1000 <- 2300: ~5e-4 for stock and gradkern alike), so the comparison allows what they account for."""
    for case in REGISTRY[op].cases(DEVICE, torch.float32, "check"):
        _check_positions(op, case.args, f"{op} {case.label}")


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bitwise_identical_repeats_on_gpu(dtype):
    assert_repeats_bitwise(OPS, dtype, DEVICE, "check")


@gpu_only
def test_tables_built_under_capture_stay_in_the_graph():
    """A plan first met during CUDA graph capture builds its tables into the graph (its memory is the graph's) and
    does not keep them: the replay is right, and so is an eager call afterwards, which builds its own."""
    args = _args(BILINEAR, (2, 3, 9, 11), (20, 7), False)
    expected = ops.upsample_bilinear2d_backward(*args)
    config.clear_plans()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        captured = ops.upsample_bilinear2d_backward(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(captured, expected, "replay")
    assert not any(plan.tables for plan in up._VALIDATED.values()), "a table built during capture was kept"
    assert_bitwise_equal(ops.upsample_bilinear2d_backward(*args), expected, "eager after capture")

