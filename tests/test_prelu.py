"""PReLU backward (gradkern.ops.prelu_backward, the fused kernels, and ATen's _prelu_kernel_backward) against stock
PyTorch: every fused layout (row and column kernels) and the strided fallback, mixed layouts, the channel at dim 1,
boundary values, fixed-order partial sums (forced small splits, capped partials), the relaunch cache, bad inputs;
and F.prelu / nn.PReLU under enable()."""

import math
from types import MappingProxyType

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradkern
from _fused_helpers import NEEDS2, check_autograd, compare, in_layout, launches, rand
from conftest import DEVICE, DTYPES, dtype_id, small_prelu_splits
from gradkern import config, ops
from gradkern.kernels import prelu as prelu_mod
from gradkern.registry import REGISTRY
from gradkern.testing import assert_bitwise_equal, assert_close, run_reference

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
    "transposed planes": ((3, 4, 5, 6), 4, "transposed"),
    "channel-major (C, N, H, W) storage": ((3, 4, 5, 6), 4, "channel_major"),
    "channel-major (C, N) storage": ((9, 6), 6, "channel_major"),
    "empty": ((0, 4, 3), 4, None),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", sorted(PRELU_INPUTS))
def test_prelu_backward_layouts(case, dtype):
    shape, c, layout = PRELU_INPUTS[case]
    x = in_layout(rand(shape, dtype, 2.0), layout)
    g = in_layout(rand(shape, dtype), layout)
    w = rand((c,), dtype, 0.25)
    gi, gw = ops.prelu_backward(g, x, w)
    ref = run_reference(REGISTRY["prelu_backward"].reference, (g, x, w))
    assert gi.shape == x.shape and gw.shape == w.shape and gi.dtype == gw.dtype == dtype
    compare((gi, gw), ref, dtype, f"prelu {case}")
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


def test_prelu_dense_layouts_take_the_fused_kernels():
    """Any dense layout shared by x and grad is (A, C, L) in memory, so the fused kernels take it (grad_weight
    summed in the same pass): channel-major storage (A = 1) and transposed planes (L in another order) as well as
    contiguous and channels_last; the (C, N, H, W) case ran the elementwise pass plus a sum over a float32 copy
    before (0.57x ATen on a GPU). Mixed layouts and gaps do not."""
    views = {"channel_major": (True, (1, 5, 144)), "transposed": (True, (3, 5, 48)), None: (True, (3, 5, 48)),
             torch.channels_last: (False, (144, 5, 1))}  # rows: (A, C, L); columns: (A, C * L, L)
    for layout, (rows, args) in views.items():
        x = in_layout(rand((3, 5, 8, 6), torch.float32), layout)
        plan = prelu_mod._fused_plan(x, x, 5)
        assert plan is not None and plan.rows == rows and plan.args[:3] == args, layout
    x = rand((3, 5, 5, 6), torch.float32)
    assert prelu_mod._fused_plan(x, in_layout(x, "channel_major"), 5) is None
    assert prelu_mod._fused_plan(x[..., ::2], x[..., ::2], 5) is None


@pytest.mark.parametrize("case", ["x NCHW, g channels_last", "x channels_last, g NCHW", "x NCHW, g expanded",
                                  "one weight: x NCHW, g channels_last", "one weight: x channels_last, g NCHW"])
def test_prelu_backward_mixed_layouts(case):
    """x and grad in different layouts: each is read through its own strides (no fused kernel reads g by x's)."""
    c = 1 if case.startswith("one weight") else 4
    x = rand((3, 4, 5, 6), torch.float32, 2.0)
    g = rand((3, 4, 5, 6), torch.float32)
    if "x channels_last" in case:
        x = x.contiguous(memory_format=torch.channels_last)
    if "g channels_last" in case:
        g = g.contiguous(memory_format=torch.channels_last)
    if "g expanded" in case:
        g = g[:1].expand(3, 4, 5, 6)
    w = rand((c,), torch.float32, 0.25)
    gi, gw = ops.prelu_backward(g, x, w)
    compare((gi, gw), run_reference(REGISTRY["prelu_backward"].reference, (g, x, w)), torch.float32, case)
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
        x, g = in_layout(rand(shape, dtype, 2.0), layout), in_layout(rand(shape, dtype), layout)
        w = rand((c,), dtype, 0.25)
        plan = prelu_mod._fused_plan(x, g, c)
        assert plan is not None and math.prod(plan.part_shape) > c  # several partials per channel
        first = ops.prelu_backward(g, x, w)
        compare(first, run_reference(REGISTRY["prelu_backward"].reference, (g, x, w)), dtype, f"split {shape}")
        assert_bitwise_equal(ops.prelu_backward(g, x, w), first, "run twice")


def test_prelu_column_kernel_splits_wide_rows_into_blocks():
    """Rows wider than cols_bk columns are walked by several programs a range of rows (the last block masked)."""
    for case in ("(N, C) several column blocks", "channels_last several column blocks"):
        shape, c, layout = PRELU_INPUTS[case]
        x = in_layout(rand(shape, torch.float32), layout)
        plan = prelu_mod._fused_plan(x, x, c)
        assert not plan.rows and plan.args[4] == -(-c // prelu_mod.CONFIG.current.cols_bk) > 1, case  # NKB


def test_prelu_row_kernel_caps_its_partials():
    """The row kernel makes at most rows_max_partials[element size] partials a channel, giving programs more tiles
    instead; every tile is still walked once (checked against stock with the cap forced low)."""
    cfg = prelu_mod.CONFIG.current
    cap = cfg.rows_max_partials[2]
    for A, C, L in ((1, 1, 1 << 26), (64, 64, 1 << 14), (3, 5, 77)):
        plan = prelu_mod._rows_plan(A, C, L, 2, cfg)
        _a, _c, _l, _nb, tiles, tpp, split = plan.args
        assert split <= cap and (split - 1) * tpp < tiles <= split * tpp
    assert prelu_mod._rows_plan(1, 1, 1 << 26, 2, cfg).part_shape == (1, cap)
    with config.override(prelu_mod.CONFIG, rows_max_partials=MappingProxyType({4: 3}), tile_bytes=64):
        for shape, c in (((700,), 1), ((4, 3, 50), 3)):
            x, g, w = rand(shape, torch.float32, 2.0), rand(shape, torch.float32), rand((c,), torch.float32, 0.25)
            assert prelu_mod._fused_plan(x, g, c).part_shape == (c, 3)
            compare(ops.prelu_backward(g, x, w), run_reference(REGISTRY["prelu_backward"].reference, (g, x, w)),
                    torch.float32, f"capped partials {shape}")


def test_prelu_int64_offsets_give_the_same_bits():
    """The fused kernels' int64 index variant (used where offsets can pass 2^31), forced by lowering the threshold:
    the same bits as in int32, for the row kernel (one weight or several) and the column kernel."""
    for case in ("(N, C, L)", "one weight NCHW", "channels_last", "(N, C)"):
        shape, c, layout = PRELU_INPUTS[case]
        x, g = in_layout(rand(shape, torch.float32, 2.0), layout), in_layout(rand(shape, torch.float32), layout)
        w = rand((c,), torch.float32, 0.25)
        want = ops.prelu_backward(g, x, w)
        assert not prelu_mod._fused_plan(x, g, c).i64
        with config.override(prelu_mod.CONFIG, i32_max=64):
            assert prelu_mod._fused_plan(x, g, c).i64, case
            assert_bitwise_equal(ops.prelu_backward(g, x, w), want, f"{case} int64")


def test_prelu_relaunch_cache_respects_alignment():
    """The fused kernels are relaunched directly after their first launch, keyed by plan, output mask and the
    pointers' 16-byte alignment: views at an odd element offset (not aligned) must not reuse a kernel compiled for
    aligned ones, nor the other way round."""
    for shape, layout in (((4, 6, 5, 8), None), ((4, 6, 5, 8), torch.channels_last), ((64, 10), None)):
        n = math.prod(shape)
        bx, bg = rand((n + 1,), torch.float32, 2.0), rand((n + 1,), torch.float32)
        w = rand((shape[1],), torch.float32, 0.25)
        for start in (0, 1, 0, 1):
            x = in_layout(bx[start:start + n].view(shape), layout)
            g = in_layout(bg[start:start + n].view(shape), layout)
            compare(ops.prelu_backward(g, x, w), run_reference(REGISTRY["prelu_backward"].reference, (g, x, w)),
                     torch.float32, f"prelu {shape} {layout} offset {start}")


def test_prelu_kernel_backward_keeps_atens_full_shape_result():
    x, g = rand((2, 3, 4, 5), torch.float32), rand((2, 3, 4, 5), torch.float32)
    w = rand((1, 3, 1, 1), torch.float32)
    gi, gw = ops._prelu_kernel_backward(g, x, w)
    assert gi.shape == gw.shape == x.shape
    assert_bitwise_equal((gi, gw), torch.ops.aten._prelu_kernel_backward(g, x, w))
    xt = x.transpose(1, 3)  # strided, weight broadcast along what is now dim 3
    assert_bitwise_equal(ops._prelu_kernel_backward(g.transpose(1, 3), xt, w.transpose(1, 3)),
                         torch.ops.aten._prelu_kernel_backward(g.transpose(1, 3), xt, w.transpose(1, 3)))


def test_bad_inputs_raise_named_errors_before_any_launch(monkeypatch):
    calls = launches(monkeypatch)
    x, g = rand((2, 3, 4), torch.float32), rand((2, 3, 4), torch.float32)
    w3 = rand((3,), torch.float32)
    cases = [
        # prelu: PyTorch's weight rule (1 or C = size(1) elements, at most 1-D), no type promotion
        ("prelu_backward", gradkern.InvalidProblem, "weight", lambda: ops.prelu_backward(g, x, rand((4,), x.dtype))),
        ("prelu_backward", gradkern.InvalidProblem, "weight", lambda: ops.prelu_backward(g, x, w3.view(3, 1))),
        ("prelu_backward", gradkern.InvalidProblem, "weight",
         lambda: ops.prelu_backward(g[0, 0, 0], x[0, 0, 0], w3)),
        ("prelu_backward", gradkern.InvalidProblem, "weight",
         lambda: ops.prelu_backward(g[0, 0], x[0, 0], rand((4,), x.dtype))),
        ("prelu_backward", gradkern.Unsupported, "weight", lambda: ops.prelu_backward(g, x, w3.double())),
        ("prelu_backward", gradkern.InvalidProblem, "grad_output", lambda: ops.prelu_backward(g[:1], x, w3)),
        ("prelu_backward", gradkern.Unsupported, "self", lambda: ops.prelu_backward(g, x.to(torch.int32), w3)),
        ("prelu_backward", gradkern.InvalidProblem, "output_mask", lambda: ops.prelu_backward(g, x, w3, (True,))),
        ("_prelu_kernel_backward", gradkern.InvalidProblem, "broadcast",
         lambda: ops._prelu_kernel_backward(g, x, rand((5,), x.dtype))),
        # a non-tensor self was once read for its dtype before being checked (AttributeError, not the named error)
        ("_prelu_kernel_backward", gradkern.Unsupported, "self",
         lambda: ops._prelu_kernel_backward(g, x.tolist(), w3)),
        ("prelu_backward", gradkern.Unsupported, "self", lambda: ops.prelu_backward(g, x.tolist(), w3)),
    ]
    for op, err, word, call in cases:
        with pytest.raises(err, match=word) as info:
            call()
        assert str(info.value).startswith(f"{op}:"), str(info.value)
    assert not calls, "a rejected call launched a kernel"


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
    x = in_layout(rand(shape, dtype, 2.0), layout)
    w = rand((c,), dtype, 0.25)
    check_autograd(F.prelu, (x, w), needs)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_nn_prelu_module_trains_with_stock_gradients(dtype, monkeypatch):
    """nn.PReLU in a small model: every parameter's gradient equals stock's, and the fused kernel really ran."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1).to(DEVICE, dtype)
    act = nn.PReLU(4, init=0.2).to(DEVICE, dtype)
    x = rand((2, 3, 6, 5), dtype)

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


def test_prelu_kernel_backward_route_takes_every_problem_where_the_native_router_replays(monkeypatch):
    """enable()'s route sends _prelu_kernel_backward to gradkern for every problem, mixed layouts and small sizes
    included, where the native router replays the call (its kernel's GPU time was at or below ATen's on every sweep
    case and its replayed host time below stock's, H200); on the Python router, from the size where the device time
    saved passes that router's host time. A pure function of the descriptor: meta tensors carry it."""
    x = torch.empty(32, 64, 56, 56, device="meta")  # 6.4M elements, above the f32 threshold of the Python router
    w = torch.empty(1, 64, 1, 1, device="meta")
    cl = x.contiguous(memory_format=torch.channels_last)
    monkeypatch.setattr(prelu_mod.native, "available", lambda: False)
    assert prelu_mod._full_route(x, x, w) and prelu_mod._full_route(cl, cl, w)
    assert prelu_mod._full_route(x, cl, w) and prelu_mod._full_route(cl, x, w)  # (1.5-1.7x ATen's GPU time)
    assert not prelu_mod._full_route(x[:1], x[:1], w)  # below the threshold
    monkeypatch.setattr(prelu_mod.native, "available", lambda: True)
    assert prelu_mod._full_route(x[:1], x[:1], w) and prelu_mod._full_route(x[:1, :, :1], cl[:1], w)
