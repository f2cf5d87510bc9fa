"""Adaptive average pooling backward (2d, 3d): the window ranges, every small (input, output) size pair against
stock PyTorch, dtypes, strided grad_output read in place, ATen's output layout, empty batches, bitwise repeats
(across tilings and index widths too), bad inputs, and training through enable() in deterministic mode."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradkern
from _det_helpers import check_refusals, check_registry_entries, check_training_step
from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import config, ops
from gradkern.kernels import adaptive_pool as ap
from gradkern.launch.alloc import channels_last_format
from gradkern.testing import (
    assert_bitwise_equal,
    assert_repeats_bitwise,
    check_case,
    layouts_nd,
    record_launches,
    spy_on_ops,
)

OPS = ["_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward"]
GPU = DEVICE == "cuda"
SIZES = range(1, 10)


def _dims(op: str) -> int:
    return 3 if "3d" in op else 2


def _problem(shape, out, dtype=torch.float32, memory_format=torch.contiguous_format):
    """(grad_output, self) for pooling an input of `shape` to output sizes `out`."""
    x = torch.randn(shape, device=DEVICE).to(dtype).contiguous(memory_format=memory_format)
    g = torch.randn(*shape[:len(shape) - len(out)], *out, device=DEVICE).to(dtype)
    return g.contiguous(memory_format=memory_format), x


def _start(o, i_size, o_size):
    return (o * i_size) // o_size


def _end(o, i_size, o_size):
    return -(-((o + 1) * i_size) // o_size)


def test_each_input_gets_the_output_range_whose_windows_hold_it():
    """ATen's window of output o is [floor(o*I/O), ceil((o+1)*I/O)); the outputs whose windows hold input i are
    [floor(i*O/I), ceil((i+1)*O/I)) (the kernel's range), never more than `max_outputs` of them (its loop count:
    exact where one size divides the other)."""
    for i_size in range(1, 41):
        for o_size in range(1, 41):
            most = 0
            for i in range(i_size):
                holding = [o for o in range(o_size) if _start(o, i_size, o_size) <= i < _end(o, i_size, o_size)]
                assert holding == list(range(_start(i, o_size, i_size), _end(i, o_size, i_size))), (i_size, o_size, i)
                most = max(most, len(holding))
            bound = ap.max_outputs(i_size, o_size)
            assert most <= bound, (i_size, o_size)
            if i_size % o_size == 0 or o_size % i_size == 0:
                assert most == bound, (i_size, o_size)


@pytest.mark.parametrize("axis", ["H", "W"])
def test_2d_every_size_pair_along_each_axis_matches_stock(axis):
    """Every input size I and output size O in 1..9 (O > I: windows overlap, each input in several; O = 1: one
    global window; O = I: the identity) along H, then W, the other axis also pooled."""
    for i_size in SIZES:
        for o_size in SIZES:
            shape, out = ((1, 1, i_size, 2), (o_size, 1)) if axis == "H" else ((1, 1, 2, i_size), (1, o_size))
            check_case(OPS[0], _problem(shape, out), what=f"{axis} {i_size} -> {o_size}")


def test_3d_every_size_pair_along_d_matches_stock():
    for i_size in SIZES:
        for o_size in SIZES:
            check_case(OPS[1], _problem((1, i_size, 1, 2), (o_size, 1, 1)), what=f"D {i_size} -> {o_size}")


# (self shape, output sizes): batched and unbatched, every dim pooled, down and up (O > I) at once, global along a
# dim, the identity, sizes of 1
SEMANTICS = {
    2: [((2, 3, 9, 11), (4, 5)), ((3, 7, 5), (10, 3)), ((2, 2, 6, 6), (6, 6)), ((1, 2, 13, 1), (1, 4)),
        ((2, 1, 5, 7), (3, 1))],
    3: [((1, 2, 5, 6, 7), (2, 4, 3)), ((2, 3, 4, 5), (5, 2, 8)), ((2, 1, 3, 4, 5), (1, 1, 5)),
        ((2, 4, 4, 4), (4, 4, 4))],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_matches_stock(op, dtype):
    for shape, out in SEMANTICS[_dims(op)]:
        res = check_case(op, _problem(shape, out, dtype), what=f"{op} {shape} -> {out}")
        assert res.shape == shape and res.dtype == dtype and res.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_strided_grad_output_is_read_in_place(op, dtype, monkeypatch):
    shape, out = SEMANTICS[_dims(op)][0]
    g0, x = _problem(shape, out, dtype)
    launches = record_launches(monkeypatch, ap)
    for name, g in layouts_nd(g0):
        launches.clear()
        check_case(op, (g, x), what=f"{op} grad_output {name}")
        read = launches[0].ptrs[1]  # the kernel's grad_output argument
        assert read.data_ptr() == g.data_ptr() and read.stride() == g.stride(), f"{name}: grad_output was copied"


def _selves():
    """(label, self) of many layouts, for the output layout rule (ATen's suggest_memory_format)."""
    cl = torch.channels_last
    yield "contiguous", torch.randn(2, 3, 5, 7, device=DEVICE)
    yield "channels_last", torch.randn(2, 3, 5, 7, device=DEVICE).contiguous(memory_format=cl)
    yield "channels_last sliced", torch.randn(2, 6, 5, 9, device=DEVICE).contiguous(memory_format=cl)[:, ::2, :, 1:8]
    yield "channels_last C=1", torch.randn(2, 1, 5, 7, device=DEVICE).contiguous(memory_format=cl)
    yield "channels_last N=1", torch.randn(1, 3, 5, 7, device=DEVICE).contiguous(memory_format=cl)
    yield "channels_last 1x1 planes", torch.randn(2, 3, 1, 1, device=DEVICE).contiguous(memory_format=cl)
    yield "channels_last W=1", torch.randn(2, 3, 5, 1, device=DEVICE).contiguous(memory_format=cl)
    yield "transposed", torch.randn(2, 3, 7, 5, device=DEVICE).transpose(-1, -2)
    yield "permuted N, C", torch.randn(3, 2, 5, 7, device=DEVICE).transpose(0, 1)
    yield "broadcast", torch.zeros((), device=DEVICE).expand(2, 3, 5, 7)
    yield "unbatched transposed", torch.randn(3, 7, 5, device=DEVICE).transpose(-1, -2)
    yield "3d channels_last_3d", torch.randn(2, 3, 4, 5, 6, device=DEVICE).contiguous(
        memory_format=torch.channels_last_3d)
    yield "3d unbatched", torch.randn(3, 4, 5, 6, device=DEVICE)


def test_output_layout_is_atens():
    """grad_input is channels_last where a 4-D self's strides suggest it (2d), else contiguous (3d always): the
    strides stock PyTorch returns."""
    for label, x in _selves():
        op = OPS[x.dim() == 5 or (x.dim() == 4 and label.startswith("3d"))]
        out = (3, 2, 4)[-_dims(op):]
        g = torch.randn(*x.shape[:-_dims(op)], *out, device=DEVICE)
        ours = check_case(op, (g, x), what=label)
        stock = getattr(torch.ops.aten, op)(g.cpu(), x.cpu())
        assert ours.stride() == stock.stride(), (label, ours.stride(), stock.stride())
        if x.dim() == 4:
            from torch._prims_common import suggest_memory_format
            cl = torch.channels_last
            assert (channels_last_format(x) is cl) is (suggest_memory_format(x) == cl), label


@pytest.mark.parametrize("op", OPS)
def test_empty_batch(op, monkeypatch):
    """N = 0 (and C = 0 unbatched): an empty grad_input of stock's shape and strides, nothing launched."""
    d = _dims(op)
    spatial, out = (5, 6, 7)[-d:], (2, 3, 4)[-d:]
    launches = record_launches(monkeypatch, ap)
    fmt = torch.channels_last if d == 2 else torch.channels_last_3d
    for shape, memory_format in (((0, 3, *spatial), torch.contiguous_format), ((0, 3, *spatial), fmt),
                                 ((0, *spatial), torch.contiguous_format)):
        g, x = _problem(shape, out, memory_format=memory_format)
        ours = getattr(ops, op)(g, x)
        stock = getattr(torch.ops.aten, op)(g.cpu(), x.cpu())
        assert ours.shape == stock.shape == shape and ours.stride() == stock.stride()
    assert not launches


@pytest.mark.parametrize("op", OPS)
def test_repeats_tilings_and_index_widths_give_the_same_bits(op, monkeypatch):
    """Each element sums its terms in one order whatever the tiling: runs repeated, tiles of a few elements (several
    per plane), programs that take several tiles in turn (the grid-stride loop, normally past 2^30 tiles) and int64
    index math (normally past 2^31) all give the same bits."""
    shape, out = SEMANTICS[_dims(op)][1]
    g, x = _problem(shape, out)
    first = getattr(ops, op)(g, x)
    assert_bitwise_equal(getattr(ops, op)(g, x), first, f"{op} run twice")
    _same_bits_with_small_knobs(lambda: getattr(ops, op)(g, x), first, ("tile", "max_bw"), op,
                                record_launches(monkeypatch, ap))


def test_plane_tiles_tell_the_kernel_the_power_of_two_dividing_w_and_the_strides(monkeypatch):
    """A contiguous grad_input's strides and W divide by W's power-of-two part (at most 16): the kernel takes the
    strides divided by it (ALIGN) and multiplies them back, so that stores along a row vectorise; the same bits as
    without, in one column block or several (masked columns past W); 1 for a channels_last grad_input tiled by
    planes."""
    launches = record_launches(monkeypatch, ap)
    for shape, out, align in (((2, 3, 5, 24), (3, 7), 8), ((2, 3, 5, 12), (3, 5), 4), ((3, 5, 7), (2, 3), 1),
                              ((2, 2, 4, 5, 48), (3, 3, 5), 16)):
        op = "_adaptive_avg_pool3d_backward" if len(shape) == 5 else "_adaptive_avg_pool2d_backward"
        g, x = _problem(shape, out)
        for settings in ({}, {"max_bw": 8}):
            with config.override(ap.CONFIG, **settings):
                launches.clear()
                ours = getattr(ops, op)(g, x)
                assert launches[0].consts["ALIGN"] == align, (shape, settings)
                with config.override(ap.CONFIG, row_align=False):
                    launches.clear()
                    assert_bitwise_equal(getattr(ops, op)(g, x), ours, f"{shape} {settings}")
                    assert launches[0].consts["ALIGN"] == 1
    g, x = _problem((2, 3, 5, 24), (3, 7))
    with config.override(ap.CONFIG, tiling="planes"):
        launches.clear()
        ops._adaptive_avg_pool2d_backward(g, x.contiguous(memory_format=torch.channels_last))
    assert launches[0].consts["ALIGN"] == 1


def test_divisions_by_magic_numbers_give_the_same_bits(monkeypatch):
    """The windows' bounds and a flat row index's split divide by the sizes as multiplies and shifts (`magic`): the
    values match stock, with the same bits as the divisions themselves, in one plane's rows a tile, rows of several
    planes a tile and the channels_last row tiling; a size of 1 (2d's D) is not divided by magic numbers."""
    launches = record_launches(monkeypatch, ap)
    for op, shape, out, tiling, memory_format in (
            (OPS[1], (1, 2, 5, 11, 13), (3, 5, 4), None, torch.contiguous_format),  # (one plane's rows a tile)
            (OPS[1], (2, 3, 5, 3, 4), (3, 2, 3), None, torch.contiguous_format),  # (several planes' rows)
            (OPS[0], (1, 4, 7, 9), (5, 4), None, torch.channels_last),  # (the row tiling)
            (OPS[1], (1, 2, 5, 7, 3), (2, 3, 5), "rows", torch.contiguous_format)):
        g, x = _problem(shape, out, memory_format=memory_format)
        with config.override(ap.CONFIG, tiling=tiling):
            launches.clear()
            ours = check_case(op, (g, x), what=f"{shape} -> {out} {tiling}")
            magic = launches[-1].consts["MAGIC"]
            with config.override(ap.CONFIG, magic=False):
                launches.clear()
                assert_bitwise_equal(getattr(ops, op)(g, x), ours, f"{shape} -> {out} {tiling} magic off")
                assert not any(launches[-1].consts["MAGIC"])
        lead = (1,) * (3 - len(out))  # (2d: D = Do = 1)
        sizes = (*lead, *shape[-len(out):], *lead, *out)
        assert magic[:6] == tuple(n > 1 for n in sizes), (shape, out, magic)


@pytest.mark.parametrize("reciprocals", [True, False])
def test_terms_with_reciprocals_or_divided_match_stock(reciprocals, monkeypatch):
    """A column's terms summed with a reciprocal a row and its 1 / kw applied to the sum (`reciprocals`), or each
    term divided by its window's volume: either way the values match stock (f64 too), and the row kernel gives the
    plane kernel's bits."""
    launches = record_launches(monkeypatch, ap)
    with config.override(ap.CONFIG, reciprocals=reciprocals):
        for op, shape, out in ((OPS[1], (1, 2, 5, 7, 6), (3, 4, 4)), (OPS[0], (1, 3, 6, 9), (4, 13))):
            for dtype in (torch.float32, torch.float64):
                g, x = _problem(shape, out, dtype)
                launches.clear()
                ours = check_case(op, (g, x), what=f"{shape} -> {out} {dtype}")
                assert launches[-1].consts["RECIP"] is reciprocals
                assert_bitwise_equal(_tiled(op, g, x, "rows"), ours, f"{shape} -> {out} {dtype} rows")


def test_small_planes_share_a_tile(monkeypatch):
    """Where a plane's rows do not fill a tile, rows (n, c, d, h) are flattened, so a tile spans several planes
    (1x1 planes pooled to 7x7: 49 terms an element; 13 -> 6; 3d planes whose D ranges differ row to row): the
    values match stock, with the same bits as tiles of one plane's rows (tile 1)."""
    launches = record_launches(monkeypatch, ap)
    for op, shape, out in ((OPS[0], (2, 5, 1, 1), (7, 7)), (OPS[0], (3, 4, 13, 13), (6, 6)),
                           (OPS[1], (2, 3, 5, 3, 4), (3, 2, 3))):
        g, x = _problem(shape, out)
        with config.override(ap.CONFIG, min_programs=1):  # (else small problems take small tiles: below)
            launches.clear()
            ours = check_case(op, (g, x), what=f"{shape} -> {out}")
        h = shape[-2]
        consts = launches[-1].consts
        assert consts["FLAT_ROWS"] and consts["BR"] >= 2 * h, (shape, consts)  # (two planes' rows or more)
        with config.override(ap.CONFIG, tile=1):
            launches.clear()
            assert_bitwise_equal(getattr(ops, op)(g, x), ours, f"{shape} -> {out} tile 1")
            assert not launches[-1].consts["FLAT_ROWS"]
    # tiles halve, down to a warp's 32 elements, while they give fewer than min_programs programs
    g, x = _problem((4, 32, 1, 1), (7, 7))
    for min_programs, br in ((1, 128), (2, 64), (8, 32)):
        with config.override(ap.CONFIG, min_programs=min_programs):
            launches.clear()
            ops._adaptive_avg_pool2d_backward(g, x)
            assert launches[-1].consts["BR"] == br, min_programs


def _same_bits_with_small_knobs(run, first, tile_knobs, label, launches) -> list[dict]:
    """`run()` gives `first`'s bits with each of `tile_knobs` (then the grid-stride loop's and the int32 limit's)
    set small, each alone but for small tiles with the grid-stride loop (so that there are several tiles) and with
    the int32 limit a second time (plane tiles hold one plane's rows then), and its launch (recorded in `launches`)
    takes the branch the knob forces; the launches' consts."""
    seen = []
    small = {tile_knobs[0]: 4}
    for knob, value, more in ((tile_knobs[0], 4, {}), (tile_knobs[1], 2, {}), ("max_programs", 2, small),
                              ("i32_max", 16, {}), ("i32_max", 16, small)):
        with config.override(ap.CONFIG, **{knob: value}, **more):
            launches.clear()
            assert_bitwise_equal(run(), first, f"{label} {knob}={value}")
        ints, consts = launches[0].ints, launches[0].consts
        if knob == "max_programs":
            assert ints[0] > value  # (more tiles than programs)
        if knob == "i32_max":
            assert consts["I64"]
        seen.append(consts)
    return seen


def _tiled(op, g, x, tiling):
    """The op's result with `tiling` forced (fresh plans)."""
    with config.override(ap.CONFIG, tiling=tiling):
        return getattr(ops, op)(g, x)


# (self shape, output sizes) for channels_last self: C not a multiple of the channel block (5 and 7 with blocks of
# 4 below), down and up (O > I), global, the identity, unbatched; W = 1
CHANNELS_LAST = [((2, 5, 9, 11), (4, 5)), ((1, 7, 6, 5), (10, 3)), ((2, 3, 7, 6), (1, 1)), ((1, 5, 6, 6), (6, 6)),
                 ((2, 7, 13, 1), (3, 4)), ((7, 5, 9), (4, 9))]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_channels_last_row_tiling_matches_stock_and_the_plane_tiling(dtype, monkeypatch):
    """A channels_last self of several channels gets the row kernel ([BW, BC] blocks of one (n, h) row, C fastest;
    here two channel blocks a row; several column blocks: the test below): stock's values and strides, and the plane
    kernel's bits on the same problem (each element sums the same terms in the same order), grad_output
    channels_last or contiguous."""
    op = OPS[0]
    launches = record_launches(monkeypatch, ap)
    with config.override(ap.CONFIG, max_bc=4):
        for shape, out in CHANNELS_LAST:
            cl = torch.channels_last if len(shape) == 4 else torch.contiguous_format
            g, x = _problem(shape, out, dtype, cl)
            for g_name, gg in (("channels_last", g), ("contiguous", g.contiguous())):
                what = f"{shape} -> {out} grad_output {g_name}"
                launches.clear()
                rows = check_case(op, (gg, x), what=what)
                assert ("BC" in launches[0].consts) is (len(shape) == 4), f"{what}: the layout's tiling"
                assert rows.stride() == getattr(torch.ops.aten, op)(gg.cpu(), x.cpu()).stride(), what
                assert_bitwise_equal(_tiled(op, gg, x, "planes"), rows, f"{what} planes")


def test_tiling_follows_the_layout(monkeypatch):
    """Rows for a channels_last grad_input of several channels, planes otherwise (contiguous, C = 1, 3d)."""
    launches = record_launches(monkeypatch, ap)
    for label, x in _selves():
        op = OPS[x.dim() == 5 or (x.dim() == 4 and label.startswith("3d"))]
        out = (3, 2, 4)[-_dims(op):]
        g = torch.randn(*x.shape[:-_dims(op)], *out, device=DEVICE)
        launches.clear()
        ours = getattr(ops, op)(g, x)
        rows = ours.dim() == 4 and ours.shape[1] > 1 and ours.is_contiguous(memory_format=torch.channels_last) \
            and not ours.is_contiguous()
        assert ("BC" in launches[0].consts) is rows, label


@pytest.mark.parametrize("op", OPS)
def test_row_tiling_repeats_tilings_and_index_widths_give_the_same_bits(op, monkeypatch):
    """The row kernel (forced, for 3d and contiguous grad_input too: it reads and writes through strides) gives the
    plane kernel's bits, across blocks of a few columns and channels, the grid-stride loop and int64 index math."""
    shape, out = SEMANTICS[_dims(op)][0]
    g, x = _problem(shape, out, memory_format=torch.channels_last if _dims(op) == 2 else torch.contiguous_format)
    first = _tiled(op, g, x, "planes")
    assert_bitwise_equal(_tiled(op, g, x, "rows"), first, f"{op} rows")
    seen = _same_bits_with_small_knobs(lambda: _tiled(op, g, x, "rows"), first, ("tile", "max_bc"), f"{op} rows",
                                       record_launches(monkeypatch, ap))
    assert all("BC" in consts for consts in seen)


def test_bad_inputs_raise_named_errors_and_launch_nothing(monkeypatch):
    g2, x2 = _problem((2, 3, 7, 8), (3, 4))
    g3, x3 = _problem((2, 3, 4, 5, 6), (2, 3, 4))
    p2, p3 = ops._adaptive_avg_pool2d_backward, ops._adaptive_avg_pool3d_backward
    before = [t.clone() for t in (g2, x2, g3, x3)]
    launches = record_launches(monkeypatch, ap)
    cases = [
        (gradkern.InvalidProblem, r"self.*3-D or 4-D.*2-D tensor of shape \(7, 8\)", lambda: p2(g2[0, 0], x2[0, 0])),
        (gradkern.InvalidProblem, r"self.*4-D or 5-D.*3-D", lambda: p3(g3[0, 0], x3[0, 0])),
        (gradkern.InvalidProblem, r"self.*3-D or 4-D.*5-D", lambda: p2(g3, x3)),
        (gradkern.InvalidProblem, r"grad_output.*4-D tensor of shape \(2, 3, <output sizes>\).*\(3, 3, 4\)",
         lambda: p2(g2[0], x2)),
        (gradkern.InvalidProblem, r"grad_output.*\(2, 3, <output sizes>\).*\(2, 2, 3, 4\)", lambda: p2(g2[:, :2], x2)),
        (gradkern.InvalidProblem, r"grad_output.*\(2, 3, <output sizes>\).*\(1, 3, 2, 3, 4\)", lambda: p3(g3[:1], x3)),
        (gradkern.InvalidProblem, r"grad_output.*non-zero sizes.*\(2, 3, 0, 4\)", lambda: p2(g2[:, :, :0], x2)),
        (gradkern.InvalidProblem, r"grad_output.*non-zero sizes.*\(2, 0, 3, 4\)",
         lambda: p2(g2[:, :0], x2[:, :0])),
        (gradkern.InvalidProblem, r"self.*non-zero pooled sizes.*\(2, 3, 4, 0, 6\)", lambda: p3(g3, x3[..., :0, :])),
        (gradkern.Unsupported, r"grad_output.*dtype torch.float32.*float64", lambda: p2(g2.double(), x2)),
        (gradkern.Unsupported, r"self.*dtype", lambda: p3(g3, x3.int())),
        (gradkern.Unsupported, r"grad_output.*torch.Tensor.*list", lambda: p2(g2.tolist(), x2)),
        (gradkern.Unsupported, r"self.*device", lambda: p2(g2, x2.to("meta"))),
    ]
    if GPU:
        cases.append((gradkern.Unsupported, r"grad_output.*device cuda", lambda: p2(g2.cpu(), x2.cpu())))
    check_refusals(cases, launches, OPS, (g2, x2, g3, x3), before)


def test_registry_entries():
    check_registry_entries(OPS)


# ----------------------------------------------------------------------------------------------- training
def _modules():
    """(label, function, input, the op its backward runs)."""
    cl = torch.channels_last
    return [
        ("F.adaptive_avg_pool2d (3, 5)", lambda t: F.adaptive_avg_pool2d(t, (3, 5)), (2, 3, 7, 9), None, OPS[0]),
        ("nn.AdaptiveAvgPool2d channels_last", nn.AdaptiveAvgPool2d((4, 2)), (2, 3, 6, 5), cl, OPS[0]),
        ("nn.AdaptiveAvgPool2d unbatched upsampling", nn.AdaptiveAvgPool2d((7, 2)), (3, 4, 5), None, OPS[0]),
        ("F.adaptive_avg_pool3d", lambda t: F.adaptive_avg_pool3d(t, (2, 3, 4)), (1, 2, 5, 4, 7), None, OPS[1]),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_training_in_deterministic_mode_runs_gradkern(dtype, monkeypatch):
    """Under gradkern.use() (mode "auto") with torch.use_deterministic_algorithms(True), adaptive average pooling's
    backward runs gradkern's kernel and gives stock's gradients (layout included)."""
    torch.manual_seed(0)
    calls = spy_on_ops(monkeypatch, OPS)
    for label, fn, shape, fmt, op in _modules():
        x = torch.randn(shape, device=DEVICE).to(dtype)
        if fmt is not None:
            x = x.contiguous(memory_format=fmt)
        check_training_step(fn, x, calls, op, label)


# ----------------------------------------------------------------------------------------------- GPU only
@gpu_only
def test_stock_raises_in_deterministic_mode_and_gradkern_does_not():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for op in OPS:
            shape, out = SEMANTICS[_dims(op)][0]
            g, x = _problem(shape, out)
            with pytest.raises(RuntimeError, match="deterministic"):
                getattr(torch.ops.aten, op)(g, x)
            with gradkern.use():
                ours = getattr(torch.ops.aten, op)(g, x)
            assert_bitwise_equal(ours, getattr(ops, op)(g, x), op)
        x = torch.randn(8, 16, 30, 31, device=DEVICE, requires_grad=True)
        with gradkern.use():
            F.adaptive_avg_pool2d(x, (7, 9)).sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bitwise_identical_repeats_on_gpu(dtype):
    assert_repeats_bitwise(OPS, dtype, DEVICE, "check")
