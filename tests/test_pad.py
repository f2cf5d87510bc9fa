"""Replication / reflection pad backward (1d/2d/3d): semantics against stock PyTorch, layouts, grad_input=,
bad inputs, the int64 and multi-plane paths, training through enable() (deterministic mode included) and, on a
GPU, no determinism alert and bit-identical repeats."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton

import gradkern
from _det_helpers import input_grad
from conftest import DEVICE, DTYPES, dtype_id, gpu_only, small_pad_tiles
from gradkern import config, ops
from gradkern.kernels import pad as padmod
from gradkern.registry import REGISTRY
from gradkern.testing import (
    assert_bitwise_equal,
    assert_close,
    assert_repeats_bitwise,
    check_case,
    poison_like,
    record_launches,
    run_reference,
)

OPS = [f"{mode}_pad{d}d_backward" for mode in ("replication", "reflection") for d in (1, 2, 3)]
GPU = DEVICE == "cuda"


def _dims(op: str) -> int:
    return int(op.split("_pad")[1][0])


def _problem(op, shape, pads, dtype=torch.float32, *, scale=1.0):
    """(grad_output, self, padding) for `op` on an input of `shape`."""
    x = torch.randn(shape, device=DEVICE).to(dtype)
    g = (torch.randn(padmod.padded_shape(shape, pads), device=DEVICE) * scale).to(dtype)
    return g, x, list(pads)


# Shapes (batched and unbatched) and pads: asymmetric, zero, negative (cropping), larger than the input
# (replicate), n - 1 (the largest reflection), size-1 dims. Kept to a few planes for the interpreter.
SEMANTICS = {
    1: [((2, 3, 11), (3, 1)), ((3, 9), (-2, 4)), ((2, 2, 7), (0, 0)), ((2, 1, 5), (4, 4)), ((1, 4, 6), (-3, -2)),
        ((3, 1), (0, 0))],
    2: [((2, 2, 7, 9), (2, 1, 0, 3)), ((2, 6, 5), (-1, 3, 4, -2)), ((1, 3, 5, 4), (3, 3, 4, 4)),
        ((1, 2, 1, 6), (1, 2, 0, 0)), ((2, 4, 3), (0, 0, 0, 0))],
    3: [((1, 2, 3, 5, 6), (2, 1, 1, 3, 2, 1)), ((2, 4, 5, 7), (1, -1, 0, 2, -2, 2)),
        ((1, 1, 4, 4, 4), (3, 3, 3, 3, 3, 3)), ((1, 2, 1, 3, 1), (2, 0, 1, 1, 0, 2))],
}
# replicate-only shapes: pads far beyond the input, crops that leave one output element per dim, and a crop past
# the whole input (lo < -n) that the other side's pad brings back: every output replicates the last element
REPLICATE_ONLY = {
    1: [((1, 2, 2), (7, 9)), ((1, 2, 4), (-3, 0)), ((2, 3), (-5, 4))],
    2: [((1, 1, 2, 3), (5, 6, 7, 3)), ((1, 1, 4, 5), (-2, -2, 0, -3)), ((1, 2, 3), (-6, 5, -4, 3)),
        ((2, 1, 4, 3), (0, 0, -6, 5))],
    3: [((1, 1, 2, 2, 3), (4, 5, 3, 6, 2, 3)), ((1, 3, 3, 2), (-1, -1, 0, 0, -2, 0)),
        ((1, 2, 2, 3), (-6, 5, 0, 0, -3, 2))],
}


def _plan(op, g, x, pads):
    """The plan `op` builds for grad_output g and self x under the config in force."""
    spec = padmod._Spec(op, _dims(op), op.startswith("reflection"))
    return padmod._plan(spec, tuple(g.shape), g.stride(), tuple(x.shape), tuple(pads), x.stride(), x.dtype)


def _valid(op, shape, pads) -> bool:
    if op.startswith("reflection"):
        return all(p < shape[-1 - k // 2] for k, p in enumerate(pads))
    return True


def _cases(op) -> list[tuple]:
    """The semantic cases `op` takes: (shape, pads)."""
    d = _dims(op)
    cases = SEMANTICS[d] + (REPLICATE_ONLY[d] if op.startswith("replication") else [])
    return [c for c in cases if _valid(op, *c)]


# one test a case (not a loop over them): compiled, each case builds its own kernels, and a loop of them was the
# last test to finish under xdist
_OP_CASES = [pytest.param(op, shape, pads, id=f"{op}-{'x'.join(map(str, shape))}-pad{','.join(map(str, pads))}")
             for op in OPS for shape, pads in _cases(op)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op, shape, pads", _OP_CASES)
def test_matches_stock(op, shape, pads, dtype):
    out = check_case(op, _problem(op, shape, pads, dtype), what=f"{op} {shape} pad {pads}")
    assert out.shape == shape and out.is_contiguous() and out.dtype == dtype


@pytest.fixture
def small_tiles():
    """Plans with tiles of a few rows and columns (conftest.small_pad_tiles): replicate's extra rows and columns
    past the first in loops."""
    with small_pad_tiles(unroll=1):
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("op, shape, pads", _OP_CASES)
def test_small_tile_plan_matches_stock(op, shape, pads, dtype, small_tiles):
    check_case(op, _problem(op, shape, pads, dtype), what=f"{op} small tiles {shape} pad {pads}")


@pytest.mark.parametrize("loop_unroll", [0, 1])
def test_wide_3d_replicate_pads_loop_after_loop_unroll_sources(loop_unroll, monkeypatch):
    """3-D pads wider than `unroll`, in per-element loops (`loop_lanes` 0), loop over their extra planes, rows and
    columns after `loop_unroll_3d` of them a side unrolled (the loops nest, and unrolled sources multiply the code at
    each level)."""
    launches = record_launches(monkeypatch, padmod)
    with small_pad_tiles(unroll=2, loop_unroll_3d=loop_unroll), config.override(padmod.CONFIG, loop_lanes=0):
        for shape, pads in (((1, 2, 3, 4, 5), (3, 2, 1, 4, 3, 0)), ((2, 1, 4, 3, 2), (0, 5, 3, 1, 0, 0))):
            op = "replication_pad3d_backward"
            check_case(op, _problem(op, shape, pads, torch.float32), what=f"{op} {shape} pad {pads}")
            c = launches[-1].consts
            assert c["LOOPS"] and max(c["UNROLL"][:3]) <= 1 + loop_unroll, c["UNROLL"]


@pytest.mark.parametrize("op", OPS)
def test_reflection_limits_and_single_elements(op):
    """Reflection pads of n - 1 on both sides (every element has direct + both mirrors), and inputs of size 1."""
    d = _dims(op)
    if op.startswith("reflection"):
        shape, pads = (1, 2, *[3] * d), (2,) * (2 * d)
    else:
        shape, pads = (1, 2, *[1] * d), (3, 2, 1, 4, 2, 2)[: 2 * d]
    check_case(op, _problem(op, shape, pads), what=f"{op} {shape} pad {pads}")


def _pad_launches(monkeypatch) -> list[tuple]:
    """Every pad kernel launch from here on, as (pointer arguments, consts); the launches still run."""
    seen = []
    real_launch = padmod.launch
    monkeypatch.setattr(padmod, "launch", lambda kernel, grid, ptrs, ints, consts, *a: (
        seen.append((ptrs, consts)), real_launch(kernel, grid, ptrs, ints, consts, *a)))
    return seen


# (shape, pads, k): grad_output's contiguous strides and the left W pad share the power-of-two factor k
ALIGNED = {
    1: [((2, 3, 9), (8, 7), 8), ((2, 3, 9), (2, 5), 2), ((2, 3, 9), (2, 6), 1)],
    2: [((2, 3, 5, 9), (8, 7, 1, 2), 8), ((2, 5, 9), (4, 3, 2, 1), 4)],
    3: [((1, 2, 3, 5, 9), (4, 3, 2, 1, 2, 0), 4), ((1, 2, 3, 5, 9), (8, 7, 2, 1, 2, 0), 8),
        ((1, 2, 3, 5, 9), (3, 2, 2, 1, 2, 0), 1)],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_aligned_rows_load_several_direct_sources_at_once(op, dtype, monkeypatch):
    """Where grad_output's plane and row strides and the left W pad are multiples of k, the kernel gets them
    divided by its VEC (k, at most 16 bytes' worth) and multiplies them back: results as stock at every width."""
    launches = _pad_launches(monkeypatch)
    for shape, pads, k in ALIGNED[_dims(op)]:
        launches.clear()
        check_case(op, _problem(op, shape, pads, dtype), what=f"{op} {shape} pad {pads}")
        widths = [consts["VEC"] for _, consts in launches]
        assert widths == [min(k, 16 // dtype.itemsize)], (shape, pads, widths)
    assert padmod._vec((64, 32, 16, 8, 2), 4, 2) == 1  # W not contiguous: one element a load
    # a stride past 2^31: divided by 2 it would be passed as a 32-bit int, and multiplied back there it would wrap
    assert padmod._vec((0, 0, 0, 2**31 + 6, 1), 2, 2) == 1
    assert padmod._vec((0, 0, 0, 2**30 + 6, 1), 2, 2) == 2


def _layouts(g: torch.Tensor):
    """grad_output views that are not contiguous: every other element of a wider buffer, a transposed copy,
    channels-last, a broadcast (stride 0) batch."""
    big = torch.zeros(*g.shape[:-1], 2 * g.shape[-1], dtype=g.dtype, device=g.device)
    big[..., ::2] = g
    yield "strided", big[..., ::2]
    yield "transposed", g.transpose(-1, -2).contiguous().transpose(-1, -2)
    if g.dim() >= 4:
        fmt = torch.channels_last if g.dim() == 4 else torch.channels_last_3d
        yield "channels_last", g.contiguous(memory_format=fmt)
    yield "broadcast", g[:1].expand(g.shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS)
def test_strided_grad_output_is_read_in_place(op, dtype, monkeypatch):
    d = _dims(op)
    shape, pads = SEMANTICS[d][0]
    g0, x, p = _problem(op, shape, pads, dtype)
    launches = _pad_launches(monkeypatch)
    for name, g in _layouts(g0):
        launches.clear()
        check_case(op, (g, x, p), what=f"{op} grad_output {name}")
        read = launches[0][0][1]  # the kernel's grad_output argument
        assert read.data_ptr() == g.data_ptr() and read.stride() == g.stride(), f"{name}: grad_output was copied"


@pytest.mark.parametrize("op", OPS)
def test_grad_input_argument_writes_every_element(op):
    d = _dims(op)
    shape, pads = SEMANTICS[d][0]
    g, x, p = _problem(op, shape, pads, torch.float32)
    fresh = getattr(ops, op)(g, x, p)
    for out in (poison_like(x), poison_like(x.transpose(-1, -2).contiguous()).transpose(-1, -2)):
        res = getattr(ops, op)(g, x, p, grad_input=out)
        assert res is out
        assert_bitwise_equal(out, fresh, f"{op} grad_input {out.stride()}")
    # the ATen overload resizes a grad_input of another shape, as ATen does
    out = torch.empty(0, device=DEVICE)
    with gradkern.use(mode="always"):
        res = getattr(torch.ops.aten, op).grad_input(g, x, p, grad_input=out)
    assert res is out and out.shape == x.shape
    assert_bitwise_equal(out, fresh, f"{op} aten grad_input")


def test_rejected_resizing_grad_input_is_left_as_it_was():
    """Bug: the ATen .grad_input overload resized grad_input before the overlap check, so a call rejected for
    overlapping grad_output still changed grad_input's shape. A rejected call changes nothing now."""
    buf = torch.randn(100, device=DEVICE)
    g = buf[:42].view(2, 3, 7)
    out = buf[10:34].view(2, 3, 4)  # inside grad_output's memory, of another shape than self's (2, 3, 5)
    x = torch.zeros(2, 3, 5, device=DEVICE)
    before = buf.clone()
    with gradkern.use(mode="always"), pytest.raises(gradkern.InvalidProblem, match="share memory"):
        torch.ops.aten.replication_pad1d_backward.grad_input(g, x, [1, 1], grad_input=out)
    assert out.shape == (2, 3, 4) and torch.equal(buf, before)
    # a grad_input whose storage must grow: resized (as ATen does) after the checks, and written
    out = torch.empty(3, device=DEVICE)
    ops.replication_pad1d_backward(g.clone(), x, [1, 1])
    with gradkern.use(mode="always"):
        torch.ops.aten.replication_pad1d_backward.grad_input(g.clone(), x, [1, 1], grad_input=out)
    assert_bitwise_equal(out, ops.replication_pad1d_backward(g.clone(), x, [1, 1]), "grown grad_input")


@pytest.mark.parametrize("op", OPS)
def test_complex_as_real_and_imaginary_parts(op):
    d = _dims(op)
    shape, pads = SEMANTICS[d][1]
    g, x, p = _problem(op, shape, pads, torch.float32)
    gc = torch.complex(g, torch.randn_like(g))
    xc = torch.complex(x, x)
    out = getattr(ops, op)(gc, xc, p)
    ref = run_reference(getattr(torch.ops.aten, op), (gc.cdouble(), xc.cdouble(), p), dtype=None)
    assert out.dtype == torch.complex64
    assert_close(torch.view_as_real(out), torch.view_as_real(ref), torch.float32, f"{op} complex")


@pytest.mark.parametrize("op", OPS)
def test_empty(op):
    d = _dims(op)
    shape = (0, 3, *[4] * d)
    g, x, p = _problem(op, shape, [1] * (2 * d))
    assert getattr(ops, op)(g, x, p).shape == shape
    # a crop to an empty grad_output: every input gets zero gradient (as ATen's backward)
    shape = (2, 3, *[4] * d)
    g, x, p = _problem(op, shape, [-2] * (2 * d))
    assert g.numel() == 0
    out = getattr(ops, op)(g, x, p)
    assert out.shape == shape and bool((out == 0).all())


@pytest.mark.parametrize("op", [OPS[0], OPS[1], OPS[5]])
def test_int64_offsets_and_several_planes_per_program(op):
    """The int64 path and the multi-plane path (normally only for > 2^31 elements / > 2^30 tiles), forced by
    lowering the config's limits."""
    d = _dims(op)
    shape, pads = SEMANTICS[d][0]
    problem = _problem(op, shape, pads, torch.float32)
    expected = getattr(ops, op)(*problem)
    knobs = [("i32_max", 64)] + ([("max_programs", 2)] if d > 1 else [])  # 1d here is a single tile
    for knob, value in knobs:
        with config.override(padmod.CONFIG, **{knob: value}):
            plan = _plan(op, *problem)
            assert plan.consts["I64"] if knob == "i32_max" else plan.args[0][1] > 1  # (GRID's planes a program)
            assert_bitwise_equal(getattr(ops, op)(*problem), expected, f"{op} {knob}={value}")


@pytest.mark.parametrize("op", [op for op in OPS if _dims(op) > 1])  # (1d pads no rows: never EARLY)
def test_strip_values_gathered_before_or_after_the_bulk_store_agree(op):
    """Whole-plane tiles gather their strip parts' values before the bulk store (EARLY), split ones after the
    barrier: forced both ways, the same bits."""
    d = _dims(op)
    shape, pads = SEMANTICS[d][0]
    problem = _problem(op, shape, pads, torch.float32)
    results = {}
    for early in (True, False):
        with config.override(padmod.CONFIG, early_strips=early):
            assert _plan(op, *problem).consts["EARLY"] is early  # (this problem's planes fit one tile)
            results[early] = getattr(ops, op)(*problem)
    assert_bitwise_equal(results[True], results[False], op)


@pytest.mark.parametrize("op", ["replication_pad2d_backward", "replication_pad3d_backward",
                                "reflection_pad2d_backward", "reflection_pad3d_backward"])
@pytest.mark.parametrize("w_in, w_pads", [(7, (1, 1)), (16, (2, 2)), (7, (1, 3)), (16, (6, 5)), (3, (1, 1))])
@pytest.mark.parametrize("split", [False, True])  # whole-plane tiles (EARLY), or tiles of a few rows
def test_edge_columns_in_the_bulk_agree_with_their_own_part(op, w_in, w_pads, split):
    """Where a tile holds every column and the column strips are one column a side (replicate; reflect with pads of
    1), their values are selected into the bulk tile (EDGES) instead of stored after the barrier: forced both ways,
    the same bits, and the reference's values (on any row width: `edges_width` 1)."""
    d = _dims(op)
    reflect = op.startswith("reflection")
    if reflect and (max(w_pads) > 1 or w_in < 5):  # ((6, 5): replicate's wide-pad loops)
        pytest.skip("reflect: column strips of one column a side only with pads of 1 and 5 columns or more")
    shape = (2, 3, 5, 6, w_in)[-(d + 2):]
    pads = (*w_pads, 2, 1, 1, 2)[:2 * d]
    problem = _problem(op, shape, pads, torch.float32)
    tile = (2 * triton.next_power_of_2(w_in),) * 3 if split else padmod.CONFIG.current.tile  # (split: two rows a tile)
    results = {}
    for edges in (frozenset({(d, 4)}), frozenset()):  # (wide pads' per-element loops: lanes store their own part)
        with config.override(padmod.CONFIG, tile=tile, edges=edges, edges_width=1, loop_lanes=0):
            plan = _plan(op, *problem)
            assert plan.consts["EDGES"] is bool(edges) and plan.consts["EARLY"] is not split
            results[bool(edges)] = check_case(op, problem, what=f"{op} pad {pads} EDGES={bool(edges)}")
    assert_bitwise_equal(results[True], results[False], op)


def test_edge_columns_stay_apart_where_rows_are_not_a_multiple_of_16():
    """EDGES (the column strips selected into the bulk tile) only where W is a multiple of 16 (or the plane is a
    constant, GEOM): other widths compiled to 80-221 registers a thread against 32-40 (sm_90), and the unbatched
    256x100x100 pad (2, 1, 3, 2) ran at 17% of the copy ceiling. Failed before: 100 columns took EDGES."""
    for w_in, edges in ((100, False), (96, True), (7, False), (32, True)):
        for op, shape in (("replication_pad2d_backward", (3, 5, w_in)), ("replication_pad1d_backward", (2, 3, w_in))):
            pads = (2, 1, 3, 2)[:2 * _dims(op)]
            plan = _plan(op, *_problem(op, shape, pads, torch.float32))
            assert plan.consts["EDGES"] is edges, (op, w_in)


# replicate shapes whose corners have several sources: pads of 1-3, a crop, a dim of size 1 (both ends' pads)
CORNERS = {2: [((2, 2, 7, 9), (2, 1, 0, 3)), ((1, 3, 5, 4), (3, 3, 2, 1)), ((1, 2, 1, 6), (1, 2, 2, 1))],
           3: [((1, 2, 3, 5, 6), (2, 1, 1, 3, 2, 1)), ((2, 4, 5, 7), (1, -1, 0, 2, -2, 2)),
               ((1, 2, 1, 3, 1), (2, 0, 1, 1, 0, 2))]}


@pytest.mark.parametrize("op", ["replication_pad2d_backward", "replication_pad3d_backward"])
@pytest.mark.parametrize("split", [False, True])  # whole-plane tiles (EARLY), or tiles of a few rows
def test_corners_a_source_a_lane_and_per_element_match_stock(op, split):
    """Replicate's corners (strip rows x strip columns) summed a source a lane (`_strip_lanes`) and each element's
    sources in turn (`corner_lanes=0`) both match stock."""
    tile = (16, 16, 16) if split else padmod.CONFIG.current.tile  # (tiles of 16 elements)
    for shape, pads in CORNERS[_dims(op)]:
        problem = _problem(op, shape, pads, torch.float32)
        for lanes in (1024, 0):
            with config.override(padmod.CONFIG, tile=tile, corner_lanes=lanes):
                plan = _plan(op, *problem)
                assert (plan.consts["LANES"][2] > 0) is (lanes > 0) and (split or plan.consts["EARLY"])
                check_case(op, problem, what=f"{op} {shape} pad {pads} lanes {lanes} split {split}")


# replicate pads wider than `unroll` (so in loops): symmetric, a crop, dims of size 1 (both ends' pads on one index)
WIDE = {1: [((2, 3, 5), (7, 6)), ((1, 1, 1), (6, 5)), ((3, 4), (-2, 7))],
        2: [((1, 2, 5, 6), (7, 7, 7, 7)), ((2, 1, 3), (5, 6, -1, 7)), ((1, 1, 1, 5), (6, 5, 7, 5))],
        3: [((1, 1, 2, 3, 4), (7,) * 6), ((1, 1, 3, 4, 5), (-1, 6, 5, -2, 6, 0)),
            ((1, 1, 1, 1, 5), (6, 5, 7, 5, 5, 6))]}


@pytest.mark.parametrize("op", [f"replication_pad{d}d_backward" for d in (1, 2, 3)])
@pytest.mark.parametrize("split", [False, True])  # whole-plane tiles (EARLY), or tiles of a few rows
def test_wide_pads_strip_parts_a_source_a_lane_match_stock(op, split):
    """Wide replicate pads' strip parts summed a source a lane (`loop_lanes`: all sources in one chunk of lanes, or
    4 lanes an element taking their sources in turn) and each element's sources in turn (0) all match stock."""
    tile = (16, 16, 16) if split else padmod.CONFIG.current.tile
    for shape, pads in WIDE[_dims(op)]:
        problem = _problem(op, shape, pads, torch.float32)
        for lanes in (1024, 4, 0):
            with config.override(padmod.CONFIG, tile=tile, loop_lanes=lanes):
                c = _plan(op, *problem).consts
                assert c["LOOPS"] and (min(c["LANES"]) > 0) is (lanes > 0), c["LANES"]
                check_case(op, problem, what=f"{op} {shape} pad {pads} lanes {lanes} split {split}")


# power-of-two planes (each a whole tile), one of them strided, and a plane whose W is not (its tile is wider); where
# whole, the column strips are selected into the bulk (EDGES): replicate's, and reflect's up to four columns (pads 2
# and 2, 1 and 1, 2 and 1)
UNMASKED = [((2, 3, 4, 8, 16), (2, 2, 2, 2, 2, 2), False), ((1, 2, 3, 4, 8), (1, 3, 0, 2, 2, -1), True),
            ((2, 2, 3, 8, 8), (1, 1, 2, 1, 1, 2), False), ((1, 2, 3, 8, 8), (2, 1, 1, 2, 2, 1), False),
            ((2, 2, 3, 8, 6), (2, 1, 1, 2, 1, 1), False)]


@pytest.mark.parametrize("op", ["replication_pad3d_backward", "reflection_pad3d_backward"])
def test_whole_tiles_unmasked_match_stock_and_masked(op):
    """16-bit 3d tiles that are exactly their plane (`PadConfig.geom`) run their bulk without masks and with the
    plane's geometry as constants (GEOM): that form matches stock and the general one bit for bit, and a plane that
    is not exactly its tile keeps its masks."""
    for shape, pads, strided in UNMASKED:
        g, x, p = _problem(op, shape, pads, torch.bfloat16)
        if strided:  # grad_output read in place through its strides
            g = torch.randn((*g.shape[:-1], 2 * g.shape[-1]), device=DEVICE).to(torch.bfloat16)[..., ::2]
        outs = []
        for geom in (frozenset({(3, 2)}), frozenset()):
            with config.override(padmod.CONFIG, geom=geom):
                whole = all(n & (n - 1) == 0 for n in shape[-2:])
                assert (_plan(op, g, x, p).consts["GEOM"] is not None) is (bool(geom) and whole)
                check_case(op, (g, x, p), what=f"{op} {shape} pad {pads} geom {set(geom)}")
                outs.append(getattr(ops, op)(g, x, p))
        assert_bitwise_equal(outs[0], outs[1])


@pytest.mark.parametrize("op, shape, magic", [
    ("reflection_pad1d_backward", (4, 8, 16), (False, False)),  # (N, C merged into rows: one plane)
    ("reflection_pad2d_backward", (2, 3, 8, 8), (False, True)),  # (D is 1)
    ("replication_pad3d_backward", (2, 3, 4, 8, 8), (True, True)),
    ("replication_pad3d_backward", (1, 1, 4, 8, 8), (True, False))])
def test_magic_division_only_by_more_than_one(op, shape, magic):
    """A plan divides a program's plane index by magic numbers only by a D or C above 1: a divisor of 1 is a
    constant to the compiler, whose division folds away (magic numbers there made reflection_pad1d 1.6x slower)."""
    g, x, p = _problem(op, shape, [1] * (2 * _dims(op)))
    assert _plan(op, g, x, p).consts["MAGIC"] == magic


def test_bad_inputs_raise_named_errors_and_write_nothing():
    g3, x3, _ = _problem("replication_pad3d_backward", (2, 3, 4, 5, 6), [1] * 6)
    g1, x1, _ = _problem("reflection_pad1d_backward", (2, 3, 5), [1, 1])
    out3, out1 = poison_like(x3), poison_like(x1)
    r3, f1 = ops.replication_pad3d_backward, ops.reflection_pad1d_backward
    cases = [
        (gradkern.InvalidProblem, r"padding.*6 ints.*\(1, 1, 1, 1\)", lambda: r3(g3, x3, [1] * 4, grad_input=out3)),
        (gradkern.InvalidProblem, r"padding.*2 ints.*\(1, 1, 1\)", lambda: f1(g1, x1, [1, 1, 1], grad_input=out1)),
        (gradkern.InvalidProblem, r"padding.*2 ints.*\(1\.0, 1\)", lambda: f1(g1, x1, [1.0, 1], grad_input=out1)),
        (gradkern.InvalidProblem, r"padding.*smaller than the input size 5.*\(5, 1\)",
         lambda: f1(torch.empty(2, 3, 11, device=DEVICE), x1, [5, 1], grad_input=out1)),
        (gradkern.InvalidProblem, r"padding.*smaller than the input size 5.*\(0, 7\)",
         lambda: f1(torch.empty(2, 3, 12, device=DEVICE), x1, [0, 7], grad_input=out1)),
        (gradkern.InvalidProblem, r"grad_output.*shape \(2, 3, 6, 7, 8\).*\(2, 3, 6, 7, 9\)",
         lambda: r3(torch.empty(2, 3, 6, 7, 9, device=DEVICE), x3, [1] * 6, grad_input=out3)),
        (gradkern.InvalidProblem, r"grad_output.*\(2, 3, 7\).*\(3, 7\)",
         lambda: f1(g1[0], x1, [1, 1], grad_input=out1)),
        (gradkern.InvalidProblem, r"self.*4-D.*5-D.*3-D tensor of shape \(4, 5, 6\)",
         lambda: r3(g3, x3[0, 0], [1] * 6, grad_input=out3)),
        (gradkern.InvalidProblem, r"self.*2-D.*3-D.*4-D tensor", lambda: f1(g1, x1[None], [1, 1], grad_input=out1)),
        (gradkern.InvalidProblem, r"padding.*size >= 0.*\(-4, -3\)",
         lambda: f1(g1, x1, [-4, -3], grad_input=out1)),
        (gradkern.Unsupported, r"grad_output.*dtype torch.float32.*float64",
         lambda: r3(g3.double(), x3, [1] * 6, grad_input=out3)),
        (gradkern.Unsupported, r"grad_output.*dtype", lambda: r3(g3.int(), x3.int(), [1] * 6)),
        (gradkern.InvalidProblem, r"grad_input.*shape \(2, 3, 5\).*\(2, 3, 4\)",
         lambda: f1(g1, x1, [1, 1], grad_input=out1[..., :4])),
        (gradkern.Unsupported, r"grad_input.*dtype", lambda: f1(g1, x1, [1, 1], grad_input=out1.double())),
        (gradkern.InvalidProblem, r"grad_input.*overlap",
         lambda: f1(g1, x1, [1, 1], grad_input=out1[:1].expand(2, 3, 5))),
    ]
    if GPU:
        cases.append((gradkern.Unsupported, r"grad_output.*device cuda", lambda: f1(g1.cpu(), x1.cpu(), [1, 1])))
        cases.append((gradkern.Unsupported, r"grad_input.*cuda", lambda: f1(g1, x1, [1, 1], grad_input=out1.cpu())))
    for err, pattern, call in cases:
        with pytest.raises(err, match=pattern) as info:
            call()
        assert str(info.value).split(":")[0] in ("replication_pad3d_backward", "reflection_pad1d_backward")
        assert torch.isnan(out3).all() and torch.isnan(out1).all(), f"a rejected call wrote: {info.value}"


def test_registry_entries():
    for op in OPS:
        info = REGISTRY[op]
        assert set(info.aten) == {op, f"{op}.grad_input"} and info.accumulates and not info.exact
        for dt in DTYPES:
            g = gradkern.guarantee(op, dt)
            assert g.deterministic and g.bit_stable
            assert g.accumulator_dtype == (torch.float64 if dt == torch.float64 else torch.float32)
        labels = [c.label for c in info.cases("meta", torch.bfloat16, "large")]
        assert any("8x32x32x64x64" in lab for lab in labels) or _dims(op) != 3


# ----------------------------------------------------------------------------------------------- training
def _modules(dtype):
    """(label, module or function, input shape) for every entry point that reaches these backward ops."""
    return [
        ("ReplicationPad1d", nn.ReplicationPad1d((2, 1)), (2, 3, 9)),
        ("ReplicationPad2d", nn.ReplicationPad2d((1, 2, 0, 3)), (2, 2, 5, 6)),
        ("ReplicationPad3d", nn.ReplicationPad3d((1, 2, 2, 0, 1, 1)), (1, 2, 3, 4, 5)),
        ("ReflectionPad1d", nn.ReflectionPad1d((2, 3)), (3, 9)),
        ("ReflectionPad2d", nn.ReflectionPad2d((1, 2, 3, 1)), (2, 2, 5, 6)),
        ("ReflectionPad3d", nn.ReflectionPad3d((1, 2, 2, 0, 1, 1)), (2, 3, 4, 5)),
        ("F.pad replicate 3d", lambda t: F.pad(t, (2, 1, 1, 1, 0, 2), mode="replicate"), (1, 2, 3, 4, 5)),
        ("F.pad replicate 1d", lambda t: F.pad(t, (-1, 3), mode="replicate"), (2, 3, 8)),
        ("F.pad reflect 2d", lambda t: F.pad(t, (2, 2, 1, 3), mode="reflect"), (2, 2, 5, 6)),
    ]


def _spy_on_pad_ops(monkeypatch) -> list[str]:
    calls = []
    for op in OPS:
        info = REGISTRY[op]
        for ov, impl in list(info.aten.items()):
            monkeypatch.setitem(info.aten, ov, lambda *a, _i=impl, _o=ov, **k: (calls.append(_o), _i(*a, **k))[1])
    return calls


@pytest.mark.parametrize("dtype, deterministic", [(d, True) for d in DTYPES] + [(torch.float32, False)],
                         ids=[f"{dtype_id(d)}-deterministic" for d in DTYPES] + ["f32-default"])
def test_modules_train_through_gradkern(dtype, deterministic, monkeypatch):
    """nn.ReplicationPad*d, nn.ReflectionPad*d and F.pad(replicate/reflect) under enable() reach gradkern's
    kernels (also with torch.use_deterministic_algorithms(True)) and give stock PyTorch's gradients."""
    torch.manual_seed(0)
    was = torch.are_deterministic_algorithms_enabled()
    calls = _spy_on_pad_ops(monkeypatch)
    try:
        for label, fn, shape in _modules(dtype):
            x = torch.randn(shape, device=DEVICE).to(dtype)
            w = torch.randn(fn(x).shape, device=DEVICE).to(dtype)
            ref = run_reference(lambda a, b, _f=fn: input_grad(_f, a, b), (x, w))  # float64, CPU, stock
            calls.clear()
            torch.use_deterministic_algorithms(deterministic)
            with gradkern.use(mode="always"):
                ours = input_grad(fn, x, w)
            torch.use_deterministic_algorithms(was)
            assert calls, f"{label}: no gradkern pad kernel ran"
            assert_close(ours, ref, dtype, label)
    finally:
        torch.use_deterministic_algorithms(was)


def _spy_on_original_replication_pad(monkeypatch) -> list:
    """Calls of the decomposition F.pad(replicate) takes in deterministic mode, counted by a spy put in its place
    before gradkern is enabled (so the route wraps the spy, and disable() puts the spy back)."""
    decomp = torch._decomp.decompositions
    original = decomp._replication_pad
    calls = []
    monkeypatch.setattr(decomp, "_replication_pad", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    return calls


def test_fpad_deterministic_route(monkeypatch):
    """The function F.pad calls in deterministic mode on CUDA: while gradkern is enabled (enable() puts the route
    there, disable() takes it out) routed to aten::replication_pad*d (and so to gradkern's backward); for other
    devices, while compiling and otherwise, the original decomposition. Called directly here, since F.pad takes
    that path only for CUDA tensors."""
    decomp = torch._decomp.decompositions
    original_calls = _spy_on_original_replication_pad(monkeypatch)
    spy = decomp._replication_pad
    calls = _spy_on_pad_ops(monkeypatch)
    x = torch.randn(2, 3, 4, 5, device=DEVICE)
    w = torch.randn(2, 3, 7, 8, device=DEVICE)
    stock = input_grad(lambda t: decomp._replication_pad(t, (1, 2, 0, 3)), x, w)
    assert original_calls and not calls
    original_calls.clear()
    with gradkern.use(mode="always"):
        assert decomp._replication_pad is not spy
        ours = input_grad(lambda t: decomp._replication_pad(t, (1, 2, 0, 3)), x, w)
        assert calls == ["replication_pad2d_backward"] and not original_calls
        assert decomp._replication_pad(x[0].to("meta"), (1, 1)).shape == (3, 4, 7)  # another device: original
        assert original_calls
        with gradkern.use(False):
            assert decomp._replication_pad is spy
    assert decomp._replication_pad is spy
    assert_close(ours, stock.double(), torch.float32, "routed F.pad replicate")


def test_fpad_route_leaves_empty_results_to_the_original():
    """Bug: the route sent every call to ATen's kernel, which refuses an empty input or output that the original
    decomposition returns (pads cropping W to 0, a C = 0 input): F.pad raised in deterministic mode under
    enable() where stock returns the empty tensor."""
    decomp = torch._decomp.decompositions
    x = torch.randn(2, 3, 5, device=DEVICE)
    for t, pad in ((x, (-3, -2)), (x, (-5, 1)), (torch.randn(2, 0, 5, device=DEVICE), (1, 1))):
        want = decomp._replication_pad(t, pad)
        with gradkern.use(mode="always"):
            got = decomp._replication_pad(t, pad)
        assert got.shape == want.shape, pad


# ----------------------------------------------------------------------------------------------- GPU only
@gpu_only
def test_deterministic_mode_ops_and_training_do_not_raise_on_cuda(monkeypatch):
    """On CUDA, ATen's pad backward kernels raise under torch.use_deterministic_algorithms(True) (which ones
    depends on the torch version: replication_pad3d_backward always has; replication_pad1d_backward did not on
    torch 2.11) and F.pad(replicate) falls back to a slow decomposition; with gradkern enabled neither happens."""
    original_calls = _spy_on_original_replication_pad(monkeypatch)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for op in OPS:
            g, x, p = _problem(op, SEMANTICS[_dims(op)][0][0], SEMANTICS[_dims(op)][0][1])
            if op == "replication_pad3d_backward":  # the stock alert these tests are about
                with pytest.raises(RuntimeError, match="deterministic"):
                    getattr(torch.ops.aten, op)(g, x, p)
            with gradkern.use(mode="always"):
                ours = getattr(torch.ops.aten, op)(g, x, p)
                getattr(torch.ops.aten, op).grad_input(g, x, p, grad_input=torch.empty_like(x))
            assert_bitwise_equal(ours, getattr(ops, op)(g, x, p), op)
        calls = _spy_on_pad_ops(monkeypatch)
        for label, fn, shape in _modules(torch.float32):
            x = torch.randn(shape, device=DEVICE)
            w = torch.randn(fn(x).shape, device=DEVICE)  # stock forward, outside use(): may take the decomposition
            calls.clear()
            original_calls.clear()
            with gradkern.use(mode="always"):
                input_grad(fn, x, w)
            assert calls, f"{label}: no gradkern kernel ran"
            assert not original_calls, f"{label}: F.pad(replicate) took the slow decomposition"
    finally:
        torch.use_deterministic_algorithms(was)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bitwise_identical_repeats_on_gpu(dtype):
    """Repeated runs (plain calls, deterministic-mode training steps) give identical bits."""
    assert_repeats_bitwise(OPS, dtype, DEVICE, "check")
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with gradkern.use(mode="always"):
            for label, fn, shape in _modules(dtype):
                x = torch.randn(*shape[:-1], 64 * shape[-1], device=DEVICE).to(dtype)  # larger along W
                w = torch.randn(fn(x).shape, device=DEVICE).to(dtype)
                first = input_grad(fn, x, w)
                for _ in range(2):
                    assert_bitwise_equal(input_grad(fn, x, w), first, f"{label} training step")
    finally:
        torch.use_deterministic_algorithms(was)


@gpu_only
def test_more_than_2_31_elements():
    """int64 offsets: a 1d problem whose two rows exceed 2^31 elements each and a 3d one whose planes do (bf16, ~20 GB
    at a time)."""
    if torch.cuda.mem_get_info()[0] < 24 * 2**30:
        pytest.skip("not enough free GPU memory")
    n = 2**31 + 3
    x = torch.zeros((), device=DEVICE, dtype=torch.bfloat16).expand(1, 2, n)
    g = torch.randn(1, 2, n + 3, device=DEVICE, dtype=torch.bfloat16)  # two rows: the second starts past 2^31
    out = ops.replication_pad1d_backward(g, x, [2, 1])
    for r in (0, 1):
        assert torch.equal(out[0, r, 1:-1], g[0, r, 3:-2])
        assert out[0, r, 0].item() == g[0, r, :3].float().sum().bfloat16().item()
        assert out[0, r, -1].item() == g[0, r, -2:].float().sum().bfloat16().item()
    del x, g, out
    shape = (1, 2**19 + 1, 4, 32, 32)  # 2^31 + 4096 elements
    assert math.prod(shape) > 2**31
    x = torch.zeros((), device=DEVICE, dtype=torch.bfloat16).expand(shape)
    g = torch.randn(padmod.padded_shape(shape, [1] * 6), device=DEVICE, dtype=torch.bfloat16)
    out = ops.reflection_pad3d_backward(g, x, [1] * 6)
    for c in (0, 2**18, 2**19):  # the last channel's offsets are past 2^31
        ref = run_reference(torch.ops.aten.reflection_pad3d_backward, (g[:, c:c + 1], x[:, c:c + 1], [1] * 6))
        assert_close(out[:, c:c + 1], ref, torch.bfloat16, f"channel {c}")


def test_grad_input_sharing_memory_is_a_named_error():
    """A gather reads neighbours of what it writes: grad_input may not overlap grad_output (partly or wholly,
    as a zero-pad problem could), nor itself (an expanded tensor); nothing is written."""
    op = ops.replication_pad1d_backward
    x = torch.randn(2, 3, 8, device=DEVICE)
    buf = torch.randn(2 * 3 * 10 + 1, device=DEVICE)
    g = buf[:60].view(2, 3, 10)
    out = buf[1:49].view(2, 3, 8)  # inside grad_output's memory
    before = buf.clone()
    with pytest.raises(gradkern.InvalidProblem, match="grad_input.*share memory with 'grad_output'"):
        op(g, x, [1, 1], grad_input=out)
    g0 = torch.randn(2, 3, 8, device=DEVICE)
    with pytest.raises(gradkern.InvalidProblem, match="grad_input.*share memory with 'grad_output'"):
        op(g0, x, [0, 0], grad_input=g0)
    with pytest.raises(gradkern.InvalidProblem, match="grad_input.*do not overlap in memory"):
        op(g, x, [1, 1], grad_input=torch.zeros(1, device=DEVICE).expand(2, 3, 8))
    assert torch.equal(buf, before)
    separate = torch.empty(2, 3, 8, device=DEVICE)  # and a buffer of its own works
    assert_bitwise_equal(op(g, x, [1, 1], grad_input=separate), op(g, x, [1, 1]))


def test_deterministic_mode_does_not_fill_the_output_first():
    """Bug: in deterministic mode torch.empty fills its memory with NaN, so every pad backward paid an extra pass
    over grad_input before the kernel overwrote it whole (ATen's own kernels allocate without that fill). No fill
    of anything but an empty tensor runs now, on the first (validating) call or a repeated one."""
    g, x = torch.randn(2, 3, 12, device=DEVICE), torch.zeros(2, 3, 8, device=DEVICE)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            with torch.profiler.profile(record_shapes=True) as prof:
                out = ops.reflection_pad1d_backward(g, x, [2, 2])
            fills = [e.input_shapes for e in prof.events() if e.name == "aten::fill_"]
            assert all(math.prod(shapes[0]) == 0 for shapes in fills), fills
    finally:
        torch.use_deterministic_algorithms(was)
    assert_close(out, torch.ops.aten.reflection_pad1d_backward(g.double(), x.double(), [2, 2]), torch.float32, "")
