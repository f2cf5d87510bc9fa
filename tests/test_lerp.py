"""torch.lerp backward (gradkern.ops.lerp_backward) against stock PyTorch: Python-number and tensor weights (the
scalar-weight gradients bit-exact), broadcast operands, a 0-d weight of another dtype, float64 math for float64
inputs, bad inputs; and torch.lerp under enable() (any subset of inputs requiring grad, what the forward saves)."""


import pytest
import torch

import gradkern
from _fused_helpers import NEEDS2, check_autograd, compare, launches, rand
from conftest import DEVICE, DTYPES, dtype_id
from gradkern import ops
from gradkern.registry import REGISTRY
from gradkern.testing import assert_bitwise_equal, assert_close, run_reference


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_lerp_backward_scalar_weight_is_bit_exact_with_stock(dtype):
    """A Python-number weight: g*(1-w) and g*w with the scalars rounded as ATen rounds a Scalar."""
    g = rand((40, 9), dtype)
    for w in (0.3, -1.5, 0.0, 1.0, 1 / 3):
        gs, ge, gw = ops.lerp_backward(g, g, g, w)
        assert gw is None
        assert_bitwise_equal(gs, g * (1 - w), f"w={w}")
        assert_bitwise_equal(ge, g * w, f"w={w}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_lerp_backward_tensor_weight(dtype):
    g, a, b = rand((40, 9), dtype), rand((40, 9), dtype), rand((40, 9), dtype)
    w = torch.rand((40, 9), device=DEVICE).to(dtype)
    ours = ops.lerp_backward(g, a, b, w)
    ref = run_reference(REGISTRY["lerp_backward"].reference, (g, a, b, w))
    # f32/f64: the same operations in the same dtype as stock, so the same bits
    stock = REGISTRY["lerp_backward"].reference(g, a, b, w) if dtype in (torch.float32, torch.float64) else None
    compare(ours, ref, dtype, "lerp tensor weight", stock)
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
    a, b = rand(ss, dtype), rand(es, dtype)
    w = torch.rand(ws, device=DEVICE).to(dtype)
    g = rand(torch.broadcast_shapes(ss, es, ws), dtype)
    ours = ops.lerp_backward(g, a, b, w)
    assert [t.shape for t in ours] == [a.shape, b.shape, w.shape]
    compare(ours, run_reference(REGISTRY["lerp_backward"].reference, (g, a, b, w)), dtype, f"lerp {case}")


@pytest.mark.parametrize("ss, es", [((), (6, 7)), ((1, 7), (6, 1)), ((6, 7), ())])
def test_lerp_backward_scalar_weight_broadcast_matches_stock_autograd(ss, es):
    """A Python-number weight with broadcast self/end: each gradient summed to its input's shape, as autograd's
    engine does (the registry reference once left them at the broadcast shape)."""
    a = rand(ss, torch.float64).requires_grad_(True)
    b = rand(es, torch.float64).requires_grad_(True)
    g = rand(torch.broadcast_shapes(ss, es), torch.float64)
    want = torch.autograd.grad(torch.lerp(a, b, 0.3), (a, b), g)
    gs, ge, _ = ops.lerp_backward(g, a.detach(), b.detach(), 0.3)
    ref = REGISTRY["lerp_backward"].reference(g, a.detach(), b.detach(), 0.3)
    for got, r, w in zip((gs, ge), ref[:2], want, strict=True):
        assert got.shape == w.shape and r.shape == w.shape
        assert_close(got, w, torch.float64)
        assert_close(r, w, torch.float64)


def test_lerp_backward_zero_dim_weight_of_another_dtype():
    """PyTorch lets a 0-d weight differ in dtype from self; its gradient comes back in its own dtype."""
    a, b, g = rand((5, 4), torch.float32), rand((5, 4), torch.float32), rand((5, 4), torch.float32)
    w = torch.tensor(0.3, device=DEVICE, dtype=torch.float64)
    gs, ge, gw = ops.lerp_backward(g, a, b, w)
    assert gw.dtype == torch.float64 and gw.shape == ()
    # computed in float32 (the inputs' math dtype, as stock does): float32's tolerance for all three
    assert_close((gs, ge, gw), run_reference(REGISTRY["lerp_backward"].reference, (g, a, b, w)), torch.float32)


def test_lerp_backward_reference_keeps_each_inputs_dtype_when_all_are_0d():
    """Bug: with 0-d self, end and grad and a 0-d float64 weight, the reference's grad * (1 - weight) promoted to
    float64 (0-d operands promote among themselves), where stock autograd returns each gradient in its input's dtype;
    the compiled sample test caught it in float16."""
    a, b, g = (rand((), torch.float16) for _ in range(3))
    w = torch.tensor(0.3, device=DEVICE, dtype=torch.float64)
    want = [t.dtype for t in (a, b, w)]
    assert [t.dtype for t in REGISTRY["lerp_backward"].reference(g, a, b, w)] == want
    assert [t.dtype for t in ops.lerp_backward(g, a, b, w)] == want


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


def test_bad_inputs_raise_named_errors_before_any_launch(monkeypatch):
    calls = launches(monkeypatch)
    a, b = rand((3, 5), torch.float32), rand((3, 5), torch.float32)
    cases = [
        # lerp: shapes that do not broadcast, dtypes PyTorch rejects
        ("lerp_backward", gradkern.InvalidProblem, "broadcast", lambda: ops.lerp_backward(a, a, b[:, :4], 0.5)),
        ("lerp_backward", gradkern.InvalidProblem, "broadcast",
         lambda: ops.lerp_backward(a, a, b, rand((2, 5), a.dtype))),
        ("lerp_backward", gradkern.InvalidProblem, "grad", lambda: ops.lerp_backward(a[:1], a, b, 0.5)),
        ("lerp_backward", gradkern.Unsupported, "end", lambda: ops.lerp_backward(a, a, b.double(), 0.5)),
        ("lerp_backward", gradkern.Unsupported, "weight", lambda: ops.lerp_backward(a, a, b, b.double())),
        ("lerp_backward", gradkern.Unsupported, "weight", lambda: ops.lerp_backward(a, a, b, 0.5j)),
    ]
    for op, err, word, call in cases:
        with pytest.raises(err, match=word) as info:
            call()
        assert str(info.value).startswith(f"{op}:"), str(info.value)
    assert not calls, "a rejected call launched a kernel"


NEEDS3 = [tuple(bool(m >> i & 1) for i in range(3)) for m in range(1, 8)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("needs", NEEDS3, ids=lambda n: "+".join(k for k, v in zip("sew", n, strict=True) if v))
def test_torch_lerp_tensor_weight_autograd(needs, dtype):
    a, b = rand((6, 7), dtype), rand((6, 7), dtype)
    w = torch.rand((6, 7), device=DEVICE).to(dtype)
    exact = dtype in (torch.float32, torch.float64)
    check_autograd(torch.lerp, (a, b, w), needs, exact=exact)
    check_autograd(torch.lerp, (a, b[:1], torch.rand((6, 1), device=DEVICE).to(dtype)), needs)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("needs", NEEDS2, ids=["both", "self", "end"])
def test_torch_lerp_scalar_weight_autograd(needs, dtype):
    a, b = rand((6, 7), dtype), rand((6, 7), dtype)
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
