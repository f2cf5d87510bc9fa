"""The shared deterministic reduction (gradkern.reduction): reduce_sum and sum_to_shape against torch.sum in
float64, over layouts (strided, transposed, overlapping, broadcast stride-0), both regimes (one pass; split +
finish), empty and 0-d tensors, every dtype and out_dtype, determinism, int64 offsets and bad inputs."""

import math

import pytest
import torch

from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import InvalidProblem, Unsupported, config
from gradkern.engines import reduction
from gradkern.engines.reduction import reduce_sum, sum_to_shape
from gradkern.launch import launcher
from gradkern.testing import assert_bitwise_equal

_EPS = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _reference(x: torch.Tensor, dims) -> torch.Tensor:
    xd = x.detach().cpu().double()
    return xd.sum(dims) if len(dims) else xd.clone()


def assert_sum_close(out: torch.Tensor, x: torch.Tensor, dims, what: str = "") -> None:
    """`out` is x summed over `dims`: within the result dtype's rounding of the float64 sum plus a summation-error
    bound of the accumulator (a multiple of its epsilon times the sum of |x|)."""
    ref = _reference(x, dims)
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} vs {tuple(ref.shape)}"
    assert out.is_contiguous(), f"{what}: result not contiguous"
    acc = torch.float64 if torch.float64 in (x.dtype, out.dtype) else torch.float32
    abs_sum = x.detach().cpu().double().abs().sum(dims) if len(dims) else x.detach().cpu().double().abs()
    tol = _EPS[out.dtype] * ref.abs() + 64 * _EPS[acc] * abs_sum + 1e-300
    got = out.detach().cpu().double()
    ref_rounded = ref.to(out.dtype).double()  # overflow to inf must agree
    finite = torch.isfinite(ref_rounded)
    assert torch.equal(torch.isnan(got), torch.isnan(ref_rounded)), f"{what}: NaN positions differ"
    assert torch.equal(got[~finite & ~torch.isnan(got)], ref_rounded[~finite & ~torch.isnan(got)]), f"{what}: inf"
    err = (got - ref).abs()[finite]
    bad = err > tol[finite]
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())} of {got.numel()} outside the bound; worst error "
                                 f"{err.max().item():.3e}")


def _randn(shape, dtype, gen_seed=0):
    g = torch.Generator().manual_seed(gen_seed)
    return torch.randn(shape, generator=g).to(dtype).to(DEVICE)


def _ints(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype).to(DEVICE)


# ------------------------------------------------------------------------------------------------ correctness
SHAPES_DIMS = [
    ((37, 5, 11), (0,)), ((37, 5, 11), (1,)), ((37, 5, 11), (2,)), ((37, 5, 11), (0, 2)),
    ((37, 5, 11), (0, 1, 2)), ((37, 5, 11), ()), ((37, 5, 11), (-1, -3)), ((6, 1, 7, 1, 5), (1, 3)),
    ((6, 1, 7, 1, 5), (0, 4)), ((3, 4, 5, 6), (1, 3)), ((2, 3, 2, 3, 2, 3, 2, 3), (0, 2, 4, 6)),
    ((4096, 3), (0,)), ((3, 4096), (1,)), ((70000,), (0,)), ((8, 4099), (1,)), ((5000, 7), (0, 1)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,dims", SHAPES_DIMS, ids=lambda v: str(v).replace(" ", ""))
def test_contiguous(shape, dims, dtype):
    x = _randn(shape, dtype)
    out = reduce_sum(x, dims, op="test")
    assert out.dtype == dtype
    assert_sum_close(out, x, dims, f"{shape} over {dims}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,dims", SHAPES_DIMS[:12], ids=lambda v: str(v).replace(" ", ""))
def test_integer_valued_sums_are_exact(shape, dims, dtype):
    """Small integers sum exactly in any order: the result must equal the float64 sum rounded once."""
    x = _ints(shape, dtype)
    out = reduce_sum(x, dims, op="test")
    assert_bitwise_equal(out, _reference(x, dims).to(dtype), f"{shape} over {dims}")


def _layouts(dtype, make):
    base = make((12, 10, 9), dtype, 1)
    yield "transposed", base.transpose(0, 2)  # (9, 10, 12)
    yield "permuted", base.permute(1, 2, 0)
    yield "sliced", make((24, 10, 18), dtype, 2)[::2, :, ::2]
    yield "offset-slice", make((14, 11, 9), dtype, 3)[1:13, 1:, :]
    yield "broadcast-inner", make((12, 1, 9), dtype, 4).expand(12, 10, 9)
    yield "broadcast-outer", make((1, 10, 9), dtype, 5).expand(12, 10, 9)
    yield "broadcast-all", make((), dtype, 6).expand(12, 10, 9)
    yield "overlapping", make((400,), dtype, 7).as_strided((12, 10, 9), (7, 3, 1))
    yield "channels-last", make((3, 4, 5, 6), dtype, 8).to(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_and_broadcast_inputs_read_in_place(dtype):
    for make in (_randn, _ints):
        for name, x in _layouts(dtype, make):
            for dims in [(0,), (1,), (x.dim() - 1,), (0, x.dim() - 1), tuple(range(x.dim())), (1, 2)]:
                out = reduce_sum(x, dims, op="test")
                if make is _ints:  # small integers: any summation order is exact
                    assert_bitwise_equal(out, _reference(x, dims).to(dtype), f"{name} over {dims} (integers)")
                else:
                    assert_sum_close(out, x, dims, f"{name} over {dims}")


@pytest.mark.parametrize("out_dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_out_dtype(dtype, out_dtype):
    x = _randn((300, 17), dtype)
    for dims in [(0,), (1,), (0, 1)]:
        out = reduce_sum(x, dims, op="test", out_dtype=out_dtype)
        assert out.dtype == out_dtype
        assert_sum_close(out, x, dims, f"{dtype}->{out_dtype} over {dims}")


def test_empty_and_zero_d():
    for dtype in DTYPES:
        x = _randn((0, 5), dtype)
        z = reduce_sum(x, (0,), op="test")  # empty reduction: zeros
        assert z.shape == (5,) and z.dtype == dtype and bool((z == 0).all())
        e = reduce_sum(x, (1,), op="test")  # no outputs
        assert e.shape == (0,)
        assert reduce_sum(x, (0, 1), op="test").item() == 0
        s = _randn((), dtype)
        for dims in [(), (0,), (-1,), 0]:
            r = reduce_sum(s, dims, op="test")
            assert r.shape == () and r.dtype == dtype
            assert_bitwise_equal(r, s)
        r = reduce_sum(s, (), op="test", out_dtype=torch.float64)
        assert r.dtype == torch.float64 and r.item() == s.double().item()
    # a reduction over size-0 and size-1 dims only
    x = _randn((3, 0, 4), torch.float32)
    assert bool((reduce_sum(x, (1,), op="test") == 0).all())
    assert reduce_sum(x, (0, 2), op="test").shape == (0,)


def test_special_values_propagate():
    for dtype in DTYPES:
        x = _randn((64, 5), dtype)
        x[3, 0] = math.nan
        x[4, 1] = math.inf
        x[5, 2] = math.inf
        x[6, 2] = -math.inf
        x[7, 3] = torch.finfo(dtype).max
        x[8, 3] = torch.finfo(dtype).max
        out = reduce_sum(x, (0,), op="test").cpu()
        assert math.isnan(out[0]) and out[1] == math.inf and math.isnan(out[2])
        if dtype != torch.float64:  # accumulated in fp32, overflow happens only at the final rounding
            assert out[3] == math.inf or dtype == torch.float32
        assert torch.isfinite(out[4])


# ------------------------------------------------------------------------------------------------ the two regimes
def _plan(x, dims, out_dtype=None):
    return reduction._get_plan("test", x, dims, out_dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_split_regime_and_single_pass_regime(dtype):
    tall = _randn((20000, 3), dtype)  # few outputs, many terms: split + a second fixed-order pass
    assert len(_plan(tall, (0,)).passes) == 2
    assert_sum_close(reduce_sum(tall, (0,), op="test"), tall, (0,), "tall")
    full = _randn((50000,), dtype)
    assert len(_plan(full, (0,)).passes) == 2
    assert_sum_close(reduce_sum(full, (0,), op="test"), full, (0,), "full")
    rows = _randn((4, 30000), dtype)  # reduction along the contiguous dim, split
    assert len(_plan(rows, (1,)).passes) == 2
    assert_sum_close(reduce_sum(rows, (1,), op="test"), rows, (1,), "rows")
    wide = _randn((16, 64, 4, 16), dtype)  # repeat-like: many outputs, few terms each, one pass
    p = _plan(wide, (0, 2))
    assert len(p.passes) == 1 and p.passes[0].o_contig > 1
    assert_sum_close(reduce_sum(wide, (0, 2), op="test"), wide, (0, 2), "wide")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_step_summed_tiles_and_spread_passes(dtype):
    """Rows that span every thread's vector sum each step at once (STEP_SUM); a pass that is not split, with few
    output tiles, takes narrower tiles (down to 128-byte rows) for more programs. Both against float64."""
    esize = torch.empty((), dtype=dtype).element_size()
    wide = _randn((3, 2**19 // esize), dtype)  # 2 KB rows over 2^19 / 2 KB >= min_programs tiles: not spread
    p = _plan(wide, (0,)).passes[0]
    assert p.step_sum and p.block_o * esize >= 2048 and p.n_oblk >= reduction.CONFIG.current.min_programs
    assert_sum_close(reduce_sum(wide, (0,), op="test"), wide, (0,), "step-summed")
    few = _randn((300, 4096), dtype)  # 300 terms (not split), 4096 outputs: 1 KB rows would be 4 to 8 tiles
    p = _plan(few, (0,)).passes[0]
    assert p.n_split == 1 and p.block_o * esize == 128 and not p.step_sum
    assert p.n_oblk == 4096 * esize // 128
    assert_sum_close(reduce_sum(few, (0,), op="test"), few, (0,), "spread")
    tall = _randn((20000, 64), dtype)  # split; the finishing pass over the fp32 partial sums is spread too
    first, second = _plan(tall, (0,)).passes
    assert first.n_split > 1 and second.block_o * 4 == 128
    assert_sum_close(reduce_sum(tall, (0,), op="test"), tall, (0,), "split, finish spread")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_few_outputs_get_programs_of_their_own(dtype):
    """Few outputs: contiguous rows take one output a program (one pass, no split: prelu's per-channel partials),
    and a short column sum splits into single-step programs until min_programs run (before: 8 programs of 4
    steps and 12.9 us at 4096 x 64 on an H200, now 32 of one step). Both against float64."""
    rows = _randn((64, 1, 3000), dtype)
    (p,) = _plan(rows, (1, 2)).passes
    assert p.block_o == 1 and p.n_oblk == 64 and p.n_split == 1
    assert_sum_close(reduce_sum(rows, (1, 2), op="test"), rows, (1, 2), "a program a row")
    cols = _randn((4096, 64), dtype)
    first, _finish = _plan(cols, (0,)).passes
    steps = math.ceil(4096 / first.block_r)
    assert first.n_oblk == 1 and first.n_split == steps and first.red_per_split == first.block_r
    assert_sum_close(reduce_sum(cols, (0,), op="test"), cols, (0,), "single-step splits")


def test_strided_split_regime():
    x = _randn((30000, 6), torch.float32)[:, ::2]  # stride 6 rows of 3
    assert len(_plan(x, (0,)).passes) == 2
    assert_sum_close(reduce_sum(x, (0,), op="test"), x, (0,), "strided tall")
    b = _randn((1, 40), torch.float32).expand(3000, 40)  # broadcast along the reduced dim
    assert_sum_close(reduce_sum(b, (0,), op="test"), b, (0,), "broadcast tall")


def test_int64_offsets_path():
    """The int64 indexing variant (used when offsets can pass 2^31) gives the same sums: forced by lowering the
    threshold, since a 2^31-element tensor does not fit a CPU test."""
    with config.override(reduction.CONFIG, i32_max=64):
        for shape, dims in [((37, 5, 11), (0, 2)), ((20000, 3), (0,)), ((3, 4096), (1,))]:
            x = _ints(shape, torch.float32)
            p = _plan(x, dims)
            assert p.passes[0].i64
            assert_bitwise_equal(reduce_sum(x, dims, op="test"), _reference(x, dims).float(), f"i64 {shape}")


# ------------------------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bitwise_deterministic(dtype):
    for shape, dims in [((20000, 3), (0,)), ((37, 5, 11), (0, 2)), ((4, 30000), (1,))]:
        x = _randn(shape, dtype, 11) * 1000
        first = reduce_sum(x, dims, op="test")
        assert_bitwise_equal(reduce_sum(x, dims, op="test"), first, f"{shape} again")
        config.clear_plans()  # re-planned from scratch: the same order, the same bits
        assert_bitwise_equal(reduce_sum(x, dims, op="test"), first, f"{shape} re-planned")
        assert_bitwise_equal(reduce_sum(x.clone(), dims, op="test"), first, f"{shape} other storage")


def test_plans_are_cached():
    x = _randn((33, 7), torch.float32)
    assert _plan(x, (0,)) is _plan(x, (0,))
    assert _plan(x, (0,)) is not _plan(x, (1,))


# ------------------------------------------------------------------------------------------------ sum_to_shape
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_sum_to_shape(dtype):
    x = _randn((2, 3, 4, 5), dtype)
    for shape in [(3, 4, 5), (1, 4, 1), (4, 5), (5,), (1,), (), (2, 3, 1, 5), (1, 1, 1, 1), (3, 1, 5)]:
        out = sum_to_shape(x, shape, op="test")
        ref = x.detach().cpu().double().sum_to_size(shape) if shape else x.detach().cpu().double().sum()
        assert tuple(out.shape) == tuple(shape) and out.is_contiguous() and out.dtype == dtype
        lead = x.dim() - len(shape)
        dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
        flat = reduce_sum(x, dims, op="test")
        assert_bitwise_equal(out.reshape(flat.shape), flat, f"sum_to {shape} == reduce_sum")
        assert_sum_close(flat, x, dims, f"sum_to {shape}")
        if dtype == torch.float64:  # and against torch's own sum_to_size, at the same dtype
            assert_sum_close(out, ref.reshape(out.shape), (), f"sum_to {shape} vs torch")


def test_sum_to_shape_identity_conversion_and_views():
    x = _randn((4, 5), torch.float32)
    assert sum_to_shape(x, (4, 5), op="test") is x
    y = sum_to_shape(x, (4, 5), op="test", out_dtype=torch.float64)
    assert y.dtype == torch.float64 and torch.equal(y, x.double())
    one = _randn((1, 1, 4, 5), torch.bfloat16)
    v = sum_to_shape(one, (4, 5), op="test")  # only size-1 leading dims: nothing to add up
    assert v.shape == (4, 5) and torch.equal(v, one[0, 0])
    b = _randn((1, 5), torch.float16).expand(64, 5)
    s = sum_to_shape(b, (1, 5), op="test", out_dtype=torch.float32)
    assert s.shape == (1, 5) and s.dtype == torch.float32
    assert_sum_close(s.view(5), b, (0,), "broadcast bias")


# ------------------------------------------------------------------------------------------------ errors
def test_bad_inputs_raise_named_errors():
    x = _randn((3, 4), torch.float32)
    with pytest.raises(InvalidProblem, match="myop.*dims"):
        reduce_sum(x, (2,), op="myop")
    with pytest.raises(InvalidProblem, match="dims"):
        reduce_sum(x, (0, -2), op="myop")
    with pytest.raises(InvalidProblem, match="dims"):
        reduce_sum(x, ("a",), op="myop")
    with pytest.raises(Unsupported, match="myop.*input"):
        reduce_sum(torch.ones(3, 4, dtype=torch.int32, device=DEVICE), (0,), op="myop")
    with pytest.raises(Unsupported, match="input"):
        reduce_sum([1.0, 2.0], (0,), op="myop")
    with pytest.raises(Unsupported, match="out_dtype"):
        reduce_sum(x, (0,), op="myop", out_dtype=torch.int64)
    with pytest.raises(InvalidProblem, match="myop.*shape"):
        sum_to_shape(x, (2, 4), op="myop")
    with pytest.raises(InvalidProblem, match="shape"):
        sum_to_shape(x, (1, 3, 4), op="myop")
    with pytest.raises(InvalidProblem, match="shape"):
        sum_to_shape(x, (4, 3), op="myop")
    # 9 kept dims that cannot be merged: Unsupported (after merging, at most 8)
    y = _randn((512,), torch.float32).as_strided((2,) * 9, tuple(2**i for i in range(9)))
    with pytest.raises(Unsupported, match="myop"):
        reduce_sum(y, (), op="myop")
    # ... but a high-rank tensor whose dims merge is fine
    z = _randn((2,) * 12, torch.float32)
    assert_sum_close(reduce_sum(z, (0, 5, 11), op="myop"), z, (0, 5, 11), "rank 12")
    if DEVICE == "cpu":
        return
    with pytest.raises(Unsupported, match="input"):
        reduce_sum(torch.ones(3), (0,), op="myop")


# ------------------------------------------------------------------------------------------------ GPU sizes
@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_large_shapes_on_gpu(dtype):
    cases = [
        (_randn((4096, 4096), dtype).view(4, 1024, 4, 1024), (0, 2)),  # repeat (4, 4) backward
        (_randn((1 << 20, 64), dtype), (0,)),  # bias over 1M rows
        (_randn((1 << 22,), dtype), (0,)),  # full sum
        (_randn((256, 64, 256, 64), dtype), (0, 2)),  # 64x64 repeated (256, 256)
        (_randn((64, 16, 4096), dtype), (0, 2)),  # prelu-like: channel in the middle
        (_randn((1 << 20, 64), dtype).t(), (1,)),  # transposed
    ]
    for x, dims in cases:
        out = reduce_sum(x, dims, op="test")
        assert_sum_close(out, x, dims, f"{tuple(x.shape)} over {dims}")
        assert_bitwise_equal(reduce_sum(x, dims, op="test"), out, "again")


def test_pdl_switch_is_read_on_every_call(monkeypatch):
    """`gradkern.launch.launcher.PDL = False` (the README's switch) turns programmatic dependent launch off at once,
    also after launches have asked whether the device can do it."""
    assert not launcher.pdl_ok(-1), "never on the CPU"
    monkeypatch.setattr(launcher, "_pdl_capable", lambda device: True)
    assert launcher.pdl_ok(0)
    monkeypatch.setattr(launcher, "PDL", False)
    assert not launcher.pdl_ok(0)


@gpu_only
def test_passes_launched_as_dependents_see_the_kernel_before():
    """On compute capability 9+ each pass launches as a programmatic dependent (PDL) of the kernel before it in the
    stream, and waits for it before reading: a sum right after the kernel that writes its input, and a split sum's
    second pass right after the first, must see every write. The values are small integers, so every sum is exact:
    x alternates between base and base + 1, and each result must be the exact sum of what was written last."""
    device = torch.cuda.current_device()
    assert launcher.pdl_ok(device) == (launcher.PDL and torch.cuda.get_device_capability(device)[0] >= 9)
    n = 1 << 22
    base = torch.randint(0, 2, (n,), device=DEVICE).float()  # sums < 2^24: exact in float32
    x = torch.empty_like(base)
    rows = x.view(1 << 16, 64)
    want = base.sum().item()
    want_rows = base.view(1 << 16, 64).double().sum(0)
    for i in range(40):
        torch.add(base, i % 2, out=x)  # the kernel right before writes the sum's input
        total = reduce_sum(x, (0,), op="test")  # split: a first pass of partials, then a pass over them
        cols = reduce_sum(rows, (0,), op="test")
        assert total.item() == want + (i % 2) * n, f"call {i}: full sum"
        assert torch.equal(cols.double().cpu(), want_rows.cpu() + (i % 2) * (1 << 16)), f"call {i}: column sums"


def test_cached_plan_does_not_skip_the_device_check():
    """The plan cache is keyed by device too: a meta tensor shaped like an earlier call is still rejected."""
    x = torch.randn(8, 8, device=DEVICE)
    reduce_sum(x, 0, op="t")
    with pytest.raises(Unsupported, match="device"):
        reduce_sum(x.to("meta"), 0, op="t")


def test_tolerance_of_long_float32_sums():
    """check_case's tolerance for a reducing op's smaller results grows with the square root of the terms summed
    (prelu's f32 grad_weight over 16,384 terms per channel missed the one-element tolerance by 1.6e-5 on the GPU),
    for float32 only (16-bit results accumulate in fp32), and still catches a wrong sum."""
    from gradkern.testing import assert_close

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16384, generator=g, dtype=torch.float64)
    x = 10 * (x - x.mean(1, keepdim=True)) + 1e-5  # small sums of large terms: the rounding shows
    exact = x.sum(1)
    fp32_sum = x.float().sum(1)  # an fp32 sum
    with pytest.raises(AssertionError):
        assert_close(fp32_sum, exact)  # the one-element tolerance is too tight for it
    assert_close(fp32_sum, exact, summed_from=x.numel())  # 16,384 terms per result
    wrong = fp32_sum.clone()
    wrong[3] += 1.0  # one term off
    with pytest.raises(AssertionError):
        assert_close(wrong, exact, summed_from=x.numel())
    # bf16: no widening (the error is the final rounding): a result 0.1 off still fails (widened by sqrt(16384)
    # the tolerance would pass it)
    close_bf16 = exact.to(torch.bfloat16)
    assert_close(close_bf16, exact, summed_from=x.numel())
    with pytest.raises(AssertionError):
        assert_close((exact + 0.1).to(torch.bfloat16), exact, summed_from=x.numel())


def test_dims_and_shapes_must_be_ints_even_after_a_cached_plan():
    """Bug: dims and shapes were truncated with int() (0.5 -> 0, 4.7 -> 4), and a plan cached for (0,) was
    found again for (0.0,), skipping validation."""
    x = torch.randn(3, 4, device=DEVICE)
    reduce_sum(x, (0,), op="test")
    for dims in ((0.0,), (0.5,)):
        with pytest.raises(InvalidProblem, match="dims"):
            reduce_sum(x, dims, op="test")
    with pytest.raises(InvalidProblem, match="shape"):
        sum_to_shape(x, (1, 4.7), op="test")


def test_a_cached_plan_does_not_let_a_negative_bit_view_through():
    x = torch.randn(3, 4, device=DEVICE)
    reduce_sum(x, (0,), op="test")
    with pytest.raises(Unsupported, match="negative-bit"):
        reduce_sum(torch._neg_view(x), (0,), op="test")


def test_zero_dim_tensor_dims_are_read_on_every_call():
    """Bug (cache-key review): 0-d tensors among dims were keyed by identity: changed in place, the first plan
    (the first dim) stayed."""
    x = torch.arange(6, device=DEVICE, dtype=torch.float32).view(2, 3)
    d = torch.tensor(0)
    assert_bitwise_equal(reduce_sum(x, [d], op="test"), x.sum(0), "dim 0")
    d.fill_(1)
    assert_bitwise_equal(reduce_sum(x, [d], op="test"), x.sum(1), "dim 1")


# ------------------------------------------------------------------------------------------------ mutation-found gaps
def test_reduced_dims_merge_once_sorted_by_stride():
    """Reduced dims are ordered by stride before merging, whatever order `dims` names them in: 10 dims of a
    reversed permutation (strides increasing with the dim) merge into one, within the 8-dim limit."""
    base = _ints((2,) * 10, torch.float32)
    x = base.permute(*reversed(range(10)))
    assert_bitwise_equal(reduce_sum(x, tuple(range(10)), op="test"), base.sum(), "all 10 dims")
    assert_bitwise_equal(reduce_sum(x, tuple(range(9)), op="test"), _reference(x, tuple(range(9))).float(), "9 dims")


def test_size_one_dims_with_any_stride_are_dropped():
    """A size-1 dim's stride is arbitrary (unsqueeze, transposes, as_strided): such dims must not stop the others
    from merging, kept or reduced: 9 size-2 dims of a contiguous block, interleaved with 9 size-1 dims of
    unrelated strides, are one dim each way."""
    base = _ints((2,) * 9, torch.float32)
    shape = (2, 1) * 9
    strides = tuple(v for i in range(9) for v in (2 ** (8 - i), 1000 + i))
    x = base.as_strided(shape, strides)
    assert torch.equal(x.reshape(base.shape), base)
    assert_bitwise_equal(reduce_sum(x, (), op="test"), x.clone(), "no dims")
    assert_bitwise_equal(reduce_sum(x, tuple(range(18)), op="test"), base.sum(), "all dims")
    odd = tuple(range(1, 18, 2))  # only the size-1 dims
    assert_bitwise_equal(reduce_sum(x, odd, op="test"), base, "the size-1 dims")


def test_exactly_eight_unmergeable_dims_each_way():
    """MAX_RANK is inclusive: 8 kept and 8 reduced dims that do not merge are summed (9 are refused)."""
    x = _ints((2,) * 16, torch.float32)
    red = tuple(range(1, 16, 2))  # kept and reduced dims alternate: neither kind merges
    p = _plan(x, red).passes[0]
    assert len(p.kshape) == 8 and len(p.rshape) == 8
    assert_bitwise_equal(reduce_sum(x, red, op="test"), _reference(x, red).float(), "8 + 8 dims")


def _offsets(shape, stride, n):
    """_flat_offsets on the host: element offsets of flat indices 0..n-1 (the outermost dim unbounded)."""
    idx = torch.arange(n, dtype=torch.int64)
    off = torch.zeros(n, dtype=torch.int64)
    for size, st in list(zip(shape, stride, strict=True))[:0:-1]:
        off += (idx % size) * st
        idx = idx // size
    return off + idx * stride[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_kept_dim_of_unit_stride_across_the_output_takes_tiles(dtype):
    """Where x's unit stride lies on a kept dim other than the result's innermost (repeat's grad transposed or
    channels_last), the pass walks [BT, BI] tiles of the kept dims (`_tiled_sum_kernel`) instead of reading x one
    element a line: the float64 sum within the bound, a fixed order (bitwise repeatable), the plain pass where
    tiles are off (`tiled_tile` 0) or too few (min_programs), and never on a broadcast kept dim."""
    t = _randn((48, 40), dtype, 1).t()  # (40, 48) strides (1, 40): repeat (2, 2) of (20, 24) read as (2, 20, 2, 24)
    cl = _randn((6, 12, 9, 7), dtype, 2).to(memory_format=torch.channels_last)
    cases = [
        (t.view(2, 20, 2, 24), (0, 2)),
        (cl, (0,)),  # kept (C, H*W), C of unit stride
        (cl, (0, 3)),  # kept (C, H), a reduced dim in between
        (_randn((3, 9, 4, 10, 8), dtype, 3).permute(0, 1, 4, 3, 2), (0, 4)),  # kept (9, 8, 10), unit stride on 8
        (_randn((20, 24), dtype, 4).t().unsqueeze(0).expand(5, 24, 20), (0,)),  # broadcast terms
    ]
    with config.override(reduction.CONFIG, tiled_tile=1024, min_programs=1):
        for x, dims in cases:
            what = f"{tuple(x.shape)} {x.stride()} over {dims}"
            (p,) = _plan(x, dims).passes
            assert p.tiled is not None, what
            out = reduce_sum(x, dims, op="test")
            assert_sum_close(out, x, dims, what)
            assert_bitwise_equal(reduce_sum(x, dims, op="test"), out, what)
        with config.override(reduction.CONFIG, i32_max=200):  # 64-bit index math
            x, dims = cases[1]
            assert _plan(x, dims).passes[0].i64
            assert_sum_close(reduce_sum(x, dims, op="test"), x, dims, "int64 offsets")
        expanded = _randn((20, 1), dtype, 5).expand(20, 24).t().unsqueeze(0).expand(3, 24, 20)  # (a stride-0 kept dim)
        assert all(p.tiled is None for p in _plan(expanded, (0,)).passes)
    for changes in ({"tiled_tile": 0, "min_programs": 1}, {"tiled_tile": 1024, "min_programs": 10 ** 6}):
        with config.override(reduction.CONFIG, **changes):
            assert all(p.tiled is None for p in _plan(*cases[0]).passes), changes


def test_ragged_rows_take_smaller_tiles():
    """Outputs contiguous in x in rows that are not a multiple of a 16-byte vector long (11 here) load a few
    elements an address, so their tiles hold at most `ragged_tile_bytes` (repeat (13, 3, 2) of a 50x70x110 f32
    input compiled to 254 registers a thread in 32 KB tiles); rows of 16 keep the long tiles. Sums within bound."""
    for inner, ragged in ((11, True), (16, False)):
        x = _randn((13, 5, 3, 7, 2, inner), torch.float32)
        dims = (0, 2, 4)  # 78 terms an output: the long tiles
        tiles = {}
        for cap in (2048, 0):
            with config.override(reduction.CONFIG, ragged_tile_bytes=cap):
                (p,) = _plan(x, dims).passes
                tiles[cap] = p.block_o * p.block_r * 4
                assert_sum_close(reduce_sum(x, dims, op="test"), x, dims, f"rows of {inner}, cap {cap}")
        assert (tiles[2048] <= 2048 < tiles[0]) is ragged, (inner, tiles)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_contiguity_and_alignment_hints_hold(dtype):
    """The hints a pass gives the compiler (O/R_CONTIG: runs of consecutive offsets, O/R_DIV: the first offset of
    each run a multiple of it) are promises the interpreter never checks, and a false one reads wrong elements
    on a GPU: verified here on the offsets every block (masked tail included) computes."""
    cases = [(x, dims) for _name, x in _layouts(dtype, _randn) for dims in [(0,), (1,), (x.dim() - 1,), (0, 2)]]
    cases += [
        (_randn((3, 5, 17), dtype)[:, :, :16], (0,)),  # rows of 16 at an odd row stride
        (_randn((3, 5, 17), dtype)[:, :, :16], (1,)),
        (_randn((6, 40), dtype)[:, 4:36], (0,)),
        (_randn((40, 6), dtype)[4:36], (1,)),
        (_randn((4, 3, 4, 8), dtype), (0, 2)),  # repeat-like
        (_randn((20000, 3), dtype), (0,)),  # split: the second pass over the workspace too
        (_randn((3, 24), dtype).t(), (1,)),
    ]
    esize = torch.empty((), dtype=dtype).element_size()
    checked = 0
    for x, dims in cases:
        for p in _plan(x, dims).passes:
            for shape, stride, block, contig, div in ((p.kshape, p.kstride, p.block_o, p.o_contig, p.o_div),
                                                      (p.rshape, p.rstride, p.block_r, p.r_contig, p.r_div)):
                what = f"{tuple(x.shape)} {x.stride()} over {dims}: {shape} {stride}, block {block}"
                assert block % contig == 0 and div * esize <= 16, what
                n = math.prod(shape)
                off = _offsets(shape, stride, -(-n // block) * block).view(-1, contig)
                assert torch.equal(off - off[:, :1], torch.arange(contig).expand_as(off)), f"{what}: contig {contig}"
                assert bool((off[:, 0] % div == 0).all()), f"{what}: div {div}"
                checked += contig > 1 or div > 1
    assert checked >= 10


def test_view_plans_are_keyed_by_result_dtype():
    """plan_view's cache holds one plan per result dtype: prelu sums its fp32 partials into a bf16 weight gradient
    for a bf16 input and an f16 one for an f16 input of the same shape, from the same view."""
    x = _ints((6, 5), torch.float32)
    for out_dtype in (torch.bfloat16, torch.float16, torch.float32, torch.bfloat16):
        plan = reduction.plan_view((6, 5), (5, 1), torch.float32, (1,), op="test", out_dtype=out_dtype)
        out = reduction.run_plan(plan, x)
        assert out.dtype == out_dtype
        assert_bitwise_equal(out, _reference(x, (1,)).to(out_dtype), f"-> {out_dtype}")
