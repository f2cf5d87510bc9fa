"""segment_max (first-argmax forward/backward, autograd-aware) and torch.segment_reduce(..., "max")'s backward
through enable() (PyTorch's tie rule, bit for bit)."""

import itertools
import math

import pytest
import torch
import triton
import triton.language as tl
from torch.utils._python_dispatch import TorchDispatchMode

import gradkern
from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import InvalidProblem, Unsupported, config, ops
from gradkern.kernels import segment_max as sm
from gradkern.testing import assert_bitwise_equal, count_calls, record_launches


def _data(shape, dtype, seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g)
    if ties:
        t = (t * 2).round() / 2
    return t.to(dtype).to(DEVICE)


def _offsets(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEVICE)


def _expected(data, offsets, axis=0):
    """A plain Python loop over segments in float64: (values, first argmax), NaN largest, empty -> (0, N)."""
    d = data.detach().cpu().double().movedim(axis, 0)
    n = d.shape[0]
    offs = offsets.cpu().tolist()
    vals, idxs = [], []
    for s in range(len(offs) - 1):
        a, b = offs[s], offs[s + 1]
        seg = d[a:b]
        if b == a:
            vals.append(torch.zeros(d.shape[1:], dtype=torch.float64))
            idxs.append(torch.full(d.shape[1:], n, dtype=torch.int64))
            continue
        nan = torch.isnan(seg)
        m = torch.where(nan, torch.full_like(seg, -math.inf), seg).amax(0)
        has_nan = nan.any(0)
        match = torch.where(has_nan, nan, seg == m)
        first = match.int().argmax(0)
        vals.append(seg.gather(0, first.unsqueeze(0)).squeeze(0))  # the element itself (sign of a tied zero)
        idxs.append(first + a)
    v = torch.stack(vals).movedim(0, axis).to(data.dtype)
    i = torch.stack(idxs).movedim(0, axis)
    return v, i


LENGTH_SETS = {
    "uniform": [4] * 6,
    "with-empty": [3, 0, 5, 0, 0, 9, 1],
    "long": [1, 70, 2, 300],
    "single": [17],
    "all-empty-tail": [5, 6, 0, 0],
    # means of at most a row: wide rows take the lane kernel there too (fwd_lanes_unit_mean), a long one its loop
    "unit-and-empty": [1, 0, 1, 1, 0, 0, 1, 1],
    "empty-with-long": [0] * 80 + [70] + [1] * 9,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", sorted(LENGTH_SETS))
def test_forward_matches_loop_reference(name, dtype):
    lengths = LENGTH_SETS[name]
    n = sum(lengths)
    for shape in [(n,), (n, 3), (n, 2, 5), (n, 130)]:
        data = _data(shape, dtype, ties=True)
        offs = _offsets(lengths)
        vals, idxs = gradkern.segment_max(data, offs)
        ev, ei = _expected(data, offs)
        assert_bitwise_equal(vals, ev, f"{name} {shape} values")
        assert_bitwise_equal(idxs, ei, f"{name} {shape} indices")
        rv, ri = sm._reference_forward(data, offs)  # the registry's composite reference agrees
        assert_bitwise_equal(rv, ev, "composite reference")
        assert_bitwise_equal(ri, ei, "composite reference")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_special_values(dtype):
    nan, inf = math.nan, math.inf
    col = [1.0, nan, 2.0, nan,  # NaN wins, first NaN's index
           -inf, -inf,  # all -inf: value -inf, first index
           3.0, 3.0, 1.0,  # ties: first
           inf, 5.0, inf,  # +inf
           -0.0, 0.0]  # -0 and 0 compare equal: the first one
    sub = torch.finfo(dtype).smallest_normal / 4  # subnormals are ordered (a compare that flushes them ties them)
    col += [sub, 2 * sub, -2 * sub, -sub]
    data = torch.tensor(col, dtype=torch.float64).to(dtype).to(DEVICE)
    offs = _offsets([4, 2, 3, 3, 2, 2, 2])
    vals, idxs = gradkern.segment_max(data, offs)
    assert idxs.cpu().tolist() == [1, 4, 6, 9, 12, 15, 17]
    v = vals.cpu().double()
    assert math.isnan(v[0]) and v[1] == -inf and v[2] == 3 and v[3] == inf
    assert v[4] == 0 and math.copysign(1, v[4]) == -1  # the first of the tied zeros: -0.0
    assert v[5] == 2 * sub and v[6] == -sub


_NEG_NAN = {torch.float16: 0xFE01 - (1 << 16), torch.bfloat16: 0xFFC1 - (1 << 16),  # sign set, a payload
            torch.float32: 0xFFC00001 - (1 << 32), torch.float64: -0x0007FFFFFFFFFFFF}
_INTS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


# the split for long segments at test sizes: chunks of 4 columns x 16 rows, 4 rows a step, 4 chunks a program
_SPLIT = {"split_min_elems": 0, "split_chunk": 64, "rows_bd_max": 4, "rows_tile": 16, "split_block": 4,
          "split_min_programs": 0}


@pytest.mark.parametrize("split", [False, True], ids=["walked", "split"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_special_values_across_tiles(dtype, split):
    """Segments of 700 rows span several row tiles (or, split, the chunk pass's chunks): the max found in a later
    tile, ties between tiles (the first wins), the sign of tied zeros and a NaN's payload and sign are kept bit for
    bit."""
    n, inf = 700, math.inf
    cols = [torch.full((n,), -inf, dtype=torch.float64) for _ in range(4)]
    cols[0][[10, 300, 600]] = torch.tensor([-0.0, 0.0, -0.0], dtype=torch.float64)  # max 0: the first, -0.0
    cols[1][[400, 650]] = 3.0  # a tie in two later tiles: the first
    cols[1][[20, 299]] = torch.tensor([2.0, -1.0], dtype=torch.float64)
    cols[2][[260, 511]] = inf  # +inf twice
    cols[3][[5, 400]] = 1.0
    data = torch.stack(cols, 1).to(dtype)
    ints = data.view(_INTS[data.element_size()])
    ints[7, 3] = _NEG_NAN[dtype]  # a negative NaN with a payload, before a positive NaN
    data[450, 3] = math.nan
    data = data.to(DEVICE)
    with config.override(sm.CONFIG, **(_SPLIT if split else {})):
        launches = gradkern.plan("segment_max_forward", data, _offsets([n]), 0).kernels
        vals, idxs = gradkern.segment_max(data, _offsets([n]))
    kernels = [k.kernel for k in launches]
    assert ("_segment_max_fwd_chunks_kernel" in kernels) == split, kernels
    assert idxs.cpu().tolist() == [[10, 400, 260, 7]]
    expected = torch.tensor([[-0.0, 3.0, inf, math.nan]], dtype=torch.float64).to(dtype)
    expected.view(_INTS[data.element_size()])[0, 3] = _NEG_NAN[dtype]
    assert_bitwise_equal(vals, expected.to(DEVICE), "values")
    assert all(n > 2 * k.config["BLOCK_L"] for k in launches if "BLOCK_L" in k.config)  # more than two row tiles


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_lengths_segment_ids_and_axis(dtype):
    lengths = [3, 0, 5, 4]
    n = sum(lengths)
    data = _data((n, 6), dtype, ties=True)
    offs = _offsets(lengths)
    ref = gradkern.segment_max(data, offs)
    L = torch.tensor(lengths, device=DEVICE)
    assert_bitwise_equal(gradkern.segment_max(data, lengths=L), ref)
    assert_bitwise_equal(gradkern.segment_max(data, lengths=L.int()), ref)
    assert_bitwise_equal(gradkern.segment_max(data, offs.int()), ref)
    ids = torch.repeat_interleave(torch.arange(4, device=DEVICE), L)
    assert_bitwise_equal(gradkern.segment_max(data, segment_ids=ids), ref)
    v6, i6 = gradkern.segment_max(data, segment_ids=ids, num_segments=6)  # two trailing empty segments
    assert v6.shape == (6, 6) and bool((v6[4:] == 0).all()) and bool((i6[4:] == n).all())
    assert_bitwise_equal((v6[:4], i6[:4]), ref)
    # axis: segments along dim 1 of (2, n, 3); and negative axis
    d3 = _data((2, n, 3), dtype, seed=3, ties=True)
    for axis in (1, -2):
        v, i = gradkern.segment_max(d3, offs, axis=axis)
        ev, ei = _expected(d3, offs, axis=1)
        assert_bitwise_equal(v, ev, f"axis {axis}")
        assert_bitwise_equal(i, ei, f"axis {axis}")
    # strided data read in place (transposed, sliced)
    dt = _data((6, n), dtype, seed=4, ties=True).t()
    assert_bitwise_equal(gradkern.segment_max(dt, offs), _expected(dt, offs))
    ds = _data((n, 12), dtype, seed=5, ties=True)[:, ::2]
    assert_bitwise_equal(gradkern.segment_max(ds, offs), _expected(ds, offs))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_backward_goes_to_first_argmax_only(dtype):
    lengths = [3, 0, 5, 1, 70]
    n = sum(lengths)
    data = _data((n, 4), dtype, ties=True).requires_grad_()
    offs = _offsets(lengths)
    vals, idxs = gradkern.segment_max(data, offs)
    assert not idxs.requires_grad
    g = _data(vals.shape, dtype, seed=7)
    (gx,) = torch.autograd.grad(vals, data, g)
    expected = torch.zeros(n, 4, dtype=torch.float64)
    ii = idxs.cpu()
    for s in range(len(lengths)):
        for d in range(4):
            if ii[s, d] < n:
                expected[ii[s, d], d] = g[s, d].double().cpu()
    assert_bitwise_equal(gx, expected.to(dtype), "gradient")
    assert int((gx != 0).sum()) <= int((g != 0).sum())
    assert_bitwise_equal(ops.segment_max_backward(g, idxs, offs, n, 0), gx, "ops.segment_max_backward")


def test_backward_trailing_dims_axis_and_double_backward():
    lengths = [2, 0, 4, 3]
    n = sum(lengths)
    offs = _offsets(lengths)
    x = _data((3, n, 2, 2), torch.float64, ties=True).requires_grad_()
    w = _data((3, n, 2, 2), torch.float64, seed=2)  # does not require grad
    vals, idxs = gradkern.segment_max(x * 1.0 + w * 0.0, offs, axis=1)
    g = _data(vals.shape, torch.float64, seed=9).requires_grad_()
    (gx,) = torch.autograd.grad(vals, x, g, create_graph=True)
    comp = sm._backward_composite(g.detach(), idxs, n, 1)
    assert_bitwise_equal(gx.detach(), comp)
    # double backward: d/dg of <gx, x> is x gathered at the argmax rows
    (gg,) = torch.autograd.grad((gx * x.detach()).sum(), g)
    expected = torch.where(idxs < n, x.detach().gather(1, idxs.clamp(max=n - 1)), torch.zeros((), dtype=x.dtype))
    assert_bitwise_equal(gg, expected.to(DEVICE))
    assert w.grad is None


def test_no_grad_and_determinism():
    lengths = [5, 0, 9, 30]
    offs = _offsets(lengths)
    data = _data((44, 8), torch.float32, ties=True)
    with torch.no_grad():
        v, i = gradkern.segment_max(data.requires_grad_(), offs)
    assert v.grad_fn is None
    for _ in range(2):
        assert_bitwise_equal(gradkern.segment_max(data.detach(), offs), (v, i))


class _Kernels(TorchDispatchMode):
    """The ATen ops a block runs that are not views (each a launch on the GPU), less the read-back: the copy to the
    host (on a GPU; on the CPU there is none) and the scalar read."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        read_back = func is torch.ops.aten._local_scalar_dense.default or (
            func is torch.ops.aten._to_copy.default and out.device.type == "cpu" and args[0].device.type != "cpu")
        if not func.is_view and not read_back:
            self.ops.append(str(func))
        return out


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_check_reads_back_in_few_launches(dtype):
    """check=True's cost beside its one synchronisation: the launches it adds to check=False's (they were 5-9, a
    comparison, a reduction and a cast per figure, stacked). And its verdicts at the edges: one segment, one row,
    no segment."""
    from gradkern.kernels.segment_max import _offsets_from

    def added(n, **given):
        counts = []
        device = next(iter(given.values())).device  # (cuda:0, as data's would be; torch.device("cuda") has no index)
        for check in (False, True):
            with _Kernels() as k:
                _offsets_from("segment_max", n, device, given.get("offsets"), given.get("lengths"),
                              given.get("segment_ids"), given.get("num_segments"), check)
            counts.append(len(k.ops))
        return counts[1] - counts[0]

    offs = torch.tensor([0, 10, 40, 100], device=DEVICE, dtype=dtype)
    ids = torch.repeat_interleave(torch.arange(3, device=DEVICE, dtype=dtype), offs.diff())
    cast = dtype == torch.int32  # (the differences are taken in int64: see the wrap below)
    assert added(100, offsets=offs) <= 3 + cast
    assert added(100, lengths=offs.diff()) <= 3
    assert added(100, segment_ids=ids, num_segments=3) <= 4 + cast
    data = _data((1, 2), torch.float32)
    for given in (dict(offsets=torch.tensor([0, 1], device=DEVICE, dtype=dtype)),
                  dict(lengths=torch.tensor([1], device=DEVICE, dtype=dtype)),
                  dict(segment_ids=torch.tensor([0], device=DEVICE, dtype=dtype))):
        v, i = gradkern.segment_max(data, **given)
        assert_bitwise_equal(v, data)
        assert_bitwise_equal(i, torch.zeros(1, 2, dtype=torch.int64, device=DEVICE))
    v, _ = gradkern.segment_max(data[:0], torch.tensor([0], device=DEVICE, dtype=dtype))
    assert v.shape == (0, 2)
    with pytest.raises(InvalidProblem, match="offsets"):
        gradkern.segment_max(data, torch.tensor([1], device=DEVICE, dtype=dtype))
    with pytest.raises(InvalidProblem, match="lengths"):
        gradkern.segment_max(_data((3, 2), torch.float32), lengths=torch.tensor([5, -2], device=DEVICE, dtype=dtype))
    # bug: in int32 the step from 2^31 - 1 down to -2^31 wrapped to +1, so these decreasing offsets passed
    top, bottom = 2**31 - 1, -(2**31)
    three = _data((3, 2), torch.float32)
    with pytest.raises(InvalidProblem, match="decreasing"):
        gradkern.segment_max(three, torch.tensor([0, top, bottom, 3], device=DEVICE, dtype=dtype))
    ids = torch.tensor([0, top, bottom], device=DEVICE, dtype=dtype)
    with pytest.raises(InvalidProblem, match="sorted"):
        gradkern.segment_max(three, segment_ids=ids, num_segments=2**31)


def test_bad_inputs_raise_named_errors():
    data = _data((10, 3), torch.float32)
    good = _offsets([4, 6])
    with pytest.raises(InvalidProblem, match="segment_max.*axis"):
        gradkern.segment_max(data, good, axis=2)
    with pytest.raises(InvalidProblem, match="axis"):
        gradkern.segment_max(data, good, axis=-3)
    with pytest.raises(InvalidProblem, match="offsets"):
        gradkern.segment_max(data, _offsets([4, 5]))  # ends at 9, not N = 10
    with pytest.raises(InvalidProblem, match="offsets"):
        gradkern.segment_max(data, torch.tensor([1, 4, 10], device=DEVICE))  # does not start at 0
    with pytest.raises(InvalidProblem, match="offsets"):
        gradkern.segment_max(data, torch.tensor([0, 6, 4, 10], device=DEVICE))  # not monotone
    with pytest.raises(InvalidProblem, match="offsets"):
        gradkern.segment_max(data, good.float())
    with pytest.raises(InvalidProblem, match="offsets"):
        gradkern.segment_max(data, good.view(1, -1))
    with pytest.raises(InvalidProblem, match="lengths"):
        gradkern.segment_max(data, lengths=torch.tensor([4, 5], device=DEVICE))
    with pytest.raises(InvalidProblem, match="lengths"):
        gradkern.segment_max(data, lengths=torch.tensor([12, -2], device=DEVICE))
    with pytest.raises(InvalidProblem, match="exactly one"):
        gradkern.segment_max(data, good, lengths=torch.tensor([4, 6], device=DEVICE))
    with pytest.raises(InvalidProblem, match="exactly one"):
        gradkern.segment_max(data)
    ids = torch.tensor([0, 0, 1, 1, 1, 0, 2, 2, 2, 2], device=DEVICE)
    with pytest.raises(InvalidProblem, match="segment_ids.*sorted"):
        gradkern.segment_max(data, segment_ids=ids)
    with pytest.raises(InvalidProblem, match="segment_ids"):
        gradkern.segment_max(data, segment_ids=ids.sort().values, num_segments=2)  # id 2 out of range
    with pytest.raises(InvalidProblem, match="segment_ids"):
        gradkern.segment_max(data, segment_ids=ids[:5])
    with pytest.raises(InvalidProblem, match="num_segments"):
        gradkern.segment_max(data, good, num_segments=3)
    with pytest.raises(Unsupported, match="data"):
        gradkern.segment_max(data.to(torch.int32), good)
    # check=False: unsorted ids are a broken precondition - unspecified values, but it runs and stays in bounds
    v, i = gradkern.segment_max(data, segment_ids=ids, num_segments=3, check=False)
    assert v.shape == (3, 3)
    v, i = gradkern.segment_max(data, torch.tensor([0, 7, 3, 99], device=DEVICE), check=False)
    assert v.shape == (3, 3) and bool(((i >= 0) & (i <= 10)).all())
    # the ops check their structural arguments
    with pytest.raises(InvalidProblem, match="indices"):
        ops.segment_max_backward(data[:2], torch.zeros(2, 3, dtype=torch.int32, device=DEVICE), good, 10)
    with pytest.raises(InvalidProblem, match="grad"):
        ops.segment_max_backward(data[:3], torch.zeros(3, 3, dtype=torch.int64, device=DEVICE), good, 10)
    with pytest.raises(Unsupported, match="reduce"):
        ops._segment_reduce_backward(data[:2], data[:2], data, "sum", lengths=torch.tensor([4, 6], device=DEVICE))
    # bug: axis was never read, so one out of data's range went through (stock: "Dimension out of range")
    for axis in (2, -3, True):
        with pytest.raises(InvalidProblem, match="axis"):
            ops._segment_reduce_backward(data[:2], data[:2], data, "max", lengths=torch.tensor([4, 6], device=DEVICE),
                                         axis=axis)
    # bools are not counts
    with pytest.raises(InvalidProblem, match="num_segments"):
        gradkern.segment_max(data, segment_ids=ids.sort().values, num_segments=True)
    with pytest.raises(InvalidProblem, match="num_rows"):
        ops.segment_max_backward(data[:2], torch.zeros(2, 3, dtype=torch.int64, device=DEVICE), good, True)


def test_segment_reduce_backward_validation_is_cached_per_problem():
    """_segment_reduce_backward validates a problem once (its plan is keyed by everything validation reads): after
    a valid call, the same layout as a negative-bit view, axis True where 1 passed (equal, but not an int), or
    another reduction is still refused, and the valid call still equals its first result."""
    data = _data((10, 3), torch.float32, ties=True)
    g = _data((2, 3), torch.float32, seed=1)
    lengths = torch.tensor([4, 6], device=DEVICE)
    out = torch.ops.aten.segment_reduce(data, "max", lengths=lengths)
    want = ops._segment_reduce_backward(g, out, data, "max", lengths, axis=1)
    with pytest.raises(Unsupported, match="negative-bit"):
        ops._segment_reduce_backward(torch._neg_view(g), out, data, "max", lengths, axis=1)
    with pytest.raises(InvalidProblem, match="axis"):
        ops._segment_reduce_backward(g, out, data, "max", lengths, axis=True)
    with pytest.raises(Unsupported, match="reduce"):
        ops._segment_reduce_backward(g, out, data, "min", lengths, axis=1)
    assert_bitwise_equal(ops._segment_reduce_backward(g, out, data, "max", lengths, axis=1), want)


def test_empty_inputs():
    data = _data((0, 3), torch.float32)
    v, i = gradkern.segment_max(data, torch.tensor([0, 0, 0], device=DEVICE))
    assert v.shape == (2, 3) and bool((v == 0).all()) and bool((i == 0).all())
    v, i = gradkern.segment_max(_data((5, 3), torch.float32), torch.tensor([0, 5], device=DEVICE))
    assert v.shape == (1, 3)
    v, i = gradkern.segment_max(_data((0,), torch.float32), lengths=torch.zeros(0, dtype=torch.int64, device=DEVICE))
    assert v.shape == (0,)
    x = _data((4, 0), torch.float32).requires_grad_()
    v, i = gradkern.segment_max(x, torch.tensor([0, 4], device=DEVICE))
    assert v.shape == (1, 0)
    v.sum().backward()
    assert x.grad.shape == (4, 0)


# ------------------------------------------------------------------------------------------------ segment_reduce
def _spy(monkeypatch):
    return count_calls(monkeypatch, sm, "_segment_reduce_backward")


def _both(data, g, **kw):
    """Gradients of segment_reduce(data, 'max', **kw) with gradkern enabled and stock."""
    out = []
    for enabled in (True, False):
        x = data.clone().requires_grad_()
        with gradkern.use(enabled, mode="always"):
            y = torch.segment_reduce(x, "max", **kw)
            (gx,) = torch.autograd.grad(y, x, g)
        out.append((y, gx))
    return out


_TILE_CLASSES = frozenset(itertools.product((True, False), (2, 4, 8)))  # (small tile?, element size): all of them


@pytest.mark.parametrize("paths", [(True, True), (False, False)], ids=["two-pass", "one-pass"])
@pytest.mark.parametrize("lengths_read", [True, False], ids=["lengths-read", "lengths-cumsum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_segment_reduce_backward_equals_stock(dtype, lengths_read, paths, monkeypatch):
    """Both ways the kernel takes lengths: summing each start from the lengths itself (small S) or reading their
    cumsum; and both ways it takes a segment longer than a tile (40 rows here; ties, NaN): counting in one pass and
    writing in a second, or writing g while counting and rewriting the columns whose ties divide g, each with and
    without the branch over empty segments."""
    two_pass, skip_empty = paths
    forced = {"segred_one_pass": frozenset() if two_pass else _TILE_CLASSES,
              "segred_no_skip": frozenset() if skip_empty else _TILE_CLASSES}
    if not lengths_read:
        forced["lens_max_s"] = 0
    calls = _spy(monkeypatch)
    with config.override(sm.CONFIG, **forced):  # (every plan is rebuilt: none made before may serve)
        lengths = [3, 0, 6, 1, 40, 2]
        n = sum(lengths)
        data = _data((n, 5), dtype, ties=True)
        data[4, 0] = math.nan
        data[5, 1] = math.nan
        data[6, 1] = math.nan
        data[10:15, 2] = 7.0  # five-way tie
        L = torch.tensor(lengths, device=DEVICE)
        for g in (_data((len(lengths), 5), dtype, seed=3), -_data((len(lengths), 5), dtype, seed=3).abs(),
                  torch.full((len(lengths), 5), 3.0, dtype=dtype, device=DEVICE)):
            for kw in ({"lengths": L}, {"offsets": _offsets(lengths)}, {"lengths": L.int()},
                       {"lengths": L, "initial": 0.25}):
                (y, gx), (ys, gxs) = _both(data, g, **kw)
                assert_bitwise_equal(y, ys, f"forward {kw.keys()}")
                assert_bitwise_equal(gx, gxs, f"backward {list(kw)}")
        assert calls, "gradkern's kernel did not run"
        made = [p.consts for p in sm._plans.values() if "SKIP_EMPTY" in p.consts]  # (cleared after the override)
    assert {c["LENS"] > 0 for c in made if c["ENDS"]} == {lengths_read}
    assert {(c["TWO_PASS"], c["SKIP_EMPTY"]) for c in made} == {paths}
    assert max(c["BLOCK_L"] for c in made) < 40, "a segment spans tiles"


@pytest.mark.parametrize("case", ["short", "long", "unit"])
def test_segment_reduce_tile_follows_the_mean_length(case, monkeypatch):
    """The segment_reduce backward's tile kernel takes tiles of short_tile elements at short mean lengths, `tile`
    at long ones, and widens its columns where segments are too short to fill segred_min_tile elements; the
    gradients are stock's whatever the tile."""
    lengths, inner = {"short": ([5, 40, 1, 20, 0, 30], 40), "long": ([300], 40), "unit": ([1] * 12, 100)}[case]
    cfg = sm.CONFIG.current
    with config.override(sm.CONFIG):  # (a fresh plan cache)
        data = _data((sum(lengths), inner), torch.float32, ties=True)
        g = _data((len(lengths), inner), torch.float32, seed=1)
        (y, gx), (ys, gxs) = _both(data, g, lengths=torch.tensor(lengths, device=DEVICE))
        (made,) = [p.consts for p in sm._plans.values() if "SKIP_EMPTY" in p.consts]
    assert_bitwise_equal(gx, gxs, "backward")
    tile = made["BLOCK_L"] * made["BLOCK_D"]
    if case == "short":
        assert made["BLOCK_D"] == 64 and tile == cfg.short_tile, made
    elif case == "long":
        assert made["BLOCK_D"] == 64 and tile == cfg.tile, made
    else:
        assert made["BLOCK_L"] == 1 and made["BLOCK_D"] == cfg.segred_min_tile, made


@pytest.mark.parametrize("one_pass", [False, True], ids=["count-then-write", "one-pass"])
@pytest.mark.parametrize("write_rows", [1, 2], ids=["write-a-lane", "write-2-rows"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_segment_reduce_lane_kernel_equals_stock(dtype, write_rows, one_pass, monkeypatch):
    """The segment_reduce backward's lane kernel (a lane a (segment, column) counting its ties, then writing; a
    segment longer than its cap taken by the whole program, as the tile kernel takes one): stock's gradients bit for
    bit, over ties with g > 0 (divided) and g < 0, NaN, empty segments, segments past the cap, several programs,
    lengths (their cumsum) and offsets, and an outer dim with one row of lengths a slice; 16-bit and f64 data with
    three rows a loop step (lanes_unroll), segment lengths not multiples of it; the writing pass a lane a (segment,
    column) or two rows of a segment side by side (lanes_write_rows: most segments take several steps); counting
    in a pass of its own or while writing g (segred_lanes_one_pass: the tied segments rewritten)."""
    lengths = [3, 0, 1, 1, 9, 2, 0, 0, 4, 1, 2]
    n = sum(lengths)
    data = _data((n, 3), dtype, ties=True)
    data[0, 0] = math.nan
    data[2, 0] = math.nan
    data[5:9, 1] = 7.0  # a four-way tie in the segment past the cap
    data[0:3, 2] = 1.5  # and a three-way one in a short segment
    L = torch.tensor(lengths, device=DEVICE)
    calls = _spy(monkeypatch)
    with config.override(sm.CONFIG, lanes_max_mean=1 << 30, lanes=8, lanes_few=8, lanes_min_programs=0, lanes_cap=4,
                         lens_max_s=0, lanes_unroll=1 if dtype == torch.float32 else 3,
                         lanes_write_rows=((dtype.itemsize, write_rows),),
                         segred_lanes_one_pass=frozenset({dtype.itemsize} if one_pass else ())):
        for g in (_data((len(lengths), 3), dtype, seed=3), torch.full((len(lengths), 3), 3.0, dtype=dtype,
                                                                      device=DEVICE)):
            for kw in ({"lengths": L}, {"offsets": _offsets(lengths)}, {"lengths": L.int()}):
                (y, gx), (ys, gxs) = _both(data, g, **kw)
                assert_bitwise_equal(gx, gxs, f"backward {list(kw)}")
        data2 = _data((2, 9, 3), dtype, ties=True)
        lengths2 = torch.tensor([[2, 0, 7], [4, 5, 0]], device=DEVICE)
        (_, gx), (_, gxs) = _both(data2, _data((2, 3, 3), dtype, seed=1), lengths=lengths2, axis=1)
        assert_bitwise_equal(gx, gxs, "outer dim")
        kernels = {p.kernel.__name__ for p in sm._plans.values() if p.kernel is not None}
        write = {(p.consts["WRITE_R"], p.consts["ONE_PASS"]) for p in sm._plans.values() if p.kernel is not None}
    assert calls, "gradkern's kernel did not run"
    assert kernels == {"_segment_reduce_max_bwd_lanes_kernel"}
    assert write == {(write_rows, one_pass)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_segment_reduce_lane_kernel_takes_wide_rows_at_unit_lengths(dtype):
    """segred_lanes_unit_inner: the lane kernel for rows wider than lanes_max_inner where segments average at most
    one row (unit and empty ones, a tie, NaN, one segment of three rows), the tile kernel at longer means; stock's
    gradients bit for bit either way."""
    for lengths, lanes in (([1, 0, 1, 1, 0, 0, 1, 3, 1, 1, 0, 1] * 3, True), ([2, 3, 1, 4] * 4, False)):
        data = _data((sum(lengths), 40), dtype, ties=True)
        data[3, :5] = math.nan
        data[7:10, 6] = 2.5  # a three-way tie
        L = torch.tensor(lengths, device=DEVICE)
        with config.override(sm.CONFIG, segred_lanes_unit_inner=64, lens_max_s=0):
            (_, gx), (_, gxs) = _both(data, _data((len(lengths), 40), dtype, seed=2).abs(), lengths=L)
            kernels = {p.kernel.__name__ for p in sm._plans.values() if p.kernel is not None}
        assert_bitwise_equal(gx, gxs, f"backward {lengths[:4]}")
        assert ("_segment_reduce_max_bwd_lanes_kernel" in kernels) == lanes, kernels


def test_segment_reduce_tie_count_rounding_in_bf16_and_f16():
    """257 tied elements: ATen divides by the count converted to the dtype (257 -> 256 in bf16)."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        data = torch.full((300, 1), 2.0, dtype=dtype, device=DEVICE)
        data[:43] = 1.0
        g = torch.tensor([[3.0]], dtype=dtype, device=DEVICE)
        (_, gx), (_, gxs) = _both(data, g, lengths=torch.tensor([300], device=DEVICE))
        assert_bitwise_equal(gx, gxs, f"{dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_segment_reduce_axis_and_2d_lengths(dtype):
    data = _data((2, 9, 3), dtype, ties=True)
    lengths = torch.tensor([[2, 0, 7], [4, 5, 0]], device=DEVICE)
    g = _data((2, 3, 3), dtype, seed=1)
    (y, gx), (ys, gxs) = _both(data, g, lengths=lengths, axis=1)
    assert_bitwise_equal(gx, gxs)
    offsets = torch.cat([torch.zeros(2, 1, dtype=torch.int64, device=DEVICE), lengths.cumsum(1)], 1)
    (y, gx), (ys, gxs) = _both(data, g, offsets=offsets, axis=1)
    assert_bitwise_equal(gx, gxs)


def test_segment_reduce_max_backward_is_gradkerns_in_mode_auto(monkeypatch):
    """Bug: enable()'s default mode left segment_reduce's backward to stock (an autograd-key override it did not
    register), so an enabled training step never ran the kernel. Now a backend-key route: plain enable() serves
    reduce="max" with it, stock's bits, and disable() gives the call back to stock."""
    calls = _spy(monkeypatch)
    data = _data((12, 3), torch.float32, ties=True)
    L = torch.tensor([5, 0, 7], device=DEVICE)
    g = _data((3, 3), torch.float32, seed=1)
    got = []
    for enabled in (True, False):
        x = data.clone().requires_grad_()
        with gradkern.use(enabled):
            got.append(torch.autograd.grad(torch.segment_reduce(x, "max", lengths=L), x, g)[0])
    assert len(calls) == 1
    assert_bitwise_equal(got[0], got[1])


def test_segment_reduce_other_reductions_stay_stock_and_double_backward_keeps_stocks_graph(monkeypatch):
    """Other reductions run stock's kernel; with create_graph=True gradkern's kernel computes the gradient below
    autograd and stock's graph sits above it (the same grad_fn, the same bits)."""
    calls = _spy(monkeypatch)
    data = _data((12, 2), torch.float64, ties=True)
    L = torch.tensor([5, 0, 7], device=DEVICE)
    g = _data((3, 2), torch.float64, seed=1)
    for reduce in ("sum", "mean", "min", "prod"):
        outs = []
        for enabled in (True, False):
            x = data.clone().requires_grad_()
            with gradkern.use(enabled, mode="always"):
                (gx,) = torch.autograd.grad(torch.segment_reduce(x, reduce, lengths=L), x, g)
            outs.append(gx)
        assert_bitwise_equal(outs[0], outs[1], reduce)
    assert not calls
    x = data.clone().requires_grad_()
    gg = g.clone().requires_grad_()
    with gradkern.use(mode="always"):
        (gx,) = torch.autograd.grad(torch.segment_reduce(x, "max", lengths=L), x, gg, create_graph=True)
    x2 = data.clone().requires_grad_()
    (gx2,) = torch.autograd.grad(torch.segment_reduce(x2, "max", lengths=L), x2, gg, create_graph=True)
    assert_bitwise_equal(gx, gx2)
    assert type(gx.grad_fn) is type(gx2.grad_fn)
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------------ relaunch
def test_launch_plans_and_relaunch_keys(monkeypatch):
    """Each segment kernel's launch is planned once per problem and relaunched by (kernel, plan, device), to which
    `launch` adds the pointers' 16-byte alignment: a repeated problem reuses its plan and key, also at an odd
    offset; other shapes, strides or dtypes get another plan."""
    keys = []
    monkeypatch.setattr(sm, "launch", lambda kernel, grid, ptrs, ints, consts, device, key: keys.append(key))
    buf = _data((4 * 161 + 1,), torch.float32)
    offs = _offsets([100, 0, 60])

    def plan_of(data, offsets=offs):
        ops.segment_max_forward(data, offsets, 0)
        return keys[-1]

    a = plan_of(buf[:640].view(160, 4))
    assert plan_of(buf[4:644].view(160, 4)) == a, "the same problem, aligned: same plan and key"
    assert plan_of(buf[1:641].view(160, 4)) == a, "an odd offset: the same plan"
    others = [plan_of(buf[:640].view(4, 160).t()), plan_of(buf[:640].view(160, 4).double()),
              plan_of(buf[:644].view(161, 4), _offsets([100, 1, 60])), plan_of(buf[:640].view(160, 4), offs.int())]
    assert len({k[1] for k in [a, *others]}) == 5, "another layout, dtype, size or offsets dtype: another plan"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_relaunches_at_other_offsets_and_sizes_stay_exact(dtype):
    """Repeated calls (the second and later take the direct relaunch on a GPU) over views at an odd element offset
    (not 16-byte aligned), int32 and int64 offsets, and sizes that are and are not multiples of 16."""
    buf = _data((4 * 161 + 1,), dtype, ties=True)
    gbuf = _data((4 * 161 + 1,), dtype, seed=2)
    for start, rows, index_dtype in ((0, 160, torch.int64), (1, 160, torch.int64), (0, 160, torch.int64),
                                     (0, 161, torch.int32), (1, 161, torch.int64), (0, 160, torch.int32)):
        data = buf[start:start + 4 * rows].view(rows, 4)
        lengths = [rows - 40, 0, 24, 16]
        offs = _offsets(lengths).to(index_dtype)
        vals, idxs = ops.segment_max_forward(data, offs, 0)
        rv, ri = _expected(data, offs)
        assert_bitwise_equal(vals, rv, f"forward at {start}, {rows} rows, {index_dtype}")
        assert_bitwise_equal(idxs, ri, f"indices at {start}, {rows} rows, {index_dtype}")
        g = gbuf[start:start + 16].view(4, 4)
        assert_bitwise_equal(ops.segment_max_backward(g, idxs, offs, rows, 0), sm._backward_composite(g, idxs, rows, 0))
        (_, gx), (_, gxs) = _both(data, g, lengths=torch.tensor(lengths, device=DEVICE, dtype=index_dtype))
        assert_bitwise_equal(gx, gxs, f"segment_reduce at {start}, {rows} rows, {index_dtype}")


def test_segment_reduce_reads_lengths_only_where_cheap():
    """The kernel sums starts from the lengths itself only for at most lens_max_s segments and while all programs
    together re-read at most lens_max_reads lengths; otherwise it reads their cumsum."""
    cfg = sm.CONFIG.current
    meta = torch.empty((4096, 64), device="meta")
    assert sm._reads_lengths(cfg, meta, 0, 1) and sm._reads_lengths(cfg, meta, 0, cfg.lens_max_s)
    assert not sm._reads_lengths(cfg, meta, 0, cfg.lens_max_s + 1) and not sm._reads_lengths(cfg, meta, 0, 0)
    wide = torch.empty((4096, 64 * 64), device="meta")  # 64 column blocks: 64x the programs, each re-reading
    assert sm._reads_lengths(cfg, wide, 0, 128) and not sm._reads_lengths(cfg, wide, 0, 256)
    assert not sm._reads_lengths(cfg, torch.empty((8, 4096, 64), device="meta"), 1, 1024)  # 8 outer slices


def test_segment_reduce_plans_follow_the_layout():
    """`_segment_reduce_backward` caches its launch per problem (shapes, strides, dtypes): the same shapes in a
    layout the kernel walks in place as one run, one it walks as two (inner dims that do not collapse), and back,
    twice each, all equal stock."""
    lengths = [5, 0, 11, 4]
    n = sum(lengths)
    base = _data((n, 3, 4), torch.float32, ties=True)
    odd = _data((n, 4, 3), torch.float32, ties=True).transpose(1, 2)  # (n, 3, 4), inner strides (1, 3): no collapse
    g = _data((len(lengths), 3, 4), torch.float32, seed=1)
    L = torch.tensor(lengths, device=DEVICE)
    for data in (base, odd, base, odd):
        (_, gx), (_, gxs) = _both(data, g, lengths=L)
        assert_bitwise_equal(gx, gxs, f"strides {data.stride()}")
        (_, gx), (_, gxs) = _both(data, g.transpose(1, 2).contiguous().transpose(1, 2), offsets=_offsets(lengths))
        assert_bitwise_equal(gx, gxs, f"strides {data.stride()}, grad transposed")


def _layout_of(kind, lead, rows, dtype, seed):
    """A tensor of shape (*lead, rows, 3, 4) ("three": (*lead, rows, 2, 3, 4); the segment axis after `lead`) whose
    dims before or after the axis merge into: "inner" two strided runs (the trailing pair transposed), "expanded"
    two (the 3 expanded from 1), "outer" two (lead (2, 3) transposed), "three" three (the trailing (2, 3, 4)
    reversed in memory)."""
    if kind == "inner":
        return _data((*lead, rows, 4, 3), dtype, seed, ties=True).transpose(-1, -2)
    if kind == "expanded":
        return _data((*lead, rows, 1, 4), dtype, seed, ties=True).expand(*lead, rows, 3, 4)
    if kind == "outer":
        return _data((3, 2, rows, 3, 4), dtype, seed, ties=True).transpose(0, 1)
    return _data((*lead, rows, 4, 3, 2), dtype, seed, ties=True).permute(0, 1, 4, 3, 2)


@pytest.mark.parametrize("kind", ["inner", "expanded", "outer", "three"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_layouts_of_two_runs_read_in_place(kind, dtype):
    """Dims on one side of the axis that merge into two strided runs (a transposed or expanded trailing pair, a
    transposed leading pair) are walked in place by all three kernels, their index split in two parts; three runs
    are copied first. Results equal the loop reference, the composite backward and stock segment_reduce."""
    config.clear_plans()  # (the plans below are this test's)
    lengths = [3, 0, 5, 9]
    n, s = sum(lengths), len(lengths)
    offs = _offsets(lengths)
    lead = (2, 3) if kind == "outer" else (6,)
    axis = len(lead)
    data = _layout_of(kind, lead, n, dtype, 0)
    vals, idxs = ops.segment_max_forward(data, offs, axis)
    rv, ri = _expected(data, offs, axis)
    assert_bitwise_equal(vals, rv, "forward")
    assert_bitwise_equal(idxs, ri, "indices")
    g = _layout_of(kind, lead, s, dtype, 3)
    assert_bitwise_equal(ops.segment_max_backward(g, idxs, offs, n, axis), sm._backward_composite(g, idxs, n, axis))
    L = torch.tensor(lengths, device=DEVICE).expand(*lead, s)
    (_, gx), (_, gxs) = _both(data, g, lengths=L, axis=axis)
    assert_bitwise_equal(gx, gxs, "segment_reduce")
    plans = list(sm._plans.values())
    assert len(plans) == 3
    copies = {p.copies for p in plans}
    if kind == "three":
        assert copies == {(True,), (True, False, True)}, copies
    else:
        assert copies == {(False,), (False, False, False)}, f"copied: {copies}"
        split = "SPLIT_O" if kind == "outer" else "SPLIT_I"
        assert all(p.consts[split] for p in plans), "walked in two parts"


# ------------------------------------------------------------------------------------------------ GPU sizes
@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_large_shapes_on_gpu(dtype):
    n, d = 1 << 18, 64
    gen = torch.Generator().manual_seed(0)
    data = _data((n, d), dtype, ties=True)
    for label, offs in sm._offset_sets(n, DEVICE, gen):
        vals, idxs = ops.segment_max_forward(data, offs, 0)
        rv, ri = sm._reference_forward(data, offs)
        assert_bitwise_equal(vals, rv, label)
        assert_bitwise_equal(idxs, ri, label)
        g = _data(vals.shape, dtype, seed=1)
        assert_bitwise_equal(ops.segment_max_backward(g, idxs, offs, n, 0), sm._backward_composite(g, idxs, n, 0))
        (y, gx), (ys, gxs) = _both(data, g, offsets=offs)
        assert_bitwise_equal(gx, gxs, f"segment_reduce {label}")


def test_backward_scatter_writes_only_rows_inside_each_segment(monkeypatch):
    """segment_max_backward zeroes its result and writes each (segment, column)'s gradient to the row its index
    names, only where that row lies in the segment: rows the offsets do not cover (they start past 0 and end
    before N), an empty segment's index N and an index outside its segment all leave zeros; a -0.0 gradient is
    written as is. Lanes split over several programs (a small block) and an outer dim; the lane split by the
    width and the segments 32-bit with multiply-high divisions, and in int64."""
    n, inner = 12, 3
    offs = torch.tensor([2, 4, 4, 9, 10], device=DEVICE)  # rows 0-1 and 10-11 in no segment; segment 1 empty
    idxs = torch.tensor([[3, 2, 3], [n, n, n], [4, 8, 1], [9, 9, 9]], device=DEVICE)  # [2, 2]: 1 is outside 4..8
    g = torch.tensor([[1.0, 2.0, -0.0], [5.0, 5.0, 5.0], [3.0, 4.0, 6.0], [7.0, -0.0, 8.0]], device=DEVICE)
    expected = torch.zeros(n, inner)
    for s in range(4):
        for d in range(inner):
            if offs[s] <= idxs[s, d] < offs[s + 1]:
                expected[idxs[s, d], d] = g[s, d]
    launches = record_launches(monkeypatch, sm)
    for i32_max, i64 in ((sm.CONFIG.current.i32_max, False), (8, True)):
        with config.override(sm.CONFIG, bwd_block=4, i32_max=i32_max):
            for outer in (1, 2):
                gg, ii = g.expand(outer, *g.shape), idxs.expand(outer, *idxs.shape)
                gx = ops.segment_max_backward(gg.contiguous(), ii.contiguous(), offs, n, 1)
                for o in range(outer):
                    assert_bitwise_equal(gx[o], expected.to(DEVICE), f"outer {o} of {outer}, int64 {i64}")
                consts = launches[-1].consts
                assert consts["I64"] is i64 and consts["MAGIC"] == ((not i64,) * 2), consts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_forward_kernels_give_the_same_bits(dtype):
    """The forward's three kernels give the same bits: the lane kernel (a lane a (segment, column); segments longer
    than its cap taken by the whole program in turn), the tile kernel (a program a segment; its 16-bit max packed or
    not) and the row kernel (a program a tile of rows, then the segments crossing tiles from their partials). Small
    blocks, a cap of 3 rows and row tiles of 2-64 rows, so that several programs run, most segments are long and some
    cross many tiles; ties, NaN, signed zeros, empty segments, an outer dim and a strided layout."""
    lengths = [3, 0, 5, 1, 0, 9, 2, 4, 0, 7, 1, 1, 6]
    n = sum(lengths)
    offs = _offsets(lengths)
    data = _data((2, n, 3), dtype, ties=True)
    data[0, 4, 1] = float("nan")
    data.view(_INTS[data.element_size()])[0, 12, 2] = _NEG_NAN[dtype]  # a payload the kernels keep bit for bit
    data[1, 0, :] = -0.0
    data[1, 1, :] = 0.0
    strided = _data((2, n, 6), dtype, seed=3, ties=True)[..., ::2]
    wide = _data((2, n, 12), dtype, seed=5, ties=True)  # (past lanes_max_inner: lanes at means past lanes_max_mean)
    wide[1, 2, 10] = float("nan")
    wider = _data((1, n, 300), dtype, seed=7, ties=True)  # (a segment a program, 512-column blocks)
    wider[0, 21, 299] = float("nan")
    for x in (data, strided, wide, wider):
        outs = []
        lanes = {"lanes_max_mean": 1 << 30, "lanes_min_programs": 0, "rows_max_programs": 0,
                 "fwd_lanes_flat_idle": (8, 8)}
        if x is wide or x is wider:
            lanes = {"lanes_max_mean": 0, "lanes_few_max_mean": 1 << 30, "lanes_few_min_programs": 0,
                     "fwd_lanes_one_min_programs": 0, "rows_max_programs": 0}
        rows = {"rows_max_programs": 1 << 62, "rows_min_mean": 0, "rows_bd_max": 2}
        tile = {"lanes_max_inner": 0, "fwd_lanes_max_inner": 0, "rows_max_programs": 0}
        flats = set()
        for knobs in (tile, {"lanes": 8, "lanes_few": 16, "lanes_cap": 3, **lanes},
                      {"lanes": 8, "lanes_few": 16, "lanes_cap": 3, **lanes, "fwd_lanes_flat_idle": (0, 0)},
                      {"lanes": 4, "lanes_few": 16, "lanes_cap": 64, **lanes},
                      {"lanes": 4, "lanes_cap": 64, "lanes_unroll": 3, "fwd_lanes_few_unroll": 3, **lanes},
                      *(() if x is wider else ({"rows_tile": 4, **rows}, {"rows_tile": 16, **rows},
                                               {"rows_tile": 128, **rows}))):  # (wider: the lanes' case; time)
            with config.override(sm.CONFIG, **knobs):
                if knobs is not tile and "rows_tile" not in knobs:
                    (launch,) = gradkern.plan("segment_max_forward", x, offs, 1).kernels
                    assert launch.kernel == "_segment_max_fwd_lanes_kernel", (x.shape, knobs)
                    flats.add(launch.config["FLAT"])
                outs.append(ops.segment_max_forward(x, offs, 1))
        assert flats == ({False} if x is wider else {True, False}), (x.shape, flats)  # (wider: a segment a block)
        ev, ei = _expected(x, offs, 1)
        if x is data:
            assert ei[0, 5, 2] == 12  # the NaN with a payload is its segment's max
            ev.view(_INTS[x.element_size()])[0, 5, 2] = _NEG_NAN[dtype]
        for vals, idxs in outs:
            assert_bitwise_equal(vals, ev.to(DEVICE), "values")
            assert_bitwise_equal(idxs, ei.to(DEVICE), "indices")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_long_segments_take_the_chunk_pass(dtype):
    """Where a slice has more rows than a chunk and the problem is large enough (split_min_elems), the tile or lane
    kernel leaves every segment longer than a chunk (16 rows here) to the split's passes (the chunk map, the
    chunks' partials, their combination): segments of
    exactly a chunk and one more, starting on a chunk's first row and inside one, one chunk shared by two long
    segments, long ones between empty and short ones, rows before the first segment and after the last; an outer
    dim, int32 offsets, a strided layout; a workspace whose chunk map holds stale entries (naming other segments,
    or out of range) where no long segment writes. Smaller problems keep one kernel."""
    g = torch.Generator().manual_seed(7)
    lengths = [16, 17, 0, 3, 40, 1, 0, 0, 29, 2, 2, 100, 5, 16, 33, 0]
    n = 8 + sum(lengths) + 5  # (8 rows before the first segment, 5 after the last)
    offs = torch.tensor([8, *(8 + torch.tensor(lengths).cumsum(0)).tolist()], device=DEVICE)
    for x, axis in ((_data((n, 3), dtype, ties=True), 0),
                    (_data((2, n, 6), dtype, seed=2, ties=True)[..., ::2], 1),
                    (_data((n, 1), dtype, seed=3), 0)):
        x.movedim(axis, 0)[torch.randint(0, n, (4,), generator=g).to(DEVICE), ..., 0] = float("nan")
        ev, ei = _expected(x, offs, axis)
        for knobs in ({"lanes_max_inner": 0, "fwd_lanes_max_inner": 0},  # the tile kernel
                      {"lanes_max_mean": 1 << 30, "lanes_min_programs": 0, "lanes_cap": 4},  # lanes
                      {"lanes_max_mean": 1 << 30, "lanes_min_programs": 0, "lanes_cap": 4,
                       "fwd_lanes_flat_idle": (8, 8)}):  # flat lanes (at 3 columns)
            with config.override(sm.CONFIG, rows_max_programs=0, **_SPLIT, **knobs):
                kernels = [k.kernel for k in gradkern.plan("segment_max_forward", x, offs, axis).kernels]
                main = ["_segment_mark_kernel", "_segment_max_fwd_kernel"] if "lanes_max_inner" in knobs \
                    else ["_segment_max_fwd_lanes_kernel"]  # (the lane kernel writes the chunk map itself)
                assert kernels == [*main, "_segment_max_fwd_chunks_kernel", "_segment_max_fwd_long_kernel"], kernels
                for o in (offs, offs.int()):
                    vals, idxs = ops.segment_max_forward(x, o, axis)
                    assert_bitwise_equal(vals, ev.to(DEVICE), f"values {x.shape} {knobs}")
                    assert_bitwise_equal(idxs, ei.to(DEVICE), f"indices {x.shape} {knobs}")
        with config.override(sm.CONFIG, **{**_SPLIT, "split_min_elems": x.numel() + 1}):
            assert len(gradkern.plan("segment_max_forward", x, offs, axis).kernels) == 1
    empty = torch.empty
    for stale in (4, 11, -1, 1 << 40):  # (4 and 11: the 40- and 100-row segments)
        def filled(*size, stale=stale, **kw):
            t = empty(*size, **kw)
            return t.fill_(stale) if t.dtype == torch.int64 else t
        with config.override(sm.CONFIG, rows_max_programs=0, lanes_max_inner=0, **_SPLIT), \
                pytest.MonkeyPatch.context() as m:
            m.setattr(torch, "empty", filled)
            vals, idxs = ops.segment_max_forward(x, offs, axis)
        assert_bitwise_equal(idxs, ei.to(DEVICE), f"indices, stale entries {stale}")


def test_split_passes_take_blocks_of_chunks_while_programs_stay():
    """The split passes' chunks a program (a plan's choice, from the shapes): doubled up to split_block while the
    passes keep split_min_programs programs; the forward's plan launches them so."""
    with config.override(sm.CONFIG, split_block=16, split_min_programs=2048):
        cfg = sm.CONFIG.current
        assert [sm._chunks_a_program(cfg, c) for c in (1000, 4095, 4096, 8192, 16384, 1 << 20)] == [1, 1, 2, 4, 8, 16]
    data = torch.randn(300, 4, device=DEVICE)
    with config.override(sm.CONFIG, rows_max_programs=0, **{**_SPLIT, "split_min_programs": 2}):
        kernels = gradkern.plan("segment_max_forward", data, _offsets([300]), 0).kernels
    passes = [k for k in kernels if k.kernel.startswith("_segment_max_fwd_") and "BLOCK_C" in k.config]
    assert [(k.config["BLOCK_C"], k.grid) for k in passes] == [(4, (5,))] * 2, kernels  # 19 chunks of 16 rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_segment_reduce_long_segments_take_the_chunk_passes(dtype):
    """The segment_reduce backward's split, as the forward's, for its tile and lane kernels: segments longer than a
    chunk (16 rows here) are left to the chunk map, tie counts a chunk, their sums a segment and a pass writing each
    chunk's rows; ties spread over chunks (a constant segment of 100 rows divides g by 100), NaN, g of both signs;
    lengths, their int32 form and offsets, an outer dim; a workspace holding stale entries (tile kernel). In the
    lane kernel one program walks a segment longer than its cap but not than a chunk. Stock's gradients bit for
    bit."""
    lengths = [16, 17, 0, 3, 40, 1, 0, 0, 29, 2, 2, 100, 5, 16, 33, 0]
    n = sum(lengths)
    data = _data((n, 3), dtype, ties=True)
    data[110:210, 1] = 2.5  # the 100-row segment, constant in one column
    data[[5, 70, 200], 0] = float("nan")
    L = torch.tensor(lengths, device=DEVICE)
    grads = (_data((len(lengths), 3), dtype, seed=3), torch.full((len(lengths), 3), 3.0, dtype=dtype, device=DEVICE))
    split = ["_segred_chunks_kernel", "_segred_sum_kernel", "_segred_write_kernel"]
    for knobs, main in (({"lanes_max_inner": 0}, ["_segment_mark_kernel", "_segment_reduce_max_bwd_kernel"]),
                        ({"lanes_max_mean": 1 << 30, "lanes_min_programs": 0, "lanes_cap": 4, "lens_max_s": 0},
                         ["_segment_reduce_max_bwd_lanes_kernel"])):
        with config.override(sm.CONFIG, **_SPLIT, **knobs):
            out = torch.segment_reduce(data, "max", lengths=L)
            launches = gradkern.plan("_segment_reduce_backward", grads[0], out, data, "max", lengths=L).kernels
            assert [k.kernel for k in launches] == main + split, launches
            for g in grads:
                for kw in ({"lengths": L}, {"offsets": _offsets(lengths)}, {"lengths": L.int()}):
                    (_, gx), (_, gxs) = _both(data, g, **kw)
                    assert_bitwise_equal(gx, gxs, f"{list(kw)} {knobs}")
            data2 = torch.stack([data, data.flip(0)])
            lengths2 = torch.stack([L, L.flip(0)])
            (_, gx), (_, gxs) = _both(data2, torch.stack(grads), lengths=lengths2, axis=1)
            assert_bitwise_equal(gx, gxs, f"outer dim {knobs}")
    with config.override(sm.CONFIG, **{**_SPLIT, "split_min_elems": data.numel() + 1}):
        assert len(gradkern.plan("_segment_reduce_backward", grads[0], out, data, "max", lengths=L).kernels) == 1
    empty = torch.empty
    for stale in (4, 11, -1, 1 << 40):  # (4 and 11: the 40- and 100-row segments)
        def filled(*size, stale=stale, **kw):
            t = empty(*size, **kw)
            return t.fill_(stale) if t.dtype == torch.int64 else t
        with config.override(sm.CONFIG, lanes_max_inner=0, **_SPLIT), pytest.MonkeyPatch.context() as m:
            m.setattr(torch, "empty", filled)
            got = ops._segment_reduce_backward(grads[1], out, data, "max", L)
        assert_bitwise_equal(got, _both(data, grads[1], lengths=L)[1][1], f"stale entries {stale}")


def test_forward_kernel_follows_the_mean_segment_length():
    """The lane kernel serves narrow data whose segments are short on average (rows / segments, from the shapes:
    a plan's choice is a function of the descriptor), and wide data at unit mean lengths or long ones; the tile
    kernel the rest."""
    def kernel(n, s, inner, **knobs):
        data = torch.randn(n, inner, device=DEVICE)
        offs = torch.linspace(0, n, s + 1, device=DEVICE).to(torch.int64)
        with config.override(sm.CONFIG, rows_max_programs=0, **knobs):
            (launch,) = gradkern.plan("segment_max_forward", data, offs, 0).kernels
        return launch.kernel
    assert kernel(64, 64, 1) == kernel(64, 8, 3) == "_segment_max_fwd_lanes_kernel"
    assert kernel(64, 7, 1) == kernel(128, 64, 9) == "_segment_max_fwd_kernel"  # (mean 9; mean 2 at 9 columns)
    # wide rows (past lanes_max_inner, up to fwd_lanes_max_inner) only at means past lanes_max_mean (here 20) or up
    # to fwd_lanes_unit_mean (unit lengths, 1)
    few = {"lanes_few_min_programs": 0, "fwd_lanes_one_min_programs": 0}
    assert kernel(640, 32, 9, **few) == kernel(640, 32, 1024, **few) == "_segment_max_fwd_lanes_kernel"
    assert kernel(640, 32, 1025, **few) == kernel(64, 32, 40, **few) == "_segment_max_fwd_kernel"  # (mean 2)
    assert kernel(64, 64, 40, **few) == kernel(32, 64, 256, **few) == "_segment_max_fwd_lanes_kernel"  # (mean 1, 1/2)
    assert kernel(64, 64, 40, fwd_lanes_unit_mean=0, **few) == "_segment_max_fwd_kernel"
    assert kernel(64, 64, 1025, **few) == "_segment_max_fwd_kernel"


def test_forward_tile_columns_follow_the_element_size_and_the_mean_length():
    """The forward tile kernel's columns (a plan's choice, from the shapes): a tile row of fwd_row_bytes (32 f32 or
    64 bf16 columns) where segments fill rows, more (up to fwd_min_tile elements a program) where they are one row
    long; fwd_row_bytes = 0 gives bd_max, as before."""
    def block_d(n, s, inner, dtype, **knobs):
        data = torch.randn(n, inner, device=DEVICE).to(dtype)
        offs = torch.linspace(0, n, s + 1, device=DEVICE).to(torch.int64)
        with config.override(sm.CONFIG, rows_max_programs=0, **knobs):
            (launch,) = gradkern.plan("segment_max_forward", data, offs, 0).kernels
        assert launch.kernel == "_segment_max_fwd_kernel"
        return launch.config["BLOCK_D"]
    assert block_d(256, 8, 64, torch.float32) == 32  # mean 32 rows
    assert block_d(256, 8, 64, torch.bfloat16) == 64
    assert block_d(256, 8, 64, torch.float32, fwd_row_bytes=0) == 64
    unit = {"fwd_lanes_unit_mean": 0}  # (else unit lengths of at most fwd_lanes_max_inner columns take lanes)
    assert block_d(16, 16, 256, torch.float32, **unit) == 128  # unit lengths: 128 columns a program
    assert block_d(16, 16, 40, torch.float32, **unit) == 64  # (no more than the columns' power of two)
    assert block_d(64, 16, 256, torch.float32) == 32  # mean 4 rows: 4 x 32 fills the 128 elements


def test_lanes_a_program_follow_the_grid_and_the_mean_length():
    """The lane kernels' block (`_lane_block`, from the shapes): `lanes` (lanes_unroll rows a step) where that still
    gives lanes_min_programs programs, else lanes_few (lanes_few_unroll, the forward's fwd_lanes_few_unroll);
    segments longer on average than lanes_max_mean take lanes_few lanes on grids of at least lanes_few_min_programs
    programs, else the tile kernel. The forward and segment_reduce's backward agree."""
    def block(n, s, inner, **knobs):
        data = torch.randn(n, inner, device=DEVICE, requires_grad=True)
        offs = torch.linspace(0, n, s + 1, device=DEVICE).to(torch.int64)
        with config.override(sm.CONFIG, rows_max_programs=0, lanes=16, lanes_few=4, lanes_unroll=1,
                             lanes_few_unroll=2, fwd_lanes_few_unroll=2, fwd_lanes_wider_cols=(0, 0),
                             fwd_lanes_one_min_programs=0, **knobs):
            (fwd,) = gradkern.plan("segment_max_forward", data, offs, 0).kernels
            out = torch.segment_reduce(data, "max", offsets=offs, axis=0)
            (bwd,) = gradkern.plan("_segment_reduce_backward", torch.ones_like(out), out, data, "max",
                                   offsets=offs, axis=0).kernels
        got = [(k.kernel, k.config.get("BLOCK_S"), k.config.get("UNROLL")) for k in (fwd, bwd)]
        assert got[0][1:] == got[1][1:] and got[0][0].endswith("fwd_lanes_kernel") == \
            got[1][0].endswith("bwd_lanes_kernel"), got
        return got[0][1:] if got[0][0] == "_segment_max_fwd_lanes_kernel" else 0
    assert block(64, 64, 1, lanes_min_programs=4) == (16, 1)  # 4 programs of 16 lanes
    assert block(64, 64, 1, lanes_min_programs=5) == (4, 2)
    assert block(64, 32, 2, lanes_min_programs=4) == (8, 1)  # (lanes over the columns: 16 // 2 segments)
    assert block(640, 32, 1, lanes_few_min_programs=8) == (4, 2)  # mean 20 rows, 8 programs of 4 lanes
    assert block(640, 32, 1, lanes_few_min_programs=9) == 0
    assert block(640, 8, 1, lanes_few_min_programs=0) == 0  # mean 80 > lanes_few_max_mean
    assert block(640, 32, 3, lanes_few_min_programs=0) == (1, 2)  # (4 lanes a segment)
    assert block(640, 32, 9, lanes_few_min_programs=0, fwd_lanes_max_inner=8) == 0  # 9 columns > lanes_max_inner

    def forward_unroll(inner):
        data = torch.randn(640, inner, device=DEVICE)
        offs = torch.linspace(0, 640, 33, device=DEVICE).to(torch.int64)
        with config.override(sm.CONFIG, rows_max_programs=0, lanes=16, lanes_few=4, lanes_few_min_programs=0,
                             lanes_few_unroll=2, fwd_lanes_few_unroll=3, fwd_lanes_wider_cols=(0, 0),
                             fwd_lanes_one_min_programs=0):
            (fwd,) = gradkern.plan("segment_max_forward", data, offs, 0).kernels
        return fwd.config["UNROLL"]
    assert forward_unroll(2) == 3  # two segments a program (4 lanes, 2 columns): the forward's own step
    assert forward_unroll(3) == 2  # one (4 columns)


def test_forward_wider_lane_blocks():
    """The forward's lane block at mean lengths past lanes_max_mean: fwd_lanes_wider lanes where the column block is
    within fwd_lanes_wider_cols and that grid keeps lanes_few_min_programs programs, else lanes_few; where a program
    holds one segment (rows at least lanes_few wide), fwd_lanes_one_min_programs programs suffice."""
    def block(inner, **knobs):
        data = torch.randn(640, inner, device=DEVICE)
        offs = torch.linspace(0, 640, 33, device=DEVICE).to(torch.int64)  # mean 20 rows
        with config.override(sm.CONFIG, rows_max_programs=0, lanes_few=4, fwd_lanes_wider=8,
                             fwd_lanes_wider_cols=(2, 4), **knobs):
            (fwd,) = gradkern.plan("segment_max_forward", data, offs, 0).kernels
        return (fwd.config["BLOCK_S"], fwd.config["BLOCK_D"]) if fwd.kernel == "_segment_max_fwd_lanes_kernel" else 0
    assert block(2, lanes_few_min_programs=4) == (4, 2)  # 8 lanes: 4 segments of 2 columns, 8 programs
    assert block(2, lanes_few_min_programs=9) == (2, 2)  # (8 lanes would leave 8 programs: lanes_few)
    assert block(1, lanes_few_min_programs=4) == (4, 1)  # one column: outside fwd_lanes_wider_cols
    assert block(8, lanes_few_min_programs=64, fwd_lanes_one_min_programs=32) == (1, 8)  # a segment a program
    assert block(8, lanes_few_min_programs=64, fwd_lanes_one_min_programs=0) == 0


def test_forward_flat_lanes_where_columns_would_idle():
    """The forward's lane block takes the next (segment, column) pairs in order (FLAT) where a [segments,
    next_pow2(inner)] block holds several segments and would idle at least 1 / k of its lanes (fwd_lanes_flat_idle:
    k at mean lengths up to lanes_max_mean, then past it), on a grid of the pairs' blocks; columns of a power of two
    keep the block of segments."""
    def plan(inner, rows=640, **knobs):
        data = torch.randn(rows, inner, device=DEVICE)
        offs = torch.linspace(0, rows, 33, device=DEVICE).to(torch.int64)  # 32 segments
        with config.override(sm.CONFIG, rows_max_programs=0, lanes=16, lanes_few=16, lanes_min_programs=0,
                             lanes_few_min_programs=0, fwd_lanes_wider_cols=(0, 0), fwd_lanes_one_min_programs=0,
                             **{"fwd_lanes_flat_idle": (3, 8), **knobs}):
            (fwd,) = gradkern.plan("segment_max_forward", data, offs, 0).kernels
        assert fwd.kernel == "_segment_max_fwd_lanes_kernel", fwd
        return fwd.config["FLAT"], fwd.grid
    # mean 20 rows (past lanes_max_mean): 1 / 8
    assert plan(3) == (True, (6,))  # 16 lanes (4 segments of 4 columns), 96 pairs
    assert plan(4) == (False, (8,))
    assert plan(5) == (True, (10,))  # 3 of every 8 lanes would idle; 160 pairs
    assert plan(7) == (True, (14,))  # 1 of 8 idle, the bound
    assert plan(7, fwd_lanes_flat_idle=(3, 7)) == (False, (16,))
    assert plan(9) == (False, (32,))  # 7 of 16 idle, but a segment a block
    assert plan(5, fwd_lanes_flat_idle=(3, 0)) == (False, (16,))
    # mean 1 row: 1 / 3
    assert plan(3, rows=32) == (False, (8,))  # 1 of 4 idle
    assert plan(5, rows=32) == (True, (10,))  # 3 of 8


def test_forward_lane_blocks_take_warps_by_lanes():
    """fwd_lanes_a_warp: a forward lane block of L lanes on min(lanes_warps, L // fwd_lanes_a_warp) warps, one at
    least; 0 keeps lanes_warps for every block."""
    def warps(lanes, a_warp):
        data = torch.randn(640, 64, device=DEVICE)
        offs = torch.linspace(0, 640, 33, device=DEVICE).to(torch.int64)  # mean 20 rows
        with config.override(sm.CONFIG, rows_max_programs=0, lanes_few=lanes, lanes_few_min_programs=0,
                             fwd_lanes_wider_cols=(0, 0), fwd_lanes_one_min_programs=0, lanes_warps=4,
                             fwd_lanes_a_warp=a_warp):
            (fwd,) = gradkern.plan("segment_max_forward", data, offs, 0).kernels
        assert fwd.kernel == "_segment_max_fwd_lanes_kernel", fwd
        return fwd.config["num_warps"]
    assert [warps(64, 64), warps(128, 64), warps(256, 64), warps(512, 64)] == [1, 2, 4, 4]
    assert [warps(64, 0), warps(64, 128), warps(256, 32)] == [4, 1, 4]


def test_few_segments_take_the_row_kernel():
    """Where the tile kernel would run fewer than rows_max_programs programs (few segments) of at least
    rows_min_mean rows on average, the row kernel and its fix-up pass serve the problem: a plan's choice, from the
    shapes."""
    data = torch.randn(64, 3, device=DEVICE)
    for s, kernels in ((2, ["_segment_max_fwd_rows_kernel", "_segment_max_fwd_fix_kernel"]),
                       (60, ["_segment_max_fwd_kernel"])):
        offs = torch.linspace(0, 64, s + 1, device=DEVICE).to(torch.int64)
        with config.override(sm.CONFIG, rows_max_programs=16, rows_min_mean=16, lanes_max_inner=0):
            got = [launch.kernel for launch in gradkern.plan("segment_max_forward", data, offs, 0).kernels]
        assert got == kernels, s


@triton.jit
def _row_segments_probe(offs, out, S, N, LOG_S, BLOCK: tl.constexpr):
    r0 = tl.program_id(0).to(tl.int64) * BLOCK
    rows = tl.minimum(r0 + tl.arange(0, BLOCK), N - 1)
    seg = sm._row_segments(offs, S, rows, r0, tl.minimum(r0 + BLOCK - 1, N - 1), LOG_S)
    tl.store(out + rows, seg)


@pytest.mark.parametrize("lengths", [[1] * 37, [0, 0, 3, 0, 5, 1, 0, 0, 0, 9, 2, 0], [40], [0] * 50 + [7] + [0] * 70,
                                     [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 30, 0, 1],
                                     [1] * 1500, ([0, 3, 1, 0, 2, 0, 0] * 300)[:-1]],
                         ids=["unit", "mixed", "one", "empty-runs", "long-empty-run", "many", "many-mixed"])
def test_row_segments_is_the_last_segment_starting_at_or_before_each_row(lengths):
    """The rows-to-segments search the row-parallel kernels share: each row's segment is the last one starting at
    or before it (empty segments passed over), for blocks that span one segment or many, runs of empty ones, and
    over a thousand segments."""
    offs = _offsets(lengths)
    s, n = len(lengths), sum(lengths)
    expected = torch.searchsorted(offs[:s].cpu(), torch.arange(n), right=True) - 1
    for block in (1, 4, 16, 64):
        out = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        _row_segments_probe[(triton.cdiv(n, block),)](offs, out, s, n, max(0, (s - 1).bit_length()), BLOCK=block)
        assert out.cpu().tolist() == expected.tolist(), f"block {block}"
