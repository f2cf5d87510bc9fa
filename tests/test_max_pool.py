"""Max pooling backward with indices (max_pool3d, adaptive_max_pool2d, adaptive_max_pool3d): the candidate outputs
against brute force, window configurations (overlapping, ceil_mode, dilation, padding) and ties against stock
PyTorch, indices that no forward produced, dtypes, strided grad_output and indices read in place, ATen's output
layout, empty batches, bitwise repeats across tilings and index widths, bad inputs, and training through enable()
in deterministic mode."""

import itertools

import pytest
import torch
import torch.nn as nn

import gradkern
from _det_helpers import check_refusals, check_registry_entries, check_training_step
from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import config, ops
from gradkern.kernels import max_pool as mp
from gradkern.launch.alloc import channels_last_format
from gradkern.launch.launcher import column_block
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

OPS = ["max_pool3d_with_indices_backward", "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward"]
MAX3D, AMAX2D, AMAX3D = OPS
CL3D = torch.channels_last_3d


def _values(shape, dtype, values: str) -> torch.Tensor:
    """Pooling input: random normal (no ties), small integers (many ties) or zeros (every value tied)."""
    if values == "ties":
        return torch.randint(0, 3, shape, device=DEVICE).to(dtype)
    if values == "zeros":
        return torch.zeros(shape, device=DEVICE, dtype=dtype)
    return torch.randn(shape, device=DEVICE).to(dtype)


def _max3d(shape, k, s, p, d=1, ceil_mode=False, dtype=torch.float32, values="randn", fmt=None) -> tuple:
    """max_pool3d_with_indices_backward's arguments, indices from stock's forward."""
    x = _values(shape, dtype, values)
    if fmt is not None:
        x = x.contiguous(memory_format=fmt)
    window = [list(v) if isinstance(v, tuple) else [v] for v in (k, s, p, d)]
    y, idx = torch.ops.aten.max_pool3d_with_indices(x, *window, ceil_mode)
    return (torch.randn(y.shape, device=DEVICE).to(dtype), x, *window, ceil_mode, idx)


def _adaptive(shape, osize, dtype=torch.float32, values="randn", fmt=None) -> tuple:
    """adaptive_max_pool{2,3}d_backward's arguments, indices from stock's forward."""
    x = _values(shape, dtype, values)
    if fmt is not None:
        x = x.contiguous(memory_format=fmt)
    fwd = torch.ops.aten.adaptive_max_pool3d if len(osize) == 3 else torch.ops.aten.adaptive_max_pool2d
    _, idx = fwd(x, list(osize))
    return torch.randn(idx.shape, device=DEVICE).to(dtype), x, idx


# ----------------------------------------------------------------------------------------------- windows
def _holding(i, o_size, k, s, p, d) -> list[int]:
    """Brute force: the outputs whose max_pool windows hold input i along a dim."""
    return [o for o in range(o_size) if any(o * s - p + j * d == i for j in range(k))]


def test_output_sizes_and_candidate_counts_match_brute_force():
    """Every (input size, kernel, stride, padding, dilation, ceil_mode) small enough: the output size is stock's
    forward's (below 1, which the op refuses, where stock's forward refuses), and no input is held by more outputs
    than the kernel visits (its loop count)."""
    x = torch.zeros(1, 1, 1, 1, 12, device="meta")
    for i_size, k, s, d in itertools.product(range(1, 10), range(1, 5), range(1, 4), range(1, 4)):
        for p, ceil_mode in itertools.product(range(k // 2 + 1), (False, True)):
            o_size = mp.output_size(i_size, k, s, p, d, ceil_mode)
            try:
                shape = torch.ops.aten.max_pool3d_with_indices(x[..., :i_size], [1, 1, k], [1, 1, s], [0, 0, p],
                                                               [1, 1, d], ceil_mode)[0].shape
            except RuntimeError:
                assert o_size < 1, (i_size, k, s, p, d, ceil_mode)
                continue
            assert o_size == shape[-1], (i_size, k, s, p, d, ceil_mode)
            window = ((k,) * 3, (s,) * 3, (p,) * 3, (d,) * 3)
            _, ks, _ = mp._progressions(window, (i_size,) * 3, (o_size,) * 3)
            most = max(len(_holding(i, o_size, k, s, p, d)) for i in range(i_size))
            assert most <= ks[0], (i_size, k, s, p, d, ceil_mode, most, ks)


# One window configuration per pooled dim (D, H, W), (input size, kernel, stride, padding, dilation), and ceil_mode:
# MaxPool3d(2) on even and odd sizes, overlapping windows (stride < kernel, padding), kernel 1 (identity,
# subsampling), a window the size of the input, ceil_mode's partial last windows, dilations whose stride and
# dilation share a factor or not (the candidates' progression: step 1, 2, 3)
WINDOWS = [
    (((6, 2, 2, 0, 1), (7, 3, 2, 1, 1), (5, 3, 1, 1, 1)), False),
    (((7, 3, 3, 0, 1), (6, 4, 3, 2, 1), (7, 2, 2, 1, 1)), True),
    (((4, 1, 1, 0, 1), (5, 1, 2, 0, 1), (4, 4, 1, 2, 1)), False),
    (((5, 2, 1, 1, 2), (7, 3, 2, 1, 2), (8, 2, 2, 0, 3)), False),
    (((6, 3, 1, 1, 3), (9, 3, 2, 1, 4), (9, 2, 4, 1, 6)), True),
]


def _window_args(dims, ceil_mode, values, dtype=torch.float32, batch=(1, 2)) -> tuple:
    shape = (*batch, *[c[0] for c in dims])
    k, s, p, d = (tuple(c[j] for c in dims) for j in range(1, 5))
    return _max3d(shape, k, s, p, d, ceil_mode, dtype, values)


@pytest.mark.parametrize("case", range(len(WINDOWS)))
def test_window_configurations_with_ties_match_stock(case):
    """Inputs of many equal values: stock's forward points overlapping windows at the same element, which then sums
    several outputs; each configuration along D, H and W in turn (one per dim in each case)."""
    dims, ceil_mode = WINDOWS[case]
    args = _window_args(dims, ceil_mode, "ties")
    check_case(MAX3D, args, what=f"{dims} ceil_mode={ceil_mode}")
    if case % 2 == 0:  # all equal: every window takes its first element
        check_case(MAX3D, _window_args(dims, ceil_mode, "zeros", batch=(2,)), what=f"{dims} zeros unbatched")


def _empty_window(i_size, k, s, p, d, ceil_mode) -> bool:
    """Whether some output's window holds no input (a dilated window stepping over the whole input)."""
    return any(not _holding_inputs(o, i_size, k, s, p, d) for o in range(mp.output_size(i_size, k, s, p, d,
                                                                                         ceil_mode)))


def _holding_inputs(o, i_size, k, s, p, d) -> list[int]:
    return [o * s - p + j * d for j in range(k) if 0 <= o * s - p + j * d < i_size]


def _random_windows(count: int, seed: int):
    """`count` (dims, ceil_mode) drawn from every (input size <= 9, kernel <= 4, stride <= 3, padding <= kernel / 2,
    dilation <= 3) per dim that leaves an output, none of whose windows is empty (see the test below)."""
    rng = torch.Generator().manual_seed(seed)

    def draw(n):
        return int(torch.randint(1, n + 1, (), generator=rng))

    out = []
    while len(out) < count:
        ceil_mode = bool(draw(2) - 1)
        dims = []
        for _ in range(3):
            k, s, d = draw(4), draw(3), draw(3)
            p = draw(k // 2 + 1) - 1
            dims.append((draw(9), k, s, p, d))
        if all(mp.output_size(*c, ceil_mode) >= 1 and not _empty_window(*c, ceil_mode) for c in dims):
            out.append((tuple(dims), ceil_mode))
    return out


@pytest.mark.parametrize("tiling", ["lines", "channels"])
def test_random_window_configurations_with_ties_match_stock(tiling):
    """Seeded draws over the whole small configuration space, in each tiling (the channels tiling forced on
    contiguous tensors: it reads and writes through strides)."""
    with config.override(mp.CONFIG, tiling=tiling):
        for dims, ceil_mode in _random_windows(12, seed=7 if tiling == "lines" else 8):
            check_case(MAX3D, _window_args(dims, ceil_mode, "ties", batch=(2, 3)), what=f"{dims} {ceil_mode}")


@pytest.mark.parametrize("op, axis", [(AMAX2D, "H"), (AMAX2D, "W"), (AMAX3D, "D")])
def test_adaptive_every_size_pair_along_an_axis_matches_stock(op, axis):
    """Every input size I and output size O in 1..8 along one axis (O > I: overlapping windows, each input in
    several, pointed at from several with ties; O = 1: one global window; O = I: the identity)."""
    for i_size, o_size in itertools.product(range(1, 9), range(1, 9)):
        shape, out = {"H": ((1, 2, i_size, 3), (o_size, 2)), "W": ((1, 2, 3, i_size), (2, o_size)),
                      "D": ((2, i_size, 2, 3), (o_size, 1, 2))}[axis]
        check_case(op, _adaptive(shape, out, values="ties"), what=f"{axis} {i_size} -> {o_size}")


# ---------------------------------------------------------------------------------------- indices no forward made
def _in_window_max3d(i_coord, o_coord, k, s, p, d):
    r = i_coord + p - o_coord * s
    return (r >= 0) & (r <= (k - 1) * d) & (r % d == 0)


def _in_window_adaptive(i_coord, o_coord, i_size, o_size):
    return (i_coord >= o_coord * i_size // o_size) & (i_coord < -(-(o_coord + 1) * i_size // o_size))


def _followed(idx, in_sizes, out_sizes, in_window) -> torch.Tensor:
    """Brute force: which indices the op follows (inside the plane and their output's window, every dim)."""
    volume = 1
    for n in in_sizes:
        volume *= n
    ok = (idx >= 0) & (idx < volume)
    rest = idx.clamp(0, volume - 1)
    for dim in reversed(range(len(in_sizes))):
        i_coord = rest % in_sizes[dim]
        rest = rest // in_sizes[dim]
        shape = [1] * idx.dim()
        shape[idx.dim() - len(in_sizes) + dim] = out_sizes[dim]
        o_coord = torch.arange(out_sizes[dim], device=idx.device).reshape(shape)
        ok &= in_window(dim, i_coord, o_coord)
    return ok


def _scatter_reference(g, idx, in_shape, dims, followed) -> torch.Tensor:
    """float64: each followed g[o] added at indices[o] of its (n, c) plane (volume) of `dims` pooled dims."""
    n_planes, volume = 1, 1
    for v in in_shape[:-dims]:
        n_planes *= v
    for v in in_shape[-dims:]:
        volume *= v
    out = torch.zeros(n_planes, volume, dtype=torch.float64)
    vals = (g.double().cpu() * followed.cpu()).reshape(n_planes, -1)
    out.scatter_add_(1, idx.cpu().clamp(0, volume - 1).reshape(n_planes, -1), vals)
    return out.reshape(in_shape)


def _garbage(idx, last, volume) -> torch.Tensor:
    """Indices no forward produced, from the forward's: as they are, a neighbour along the last dim (of size `last`)
    or a row over or under (often off the window, or its grid), anywhere in [-2, volume + 2), -1 or the volume."""
    picks = [idx, idx + 1, idx - 1, idx + last, idx - last,
             torch.randint(-2, volume + 2, idx.shape, device=idx.device),
             torch.full_like(idx, -1), torch.full_like(idx, volume)]
    which = torch.randint(0, len(picks), idx.shape, device=idx.device)
    return torch.stack(picks).gather(0, which.unsqueeze(0)).squeeze(0)


@pytest.mark.parametrize("tiling", ["lines", "channels", "outputs"])
def test_indices_outside_their_window_or_plane_add_nothing(tiling):
    """Indices no forward produced: the op follows an index only inside its output's window (and so the plane);
    the rest add nothing anywhere (stock's kernels write wherever they point, out of bounds included). The gather's
    two tilings, and the outputs' side, where an index is an address only once it is found in its window."""
    with config.override(mp.CONFIG, **_path(tiling)):
        for dims, ceil_mode in (WINDOWS[1], WINDOWS[3]):
            g, x, k, s, p, d, c, idx = _window_args(dims, ceil_mode, "randn")
            ins, outs = x.shape[-3:], idx.shape[-3:]
            bad = _garbage(idx, ins[-1], ins[0] * ins[1] * ins[2])
            followed = _followed(bad, ins, outs, lambda j, i, o, k=k, s=s, p=p, d=d: _in_window_max3d(
                i, o, k[j], s[j], p[j], d[j]))
            assert 0 < int(followed.sum()) < bad.numel()
            ours = ops.max_pool3d_with_indices_backward(g, x, k, s, p, d, c, bad)
            assert_close(ours, _scatter_reference(g, bad, tuple(x.shape), 3, followed), torch.float32, str(dims))
        for shape, osize in (((2, 3, 7, 9), (4, 5)), ((1, 2, 5, 6, 7), (2, 4, 3))):
            g, x, idx = _adaptive(shape, osize)
            ins = x.shape[-len(osize):]
            bad = _garbage(idx, ins[-1], idx.new_tensor(ins).prod().item())
            followed = _followed(bad, ins, osize, lambda j, i, o, _i=ins, _o=osize: _in_window_adaptive(
                i, o, _i[j], _o[j]))
            op = getattr(ops, OPS[len(osize) - 1])
            assert_close(op(g, x, bad), _scatter_reference(g, bad, tuple(x.shape), len(osize), followed),
                         torch.float32, str(shape))


def test_windows_holding_no_input_pass_no_gradient():
    """ATen takes dilations that step a window over the whole input (here along W: input size 1, window {-1, 1}):
    the forward gives -inf and, for an index, the window's first grid point past the padding, outside the window
    (here the next row's first element, or past the volume). No input is in such a window, so the op passes its
    gradient nowhere; stock's kernels add it at that index (out of bounds for the last row)."""
    dims = ((3, 1, 1, 0, 1), (4, 3, 1, 1, 1), (1, 2, 3, 1, 2))
    assert _empty_window(*dims[2], False)
    g, x, k, s, p, d, c, idx = _window_args(dims, False, "randn")
    ins, outs = x.shape[-3:], idx.shape[-3:]
    followed = _followed(idx, ins, outs, lambda j, i, o: _in_window_max3d(i, o, k[j], s[j], p[j], d[j]))
    assert not followed.any()
    ours = ops.max_pool3d_with_indices_backward(g, x, k, s, p, d, c, idx)
    assert_bitwise_equal(ours, torch.zeros_like(x), "empty windows")


# ----------------------------------------------------------------------------------------------- dtypes, layouts
def _problems(dtype=torch.float32, values="ties") -> dict:
    """One problem per op with overlapping windows (an input in several), unbatched among them."""
    return {
        MAX3D: _max3d((1, 2, 5, 6, 7), 3, 2, 1, 1, True, dtype, values),
        AMAX2D: _adaptive((3, 7, 5), (4, 3), dtype, values),
        AMAX3D: _adaptive((1, 2, 5, 4, 6), (3, 3, 4), dtype, values),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_every_dtype_matches_stock(dtype):
    for op, args in _problems(dtype).items():
        res = check_case(op, args, what=f"{op} {dtype}")
        assert res.shape == args[1].shape and res.dtype == dtype and res.is_contiguous()


@pytest.mark.parametrize("op", OPS)
def test_strided_grad_output_and_indices_are_read_in_place(op, monkeypatch):
    """grad_output and indices in other layouts (each alone, then both in one): the values stock gives with the
    same values contiguous, and the kernel reads the tensors given, not copies. (Stock's adaptive_max_pool3d_backward
    reads indices as if contiguous: wrong values for the others.)"""
    batched = {MAX3D: _max3d((2, 2, 3, 4, 5), (1, 2, 2), (1, 2, 2), 0), AMAX2D: _adaptive((2, 3, 6, 7), (4, 3)),
               AMAX3D: _adaptive((2, 2, 2, 4, 5), (1, 2, 3))}[op]
    g0, idx0 = batched[0], batched[-1]
    gv, xv = dict(layouts_nd(g0, plane=0)), dict(layouts_nd(idx0, plane=0))  # (no plane broadcast: indices)
    pairs = [(name, gv[name], "contiguous", idx0) for name in gv] + [("contiguous", g0, name, xv[name]) for name in xv]
    pairs += [(name, gv[name], name, xv[name]) for name in ("transposed", "broadcast batch")]
    launches = record_launches(monkeypatch, mp)
    for g_name, g, x_name, idx in pairs:
        args = (g, *batched[1:-1], idx)
        launches.clear()
        what = f"{op} grad_output {g_name}, indices {x_name}"
        ref = run_reference(getattr(torch.ops.aten, op), (*args[:-1], idx.contiguous()))
        assert_close(getattr(ops, op)(*args), ref, torch.float32, what)
        ptrs = launches[0].ptrs
        for got, want, name in ((ptrs[1], g, "grad_output"), (ptrs[2], idx, "indices")):
            assert got.data_ptr() == want.data_ptr() and got.stride() == want.stride(), f"{what}: {name} copied"


def _selves():
    """(label, self) of many layouts, for the output layout rule."""
    cl = torch.channels_last

    def cl3d(*shape):
        return torch.randn(*shape, device=DEVICE).contiguous(memory_format=CL3D)

    yield "contiguous", torch.randn(2, 3, 2, 4, 5, device=DEVICE)
    yield "channels_last_3d", cl3d(2, 3, 2, 4, 5)
    yield "channels_last_3d sliced C", cl3d(2, 6, 2, 4, 5)[:, ::2]
    yield "channels_last_3d C=1", cl3d(2, 1, 2, 4, 5)
    yield "channels_last_3d N=1", cl3d(1, 3, 2, 4, 5)
    yield "channels_last_3d sliced W", cl3d(2, 3, 2, 4, 7)[..., 1:6]
    yield "transposed", torch.randn(2, 3, 2, 5, 4, device=DEVICE).transpose(-1, -2)
    yield "permuted N, C", torch.randn(3, 2, 2, 4, 5, device=DEVICE).transpose(0, 1)
    yield "unbatched", torch.randn(3, 2, 4, 5, device=DEVICE)
    yield "unbatched C fastest", cl3d(1, 3, 2, 4, 5)[0]
    yield "2d contiguous", torch.randn(2, 3, 5, 7, device=DEVICE)
    yield "2d channels_last", torch.randn(2, 3, 5, 7, device=DEVICE).contiguous(memory_format=cl)
    yield "2d channels_last sliced", torch.randn(2, 6, 5, 9, device=DEVICE).contiguous(memory_format=cl)[
        :, ::2, :, 1:8]
    yield "2d channels_last C=1", torch.randn(2, 1, 5, 7, device=DEVICE).contiguous(memory_format=cl)
    yield "2d transposed", torch.randn(2, 3, 7, 5, device=DEVICE).transpose(-1, -2)
    yield "2d unbatched transposed", torch.randn(3, 7, 5, device=DEVICE).transpose(-1, -2)


def _ops_for(label, x):
    """The ops taking self x, with their arguments (indices from stock's forward on x)."""
    if label.startswith("2d"):
        _, idx = torch.ops.aten.adaptive_max_pool2d(x, [3, 4])
        return [(AMAX2D, (torch.randn(idx.shape, device=DEVICE), x, idx))]
    window = [[2], [2], [0], [1]]
    y, idx = torch.ops.aten.max_pool3d_with_indices(x, *window, False)
    _, aidx = torch.ops.aten.adaptive_max_pool3d(x, [1, 3, 2])
    return [(MAX3D, (torch.randn(y.shape, device=DEVICE), x, *window, False, idx)),
            (AMAX3D, (torch.randn(aidx.shape, device=DEVICE), x, aidx))]


def test_output_layout_is_atens(monkeypatch):
    """grad_input's strides are stock's: max_pool3d channels_last_3d where a 5-D self suggests it, adaptive 2d
    channels_last where a 4-D self suggests it, contiguous otherwise; and a channels_last grad_input of several
    channels takes the channels tiling, everything else lines. (Unbatched max_pool3d: contiguous, as ATen's meta
    function declares; stock's CPU kernel agrees for a contiguous grad_output, as here.)"""
    from torch._prims_common import suggest_memory_format

    launches = record_launches(monkeypatch, mp)
    for label, x in _selves():
        if x.dim() == 5:
            assert (channels_last_format(x) is CL3D) is (suggest_memory_format(x) == CL3D), label
        for op, args in _ops_for(label, x):
            launches.clear()
            ours = check_case(op, args, what=f"{op} {label}")
            stock = getattr(torch.ops.aten, op)(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
            assert ours.stride() == stock.stride(), (op, label, ours.stride(), stock.stride())
            meta = getattr(torch.ops.aten, op)(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
            assert ours.stride() == meta.stride(), (op, label)
            # (a non-contiguous grad_input is batched channels_last; the outputs' side has no tiling)
            if "CHANNELS" in launches[0].consts:
                assert launches[0].consts["CHANNELS"] is (not ours.is_contiguous() and ours.shape[1] > 1), (op, label)


@pytest.mark.parametrize("op", OPS)
def test_empty_batch(op, monkeypatch):
    """N = 0 (and C = 0 unbatched, where ATen takes it): an empty grad_input of stock's shape and strides, nothing
    launched."""
    launches = record_launches(monkeypatch, mp)
    problems = {MAX3D: [_max3d((0, 3, 4, 5, 6), 2, 2, 0), _max3d((0, 3, 4, 5, 6), 2, 2, 0, fmt=CL3D)],
                AMAX2D: [_adaptive((0, 3, 5, 6), (2, 3)), _adaptive((0, 3, 5, 6), (2, 3), fmt=torch.channels_last),
                         _adaptive((0, 5, 6), (2, 3))],
                AMAX3D: [_adaptive((0, 3, 4, 5, 6), (2, 3, 4)), _adaptive((0, 3, 4, 5, 6), (2, 3, 4), fmt=CL3D),
                         _adaptive((0, 4, 5, 6), (2, 3, 4))]}[op]
    for args in problems:
        ours = getattr(ops, op)(*args)
        stock = getattr(torch.ops.aten, op)(*args)
        x = args[1]
        assert ours.shape == stock.shape == x.shape and ours.stride() == stock.stride(), (x.shape, x.stride())
    assert not launches


# ----------------------------------------------------------------------------------------------- bits
def _same_bits_with_small_knobs(run, first, block_knob, label, launches) -> list[dict]:
    """`run()` gives `first`'s bits with tiles of 4 elements, blocks of 2 columns or channels (`block_knob`), 2
    programs for more tiles (the grid-stride loop, normally past 2^30 tiles), int64 index math (normally past
    2^31) and the other orientation of the lines tile, each alone, and its launch (recorded in `launches`) takes
    the branch the knob forces; the launches' consts."""
    seen = []
    for knobs in ({"tile": 4}, {block_knob: 2}, {"max_programs": 2, "tile": 16}, {"i32_max": 16},
                  {"cols0": not mp.CONFIG.default.cols0, "tile": 64}):
        with config.override(mp.CONFIG, **knobs):
            launches.clear()
            assert_bitwise_equal(run(), first, f"{label} {knobs}")
        ints, consts = launches[0].ints, launches[0].consts
        if "max_programs" in knobs:
            assert ints[0] > 2  # (more tiles than programs)
        if "i32_max" in knobs:
            assert consts["I64"]
        seen.append(consts)
    return seen


def _path(tiling) -> dict:
    """Config fields that force the gather with `tiling`, or (tiling "outputs") the outputs' side."""
    if tiling == "outputs":
        return {"outputs_side_ratio": 0, "outputs_side_one_ratio": 0, "outputs_side_min_inputs": 0,
                "outputs_side_one_min_inputs": 0}
    return {"tiling": tiling, "outputs_side_ratio": _NEVER, "outputs_side_one_ratio": _NEVER}


_NEVER = 2**62  # an outputs_side_ratio no problem meets: the gather always


def _tiled(op, args, tiling):
    """The op's result through the gather with `tiling` forced, or from the outputs' side (fresh plans)."""
    with config.override(mp.CONFIG, **_path(tiling)):
        return getattr(ops, op)(*args)



# per op, a problem with overlapping windows (max_pool3d's and adaptive 2d's channels_last: the channels tiling when
# not forced)
BITS = {
    MAX3D: lambda: _max3d((1, 3, 2, 3, 5), 2, 1, 1, 2, True, values="ties", fmt=CL3D),
    AMAX2D: lambda: _adaptive((1, 3, 5, 7), (4, 3), values="ties", fmt=torch.channels_last),
    AMAX3D: lambda: _adaptive((1, 2, 3, 4, 5), (2, 3, 3), values="ties"),
}


@pytest.mark.parametrize("op", OPS)
def test_tilings_repeats_and_index_widths_give_the_same_bits(op, monkeypatch):
    """Each element sums its terms in one order whatever the tiling: the lines and the channels tilings (each reads
    and writes through strides), runs repeated, tiles of a few elements, the grid-stride loop and int64 index math
    all give the same bits, and so does the outputs' side (32- and 64-bit)."""
    args = BITS[op]()
    first = _tiled(op, args, "lines")
    check_case(op, args, what=op)
    assert_bitwise_equal(getattr(ops, op)(*args), first, f"{op} run twice")
    assert_bitwise_equal(_tiled(op, args, "channels"), first, f"{op} channels")
    launches = record_launches(monkeypatch, mp)
    for tiling, knob in (("lines", "max_bw"), ("channels", "max_bc")):
        seen = _same_bits_with_small_knobs(lambda t=tiling: _tiled(op, args, t), first, knob, f"{op} {tiling}",
                                           launches)
        assert all(c["CHANNELS"] is (tiling == "channels") for c in seen)
    assert_bitwise_equal(_tiled(op, args, "outputs"), first, f"{op} outputs' side")
    with config.override(mp.CONFIG, i32_max=16):
        launches.clear()
        assert_bitwise_equal(_tiled(op, args, "outputs"), first, f"{op} outputs' side, int64 index math")
    assert launches[-1].consts["I64"] and "BLOCK" in launches[-1].consts


def test_gather_tiles_give_a_thread_fewer_elements_the_more_candidate_slots(monkeypatch):
    """Each candidate slot is unrolled for every element a thread holds: 27 slots (3/1/1) take one element a
    thread, 8 slots (kernel 2, stride 1) two, one slot (kernel 2, stride 2) the tile's four."""
    launches = record_launches(monkeypatch, mp)
    cfg = mp.CONFIG.current
    for k, s, p, per_thread in ((3, 1, 1, 1), (2, 1, 0, 2), (2, 2, 0, 4)):
        _tiled(MAX3D, _max3d((1, 1, 4, 4, 64), k, s, p), "lines")  # (16 rows: 8 at the largest tile)
        c = launches[-1].consts
        assert c["BA"] * c["BB"] == 32 * cfg.warps * per_thread, (k, s, p)


def _outputs_side_problems():
    """Problems whose inputs have several candidates: overlapping, dilated and ceil_mode windows, adaptive sizes
    that do not divide, ties (an input summing several outputs), channels_last, strided grad_output and indices."""
    for case, (dims, ceil_mode) in enumerate(WINDOWS):
        yield MAX3D, f"window {case}", _window_args(dims, ceil_mode, "ties")
    yield MAX3D, "k3 s2 p1 channels_last_3d", _max3d((2, 3, 5, 6, 7), 3, 2, 1, values="ties", fmt=CL3D)
    g, x, *w, c, idx = _max3d((2, 3, 6, 7, 8), 3, (1, 2, 2), 1, values="ties")
    yield MAX3D, "strided grad and indices", (g.transpose(0, 1).contiguous().transpose(0, 1), x, *w, c,
                                              idx[:, :, :, :, :].transpose(3, 4).contiguous().transpose(3, 4))
    for shape, osize, fmt in (((2, 3, 13, 11), (4, 3), None), ((2, 4, 9, 10), (4, 4), torch.channels_last),
                              ((3, 17, 19), (5, 6), None), ((2, 2, 7, 9, 10), (3, 4, 3), None),
                              ((1, 3, 5, 6, 7), (2, 4, 3), CL3D)):
        yield OPS[len(osize) - 1], f"{shape} -> {osize}", _adaptive(shape, osize, values="ties", fmt=fmt)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_outputs_side_gives_the_gathers_bits(dtype, monkeypatch):
    """The outputs' side (few outputs, several candidates an input) sums the gather's terms in the gather's order
    and accumulator: the same bits, every problem, with its index divisions as multiplies (`outputs_magic`) or
    not; where the plan picks it by default it is the one launched."""
    launches = record_launches(monkeypatch, mp)
    orders = set()
    for op, label, args in _outputs_side_problems():
        args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        gather = _tiled(op, args, "lines")
        launches.clear()
        outputs = _tiled(op, args, "outputs")
        assert "BLOCK" in launches[-1].consts, (op, label)  # (the outputs' side's launch)
        assert any(launches[-1].consts["OMAGIC"]), (op, label)  # (its index divisions as multiplies)
        orders.add(launches[-1].consts["CL"])
        assert_bitwise_equal(outputs, gather, f"{op} {label}")
        with config.override(mp.CONFIG, outputs_magic=False):
            assert_bitwise_equal(_tiled(op, args, "outputs"), gather, f"{op} {label}, divisions")
            assert not any(launches[-1].consts["OMAGIC"]), (op, label)
        check_case(op, args, what=f"{op} {label} (default plan)")
    assert orders == {False, True}, "outputs taken in both orders: W fastest and channels fastest"
    # the default: the outputs' side where inputs are at least outputs_side_ratio times the outputs, and from
    # outputs_side_min_inputs inputs (a small problem keeps the gather's one launch)
    args = _adaptive((2, 3, 13, 11), (4, 3), dtype=dtype)
    launches.clear()
    ops.adaptive_max_pool2d_backward(*args)
    assert "CHANNELS" in launches[-1].consts
    with config.override(mp.CONFIG, outputs_side_min_inputs=2 * 3 * 13 * 11):
        launches.clear()
        ops.adaptive_max_pool2d_backward(*args)
        assert "BLOCK" in launches[-1].consts
    launches.clear()
    ops.max_pool3d_with_indices_backward(*_max3d((1, 2, 4, 6, 6), 2, 2, 0, dtype=dtype))  # (k <= s: one candidate)
    assert "CHANNELS" in launches[-1].consts
    # one candidate an input: the outputs' side from outputs_side_one_ratio inputs an output (here 8 and 64)
    with config.override(mp.CONFIG, outputs_side_one_min_inputs=0):
        for shape, k, outputs_side in (((1, 2, 4, 6, 6), 2, False), ((1, 2, 4, 8, 8), 4, True)):
            launches.clear()
            args = _max3d(shape, k, k, 0, dtype=dtype)
            check_case(MAX3D, args, what=f"{MAX3D} {shape} k{k}")
            assert ("BLOCK" in launches[-1].consts) is outputs_side, (shape, k)


# ----------------------------------------------------------------------------------------------- compile-time
def test_column_blocks_waste_the_fewest_lanes():
    """The column block (a power of two from 32 to 128, or the row's next power of two): the one whose blocks pad a
    row least, the widest of equals."""
    for size, block in ((96, 32), (56, 64), (64, 64), (128, 128), (7, 8), (200, 32), (300, 64), (48, 64), (3, 4),
                        (1, 1), (1000, 128), (4096, 128)):
        assert column_block(size, 128, 32) == block, (size, column_block(size, 128, 32))


def test_window_constants_not_sizes_select_the_compile():
    """The constexprs depend on the pooling configuration and a few layout classes, not on the sizes: problems of
    one configuration share a compiled variant (batch, channels, depth and height here), and only the window
    changes the window constants."""
    consts = []
    for shape in ((2, 3, 8, 16, 32), (4, 5, 6, 12, 32), (1, 7, 10, 22, 32)):
        g, x, k, s, p, d, c, idx = _max3d(shape, 2, 2, 0)
        consts.append(mp._plan(mp._SPECS[MAX3D], tuple(g.shape), g.stride(), idx.stride(), tuple(x.shape), False,
                               x.dtype, mp._window(mp._SPECS[MAX3D], x, k, s, p, d, c)[0]).consts)
    assert all(c == consts[0] for c in consts), consts
    assert consts[0]["WD"][7:] == (1, True) and consts[0]["EAGER"]  # (k = s: lean, one candidate a dim)
    k3 = mp._progressions(((3,) * 3, (2,) * 3, (1,) * 3, (1,) * 3), (8,) * 3, (4,) * 3)[0]
    assert k3[0] == (2, 2, 1, 1, 1, 0, 1, 2, False)  # (span, stride, padding, dilation, gcd, inverse, step, KS, lean)


@pytest.mark.parametrize("case", range(3))
def test_load_orders_and_layout_factors_give_the_same_bits(case, monkeypatch):
    """g loaded with its index (EAGER) or after it, the whole-row column block or the narrowest, the lines tiling's
    tile in both orientations (`cols0`: the one the installed Triton does not take), the channels tiling on even
    channel counts (whose strides' factors of two the kernel takes out and multiplies back: ALIGN) and a row width
    that is not a multiple of 16: the same bits, and stock's values. Windows lean along some dims (one candidate:
    k <= s, or a dilated span below the stride) and not along others."""
    args = [_max3d((2, 8, 5, 7, 12), (2, 3, 2), (2, 2, 3), (0, 1, 1), (1, 1, 2), False, values="ties", fmt=CL3D),
            _adaptive((2, 8, 9, 12), (4, 5), values="ties", fmt=torch.channels_last),
            _adaptive((2, 4, 6, 10, 20), (3, 3, 5), values="ties")][case]
    if case < 2:  # (grad_output channels_last too, as the forward's output)
        args = (args[0].contiguous(memory_format=CL3D if case == 0 else torch.channels_last), *args[1:])
    op = [MAX3D, AMAX2D, AMAX3D][case]
    first = check_case(op, args, what=op)
    launches = record_launches(monkeypatch, mp)
    for knobs in ({"eager_slots": 0}, {"eager_slots": 64}, {"min_block": 128}, {"tiling": "lines"},
                  {"tiling": "lines", "cols0": not mp.CONFIG.default.cols0},
                  {"tiling": "channels", "eager_slots": 0}):
        with config.override(mp.CONFIG, **knobs, outputs_side_ratio=_NEVER, outputs_side_one_ratio=_NEVER) as cfg:
            launches.clear()
            assert_bitwise_equal(getattr(ops, op)(*args), first, f"{op} {knobs}")
        consts = launches[0].consts
        if "eager_slots" in knobs:
            assert consts["EAGER"] is (knobs["eager_slots"] > 0)
        assert consts["COLS0"] is (cfg.cols0 and not consts["CHANNELS"])
        if consts["CHANNELS"] and op != AMAX3D:
            assert consts["ALIGN"][1] > 1 and consts["ALIGN"][2] > 1, consts["ALIGN"]  # (8 channels)


# ----------------------------------------------------------------------------------------------- errors
def test_bad_inputs_raise_named_errors_and_launch_nothing(monkeypatch):
    g, x, k, s, p, d, c, idx = _max3d((2, 3, 4, 6, 8), 2, 2, 0)
    a2, a3 = _adaptive((2, 3, 7, 8), (3, 4)), _adaptive((2, 3, 4, 5, 6), (2, 3, 4))
    m3, p2, p3 = ops.max_pool3d_with_indices_backward, ops.adaptive_max_pool2d_backward, \
        ops.adaptive_max_pool3d_backward
    before = [t.clone() for t in (g, x, idx, *a2, *a3)]
    launches = record_launches(monkeypatch, mp)
    IP, US = gradkern.InvalidProblem, gradkern.Unsupported
    cases = [
        # max_pool3d: window parameters as ATen checks them
        (IP, r"kernel_size.*1 or 3 ints.*\[2, 2\]", lambda: m3(g, x, [2, 2], s, p, d, c, idx)),
        (IP, r"stride.*0, 1 or 3 ints", lambda: m3(g, x, k, [2, 2], p, d, c, idx)),
        (IP, r"padding.*1 or 3 ints", lambda: m3(g, x, k, s, [], d, c, idx)),
        (IP, r"dilation.*1 or 3 ints", lambda: m3(g, x, k, s, p, [1, 1, 1, 1], c, idx)),
        (IP, r"kernel_size.*ints", lambda: m3(g, x, [2.0], s, p, d, c, idx)),
        (IP, r"kernel_size.*below 2\^31", lambda: m3(g, x, [2**31], s, p, d, c, idx)),
        (IP, r"kernel_size.*values >= 1.*\(0, 0, 0\)", lambda: m3(g, x, [0], s, p, d, c, idx)),
        (IP, r"stride.*values >= 1", lambda: m3(g, x, k, [2, 0, 2], p, d, c, idx)),
        (IP, r"dilation.*values >= 1", lambda: m3(g, x, k, s, p, [0], c, idx)),
        (IP, r"padding.*values >= 0", lambda: m3(g, x, k, s, [-1], d, c, idx)),
        (IP, r"padding.*at most half the kernel size \(2, 2, 2\).*\(2, 2, 2\)", lambda: m3(g, x, k, s, [2], d, c, idx)),
        (US, r"ceil_mode.*a bool.*int", lambda: m3(g, x, k, s, p, d, 0, idx)),
        (IP, r"self.*leave at least one output.*output sizes \(-4, -2, 0\)",
         lambda: m3(g, x, [5], [1], [2], [3], c, idx)),
        (IP, r"grad_output.*\(2, 3, 2, 3, 4\).*\(2, 3, 2, 3, 3\)", lambda: m3(g[..., :3], x, k, s, p, d, c, idx)),
        # (kernel 3, stride 2 on (4, 6, 8): output sizes (2, 3, 4) with ceil_mode, as grad_output's, else (1, 2, 3))
        (IP, r"grad_output.*\(2, 3, 1, 2, 3\).*\(2, 3, 2, 3, 4\)", lambda: m3(g, x, [3], [2], p, d, False, idx)),
        (IP, r"indices.*shape \(2, 3, 2, 3, 4\).*\(1, 3, 2, 3, 4\)", lambda: m3(g, x, k, s, p, d, c, idx[:1])),
        (IP, r"self.*4-D or 5-D.*3-D", lambda: m3(g[0, 0], x[0, 0], k, s, p, d, c, idx[0, 0])),
        (IP, r"self.*every dim but the batch dim.*\(2, 0, 4, 6, 8\)",
         lambda: m3(g[:, :0], x[:, :0], k, s, p, d, c, idx[:, :0])),
        (IP, r"self.*every dim but the batch dim.*\(0, 4, 6, 8\)", lambda: m3(g[0, :0], x[0, :0], k, s, p, d, c,
                                                                              idx[0, :0])),
        (US, r"indices.*dtype int64.*torch.int32", lambda: m3(g, x, k, s, p, d, c, idx.int())),
        (US, r"indices.*torch.Tensor.*list", lambda: m3(g, x, k, s, p, d, c, idx.tolist())),
        (US, r"indices.*device", lambda: m3(g, x, k, s, p, d, c, idx.to("meta"))),
        (US, r"grad_output.*dtype torch.float32.*float64", lambda: m3(g.double(), x, k, s, p, d, c, idx)),
        # adaptive
        (IP, r"self.*3-D or 4-D.*2-D tensor of shape \(7, 8\)", lambda: p2(a2[0][0, 0], a2[1][0, 0], a2[2][0, 0])),
        (IP, r"self.*4-D or 5-D.*3-D", lambda: p3(a3[0][0, 0], a3[1][0, 0], a3[2][0, 0])),
        (IP, r"grad_output.*\(2, 3, <output sizes>\).*\(2, 2, 3, 4\)", lambda: p2(a2[0][:, :2], a2[1], a2[2][:, :2])),
        (IP, r"grad_output.*non-zero sizes.*\(2, 3, 0, 4\)", lambda: p2(a2[0][:, :, :0], a2[1], a2[2][:, :, :0])),
        (IP, r"indices.*shape \(2, 3, 3, 4\).*\(2, 3, 3, 3\)", lambda: p2(a2[0], a2[1], a2[2][..., :3])),
        (IP, r"self.*non-zero pooled sizes.*\(2, 3, 4, 0, 6\)", lambda: p3(a3[0], a3[1][..., :0, :], a3[2])),
        (US, r"indices.*dtype int64", lambda: p3(a3[0], a3[1], a3[2].double())),
        (US, r"self.*dtype", lambda: p2(a2[0], a2[1].int(), a2[2])),
    ]
    check_refusals(cases, launches, OPS, (g, x, idx, *a2, *a3), before)


def test_registry_entries():
    check_registry_entries(OPS)
    for op in OPS:
        tiny = REGISTRY[op].cases(DEVICE, torch.float32, "tiny")[0]
        assert gradkern.plan(op, *tiny.args).bytes == tiny.bytes
        g, x, idx = tiny.args[0], tiny.args[1], tiny.args[-1]
        assert tiny.bytes == (g.numel() + x.numel()) * 4 + idx.numel() * 8  # (self is not read)


def test_every_registry_case_is_a_valid_problem():
    """Every size's cases (the GPU's check and large ones too, built on the meta device: stock's forward gives their
    indices) pass the op's checks, as a CPU run cannot show for the larger sizes."""
    for op in OPS:
        spec = mp._SPECS[op]
        for size in ("tiny", "small", "check", "large"):
            for case in REGISTRY[op].cases("meta", torch.float32, size):
                g, x, idx = case.args[0], case.args[1], case.args[-1]
                mp._check_self(spec, x)
                window, out_sizes = (None, None) if spec.adaptive else mp._window(spec, x, *case.args[2:7])
                mp._check_grad(spec, g, x, idx, out_sizes)


# ----------------------------------------------------------------------------------------------- training
def _modules():
    """(label, module, input shape, memory format, values, the op its backward runs)."""
    return [
        ("nn.MaxPool3d(2)", nn.MaxPool3d(2), (2, 2, 4, 6, 5), None, "randn", MAX3D),
        ("nn.MaxPool3d(3, 2, 1) channels_last_3d, ties", nn.MaxPool3d(3, 2, 1), (1, 3, 3, 5, 4), CL3D, "ties", MAX3D),
        ("nn.MaxPool3d dilation ceil_mode unbatched", nn.MaxPool3d(2, 1, 1, dilation=2, ceil_mode=True), (2, 3, 4, 5),
         None, "randn", MAX3D),
        ("nn.AdaptiveMaxPool2d((3, 4)) channels_last", nn.AdaptiveMaxPool2d((3, 4)), (2, 3, 5, 7),
         torch.channels_last, "randn", AMAX2D),
        ("nn.AdaptiveMaxPool2d(1), ties", nn.AdaptiveMaxPool2d(1), (2, 3, 4, 5), None, "ties", AMAX2D),
        ("nn.AdaptiveMaxPool3d((2, 3, 2))", nn.AdaptiveMaxPool3d((2, 3, 2)), (1, 2, 3, 5, 4), None, "randn", AMAX3D),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_training_in_deterministic_mode_runs_gradkern(dtype, monkeypatch):
    """Under gradkern.use(mode="always") with torch.use_deterministic_algorithms(True), the pools' backward runs
    gradkern's kernels and gives stock's gradients (layout included)."""
    torch.manual_seed(0)
    calls = spy_on_ops(monkeypatch, OPS)
    for label, module, shape, fmt, values, op in _modules():
        x = _values(shape, dtype, values)
        if fmt is not None:
            x = x.contiguous(memory_format=fmt)
        check_training_step(module, x, calls, op, label, mode="always")


# ----------------------------------------------------------------------------------------------- GPU only
@gpu_only
def test_stock_raises_in_deterministic_mode_and_gradkern_does_not():
    """max_pool3d's and adaptive_max_pool2d's stock CUDA backwards raise in deterministic mode (adaptive_max_pool3d's
    is silently nondeterministic); gradkern's run, and give the plain op's bits."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for op, args in _problems(values="randn").items():
            if op != AMAX3D:
                with pytest.raises(RuntimeError, match="deterministic"):
                    getattr(torch.ops.aten, op)(*args)
            with gradkern.use():
                ours = getattr(torch.ops.aten, op)(*args)
            assert_bitwise_equal(ours, getattr(ops, op)(*args), op)
        x = torch.randn(2, 16, 32, 64, 64, device=DEVICE, requires_grad=True)
        with gradkern.use():
            nn.MaxPool3d(3, 2, 1)(x).sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bitwise_identical_repeats_on_gpu(dtype):
    assert_repeats_bitwise(OPS, dtype, DEVICE, "check")
