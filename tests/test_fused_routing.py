"""What the fused backwards (where, lerp, prelu) share under enable(): invalid calls fail as stock's do, the fused
backward really runs, no_grad / inference mode / integer inputs / forward AD / functorch / double backward go to stock
autograd, no registration bypasses autograd (FlagGems #1971), the ops are listed with their guarantees, unusual and
batched incoming gradients, and the plain functions' cached validation."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import gradkern
from _fused_helpers import check_autograd, cond
from conftest import DEVICE, DTYPES
from gradkern import _runtime, ops
from gradkern.kernels import prelu as prelu_mod
from gradkern.registry import REGISTRY
from gradkern.routing import dispatch, native
from gradkern.testing import assert_bitwise_equal

FUSED_OPS = ("where_backward", "lerp_backward", "prelu_backward")


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
    c = cond((4, 5))
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
    c = cond((4, 5))
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

    c = cond((3, 4))
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
    c = cond((3, 4))
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


def test_flaggems_1971_no_backend_registration_of_a_composite_op():
    """Registering a backend kernel for a CompositeImplicitAutograd op replaces its decomposition on that device,
    so autograd never sees the ops it decomposes into (FlagGems #1971: `where` gave zero gradients). No gradkern
    registration may do that, and every autograd-key registration must override an op autograd differentiates
    (ATen's kernel on the Autograd alias key, which is also what a declined call runs)."""
    for overload, name in dispatch.routed_overloads().items():
        schema = native.aten_overload(overload).name()
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
        c = cond((5, 8))
        x = torch.randn(5, 8, device=DEVICE)
        with pytest.raises((AssertionError, RuntimeError)):
            check_autograd(lambda c, x: torch.where(c, x, 0.0), (c, x), (False, True), fused=False)
    finally:
        lib._destroy()
    check_autograd(lambda c, x: torch.where(c, x, 0.0), (c, x), (False, True), exact=True)


def test_stock_call_of_an_autograd_override_keeps_autograd():
    """dispatch.stock_call for an autograd-key op is ATen's autograd kernel: a declined call keeps its graph."""
    stock = dispatch.stock_call(REGISTRY["where_backward"], "where.self")
    c = cond((3, 4))
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
