"""Property-based tests (hypothesis) for the ops that are not pointwise: where / lerp / prelu backward (fused and
ATen's `_prelu_kernel_backward`), replication / reflection pad 1d/2d/3d backward, repeat backward, sparsemax
forward / backward, segment_max (forward and its backward through autograd) and the shared deterministic
reduction (`reduce_sum`, `sum_to_shape`).

Each test draws shapes (0-d, empty and size-1 dims included), operand shapes that broadcast, memory layouts
(strided slices, dense permutations, stride-0 expands, copies PyTorch materialised from flips), the four float
dtypes and the op's parameters, and compares with stock PyTorch through `gradkern.testing.check_case` (the
registry reference: bit-exact for selections, else the dtype's tolerance against float64). Where a result is a
sum of many terms the values are drawn on a coarse dyadic grid (k/8), so that every summation order gives the
float64 sum exactly and cancellation cannot make a correct result miss a fixed tolerance.

Bounded for CI (interpreter-sized problems, GRADKERN_FUZZ_EXAMPLES examples per test, default 15);
GRADKERN_FUZZ_EXAMPLES raises the count (GPU profile). Tensor values come from a torch.Generator seeded by a drawn
integer, so a failing example replays exactly."""

import functools
import math
import os
from contextlib import ExitStack
from itertools import accumulate

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradkern
from conftest import DEVICE, DTYPES, small_pad_tiles, small_prelu_splits
from gradkern import config, ops
from gradkern.engines.reduction import reduce_sum, sum_to_shape
from gradkern.kernels import pad as pad_mod
from gradkern.kernels import segment_max as segmax_mod
from gradkern.kernels import sparsemax as sparsemax_mod
from gradkern.registry import REGISTRY
from gradkern.routing import dispatch
from gradkern.testing import assert_bitwise_equal, check_case, run_reference
from test_reduction import assert_sum_close

EXAMPLES = int(os.environ.get("GRADKERN_FUZZ_EXAMPLES", "15"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

LAYOUTS = ("contiguous", "sliced", "permuted", "flipped", "broadcast")
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)
masks2 = st.tuples(st.booleans(), st.booleans())
masks3 = st.tuples(st.booleans(), st.booleans(), st.booleans())


# ----------------------------------------------------------------------------------------------- strategies
@st.composite
def generators(draw):
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def make_values(gen, shape, dtype, kind: str, scale: float = 1.0) -> torch.Tensor:
    """CPU values: "normal" (randn * scale) or "grid" (k/8 for |k| <= 32: exact in every dtype, and sums of up to
    thousands of them and their pairwise products are exact in fp32)."""
    if kind == "grid":
        return (torch.randint(-32, 33, shape, generator=gen) / 8).to(dtype)
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


@st.composite
def placed(draw, base: torch.Tensor, layouts=LAYOUTS) -> torch.Tensor:
    """`base` (a CPU tensor of any dtype) on the device in a drawn memory layout. "broadcast" makes one dim
    (drawn) a stride-0 expand of its first entry, so it changes the values - the reference sees the same ones."""
    layout = draw(st.sampled_from(layouts))
    shape, rank = tuple(base.shape), base.dim()
    if layout == "sliced" and rank:
        big = torch.zeros(*shape[:-1], 2 * shape[-1] + 1, dtype=base.dtype)
        big[..., 1::2] = base
        return big.to(DEVICE)[..., 1::2]
    if layout == "permuted" and rank >= 2:
        perm = draw(st.permutations(range(rank)))
        inv = [perm.index(i) for i in range(rank)]
        return base.permute(perm).contiguous().to(DEVICE).permute(inv)
    if layout == "flipped" and rank:
        return base.flip(-1).to(DEVICE).flip(-1)  # PyTorch materialises negative steps as a copy
    if layout == "broadcast" and rank:
        d = draw(st.integers(0, rank - 1))
        if shape[d]:
            return base.narrow(d, 0, 1).to(DEVICE).expand(shape)
    return base.contiguous().to(DEVICE)


@st.composite
def operand_shape(draw, shape):
    """A shape that broadcasts to `shape`: some leading dims dropped, some others set to 1."""
    rest = shape[draw(st.integers(0, len(shape))):]
    ones = draw(st.lists(st.booleans(), min_size=len(rest), max_size=len(rest)))
    return tuple(1 if one else s for one, s in zip(ones, rest))


def _summed(shape, full) -> bool:
    return tuple(shape) != tuple(full)


def _desc(**tensors) -> str:
    return " ".join(f"{k}{tuple(t.shape)}:{t.stride()}:{t.dtype}" if isinstance(t, torch.Tensor) else f"{k}={t!r}"
                    for k, t in tensors.items())


# ----------------------------------------------------------------------------------------------- where
@pytest.mark.filterwarnings("ignore:where received a uint8 condition")  # the reference's deprecation warning
@SETTINGS
@given(data=st.data(), shape=shapes, gen=generators(), mask=masks2)
def test_where_backward_fuzz(data, shape, gen, mask):
    cs, ss, os_ = (data.draw(operand_shape(shape)) for _ in range(3))
    sd, od = data.draw(st.sampled_from(DTYPES)), data.draw(st.sampled_from(DTYPES))
    scalar = data.draw(st.sampled_from([None, "self", "other"]))  # a Python-number operand has no gradient
    mask = (mask[0] and scalar != "self", mask[1] and scalar != "other")
    full = tuple(torch.broadcast_shapes(cs, () if scalar == "self" else ss, () if scalar == "other" else os_))
    self_ = 0.5 if scalar == "self" else data.draw(placed(make_values(gen, ss, sd, "normal")))
    other = 1.5 if scalar == "other" else data.draw(placed(make_values(gen, os_, od, "normal")))
    gd = functools.reduce(torch.promote_types, [t.dtype for t in (self_, other) if isinstance(t, torch.Tensor)])
    if data.draw(st.booleans()):
        cond = torch.rand(cs, generator=gen) > 0.5
    else:  # uint8: nonzero means true (deprecated in PyTorch, still accepted)
        cond = torch.randint(0, 4, cs, generator=gen, dtype=torch.uint8)
    cond = data.draw(placed(cond))
    sums = any(m and _summed(getattr(t, "shape", ()), full) for m, t in zip(mask, (self_, other)))
    kind = "grid" if sums else data.draw(st.sampled_from(["normal", "grid"]))
    g = data.draw(placed(make_values(gen, full, gd, kind, data.draw(st.sampled_from([0.5, 3.0, 10.0])))))
    out = check_case("where_backward", (g, cond, self_, other, mask),
                     what=f"where_backward {_desc(g=g, cond=cond, self=self_, other=other, mask=mask)}")
    for m, o, t in zip(mask, out, (self_, other)):
        assert (o is None) == (not m)
        if o is not None:
            assert o.shape == t.shape and o.dtype == t.dtype


# ----------------------------------------------------------------------------------------------- lerp
DYADIC_WEIGHTS = [0.25, -1.5, 0.0, 1.0, 0.625, 2.0]


@SETTINGS
@given(data=st.data(), shape=shapes, gen=generators(), mask=masks3, dtype=st.sampled_from(DTYPES),
       weight_kind=st.sampled_from(["scalar", "tensor", "0-d of any dtype"]))
def test_lerp_backward_fuzz(data, shape, gen, mask, dtype, weight_kind):
    ss, es, ws = (data.draw(operand_shape(shape)) for _ in range(3))
    if weight_kind == "scalar":
        full = tuple(torch.broadcast_shapes(ss, es))
        sums = (mask[0] and _summed(ss, full)) or (mask[1] and _summed(es, full))
        weight = data.draw(st.sampled_from(DYADIC_WEIGHTS + ([] if sums else [1 / 3, 0.3])))
    else:
        wd = dtype if weight_kind == "tensor" else data.draw(st.sampled_from(DTYPES))
        ws = ws if weight_kind == "tensor" else ()
        full = tuple(torch.broadcast_shapes(ss, es, ws))
        sums = any(m and _summed(s, full) for m, s in zip(mask, (ss, es, ws)))
        weight = data.draw(placed(make_values(gen, ws, wd, "grid")))  # k/8: 1 - w is exact
    # grid where a gradient is summed, and for a 0-d weight of another dtype (its gradient is computed in self's
    # math dtype, as stock does, but compared at the weight's dtype's tolerance)
    exact = sums or weight_kind == "0-d of any dtype"
    kind = "grid" if exact else data.draw(st.sampled_from(["normal", "grid"]))
    self_ = data.draw(placed(make_values(gen, ss, dtype, kind, 3.0)))
    end = data.draw(placed(make_values(gen, es, dtype, kind, 3.0)))
    g = data.draw(placed(make_values(gen, full, dtype, kind, 3.0)))
    out = check_case("lerp_backward", (g, self_, end, weight, mask),
                     what=f"lerp_backward {_desc(g=g, self=self_, end=end, weight=weight, mask=mask)}")
    for m, o, t in zip(mask, out, (self_, end, weight)):
        assert (o is None) == (not m or not isinstance(t, torch.Tensor))
        if o is not None:
            assert o.shape == t.shape and o.dtype == t.dtype


# ----------------------------------------------------------------------------------------------- prelu
PRELU_LAYOUTS = LAYOUTS + ("channels_last",)


@st.composite
def prelu_placed(draw, base):
    """placed(), plus channels_last / channels_last_3d (the fused column kernel) for 4-D / 5-D tensors."""
    layout = draw(st.sampled_from(PRELU_LAYOUTS))
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(base.dim())
    if layout == "channels_last":
        if fmt is not None:
            return base.to(DEVICE).contiguous(memory_format=fmt)
        layout = "contiguous"
    return draw(placed(base, (layout,)))


@SETTINGS
@given(data=st.data(), shape=st.lists(st.integers(0, 5), min_size=0, max_size=5).map(tuple), gen=generators(),
       mask=masks2, dtype=st.sampled_from(DTYPES), small_tiles=st.booleans())
def test_prelu_backward_fuzz(data, shape, gen, mask, dtype, small_tiles):
    if math.prod(shape) > 2000:
        shape = shape[:3]
    channels = shape[1] if len(shape) >= 2 else 1
    n_w = data.draw(st.sampled_from([1, channels]))
    w_shape = data.draw(st.sampled_from([(n_w,), ()] if n_w == 1 else [(n_w,)]))
    x = data.draw(prelu_placed(make_values(gen, shape, dtype, "grid")))  # grid: x = 0 (the w*g branch) too
    g = x if data.draw(st.booleans()) else data.draw(prelu_placed(make_values(gen, shape, dtype, "grid")))
    w = data.draw(placed(make_values(gen, w_shape, dtype, "grid")))
    with ExitStack() as stack:
        if small_tiles:  # several tiles and partials per channel: the fixed-order second pass
            stack.enter_context(small_prelu_splits(tile_bytes=128, rows_tpp=3))
        gi, gw = check_case("prelu_backward", (g, x, w, mask),
                            what=f"prelu_backward {_desc(g=g, x=x, w=w, mask=mask, small_tiles=small_tiles)}")
    assert (gi is None, gw is None) == (not mask[0], not mask[1])
    if gw is not None:
        assert gw.shape == w.shape and gw.dtype == dtype


def test_prelu_strided_weight_found_by_fuzzing():
    """The fuzzer's minimal example: a weight that is a strided view (w[::2]) was read as if dense by the fused
    kernels (grad_input got w's neighbour in memory: -0.0 here instead of 2.625 * -2.875)."""
    x = torch.tensor([[1.625, -2.875]], device=DEVICE)
    w = torch.tensor([-0.375, 0.0, 2.625, 0.0], device=DEVICE)[::2]
    gi, gw = check_case("prelu_backward", (x, x, w), what="strided weight")
    assert gi.tolist() == [[1.625, 2.625 * -2.875]] and gw.tolist() == [0.0, 2.875 * 2.875]


@SETTINGS
@given(data=st.data(), shape=shapes, gen=generators(), dtype=st.sampled_from(DTYPES),
       kind=st.sampled_from(["normal", "grid"]))
def test_prelu_kernel_backward_fuzz(data, shape, gen, dtype, kind):
    """ATen's signature: any weight that broadcasts to x, full-shape results, bit-exact against stock."""
    w_shape = data.draw(operand_shape(shape))
    x = data.draw(placed(make_values(gen, shape, dtype, kind, 2.0)))
    g = data.draw(placed(make_values(gen, shape, dtype, kind)))
    w = data.draw(placed(make_values(gen, w_shape, dtype, kind, 0.25)))
    gi, gw = check_case("_prelu_kernel_backward", (g, x, w), what=f"_prelu_kernel_backward {_desc(g=g, x=x, w=w)}")
    assert gi.shape == gw.shape == x.shape


# ----------------------------------------------------------------------------------------------- pad
PAD_OPS = [f"{mode}_pad{d}d_backward" for mode in ("replication", "reflection") for d in (1, 2, 3)]


@SETTINGS
@given(data=st.data(), op=st.sampled_from(PAD_OPS), gen=generators(), dtype=st.sampled_from(DTYPES),
       batched=st.booleans(), small_tiles=st.booleans(), out_layout=st.sampled_from([None, "contiguous", "permuted"]))
def test_pad_backward_fuzz(data, op, gen, dtype, batched, small_tiles, out_layout):
    dims = int(op.split("_pad")[1][0])
    reflect = op.startswith("reflection")
    lead = ((data.draw(st.integers(0, 2)),) if batched else ()) + (data.draw(st.integers(1, 3)),)
    spatial = tuple(data.draw(st.lists(st.integers(1, 5 if dims < 3 else 4), min_size=dims, max_size=dims)))
    shape = lead + spatial
    pads = []
    for k in range(dims):  # padding lists the last dim first; reflection pads stay below the input size
        n = shape[-1 - k]
        lo = data.draw(st.integers(-n, n - 1 if reflect else 5))
        hi = data.draw(st.integers(-(n + lo) if lo < 0 else -n, n - 1 if reflect else 5))  # size n + lo + hi >= 0
        pads += [lo, hi]
    self_ = torch.zeros((), dtype=dtype, device=DEVICE).expand(shape)  # only its shape and dtype are read
    kind = "grid" if not reflect else data.draw(st.sampled_from(["normal", "grid"]))
    g = data.draw(placed(make_values(gen, pad_mod.padded_shape(shape, pads), dtype, kind, 3.0)))
    what = f"{op} {_desc(g=g, self=self_)} pad {pads} small_tiles={small_tiles}"
    with ExitStack() as stack:
        if small_tiles:  # tiles of a few rows and columns: the border strips cross tile edges (as in large planes)
            stack.enter_context(small_pad_tiles(unroll=1))
        if g.numel():
            out = check_case(op, (g, self_, pads), what=what)
        else:  # pads that crop a dim to size 0: no gradient at all. (Not against stock here: ATen's CPU
            # reflection_pad1d/3d_backward return grad_input uninitialised when grad_output has no elements.)
            out = getattr(ops, op)(g, self_, pads)
            assert_bitwise_equal(out, torch.zeros(shape, dtype=dtype), f"{what}: zeros")
        assert out.shape == shape and out.dtype == dtype
        if out_layout is not None:  # grad_input=: written in place, whatever its strides, with the same bits
            buf = torch.full(shape[::-1], math.nan, dtype=dtype, device=DEVICE)
            given_out = buf.permute(*reversed(range(len(shape)))) if out_layout == "permuted" else \
                torch.full(shape, math.nan, dtype=dtype, device=DEVICE)
            res = getattr(ops, op)(g, self_, pads, grad_input=given_out)
            assert res is given_out
            assert_bitwise_equal(given_out, out, f"{what} grad_input= {out_layout}")


# ----------------------------------------------------------------------------------------------- repeat
@SETTINGS
@given(data=st.data(), in_shape=st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple), gen=generators(),
       dtype=st.sampled_from(DTYPES))
def test_repeat_backward_fuzz(data, in_shape, gen, dtype):
    extra = data.draw(st.integers(0, 2))  # leading repeats add dims
    reps = tuple(data.draw(st.lists(st.integers(0, 3), min_size=len(in_shape) + extra,
                                    max_size=len(in_shape) + extra)))
    padded = (1,) * extra + in_shape
    g_shape = tuple(r * s for r, s in zip(reps, padded))
    if math.prod(g_shape) > 4000:
        reps = tuple(min(r, 1) for r in reps)
        g_shape = tuple(r * s for r, s in zip(reps, padded))
    kind = "grid" if math.prod(reps) > 1 else data.draw(st.sampled_from(["normal", "grid"]))
    g = data.draw(placed(make_values(gen, g_shape, dtype, kind, 3.0)))
    out = check_case("repeat_backward", (g, list(reps), list(in_shape)),
                     what=f"repeat_backward {_desc(g=g)} repeats {reps} input {in_shape}")
    assert out.shape == in_shape and out.dtype == dtype
    if 0 in reps:
        assert not bool(out.any())


# ----------------------------------------------------------------------------------------------- sparsemax
@st.composite
def sparsemax_inputs(draw, gen, dtype):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    if draw(st.booleans()) and shape:  # one longer dim: rows of up to 40 entries
        d = draw(st.integers(0, len(shape) - 1))
        shape = shape[:d] + (draw(st.integers(7, 40)),) + shape[d + 1:]
    rank = max(len(shape), 1)
    dim = draw(st.integers(-rank, rank - 1))
    kind = draw(st.sampled_from(["normal", "grid"]))  # grid: ties (also at the threshold)
    x = make_values(gen, shape, dtype, kind, draw(st.sampled_from([0.01, 2.0, 50.0])))
    if draw(st.booleans()) and x.numel():  # a few special values: NaN rows, -inf entries, +inf maxima
        flat = x.view(-1)
        for _ in range(draw(st.integers(1, 3))):
            flat[draw(st.integers(0, x.numel() - 1))] = draw(st.sampled_from([math.nan, -math.inf, math.inf]))
    return draw(placed(x)), dim


@SETTINGS
@given(data=st.data(), gen=generators(), dtype=st.sampled_from(DTYPES),
       block_max=st.sampled_from([None, 4, 16]))
def test_sparsemax_forward_backward_fuzz(data, gen, dtype, block_max):
    x, dim = data.draw(sparsemax_inputs(gen, dtype))
    with ExitStack() as stack:
        if block_max is not None:  # rows longer than this are split across programs (the long-row kernels)
            stack.enter_context(config.override(sparsemax_mod.CONFIG, block_max=block_max))
        y = check_case("sparsemax_forward", (x, dim), what=f"sparsemax_forward {_desc(x=x, dim=dim)}")
        assert y.shape == x.shape and y.dtype == dtype
        y = data.draw(placed(y.cpu(), ("contiguous", "sliced", "permuted")))
        g = data.draw(placed(make_values(gen, tuple(x.shape), dtype, "normal", 2.0)))
        dx = check_case("sparsemax_backward", (g, y, dim), what=f"sparsemax_backward {_desc(g=g, y=y, dim=dim)}")
        assert dx.shape == x.shape and dx.dtype == dtype


# ----------------------------------------------------------------------------------------------- segment_max
@SETTINGS
@given(data=st.data(), gen=generators(), dtype=st.sampled_from(DTYPES),
       lengths=st.lists(st.integers(0, 5), min_size=0, max_size=5),
       other=st.lists(st.integers(1, 4), min_size=0, max_size=2).map(tuple),
       how=st.sampled_from(["offsets", "lengths", "segment_ids"]), index_dtype=st.sampled_from([torch.int32,
                                                                                                torch.int64]))
def test_segment_max_fuzz(data, gen, dtype, lengths, other, how, index_dtype):
    n = sum(lengths)
    axis = data.draw(st.integers(0, len(other)))
    shape = other[:axis] + (n,) + other[axis:]
    x = make_values(gen, shape, dtype, "grid")  # grid: ties, so "first argmax" matters
    if data.draw(st.booleans()) and x.numel():
        for _ in range(data.draw(st.integers(1, 3))):
            x.view(-1)[data.draw(st.integers(0, x.numel() - 1))] = data.draw(st.sampled_from([math.nan, math.inf,
                                                                                              -math.inf, -0.0]))
    x = data.draw(placed(x)).requires_grad_(True)
    axis_arg = axis - len(shape) if data.draw(st.booleans()) else axis
    eff = list(lengths)
    kwargs = {"axis": axis_arg, "check": data.draw(st.booleans())}
    if how == "offsets":
        kwargs["offsets"] = torch.tensor([0, *accumulate(lengths)], dtype=index_dtype, device=DEVICE)
    elif how == "lengths":
        kwargs["lengths"] = torch.tensor(lengths, dtype=index_dtype, device=DEVICE)
    else:
        kwargs["segment_ids"] = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch
                                                        .int64)).to(index_dtype).to(DEVICE)
        if data.draw(st.booleans()):
            kwargs["num_segments"] = len(lengths)
        else:  # the last id + 1 segments: trailing empty segments are not seen
            while eff and eff[-1] == 0:
                eff.pop()
    offsets = torch.tensor([0, *accumulate(eff)], dtype=torch.int64)
    what = f"segment_max {_desc(x=x)} lengths {lengths} by {how} {kwargs.get('num_segments')} axis {axis_arg}"
    vals, idxs = gradkern.segment_max(x, **kwargs)
    ref_vals, ref_idxs = run_reference(REGISTRY["segment_max_forward"].reference_fn(), (x, offsets, axis), dtype=None)
    assert_bitwise_equal(vals, ref_vals, f"{what} values")
    assert_bitwise_equal(idxs, ref_idxs, f"{what} indices")
    # backward through autograd, against autograd through the float64 composite (gather from the first argmax)
    g = data.draw(placed(make_values(gen, tuple(vals.shape), dtype, "normal", 2.0)))
    (grad,) = torch.autograd.grad(vals, x, g, allow_unused=True)
    x64 = x.detach().cpu().double().requires_grad_(True)
    with dispatch.use(False):
        v64, _ = segmax_mod._reference_forward(x64, offsets, axis)
        (ref,) = torch.autograd.grad(v64, x64, g.detach().cpu().double(), allow_unused=True)
    ref = torch.zeros_like(x64) if ref is None else ref
    grad = torch.zeros_like(x) if grad is None else grad
    assert_bitwise_equal(grad, ref.to(dtype), f"{what} backward")


def test_segment_max_found_by_fuzzing():
    """Two minimal examples the fuzzer found: data without elements whose strides are not contiguous ones
    (contiguous() keeps them; the layout code then failed with a TypeError), and the registry reference for an
    axis other than 0 (stock segment_reduce wants offsets with data's leading dims)."""
    x = torch.empty(0, 3, 2, device=DEVICE).transpose(1, 2)  # shape (0, 2, 3), strides (6, 1, 2)
    for kw in ({"offsets": torch.tensor([0, 0], device=DEVICE)}, {"lengths": torch.tensor([], device=DEVICE,
                                                                                            dtype=torch.int64)}):
        vals, idxs = gradkern.segment_max(x, **kw)
        assert vals.shape == idxs.shape == (len(kw.get("offsets", [0])) - 1, 2, 3)
        assert not bool(vals.any()) and bool((idxs == 0).all())
    data = torch.tensor([[1.0, 3.0, 3.0, -1.0], [2.0, 0.0, 5.0, 5.0]], device=DEVICE)
    offsets = torch.tensor([0, 1, 1, 4], device=DEVICE)
    vals, idxs = check_case("segment_max_forward", (data, offsets, 1), what="axis 1")
    assert vals.tolist() == [[1.0, 0.0, 3.0], [2.0, 0.0, 5.0]] and idxs.tolist() == [[0, 4, 1], [0, 4, 2]]


# ----------------------------------------------------------------------------------------------- reduction
@SETTINGS
@given(data=st.data(), shape=shapes, gen=generators(), dtype=st.sampled_from(DTYPES),
       out_dtype=st.sampled_from([None, *DTYPES]), kind=st.sampled_from(["normal", "grid"]))
def test_reduce_sum_fuzz(data, shape, gen, dtype, out_dtype, kind):
    rank = max(len(shape), 1)
    picked = data.draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
    dims = tuple(d - rank if data.draw(st.booleans()) else d for d in picked)  # negative dims too
    x = data.draw(placed(make_values(gen, shape, dtype, kind, 3.0)))
    out = reduce_sum(x, dims, op="fuzz", out_dtype=out_dtype)
    want = out_dtype or dtype
    assert out.dtype == want and out.is_contiguous()
    what = f"reduce_sum {_desc(x=x)} dims {dims} out_dtype {out_dtype}"
    sorted_dims = tuple(sorted({d % rank for d in dims})) if len(shape) else ()
    ref = x.detach().cpu().double()
    ref = ref.sum(sorted_dims) if sorted_dims else ref.clone()
    if kind == "grid":  # every partial sum is exact: one rounding, whatever the order
        assert_bitwise_equal(out, ref.to(want), what)
    else:
        assert_sum_close(out, x, sorted_dims, what)


@SETTINGS
@given(data=st.data(), shape=shapes, gen=generators(), dtype=st.sampled_from(DTYPES),
       out_dtype=st.sampled_from([None, *DTYPES]))
def test_sum_to_shape_fuzz(data, shape, gen, dtype, out_dtype):
    target = data.draw(operand_shape(shape))
    x = data.draw(placed(make_values(gen, shape, dtype, "grid")))
    out = sum_to_shape(x, target, op="fuzz", out_dtype=out_dtype)
    want = out_dtype or dtype
    assert tuple(out.shape) == target and out.dtype == want
    ref = x.detach().cpu().double()
    ref = ref.sum_to_size(target) if target else ref.sum()
    assert_bitwise_equal(out, ref.to(want), f"sum_to_shape {_desc(x=x)} to {target} out_dtype {out_dtype}")
