"""Fused multi-output backwards (where, lerp, prelu) and their autograd integration under enable().

The kernels are checked as plain functions (gradkern.ops.*_backward) against stock PyTorch; then the autograd
path: with enable(), torch.where / torch.lerp / F.prelu / nn.PReLU use the fused backward and give stock's
gradients for every input (any subset requiring grad), under no_grad, in double backward, and fall back to stock
where they must (integer where, forward AD, functorch transforms)."""

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradkern
from conftest import DEVICE, DTYPES, dtype_id, small_prelu_splits
from gradkern import _runtime, config, ops
from gradkern.engines import multi_pointwise
from gradkern.kernels import prelu as prelu_mod
from gradkern.registry import REGISTRY
from gradkern.routing import dispatch
from gradkern.testing import assert_bitwise_equal, assert_close, run_reference, to_reference

FUSED_OPS = ("where_backward", "lerp_backward", "prelu_backward")


def _rand(shape, dtype, scale=1.0):
    return (torch.randn(shape, device=DEVICE) * scale).to(dtype)


def _cond(shape):
    return torch.rand(shape, device=DEVICE) > 0.5


def _compare(ours, ref, dtype, what, exact_against=None):
    """ours within dtype's tolerance of the float64 reference; bit-exact against `exact_against` if given."""
    assert_close(ours, ref, None, what)
    if exact_against is not None:
        assert_bitwise_equal(ours, exact_against, what)


# ============================================================================ kernels as plain functions
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_where_backward_same_shape_is_bit_exact(dtype):
    g = _rand((33, 17), dtype)
    g[0, :6] = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-30]).to(dtype)
    c = _cond((33, 17))
    c[0, :6] = True
    gs, go = ops.where_backward(g, c, g, g)
    assert_bitwise_equal(gs, torch.where(c, g, 0))
    assert_bitwise_equal(go, torch.where(c, 0, g))
    assert gs.dtype == dtype and go.dtype == dtype
    # only the requested gradient is computed
    assert ops.where_backward(g, c, g, g, (True, False))[1] is None
    only_other = ops.where_backward(g, c, g, g, (False, True))
    assert only_other[0] is None
    assert_bitwise_equal(only_other[1], go)
    # a uint8 condition (deprecated, still accepted by PyTorch) means nonzero
    assert_bitwise_equal(ops.where_backward(g, c.to(torch.uint8) * 3, g, g)[0], gs)


WHERE_SHAPES = {  # condition, self, other (grad has their broadcast shape)
    "other (N,1)": ((6, 7), (6, 7), (6, 1)),
    "self (N,1)": ((6, 7), (6, 1), (6, 7)),
    "cond (1,M)": ((1, 7), (6, 7), (6, 7)),
    "cond (N,1), other (M,)": ((6, 1), (6, 7), (7,)),
    "other 0-d": ((6, 7), (6, 7), ()),
    "leading broadcast": ((3, 6, 7), (6, 7), (1, 1, 7)),
    "all 0-d": ((), (), ()),
    "empty": ((0, 7), (0, 7), (1, 7)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", sorted(WHERE_SHAPES))
def test_where_backward_broadcast(case, dtype):
    cs, ss, os_ = WHERE_SHAPES[case]
    shape = torch.broadcast_shapes(cs, ss, os_)
    g, c = _rand(shape, dtype), _cond(cs)
    s, o = _rand(ss, dtype), _rand(os_, dtype)
    ours = ops.where_backward(g, c, s, o)
    assert [t.shape for t in ours] == [s.shape, o.shape]
    ref = run_reference(REGISTRY["where_backward"].reference, (g, c, s, o))
    _compare(ours, ref, dtype, f"where {case}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_summing_pass_sums_trailing_or_leading_dims(dtype, monkeypatch):
    """Gradients summed over B's trailing dims (a per-row operand) or its leading dims (a per-column one) take the
    summing pass: partial sums per program, summed in a fixed order, nothing written at B for them. Several column
    blocks (M > 2048), row blocks with a ragged end, rows split over programs, dims merged, a 0-d operand
    (everything summed), a strided input; against stock in float64. Column sums split over 3 programs at most here,
    so that each walks several row steps."""
    monkeypatch.setattr(multi_pointwise, "COLS_PROGRAMS", 3)
    from gradkern.kernels import lerp as lerp_mod
    from gradkern.kernels import where as where_mod

    cases = (((3, 5000), (3, 1), None), ((300, 5), (300, 1), None), ((2, 3, 4, 5), (2, 3, 1, 1), None),
             ((6, 7), (), None), ((5, 9), (5, 1), "strided"),
             # over the leading dims (a column sum): rows split over programs, several column blocks, merged dims
             ((3000, 7), (7,), None), ((70, 2500), (1, 2500), None), ((3, 4, 5, 6), (5, 6), None),
             ((40, 9), (9,), "strided"))
    for shape, oshape, view in cases:
        # positive grads: sums of thousands of terms that cancel to ~0 have no relative accuracy (stock's neither)
        g, c, s = _rand(shape, dtype).abs() + 0.1, _cond(shape), -_rand(shape, dtype).abs() - 0.1
        if view == "strided":
            g = _rand((shape[0], 2 * shape[1]), dtype)[:, ::2].abs() + 0.1
        o = _rand(oshape, dtype).abs() + 0.1  # (lerp's grad_weight sums g * (end - self) > 0)
        config.clear_plans()
        ours = ops.where_backward(g, c, s, o)
        (plan,) = where_mod._WHERE_BACKWARD._plans.values()
        assert plan.summing, f"{shape} {oshape}: not the summing pass"
        _compare(ours, run_reference(REGISTRY["where_backward"].reference, (g, c, s, o)), dtype, f"where {shape}")
        w = _rand(oshape, dtype)
        config.clear_plans()
        ours = ops.lerp_backward(g, s, o, w)
        (plan,) = lerp_mod._LERP_BACKWARD._plans.values()
        assert plan.summing, f"lerp {shape} {oshape}: not the summing pass"
        _compare(ours, run_reference(REGISTRY["lerp_backward"].reference, (g, s, o, w)), dtype, f"lerp {shape}")


def test_summing_pass_int64_offsets(monkeypatch):
    """The summing pass's int64 index variant (used where offsets can pass 2^31) gives the same results: forced by
    lowering the threshold, since a 2^31-element problem does not fit a CPU test."""
    from gradkern.kernels import where as where_mod

    monkeypatch.setattr(multi_pointwise, "I32_MAX", 64)
    for shape, oshape in (((30, 70), (30, 1)), ((30, 70), (70,))):
        g, c, s = _rand(shape, torch.float32).abs() + 0.1, _cond(shape), _rand(shape, torch.float32)
        o = _rand(oshape, torch.float32)
        config.clear_plans()
        ours = ops.where_backward(g, c, s, o)
        (plan,) = where_mod._WHERE_BACKWARD._plans.values()
        assert plan.summing and plan.i64
        _compare(ours, run_reference(REGISTRY["where_backward"].reference, (g, c, s, o)), torch.float32,
                 f"where i64 {oshape}")
    config.clear_plans()


def test_where_backward_layouts_and_mixed_dtypes():
    g0 = _rand((8, 6, 5), torch.float32)
    c0 = _cond((8, 6, 5))
    for g, c, what in ((g0.transpose(0, 2), c0.transpose(0, 2), "both transposed"),
                       (g0.transpose(0, 2).contiguous(), c0.transpose(0, 2), "cond transposed"),
                       (g0[:, ::2], c0[:, ::2], "strided slices"),
                       (g0[:1, :1, :1].expand(8, 6, 5), c0, "expanded grad (from .sum())"),
                       (g0.permute(2, 0, 1).contiguous().permute(1, 2, 0), c0.permute(2, 0, 1).contiguous()
                        .permute(1, 2, 0), "same dense permutation")):
        gs, go = ops.where_backward(g, c, g, g)
        assert_bitwise_equal(gs, torch.where(c, g, 0), what)
        assert_bitwise_equal(go, torch.where(c, 0, g), what)
    # self bf16, other f64: grad is f64 (the promoted result); each gradient comes back in its input's dtype
    s, o = _rand((8, 6, 5), torch.bfloat16), _rand((6, 1), torch.float64)
    g = _rand((8, 6, 5), torch.float64)
    gs, go = ops.where_backward(g, c0, s, o)
    assert gs.dtype == torch.bfloat16 and go.dtype == torch.float64 and go.shape == (6, 1)
    assert_bitwise_equal(gs, torch.where(c0, g, 0).to(torch.bfloat16))
    assert_close(go, torch.where(c0, 0, g).double().sum((0, 2)).view(6, 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_lerp_backward_scalar_weight_is_bit_exact_with_stock(dtype):
    """A Python-number weight: g*(1-w) and g*w with the scalars rounded as ATen rounds a Scalar."""
    g = _rand((40, 9), dtype)
    for w in (0.3, -1.5, 0.0, 1.0, 1 / 3):
        gs, ge, gw = ops.lerp_backward(g, g, g, w)
        assert gw is None
        assert_bitwise_equal(gs, g * (1 - w), f"w={w}")
        assert_bitwise_equal(ge, g * w, f"w={w}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_lerp_backward_tensor_weight(dtype):
    g, a, b = _rand((40, 9), dtype), _rand((40, 9), dtype), _rand((40, 9), dtype)
    w = torch.rand((40, 9), device=DEVICE).to(dtype)
    ours = ops.lerp_backward(g, a, b, w)
    ref = run_reference(REGISTRY["lerp_backward"].reference, (g, a, b, w))
    # f32/f64: the same operations in the same dtype as stock, so the same bits
    stock = REGISTRY["lerp_backward"].reference(g, a, b, w) if dtype in (torch.float32, torch.float64) else None
    _compare(ours, ref, dtype, "lerp tensor weight", stock)
    # each subset of gradients
    for mask in ((True, False, False), (False, True, False), (False, False, True), (False, True, True)):
        part = ops.lerp_backward(g, a, b, w, mask)
        for want, got, full in zip(mask, part, ours, strict=True):
            assert (got is None) == (not want)
            if want:
                assert_bitwise_equal(got, full, f"mask {mask}")


LERP_SHAPES = {  # self, end, weight
    "weight (N,1)": ((6, 7), (6, 7), (6, 1)),
    "end (N,1)": ((6, 7), (6, 1), (6, 7)),
    "self (M,)": ((7,), (6, 7), (6, 7)),
    "weight 0-d": ((6, 7), (6, 7), ()),
    "all broadcast": ((1, 7), (6, 1), (3, 1, 1)),
    "empty": ((0, 7), (0, 7), (7,)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", sorted(LERP_SHAPES))
def test_lerp_backward_broadcast(case, dtype):
    ss, es, ws = LERP_SHAPES[case]
    a, b = _rand(ss, dtype), _rand(es, dtype)
    w = torch.rand(ws, device=DEVICE).to(dtype)
    g = _rand(torch.broadcast_shapes(ss, es, ws), dtype)
    ours = ops.lerp_backward(g, a, b, w)
    assert [t.shape for t in ours] == [a.shape, b.shape, w.shape]
    _compare(ours, run_reference(REGISTRY["lerp_backward"].reference, (g, a, b, w)), dtype, f"lerp {case}")


@pytest.mark.parametrize("ss, es", [((), (6, 7)), ((1, 7), (6, 1)), ((6, 7), ())])
def test_lerp_backward_scalar_weight_broadcast_matches_stock_autograd(ss, es):
    """A Python-number weight with broadcast self/end: each gradient summed to its input's shape, as autograd's
    engine does (the registry reference once left them at the broadcast shape)."""
    a = _rand(ss, torch.float64).requires_grad_(True)
    b = _rand(es, torch.float64).requires_grad_(True)
    g = _rand(torch.broadcast_shapes(ss, es), torch.float64)
    want = torch.autograd.grad(torch.lerp(a, b, 0.3), (a, b), g)
    gs, ge, _ = ops.lerp_backward(g, a.detach(), b.detach(), 0.3)
    ref = REGISTRY["lerp_backward"].reference(g, a.detach(), b.detach(), 0.3)
    for got, r, w in zip((gs, ge), ref[:2], want, strict=True):
        assert got.shape == w.shape and r.shape == w.shape
        assert_close(got, w, torch.float64)
        assert_close(r, w, torch.float64)


def test_lerp_backward_zero_dim_weight_of_another_dtype():
    """PyTorch lets a 0-d weight differ in dtype from self; its gradient comes back in its own dtype."""
    a, b, g = _rand((5, 4), torch.float32), _rand((5, 4), torch.float32), _rand((5, 4), torch.float32)
    w = torch.tensor(0.3, device=DEVICE, dtype=torch.float64)
    gs, ge, gw = ops.lerp_backward(g, a, b, w)
    assert gw.dtype == torch.float64 and gw.shape == ()
    # computed in float32 (the inputs' math dtype, as stock does): float32's tolerance for all three
    assert_close((gs, ge, gw), run_reference(REGISTRY["lerp_backward"].reference, (g, a, b, w)), torch.float32)


PRELU_INPUTS = {  # input shape, weight elements, layout
    "NCHW": ((3, 4, 5, 6), 4, None),
    "C == W (channel is dim 1, not the last)": ((2, 5, 3, 5), 5, None),
    "C == W channels_last": ((2, 5, 3, 5), 5, torch.channels_last),
    "NCHW small spatial (column kernel)": ((6, 7, 2, 3), 7, None),
    "channels_last": ((3, 4, 5, 6), 4, torch.channels_last),
    "channels_last_3d": ((2, 3, 4, 5, 3), 3, torch.channels_last_3d),
    "NCDHW": ((2, 3, 4, 5, 3), 3, None),
    "(N, C)": ((9, 6), 6, None),
    "(N, C) several column blocks": ((5, 150), 150, None),
    "channels_last several column blocks": ((2, 80, 2, 3), 80, torch.channels_last),
    "(N, C, L)": ((4, 3, 40), 3, None),
    "1-D": ((37,), 1, None),
    "0-d": ((), 1, None),
    "one weight NCHW": ((3, 4, 5, 6), 1, None),
    "one weight channels_last": ((3, 4, 5, 6), 1, torch.channels_last),
    "one weight (N, C)": ((9, 6), 1, None),
    "transposed (strided path)": ((3, 4, 5, 6), 4, "transposed"),
    "empty": ((0, 4, 3), 4, None),
}


def _layout(t, layout):
    if layout == "transposed":
        return t.transpose(2, 3).contiguous().transpose(2, 3)
    return t.contiguous(memory_format=layout) if layout is not None else t


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", sorted(PRELU_INPUTS))
def test_prelu_backward_layouts(case, dtype):
    shape, c, layout = PRELU_INPUTS[case]
    x = _layout(_rand(shape, dtype, 2.0), layout)
    g = _layout(_rand(shape, dtype), layout)
    w = _rand((c,), dtype, 0.25)
    gi, gw = ops.prelu_backward(g, x, w)
    ref = run_reference(REGISTRY["prelu_backward"].reference, (g, x, w))
    assert gi.shape == x.shape and gw.shape == w.shape and gi.dtype == gw.dtype == dtype
    _compare((gi, gw), ref, dtype, f"prelu {case}")
    # grad_input is a selection or one product: bit-exact against stock at the same dtype
    w_b = w.view([1, c] + [1] * (x.dim() - 2)) if x.dim() >= 2 else w.view([1] * x.dim())
    stock_gi = torch.where(x > 0, g, w_b * g)
    assert_bitwise_equal(gi, stock_gi, f"prelu {case} grad_input")
    if layout in (torch.channels_last, torch.channels_last_3d):
        assert gi.is_contiguous(memory_format=layout)
    for mask in ((True, False), (False, True)):
        part = ops.prelu_backward(g, x, w, mask)
        assert (part[0] is None, part[1] is None) == (not mask[0], not mask[1])
        for got, full in zip(part, (gi, gw), strict=True):
            if got is not None:
                assert_bitwise_equal(got, full, f"prelu {case} mask {mask}")


@pytest.mark.parametrize("case", ["x NCHW, g channels_last", "x channels_last, g NCHW", "x NCHW, g expanded",
                                  "one weight: x NCHW, g channels_last", "one weight: x channels_last, g NCHW"])
def test_prelu_backward_mixed_layouts(case):
    """x and grad in different layouts: each is read through its own strides (no fused kernel reads g by x's)."""
    c = 1 if case.startswith("one weight") else 4
    x = _rand((3, 4, 5, 6), torch.float32, 2.0)
    g = _rand((3, 4, 5, 6), torch.float32)
    if "x channels_last" in case:
        x = x.contiguous(memory_format=torch.channels_last)
    if "g channels_last" in case:
        g = g.contiguous(memory_format=torch.channels_last)
    if "g expanded" in case:
        g = g[:1].expand(3, 4, 5, 6)
    w = _rand((c,), torch.float32, 0.25)
    gi, gw = ops.prelu_backward(g, x, w)
    _compare((gi, gw), run_reference(REGISTRY["prelu_backward"].reference, (g, x, w)), torch.float32, case)
    assert_bitwise_equal(gi, torch.where(x > 0, g, w.view(1, c, 1, 1) * g), f"prelu {case} grad_input")


def test_prelu_c_equals_w_takes_the_channel_from_dim_1():
    """FlagGems' prelu backward took the channel from the last dim; with C == W that is silently wrong. Here each
    channel's weight is distinct and x is negative everywhere, so grad_input = w[c] * g must follow dim 1."""
    x = -torch.rand(2, 5, 3, 5, device=DEVICE) - 0.1
    w = torch.arange(1, 6, device=DEVICE, dtype=torch.float32)
    g = torch.ones_like(x)
    gi, gw = ops.prelu_backward(g, x, w)
    assert torch.equal(gi, w.view(1, 5, 1, 1).expand_as(x))
    assert_close(gw, x.double().sum((0, 2, 3)))
    assert not torch.equal(gi, w.view(1, 1, 1, 5).expand_as(x))


def test_prelu_boundary_values():
    """x = 0 (and -0) takes the w*g branch with no weight gradient; NaN x gives w*g and a NaN weight gradient."""
    x = torch.tensor([0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e-30], device=DEVICE)
    g = torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], device=DEVICE)
    w = torch.tensor([0.5], device=DEVICE)
    gi, gw = ops.prelu_backward(g, x, w)
    assert gi.tolist()[:4] == [1.0, 1.5, 4.0, 2.5]
    assert gi[4].item() == 3.0 and gi[5].item() == 7.0 and gi[6].item() == 4.0
    assert math.isnan(gw.item())
    gi2, gw2 = ops.prelu_backward(g[:4], x[:4], w)
    assert gw2.item() == -5.0
    full_gi, full_gw = ops._prelu_kernel_backward(g, x, w)
    assert_bitwise_equal((full_gi, full_gw), run_reference(torch.ops.aten._prelu_kernel_backward, (g, x, w),
                                                           dtype=None))
    # the same values through the column kernel ((N, C) and channels_last: C innermost), two channels
    w2 = torch.tensor([0.5, 0.25], device=DEVICE)
    for xs, gs in ((x.view(4, 2), g.view(4, 2)),
                   (x.view(1, 4, 1, 2).permute(0, 3, 1, 2), g.view(1, 4, 1, 2).permute(0, 3, 1, 2))):
        gi3, gw3 = ops.prelu_backward(gs, xs, w2)
        wb = w2.view([1, 2] + [1] * (xs.dim() - 2))
        assert_bitwise_equal(gi3, torch.where(xs > 0, gs, wb * gs), f"column kernel {xs.shape}")
        ref = run_reference(REGISTRY["prelu_backward"].reference, (gs, xs, w2), dtype=None)[1]
        assert torch.equal(torch.isnan(gw3).cpu(), torch.isnan(ref)) and gw3[1].item() == ref[1].item()  # (ref: CPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_prelu_split_reduction_is_fixed_order(dtype):
    """Force many tiles per program and a multi-partial second pass; results stay right and bitwise stable."""
    with small_prelu_splits(tile_bytes=256, rows_tpp=5):
        _check_prelu_splits(dtype)


def _check_prelu_splits(dtype):
    for shape, layout in (((5, 3, 9, 20), None), ((7, 6, 3, 5), torch.channels_last), ((700,), None)):
        c = shape[1] if len(shape) > 1 else 1
        x, g = _layout(_rand(shape, dtype, 2.0), layout), _layout(_rand(shape, dtype), layout)
        w = _rand((c,), dtype, 0.25)
        plan = prelu_mod._fused_plan(x, g, c)
        assert plan is not None and math.prod(plan.part_shape) > c  # several partials per channel
        first = ops.prelu_backward(g, x, w)
        _compare(first, run_reference(REGISTRY["prelu_backward"].reference, (g, x, w)), dtype, f"split {shape}")
        assert_bitwise_equal(ops.prelu_backward(g, x, w), first, "run twice")


def test_prelu_column_kernel_splits_wide_rows_into_blocks():
    """Rows wider than _COLS_BK columns are walked by several programs a range of rows (the last block masked)."""
    for case in ("(N, C) several column blocks", "channels_last several column blocks"):
        shape, c, layout = PRELU_INPUTS[case]
        x = _layout(_rand(shape, torch.float32), layout)
        plan = prelu_mod._fused_plan(x, x, c)
        assert not plan.rows and plan.args[4] == -(-c // prelu_mod._COLS_BK) > 1, case  # NKB


def test_prelu_row_kernel_caps_its_partials(monkeypatch):
    """The row kernel makes at most _ROWS_MAX_PARTIALS[element size] partials a channel, giving programs more tiles
    instead; every tile is still walked once (checked against stock with the cap forced low)."""
    cap = prelu_mod._ROWS_MAX_PARTIALS[2]
    for A, C, L in ((1, 1, 1 << 26), (64, 64, 1 << 14), (3, 5, 77)):
        plan = prelu_mod._rows_plan(A, C, L, 4096, 2)
        _a, _c, _l, _nb, tiles, tpp, split = plan.args
        assert split <= cap and (split - 1) * tpp < tiles <= split * tpp
    assert prelu_mod._rows_plan(1, 1, 1 << 26, 4096, 2).part_shape == (1, cap)
    monkeypatch.setattr(prelu_mod, "_ROWS_MAX_PARTIALS", {4: 3})
    monkeypatch.setattr(prelu_mod, "_TILE_BYTES", 64)
    monkeypatch.setattr(prelu_mod, "_plans", {})
    for shape, c in (((700,), 1), ((4, 3, 50), 3)):
        x, g, w = _rand(shape, torch.float32, 2.0), _rand(shape, torch.float32), _rand((c,), torch.float32, 0.25)
        assert prelu_mod._fused_plan(x, g, c).part_shape == (c, 3)
        _compare(ops.prelu_backward(g, x, w), run_reference(REGISTRY["prelu_backward"].reference, (g, x, w)),
                 torch.float32, f"capped partials {shape}")


def test_fused_relaunch_keys_follow_scalar_specialisation():
    """Fused kernels are relaunched directly, keyed by what Triton specialises their integer arguments on. lerp's
    Python-number weight w enters as the float64 bits of 1 - w and w: for w = 5e-324 the second is 1, which
    Triton compiles in as a constant; for w = 0.0 it is 0. A kernel compiled for one must not serve the other
    (grad_end = g * 5e-324 is not 0 in f64). The flat path (contiguous grad) and the strided one (a non-dense
    view), at two offsets each."""
    buf = _rand((64 * 131,), torch.float64)
    for w in (5e-324, 0.0, 5e-324, 0.1, 0.0, 5e-324):
        for start in (0, 1):
            for grad in (buf[start:start + 64 * 128].view(64, 128), buf.view(64, 131)[:, start:start + 128:2]):
                x = torch.zeros_like(grad)
                gs, ge, gw = ops.lerp_backward(grad, x, x, w)
                assert gw is None
                what = f"w={w} offset {start} strides {grad.stride()}"
                assert_bitwise_equal(gs, grad * (1.0 - w), f"grad_self {what}")
                assert_bitwise_equal(ge, grad * w, f"grad_end {what}")


def test_prelu_relaunch_cache_respects_alignment():
    """The fused kernels are relaunched directly after their first launch, keyed by plan, output mask and the
    pointers' 16-byte alignment: views at an odd element offset (not aligned) must not reuse a kernel compiled for
    aligned ones, nor the other way round."""
    for shape, layout in (((4, 6, 5, 8), None), ((4, 6, 5, 8), torch.channels_last), ((64, 10), None)):
        n = math.prod(shape)
        bx, bg = _rand((n + 1,), torch.float32, 2.0), _rand((n + 1,), torch.float32)
        w = _rand((shape[1],), torch.float32, 0.25)
        for start in (0, 1, 0, 1):
            x = _layout(bx[start:start + n].view(shape), layout)
            g = _layout(bg[start:start + n].view(shape), layout)
            _compare(ops.prelu_backward(g, x, w), run_reference(REGISTRY["prelu_backward"].reference, (g, x, w)),
                     torch.float32, f"prelu {shape} {layout} offset {start}")


def test_prelu_kernel_backward_keeps_atens_full_shape_result():
    x, g = _rand((2, 3, 4, 5), torch.float32), _rand((2, 3, 4, 5), torch.float32)
    w = _rand((1, 3, 1, 1), torch.float32)
    gi, gw = ops._prelu_kernel_backward(g, x, w)
    assert gi.shape == gw.shape == x.shape
    assert_bitwise_equal((gi, gw), torch.ops.aten._prelu_kernel_backward(g, x, w))
    xt = x.transpose(1, 3)  # strided, weight broadcast along what is now dim 3
    assert_bitwise_equal(ops._prelu_kernel_backward(g.transpose(1, 3), xt, w.transpose(1, 3)),
                         torch.ops.aten._prelu_kernel_backward(g.transpose(1, 3), xt, w.transpose(1, 3)))


# ============================================================================ bad input
def _launches(monkeypatch):
    """Record every kernel launch the fused ops make (a rejected call must make none)."""
    calls = []

    def spy(real):
        return lambda *a, **k: (calls.append(a[0]), real(*a, **k))[1]

    monkeypatch.setattr(multi_pointwise, "launch", spy(multi_pointwise.launch))
    monkeypatch.setattr(prelu_mod, "launch", spy(prelu_mod.launch))
    return calls


def test_bad_inputs_raise_named_errors_before_any_launch(monkeypatch):
    calls = _launches(monkeypatch)
    x, g = _rand((2, 3, 4), torch.float32), _rand((2, 3, 4), torch.float32)
    w3 = _rand((3,), torch.float32)
    a, b = _rand((3, 5), torch.float32), _rand((3, 5), torch.float32)
    c = _cond((3, 5))
    cases = [
        # prelu: PyTorch's weight rule (1 or C = size(1) elements, at most 1-D), no type promotion
        ("prelu_backward", gradkern.InvalidProblem, "weight", lambda: ops.prelu_backward(g, x, _rand((4,), x.dtype))),
        ("prelu_backward", gradkern.InvalidProblem, "weight", lambda: ops.prelu_backward(g, x, w3.view(3, 1))),
        ("prelu_backward", gradkern.InvalidProblem, "weight",
         lambda: ops.prelu_backward(g[0, 0, 0], x[0, 0, 0], w3)),
        ("prelu_backward", gradkern.InvalidProblem, "weight",
         lambda: ops.prelu_backward(g[0, 0], x[0, 0], _rand((4,), x.dtype))),
        ("prelu_backward", gradkern.Unsupported, "weight", lambda: ops.prelu_backward(g, x, w3.double())),
        ("prelu_backward", gradkern.InvalidProblem, "grad_output", lambda: ops.prelu_backward(g[:1], x, w3)),
        ("prelu_backward", gradkern.Unsupported, "self", lambda: ops.prelu_backward(g, x.to(torch.int32), w3)),
        ("prelu_backward", gradkern.InvalidProblem, "output_mask", lambda: ops.prelu_backward(g, x, w3, (True,))),
        ("_prelu_kernel_backward", gradkern.InvalidProblem, "broadcast",
         lambda: ops._prelu_kernel_backward(g, x, _rand((5,), x.dtype))),
        # a non-tensor self was once read for its dtype before being checked (AttributeError, not the named error)
        ("_prelu_kernel_backward", gradkern.Unsupported, "self",
         lambda: ops._prelu_kernel_backward(g, x.tolist(), w3)),
        ("prelu_backward", gradkern.Unsupported, "self", lambda: ops.prelu_backward(g, x.tolist(), w3)),
        # lerp: shapes that do not broadcast, dtypes PyTorch rejects
        ("lerp_backward", gradkern.InvalidProblem, "broadcast", lambda: ops.lerp_backward(a, a, b[:, :4], 0.5)),
        ("lerp_backward", gradkern.InvalidProblem, "broadcast",
         lambda: ops.lerp_backward(a, a, b, _rand((2, 5), a.dtype))),
        ("lerp_backward", gradkern.InvalidProblem, "grad", lambda: ops.lerp_backward(a[:1], a, b, 0.5)),
        ("lerp_backward", gradkern.Unsupported, "end", lambda: ops.lerp_backward(a, a, b.double(), 0.5)),
        ("lerp_backward", gradkern.Unsupported, "weight", lambda: ops.lerp_backward(a, a, b, b.double())),
        ("lerp_backward", gradkern.Unsupported, "weight", lambda: ops.lerp_backward(a, a, b, 0.5j)),
        # where: a condition that is not bool (or the deprecated uint8), shapes, scalar operands asked for a grad
        ("where_backward", gradkern.Unsupported, "condition", lambda: ops.where_backward(a, a, a, b)),
        ("where_backward", gradkern.Unsupported, "condition",
         lambda: ops.where_backward(a, c.to(torch.int64), a, b)),
        ("where_backward", gradkern.InvalidProblem, "broadcast", lambda: ops.where_backward(a, c, a, b[:, :4])),
        ("where_backward", gradkern.InvalidProblem, "grad", lambda: ops.where_backward(a[:, :1], c, a, b)),
        ("where_backward", gradkern.Unsupported, "other", lambda: ops.where_backward(a, c, a, 0.5)),
        ("where_backward", gradkern.Unsupported, "self", lambda: ops.where_backward(a, c, c.int(), b)),
        ("where_backward", gradkern.InvalidProblem, "output_mask", lambda: ops.where_backward(a, c, a, b, (1, 1, 1))),
        ("where_backward", gradkern.InvalidProblem, "output_mask", lambda: ops.where_backward(a, c, a, b, "ab")),
    ]
    for op, err, word, call in cases:
        with pytest.raises(err, match=word) as info:
            call()
        assert str(info.value).startswith(f"{op}:"), str(info.value)
    assert not calls, "a rejected call launched a kernel"
    assert ops.where_backward(a, c, a, 0.5, (True, False))[1] is None  # a scalar operand is fine unasked


def test_bad_inputs_under_enable_raise_stocks_errors():
    """With enable(), invalid calls fail exactly as stock PyTorch does (the forward is stock's)."""
    x = torch.randn(2, 3, 4, device=DEVICE, requires_grad=True)
    a = torch.randn(3, 5, device=DEVICE, requires_grad=True)
    calls = [lambda: F.prelu(x, torch.randn(4, device=DEVICE)),
             lambda: torch.lerp(a, torch.randn(3, 4, device=DEVICE), 0.5),
             lambda: torch.where(torch.ones(3, 5, device=DEVICE), a, a)]
    for call in calls:
        with pytest.raises(RuntimeError) as stock:
            call()
        with gradkern.use(mode="always"), pytest.raises(RuntimeError) as ours:
            call()
        assert type(ours.value) is type(stock.value) and str(ours.value) == str(stock.value)


# ============================================================================ autograd integration
def _grads(fn, inputs, needs, g=None, dtype=None):
    """Run fn on fresh leaves (float inputs cast to `dtype` on CPU if given; requires_grad per `needs`) and
    backpropagate g (default: a fixed random one). Returns (output, grad_fn name, input gradients, g)."""
    leaves = []
    for t, need in zip(inputs, needs, strict=True):
        if isinstance(t, torch.Tensor):
            t = to_reference(t, dtype) if dtype is not None else t.detach().clone()
            t.requires_grad_(need)
        leaves.append(t)
    out = fn(*leaves)
    if g is None:
        gen = torch.Generator(device=out.device).manual_seed(0)
        g = torch.randn(out.shape, generator=gen, device=out.device, dtype=torch.float32).to(out.dtype)
    wanted = [leaf for leaf, need in zip(leaves, needs, strict=True) if need]
    grads = torch.autograd.grad(out, wanted, to_reference(g, dtype) if dtype is not None else g)
    return out, type(out.grad_fn).__name__, grads, g


def check_autograd(fn, inputs, needs, *, exact=False, fused=True):
    """Gradients with enable() equal stock PyTorch's for every input that requires grad: within the dtype's
    tolerance of stock in float64 (bit-exact against stock at the same dtype where `exact`); the forward is
    stock's, bit for bit; the fused backward ran (`fused`), and none of the gradients is missing or zero where
    stock's is not."""
    with gradkern.use(False):
        stock_out, stock_fn, stock, g = _grads(fn, inputs, needs)
        ref = _grads(fn, inputs, needs, g, dtype=torch.float64)[2]
    with gradkern.use(mode="always"):
        out, node, ours, _ = _grads(fn, inputs, needs, g)
    assert node.startswith("Gradkern") == fused, f"grad_fn {node} (stock: {stock_fn})"
    assert_bitwise_equal(out, stock_out, "forward")
    assert len(ours) == len(stock) == sum(needs)
    for i, (o, s, r) in enumerate(zip(ours, stock, ref, strict=True)):
        assert o.shape == s.shape and o.dtype == s.dtype, f"grad {i}: {o.shape} {o.dtype} vs {s.shape} {s.dtype}"
        assert_close(o, r, None, f"grad {i}")
        if exact:
            assert_bitwise_equal(o, s, f"grad {i}")
        if bool((s != 0).any()):
            assert bool((o != 0).any()), f"grad {i} is all zeros where stock's is not"
    return ours


NEEDS2 = [(True, True), (True, False), (False, True)]


@pytest.mark.parametrize("shapes", [((2, 0), (0,)), ((0, 3), (0, 1)), ((0, 3), (3,)), ((3, 2, 0, 7), (0, 7))],
                         ids=["kept-empty", "rows-empty", "rows-empty-row", "prelu-like"])
def test_empty_broadcast_shapes(shapes):
    """Empty problems whose summed-back operand has another shape (the summing pass's view of an empty B): where,
    lerp (scalar and tensor weight) and _prelu_kernel give stock's empty or zero gradients (a ZeroDivisionError
    when planning the summing pass's tiles before)."""
    big, small = shapes
    c = torch.ones(big, dtype=torch.bool, device=DEVICE)
    cases = [(lambda a, b: torch.where(c, a, b), (_rand(big, torch.float32), _rand(small, torch.float32))),
             (lambda a, b: torch.lerp(b, a, 0.5), (_rand(big, torch.float32), _rand(small, torch.float32))),
             (lambda a, b, w: torch.lerp(b, a, w), (_rand(big, torch.float32), _rand(small, torch.float32),
                                                     _rand(small, torch.float32)))]
    if len(big) == 4:
        cases.append((torch.ops.aten._prelu_kernel, (_rand(big, torch.float32), _rand(small, torch.float32))))
    for fn, inputs in cases:
        outs = []
        for enabled in (False, True):
            with gradkern.use(enabled, mode="always"):
                outs.append(_grads(fn, inputs, [True] * len(inputs))[2])
        for o, st in zip(outs[1], outs[0], strict=True):
            assert o.shape == st.shape and o.dtype == st.dtype
            assert_bitwise_equal(o, st)
    g = _rand(big, torch.float32)
    assert [t.shape for t in ops.where_backward(g, c, g, _rand(small, torch.float32))] == [big, small]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("needs", NEEDS2, ids=["both", "self", "other"])
def test_torch_where_autograd(needs, dtype):
    c = _cond((6, 7))
    x, y = _rand((6, 7), dtype), _rand((6, 7), dtype)
    check_autograd(lambda c, x, y: torch.where(c, x, y), (c, x, y), (False, *needs), exact=True)
    check_autograd(lambda c, x, y: x.where(c, y), (c, x, y), (False, *needs), exact=True)
    yb = _rand((6, 1), dtype)
    check_autograd(lambda c, x, y: torch.where(c, x, y), (c, x, yb), (False, *needs))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_torch_where_scalar_operands_autograd(dtype):
    """`where(c, x, 0.0)` / `where(c, 1.0, y)` are CompositeImplicitAutograd overloads (ScalarOther /
    ScalarSelf): they decompose into where.self above the autograd key, so they reach the fused backward - the
    path FlagGems #1971 broke by registering them on the backend key."""
    c = _cond((5, 8))
    x = _rand((5, 8), dtype)
    check_autograd(lambda c, x: torch.where(c, x, 0.0), (c, x), (False, True), exact=True)
    check_autograd(lambda c, x: torch.where(c, 1.5, x), (c, x), (False, True), exact=True)
    check_autograd(lambda c, x: torch.where(c, x, torch.tensor(2.0, device=x.device, dtype=x.dtype)), (c, x),
                   (False, True), exact=True)
    # mixed dtypes: each gradient in its input's dtype
    y = _rand((8,), torch.float64)
    check_autograd(lambda c, x, y: torch.where(c, x, y), (c, x, y), (False, True, True))


NEEDS3 = [tuple(bool(m >> i & 1) for i in range(3)) for m in range(1, 8)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("needs", NEEDS3, ids=lambda n: "+".join(k for k, v in zip("sew", n, strict=True) if v))
def test_torch_lerp_tensor_weight_autograd(needs, dtype):
    a, b = _rand((6, 7), dtype), _rand((6, 7), dtype)
    w = torch.rand((6, 7), device=DEVICE).to(dtype)
    exact = dtype in (torch.float32, torch.float64)
    check_autograd(torch.lerp, (a, b, w), needs, exact=exact)
    check_autograd(torch.lerp, (a, b[:1], torch.rand((6, 1), device=DEVICE).to(dtype)), needs)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("needs", NEEDS2, ids=["both", "self", "end"])
def test_torch_lerp_scalar_weight_autograd(needs, dtype):
    a, b = _rand((6, 7), dtype), _rand((6, 7), dtype)
    check_autograd(lambda a, b: torch.lerp(a, b, 0.3), (a, b), needs, exact=True)
    check_autograd(lambda a, b: a.lerp(b, -0.7), (a, b), needs, exact=True)
    check_autograd(lambda a, b: torch.lerp(a, b, 0.25), (a[:1], b), needs)


def test_lerp_saves_only_what_the_requested_gradients_need():
    a, b, w = (torch.randn(4, 3, device=DEVICE) for _ in range(3))
    with gradkern.use(mode="always"):
        out = torch.lerp(a.requires_grad_(), b, w)
        assert [t is None for t in out.grad_fn.saved_tensors] == [True, True, False]  # weight only
        out = torch.lerp(a.detach(), b, w.requires_grad_())
        assert [t is None for t in out.grad_fn.saved_tensors] == [False, False, True]  # self and end only


PRELU_AUTOGRAD = {
    "NCHW": ((3, 4, 5, 6), 4, None),
    "C == W": ((2, 5, 3, 5), 5, None),
    "channels_last": ((2, 5, 3, 5), 5, torch.channels_last),
    "NCDHW channels_last_3d": ((2, 3, 2, 4, 3), 3, torch.channels_last_3d),
    "(N, C)": ((9, 6), 6, None),
    "(N, C) several column blocks": ((5, 150), 150, None),
    "channels_last several column blocks": ((2, 80, 2, 3), 80, torch.channels_last),
    "1-D": ((11,), 1, None),
    "0-d": ((), 1, None),
    "one weight": ((3, 4, 5, 6), 1, None),
    "transposed": ((3, 4, 5, 6), 4, "transposed"),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("needs", NEEDS2, ids=["both", "input", "weight"])
@pytest.mark.parametrize("case", sorted(PRELU_AUTOGRAD))
def test_f_prelu_autograd(case, needs, dtype):
    shape, c, layout = PRELU_AUTOGRAD[case]
    x = _layout(_rand(shape, dtype, 2.0), layout)
    w = _rand((c,), dtype, 0.25)
    check_autograd(F.prelu, (x, w), needs)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_nn_prelu_module_trains_with_stock_gradients(dtype, monkeypatch):
    """nn.PReLU in a small model: every parameter's gradient equals stock's, and the fused kernel really ran."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1).to(DEVICE, dtype)
    act = nn.PReLU(4, init=0.2).to(DEVICE, dtype)
    x = _rand((2, 3, 6, 5), dtype)

    def step():
        conv.zero_grad()
        act.zero_grad()
        act(conv(x)).square().sum().backward()
        return [p.grad.clone() for p in (*conv.parameters(), act.weight)]

    stock = step()
    ran = []
    real = prelu_mod._prelu_grads
    monkeypatch.setattr(prelu_mod, "_prelu_grads", lambda *a, **k: (ran.append(1), real(*a, **k))[1])
    with gradkern.use(mode="always"):
        ours = step()
    assert ran, "the fused prelu backward did not run"
    for a, b in zip(ours, stock, strict=True):
        if dtype in (torch.float32, torch.float64):
            assert_close(a, b, dtype, "nn.PReLU model")
        else:  # both sides carry the low-precision forward; compare loosely
            torch.testing.assert_close(a.float(), b.float(), atol=0.1, rtol=0.05)


def test_fused_backward_really_runs_for_each_op(monkeypatch):
    """The registrations are live end to end: the forward goes through the override and the backward through
    the fused kernel function of each op."""
    from gradkern.kernels import lerp as lerp_mod
    from gradkern.kernels import where as where_mod

    ran = []
    for mod, name in ((where_mod, "_where_grads"), (lerp_mod, "_lerp_grads"), (prelu_mod, "_prelu_grads")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, _n=name, **k: (ran.append(_n), _r(*a, **k))[1])
    x = torch.randn(2, 3, 4, device=DEVICE, requires_grad=True)
    w = torch.rand(3, device=DEVICE, requires_grad=True)
    with gradkern.use(mode="always"):
        y = torch.where(x > 0, x, x * 2)
        y = torch.lerp(y, x, 0.5) + torch.lerp(x, y, w.view(3, 1))
        F.prelu(y, w).sum().backward()
    assert sorted(set(ran)) == ["_lerp_grads", "_prelu_grads", "_where_grads"]
    assert x.grad is not None and w.grad is not None


def test_no_grad_and_inference_mode_forward_is_stock():
    c = _cond((4, 5))
    x = torch.randn(4, 5, device=DEVICE, requires_grad=True)
    w = torch.rand(5, device=DEVICE, requires_grad=True)
    with gradkern.use(mode="always"):
        for ctx in (torch.no_grad, torch.inference_mode):
            with ctx():
                outs = [torch.where(c, x, 0.0), torch.lerp(x, x * 2, w), F.prelu(x, w)]
            assert all(o.grad_fn is None and not o.requires_grad for o in outs)
            assert_bitwise_equal(outs, [torch.where(c, x, 0.0).detach(), torch.lerp(x, x * 2, w).detach(),
                                        F.prelu(x, w).detach()])


def test_integer_and_unsupported_inputs_fall_back_to_stock():
    c = _cond((4, 5))
    i, j = torch.arange(20, device=DEVICE).view(4, 5), -torch.arange(20, device=DEVICE).view(4, 5)
    x = torch.randn(4, 5, device=DEVICE, requires_grad=True)
    with gradkern.use(mode="always"):
        assert torch.equal(torch.where(c, i, j), torch.where(c.cpu(), i.cpu(), j.cpu()).to(DEVICE))
        # an int operand next to a float one: stock autograd (WhereBackward), correct gradient
        out = torch.where(c, x, i)
        assert type(out.grad_fn).__name__ == "WhereBackward0"
        out.sum().backward()
    assert torch.equal(x.grad, c.to(x.dtype))


def test_forward_ad_and_functorch_use_stock_autograd():
    """Declined calls run ATen's own autograd kernel, so forward-mode AD and torch.func transforms still work."""
    import torch.autograd.forward_ad as fwAD

    c = _cond((3, 4))
    x, y, t = (torch.randn(3, 4, device=DEVICE, dtype=torch.float64) for _ in range(3))
    w = torch.rand(4, device=DEVICE, dtype=torch.float64)
    with gradkern.use(mode="always"):
        with fwAD.dual_level():
            tangent = fwAD.unpack_dual(torch.where(c, fwAD.make_dual(x, t), y)).tangent
            tangent_l = fwAD.unpack_dual(torch.lerp(fwAD.make_dual(x, t), y, 0.25)).tangent
        gx = torch.func.grad(lambda x: F.prelu(x, w).sum())(x)
        jac = torch.func.jacrev(lambda x: torch.where(c, x, y))(x)
    assert torch.equal(tangent, torch.where(c, t, 0))
    assert torch.allclose(tangent_l, t * 0.75)
    assert torch.equal(gx, torch.where(x > 0, 1.0, w.expand_as(x)))
    assert jac.shape == (3, 4, 3, 4)


def test_double_backward_matches_stock():
    """create_graph=True: the backward runs the differentiable ATen formula, so second-order gradients are
    stock's (checked numerically by gradgradcheck, and against stock directly)."""
    torch.manual_seed(0)
    c = _cond((3, 4))
    x = torch.randn(3, 4, device=DEVICE, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, 1, device=DEVICE, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3, 4, device=DEVICE, dtype=torch.float64, requires_grad=True)
    xp = torch.randn(2, 3, 4, device=DEVICE, dtype=torch.float64, requires_grad=True)
    wp = torch.rand(3, device=DEVICE, dtype=torch.float64, requires_grad=True)
    funcs = {
        "where": (lambda x, y: torch.where(c, x * x, y * y), (x, y)),
        "lerp scalar": (lambda x, w: torch.lerp(x * x, w, 0.3), (x, w)),
        "lerp tensor": (lambda x, y, w: torch.lerp(x * x, y * y, w * w), (x, y, w)),
        "prelu": (lambda x, w: F.prelu(x * x - 0.5, w * w), (xp, wp)),
    }
    for name, (fn, inputs) in funcs.items():
        def second(fn=fn, inputs=inputs):
            out = fn(*inputs)
            first = torch.autograd.grad(out, inputs, torch.ones_like(out), create_graph=True)
            return torch.autograd.grad(sum((f * f).sum() for f in first), inputs, allow_unused=True)

        stock = second()
        with gradkern.use(mode="always"):
            assert type(fn(*inputs).grad_fn).__name__.startswith("Gradkern"), name
            ours = second()
            assert torch.autograd.gradcheck(fn, inputs), name
            assert torch.autograd.gradgradcheck(fn, inputs), name
        for a, b in zip(ours, stock, strict=True):
            assert (a is None) == (b is None), name
            if a is not None:
                torch.testing.assert_close(a, b, msg=name)


# ============================================================================ registration
def test_flaggems_1971_no_backend_registration_of_a_composite_op():
    """Registering a backend kernel for a CompositeImplicitAutograd op replaces its decomposition on that device,
    so autograd never sees the ops it decomposes into (FlagGems #1971: `where` gave zero gradients). No gradkern
    registration may do that, and every autograd-key registration must override an op autograd differentiates
    (ATen's kernel on the Autograd alias key, which is also what a declined call runs)."""
    for overload, name in dispatch.routed_overloads().items():
        schema = dispatch._overload(overload).name()
        composite = torch._C._dispatch_has_kernel_for_dispatch_key(schema, "CompositeImplicitAutograd")
        if REGISTRY[name].dispatch == "backend":
            assert not composite, f"{overload} is CompositeImplicitAutograd: a backend kernel would bypass autograd"
        else:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(schema, "Autograd"), overload


def test_flaggems_1971_style_registration_is_caught(monkeypatch):
    """What the FlagGems bug looked like, reproduced: `where.ScalarOther` registered on the backend key with an
    opaque kernel. `check_autograd` (used above for every entry point) rejects it."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        def opaque(cond, self, other):
            with torch.no_grad():
                return torch.ops.aten.where.self(cond, self.detach(), torch.full_like(self, other).detach())

        with warnings.catch_warnings():  # "Overriding a previously registered kernel"
            warnings.simplefilter("ignore")
            lib.impl("where.ScalarOther", opaque, _runtime.BACKEND_KEY)
        c = _cond((5, 8))
        x = torch.randn(5, 8, device=DEVICE)
        with pytest.raises((AssertionError, RuntimeError)):
            check_autograd(lambda c, x: torch.where(c, x, 0.0), (c, x), (False, True), fused=False)
    finally:
        lib._destroy()
    check_autograd(lambda c, x: torch.where(c, x, 0.0), (c, x), (False, True), exact=True)


def test_stock_call_of_an_autograd_override_keeps_autograd():
    """dispatch.stock_call for an autograd-key op is ATen's autograd kernel: a declined call keeps its graph."""
    stock = dispatch.stock_call(REGISTRY["where_backward"], "where.self")
    c = _cond((3, 4))
    x = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    with gradkern.use(mode="always"):
        out = stock(c, x, torch.zeros(3, 4, device=DEVICE))
    assert type(out.grad_fn).__name__ == "WhereBackward0"
    out.sum().backward()
    assert torch.equal(x.grad, c.float())


@pytest.mark.parametrize("name", FUSED_OPS)
def test_fused_ops_are_listed_with_guarantees(name):
    row = {r["name"]: r for r in gradkern.supported_ops()}[name]
    assert row["dispatch"] == "autograd" and row["aten"]
    for dt in DTYPES:
        g = gradkern.guarantee(name, dt)
        assert g.deterministic and g.bit_stable
        assert g.accumulator_dtype == (torch.float64 if dt == torch.float64 else torch.float32)


def _unusual_grads(shape):
    """Incoming gradients the fused backwards must not read as plain storage: a negative-bit view (what
    `torch.complex(0, y).conj()` followed by `.real` of a product hands back), a tensor subclass and an efficient
    zero tensor. Each as (name, make(): the grad)."""
    from torch.testing._internal.two_tensor import TwoTensor

    base = torch.randn(shape, device=DEVICE, dtype=torch.float64)
    return [("negative bit", lambda: torch._neg_view(base)),
            ("TwoTensor", lambda: TwoTensor(base.clone(), 2 * base)),
            ("zero tensor", lambda: torch.ops.aten._efficientzerotensor(shape, dtype=torch.float64,
                                                                          device=DEVICE))]


_AUTOGRAD_KEY_OPS = {  # every autograd-key override of enable(), as f(x) with x of shape (2, 3, 4)
    "where": lambda x: torch.where(x > 0, x, 0.5),
    "lerp scalar": lambda x: torch.lerp(x, 3 * x.detach(), 0.25),
    "lerp tensor": lambda x: torch.lerp(x, 3 * x.detach(), torch.full((4,), 0.25, dtype=x.dtype, device=DEVICE)),
    "prelu": lambda x: F.prelu(x, torch.tensor([0.1, 0.2, 0.3], dtype=x.dtype, device=DEVICE)),
    "repeat": lambda x: x.repeat(2, 1, 1),
}


@pytest.mark.parametrize("op", sorted(_AUTOGRAD_KEY_OPS))
def test_unusual_incoming_gradients_match_stock(op):
    """Bug: the fused backwards read a negative-bit gradient's storage as is (every gradient with the wrong sign)
    and failed on a subclass or zero-tensor gradient. Such gradients take the op's ATen formula now."""
    f = _AUTOGRAD_KEY_OPS[op]
    x0 = torch.randn(2, 3, 4, device=DEVICE, dtype=torch.float64)
    shape = f(x0).shape
    for name, make in _unusual_grads(shape):
        got = {}
        for enabled in (False, True):
            x = x0.clone().requires_grad_(True)
            with gradkern.use(enabled, mode="always"):
                (gx,) = torch.autograd.grad(f(x), x, make())
            got[enabled] = gx.to_dense() if gx.layout != torch.strided else gx
            if type(got[enabled]) is not torch.Tensor:  # a TwoTensor result: its first half
                got[enabled] = got[enabled].a
        assert torch.equal(got[True], got[False]), f"{op}, {name} gradient"


@pytest.mark.parametrize("op", sorted(_AUTOGRAD_KEY_OPS))
def test_batched_gradients_match_stock(op):
    """Bug: autograd.grad(..., is_grads_batched=True) (what jacobian(vectorize=True) uses) hands the backward a
    batched gradient under vmap, which the fused kernels cannot read: it failed; stock computes it."""
    f = _AUTOGRAD_KEY_OPS[op]
    x0 = torch.randn(2, 3, 4, device=DEVICE, dtype=torch.float64)
    n = f(x0).numel()
    got = {}
    for enabled in (False, True):
        x = x0.clone().requires_grad_(True)
        y = f(x)
        eye = torch.eye(n, device=DEVICE, dtype=torch.float64).view(n, *y.shape)
        with gradkern.use(enabled, mode="always"):
            y = f(x)
            (got[enabled],) = torch.autograd.grad(y, x, eye, is_grads_batched=True)
    assert torch.equal(got[True], got[False])


def test_direct_calls_reject_a_negative_bit_view():
    """The plain functions read storage as is, so a negative-bit view (whose storage holds -x) is a named error
    rather than a result with the wrong sign."""
    g = torch._neg_view(torch.randn(3, 4, device=DEVICE))
    x = torch.randn(3, 4, device=DEVICE)
    for call in (lambda: ops.where_backward(g, x > 0, x, x),
                 lambda: ops.hardsigmoid_backward(g, x),
                 lambda: ops.prelu_backward(g, x, torch.rand(4, device=DEVICE)),
                 lambda: ops.repeat_backward(g, (1, 1), (3, 4))):
        with pytest.raises(gradkern.Unsupported, match="negative-bit"):
            call()


def test_validation_cached_per_problem_still_refuses_what_it_refused():
    """Each plain function validates a problem once and keys what it found by the arguments' shapes, dtypes,
    devices and negative bits: after a valid call, the same layout as a negative-bit view, an integer dtype, a bad
    output mask or a number where a gradient needs a tensor is still refused, and a valid call still runs."""
    x, g = torch.randn(3, 4, device=DEVICE), torch.randn(3, 4, device=DEVICE)
    w = torch.rand(4, device=DEVICE)
    for call in (lambda g, x: ops.where_backward(g, x > 0, x, x),
                 lambda g, x: ops.lerp_backward(g, x, x, 0.25),
                 lambda g, x: ops.lerp_backward(g, x, x, x),
                 lambda g, x: ops.prelu_backward(g, x, w),
                 lambda g, x: ops._prelu_kernel_backward(g, x, w)):
        want = call(g, x)
        with pytest.raises(gradkern.Unsupported, match="negative-bit"):
            call(torch._neg_view(g), x)
        with pytest.raises(gradkern.Unsupported):
            call(g.int(), x)
        assert_bitwise_equal(call(g, x), want)
    ops.where_backward(g, x > 0, x, x, (True, False))
    with pytest.raises(gradkern.InvalidProblem, match="output_mask"):
        ops.where_backward(g, x > 0, x, x, (True,))
    with pytest.raises(gradkern.Unsupported, match="self"):
        ops.where_backward(g, x > 0, 1.0, x, (True, False))


def test_lerp_backward_computes_in_float64_when_its_inputs_are():
    """Bug: the fused kernels took their math dtype from grad alone, so an f32 grad with f64 self/end/weight
    (f64 results, as ATen promotes) was computed in f32: errors of 1e-8 to 1e-7 against an f64 reference."""
    torch.manual_seed(0)
    g = torch.randn(6, 5, device=DEVICE)
    s, e, w = (torch.randn(6, 5, device=DEVICE, dtype=torch.float64) for _ in range(3))
    gs, ge, gw = ops.lerp_backward(g, s, e, w)
    gd = g.double()
    for got, want, name in ((gs, gd * (1 - w), "self"), (ge, gd * w, "end"), (gw, gd * (e - s), "weight")):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14, msg=name)
