"""torch.where backward (gradkern.ops.where_backward) against stock PyTorch: bit-exact selections, every operand
broadcast and layout, mixed dtypes, bad inputs; and torch.where / Tensor.where under enable() (any subset of
inputs requiring grad, Python-scalar operands)."""

import math

import pytest
import torch

import gradkern
from _fused_helpers import NEEDS2, check_autograd, compare, cond, launches, rand
from conftest import DTYPES, dtype_id
from gradkern import ops
from gradkern.registry import REGISTRY
from gradkern.testing import assert_bitwise_equal, assert_close, run_reference


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_where_backward_same_shape_is_bit_exact(dtype):
    g = rand((33, 17), dtype)
    g[0, :6] = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-30]).to(dtype)
    c = cond((33, 17))
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
    g, c = rand(shape, dtype), cond(cs)
    s, o = rand(ss, dtype), rand(os_, dtype)
    ours = ops.where_backward(g, c, s, o)
    assert [t.shape for t in ours] == [s.shape, o.shape]
    ref = run_reference(REGISTRY["where_backward"].reference, (g, c, s, o))
    compare(ours, ref, dtype, f"where {case}")


def test_where_backward_layouts_and_mixed_dtypes():
    g0 = rand((8, 6, 5), torch.float32)
    c0 = cond((8, 6, 5))
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
    s, o = rand((8, 6, 5), torch.bfloat16), rand((6, 1), torch.float64)
    g = rand((8, 6, 5), torch.float64)
    gs, go = ops.where_backward(g, c0, s, o)
    assert gs.dtype == torch.bfloat16 and go.dtype == torch.float64 and go.shape == (6, 1)
    assert_bitwise_equal(gs, torch.where(c0, g, 0).to(torch.bfloat16))
    assert_close(go, torch.where(c0, 0, g).double().sum((0, 2)).view(6, 1))


def test_bad_inputs_raise_named_errors_before_any_launch(monkeypatch):
    calls = launches(monkeypatch)
    a, b = rand((3, 5), torch.float32), rand((3, 5), torch.float32)
    c = cond((3, 5))
    cases = [
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("needs", NEEDS2, ids=["both", "self", "other"])
def test_torch_where_autograd(needs, dtype):
    c = cond((6, 7))
    x, y = rand((6, 7), dtype), rand((6, 7), dtype)
    check_autograd(lambda c, x, y: torch.where(c, x, y), (c, x, y), (False, *needs), exact=True)
    check_autograd(lambda c, x, y: x.where(c, y), (c, x, y), (False, *needs), exact=True)
    yb = rand((6, 1), dtype)
    check_autograd(lambda c, x, y: torch.where(c, x, y), (c, x, yb), (False, *needs))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_torch_where_scalar_operands_autograd(dtype):
    """`where(c, x, 0.0)` / `where(c, 1.0, y)` are CompositeImplicitAutograd overloads (ScalarOther /
    ScalarSelf): they decompose into where.self above the autograd key, so they reach the fused backward - the
    path FlagGems #1971 broke by registering them on the backend key."""
    c = cond((5, 8))
    x = rand((5, 8), dtype)
    check_autograd(lambda c, x: torch.where(c, x, 0.0), (c, x), (False, True), exact=True)
    check_autograd(lambda c, x: torch.where(c, 1.5, x), (c, x), (False, True), exact=True)
    check_autograd(lambda c, x: torch.where(c, x, torch.tensor(2.0, device=x.device, dtype=x.dtype)), (c, x),
                   (False, True), exact=True)
    # mixed dtypes: each gradient in its input's dtype
    y = rand((8,), torch.float64)
    check_autograd(lambda c, x, y: torch.where(c, x, y), (c, x, y), (False, True, True))
