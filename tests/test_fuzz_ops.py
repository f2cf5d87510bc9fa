"""Property-based tests (hypothesis) for the ops that are not pointwise, drawing from each op's own random samples
(`register_op(samples=...)`: where / lerp / prelu backward (fused and ATen's `_prelu_kernel_backward`),
replication / reflection pad 1d/2d/3d backward, repeat backward, sparsemax forward / backward, segment_max forward /
backward and `_segment_reduce_backward`, the pooling and upsampling backwards and nll_loss2d_forward), under the
plan variants a sample cannot pick (prelu's and the pads' small tiles, sparsemax's split rows), with grad_input= in a
drawn layout where the op takes one; and for `gradkern.segment_max` (the autograd-aware user function: offsets,
lengths or segment ids) and the shared deterministic reduction (`reduce_sum`, `sum_to_shape`).

Every sample is compared with stock PyTorch through `gradkern.testing.check_case` (the registry reference:
bit-exact for selections, else the dtype's tolerance against float64). The samples keep sums exact where they
matter (values on a k/8 grid), so that cancellation cannot make a correct result miss a fixed tolerance.

Bounded for CI (interpreter-sized problems, GRADKERN_FUZZ_EXAMPLES examples per test, default 15);
GRADKERN_FUZZ_EXAMPLES raises the count (GPU profile). A sample is drawn from a hypothesis-drawn seed, so a failing
example replays exactly."""

import contextlib
import inspect
import math
import os
import random
from itertools import accumulate

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradkern
from conftest import DEVICE, DTYPES, small_pad_tiles, small_prelu_splits
from gradkern import config
from gradkern._cases import SAMPLE_LAYOUTS
from gradkern.engines.reduction import reduce_sum, sum_to_shape
from gradkern.kernels import segment_max as segmax_mod
from gradkern.kernels import sparsemax as sparsemax_mod
from gradkern.registry import REGISTRY
from gradkern.routing import dispatch
from gradkern.testing import arrangeable, assert_bitwise_equal, check_case, place, run_reference
from test_reduction import assert_sum_close

EXAMPLES = int(os.environ.get("GRADKERN_FUZZ_EXAMPLES", "15"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PAD_OPS = [f"{mode}_pad{d}d_backward" for mode in ("replication", "reflection") for d in (1, 2, 3)]
FAMILIES = {
    "where_lerp": ["where_backward", "lerp_backward"],
    "prelu": ["prelu_backward", "_prelu_kernel_backward"],
    "pad": PAD_OPS,
    "repeat": ["repeat_backward"],
    "sparsemax": ["sparsemax_forward", "sparsemax_backward"],
    "segment": ["segment_max_forward", "segment_max_backward", "_segment_reduce_backward"],
    "pool": ["_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward", "avg_pool3d_backward",
             "max_pool3d_with_indices_backward", "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward"],
    "upsample": ["upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_trilinear3d_backward",
                 "upsample_bicubic2d_backward", "_upsample_bilinear2d_aa_backward"],
    "nll_loss": ["nll_loss2d_forward"],
}
seeds = st.integers(0, 2**63 - 1)


def sample(name: str, seed: int, dtype: torch.dtype):
    """The first sample of op `name`'s stream seeded by `seed`."""
    return next(iter(REGISTRY[name].samples(random.Random(seed), DEVICE, dtype)))


def plan_variant(name: str, data) -> contextlib.AbstractContextManager:
    """A plan variant the op's samples cannot pick, drawn: prelu's and the pads' small tiles (several partials
    per channel, border strips crossing tile edges), sparsemax's long-row split at a small row length."""
    if name == "prelu_backward" and data.draw(st.booleans(), label="small tiles"):
        return small_prelu_splits(tile_bytes=128, rows_tpp=3)
    if name in PAD_OPS and data.draw(st.booleans(), label="small tiles"):
        return small_pad_tiles(unroll=1)
    block_max = data.draw(st.sampled_from([None, 4, 16]), label="block_max") if "sparsemax" in name else None
    if block_max is not None:  # rows longer than this are split across programs (the long-row kernels)
        return config.override(sparsemax_mod.CONFIG, block_max=block_max)
    return contextlib.nullcontext()


def out_kwarg(name: str) -> str | None:
    """The op's out= / grad_input= keyword, if it takes one."""
    params = inspect.signature(REGISTRY[name].fn).parameters
    return next((p for p in ("grad_input", "out") if p in params), None)


@pytest.mark.filterwarnings("ignore:where received a uint8 condition")  # the reference's deprecation warning
@pytest.mark.parametrize("family", sorted(FAMILIES))
@SETTINGS
@given(data=st.data(), seed=seeds, dtype=st.sampled_from(DTYPES))
def test_sampled_ops_fuzz(family, data, seed, dtype):
    name = data.draw(st.sampled_from(FAMILIES[family]), label="op")
    case = sample(name, seed, dtype)
    what = f"{name} seed {seed} {case.label}"
    with plan_variant(name, data):
        out = check_case(name, case.args, dict(case.kwargs), what=what)
        kw = out_kwarg(name)
        if kw is not None and data.draw(st.booleans(), label="into a given buffer"):
            # written in place, whatever its layout, with the same bits (the poison must all be overwritten)
            layout = data.draw(st.sampled_from([k for k in SAMPLE_LAYOUTS if k != "exp_rand"]), label="layout")
            given_out = place(torch.full_like(out, math.nan, memory_format=torch.contiguous_format),
                              layout if arrangeable(out.shape, layout) else "contig", random.Random(seed))
            res = REGISTRY[name].fn(*case.args, **case.kwargs, **{kw: given_out})
            assert res is given_out
            assert_bitwise_equal(given_out, out, f"{what} {kw}= {layout}")


def test_prelu_strided_weight_found_by_fuzzing():
    """The fuzzer's minimal example: a weight that is a strided view (w[::2]) was read as if dense by the fused
    kernels (grad_input got w's neighbour in memory: -0.0 here instead of 2.625 * -2.875)."""
    x = torch.tensor([[1.625, -2.875]], device=DEVICE)
    w = torch.tensor([-0.375, 0.0, 2.625, 0.0], device=DEVICE)[::2]
    gi, gw = check_case("prelu_backward", (x, x, w), what="strided weight")
    assert gi.tolist() == [[1.625, 2.625 * -2.875]] and gw.tolist() == [0.0, 2.875 * 2.875]


# ----------------------------------------------------------------------------------------------- segment_max
@st.composite
def placed(draw, base: torch.Tensor, layouts=SAMPLE_LAYOUTS) -> torch.Tensor:
    """`base` (a CPU tensor of any dtype) on the device in a drawn layout (`gradkern.testing.place`: an expanded
    one holds the values at index 0 along its stride-0 dims; the returned tensor is the problem)."""
    layout = draw(st.sampled_from([k for k in layouts if arrangeable(base.shape, k)] or ["contig"]))
    return place(base.to(DEVICE), layout, random.Random(draw(st.integers(0, 2**32 - 1))))


def grid_values(gen, shape, dtype) -> torch.Tensor:
    """k/8 for |k| <= 32: exact in every dtype, and so are sums of thousands of them."""
    return (torch.randint(-32, 33, shape, generator=gen) / 8).to(dtype)


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from(DTYPES),
       lengths=st.lists(st.integers(0, 5), min_size=0, max_size=5),
       other=st.lists(st.integers(1, 4), min_size=0, max_size=2).map(tuple),
       how=st.sampled_from(["offsets", "lengths", "segment_ids"]), index_dtype=st.sampled_from([torch.int32,
                                                                                                torch.int64]))
def test_segment_max_fuzz(data, seed, dtype, lengths, other, how, index_dtype):
    """gradkern.segment_max, the user function: segments as offsets, lengths or ids (with and without
    num_segments), the check, negative axes, and its backward through autograd."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    axis = data.draw(st.integers(0, len(other)))
    shape = other[:axis] + (n,) + other[axis:]
    x = grid_values(gen, shape, dtype)  # grid: ties, so "first argmax" matters
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
    what = f"segment_max x{tuple(x.shape)}:{x.stride()} lengths {lengths} by {how} {kwargs.get('num_segments')} " \
           f"axis {axis_arg}"
    vals, idxs = gradkern.segment_max(x, **kwargs)
    ref_vals, ref_idxs = run_reference(REGISTRY["segment_max_forward"].reference_fn(), (x, offsets, axis), dtype=None)
    assert_bitwise_equal(vals, ref_vals, f"{what} values")
    assert_bitwise_equal(idxs, ref_idxs, f"{what} indices")
    # backward through autograd, against autograd through the float64 composite (gather from the first argmax)
    g = data.draw(placed((torch.randn(tuple(vals.shape), generator=gen) * 2).to(dtype)))
    (grad,) = torch.autograd.grad(vals, x, g, allow_unused=True)
    x64 = x.detach().cpu().double().requires_grad_(True)
    with dispatch.use(False):
        v64, _ = segmax_mod._reference_forward(x64.clone(memory_format=torch.contiguous_format), offsets, axis)
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
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@st.composite
def operand_shape(draw, shape):
    """A shape that broadcasts to `shape`: some leading dims dropped, some others set to 1."""
    rest = shape[draw(st.integers(0, len(shape))):]
    ones = draw(st.lists(st.booleans(), min_size=len(rest), max_size=len(rest)))
    return tuple(1 if one else s for one, s in zip(ones, rest))


@SETTINGS
@given(data=st.data(), shape=shapes, seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from(DTYPES),
       out_dtype=st.sampled_from([None, *DTYPES]), kind=st.sampled_from(["normal", "grid"]))
def test_reduce_sum_fuzz(data, shape, seed, dtype, out_dtype, kind):
    gen = torch.Generator().manual_seed(seed)
    rank = max(len(shape), 1)
    picked = data.draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
    dims = tuple(d - rank if data.draw(st.booleans()) else d for d in picked)  # negative dims too
    values = grid_values(gen, shape, dtype) if kind == "grid" else (torch.randn(shape, generator=gen) * 3).to(dtype)
    x = data.draw(placed(values))
    out = reduce_sum(x, dims, op="fuzz", out_dtype=out_dtype)
    want = out_dtype or dtype
    assert out.dtype == want and out.is_contiguous()
    what = f"reduce_sum x{tuple(x.shape)}:{x.stride()} dims {dims} out_dtype {out_dtype}"
    sorted_dims = tuple(sorted({d % rank for d in dims})) if len(shape) else ()
    ref = x.detach().cpu().double()
    ref = ref.sum(sorted_dims) if sorted_dims else ref.clone()
    if kind == "grid":  # every partial sum is exact: one rounding, whatever the order
        assert_bitwise_equal(out, ref.to(want), what)
    else:
        assert_sum_close(out, x, sorted_dims, what)


@SETTINGS
@given(data=st.data(), shape=shapes, seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from(DTYPES),
       out_dtype=st.sampled_from([None, *DTYPES]))
def test_sum_to_shape_fuzz(data, shape, seed, dtype, out_dtype):
    target = data.draw(operand_shape(shape))
    x = data.draw(placed(grid_values(torch.Generator().manual_seed(seed), shape, dtype)))
    out = sum_to_shape(x, target, op="fuzz", out_dtype=out_dtype)
    want = out_dtype or dtype
    assert tuple(out.shape) == target and out.dtype == want
    ref = x.detach().cpu().double()
    ref = ref.sum_to_size(target) if target else ref.sum()
    assert_bitwise_equal(out, ref.to(want), f"sum_to_shape x{tuple(x.shape)}:{x.stride()} to {target} "
                         f"out_dtype {out_dtype}")
