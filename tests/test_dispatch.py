"""enable()/disable()/use(): scoping, nesting and non-re-entrance."""

import pytest
import torch
import torch.nn.functional as F

import gradkern
from conftest import DEVICE
from gradkern import dispatch


def test_enable_disable_idempotent_and_use_nests():
    assert not gradkern.is_enabled()
    gradkern.enable()
    gradkern.enable()
    assert gradkern.is_enabled()
    gradkern.disable()
    gradkern.disable()
    assert not gradkern.is_enabled()
    with gradkern.use():
        assert gradkern.is_enabled()
        with gradkern.use(False):
            assert not gradkern.is_enabled()
            with gradkern.use():
                assert gradkern.is_enabled()
            assert not gradkern.is_enabled()
        assert gradkern.is_enabled()
    assert not gradkern.is_enabled()


def test_use_restores_state_on_exception():
    try:
        with gradkern.use():
            raise KeyError("boom")
    except KeyError:
        pass
    assert not gradkern.is_enabled()


def test_override_does_not_reenter(monkeypatch):
    """A gradkern-routed op called from inside an override reaches stock PyTorch, not gradkern again."""
    info = gradkern.registry.REGISTRY["hardsigmoid_backward"]
    seen = []
    inner_results = []

    def impl(g, x):
        seen.append(1)
        inner_results.append(torch.ops.aten.hardsigmoid_backward(g, x))  # nested: must go to stock
        return info.fn(g, x)

    monkeypatch.setitem(info.aten, "hardsigmoid_backward", impl)
    g = torch.randn(64, device=DEVICE)
    x = torch.randn(64, device=DEVICE) * 4
    with gradkern.use():
        out = torch.ops.aten.hardsigmoid_backward(g, x)
    assert len(seen) == 1
    assert torch.equal(out, inner_results[0])


def test_enable_keeps_autograd():
    x = torch.randn(32, device=DEVICE, dtype=torch.float64, requires_grad=True)
    with gradkern.use():
        (gx,) = torch.autograd.grad(F.hardsigmoid(x).sum(), x)
    (ref,) = torch.autograd.grad(F.hardsigmoid(x).sum(), x)
    assert torch.equal(gx, ref)


def test_routed_overloads_names_registry_ops():
    routed = dispatch.routed_overloads()
    assert routed["elu_backward"] == "elu_backward"
    assert set(routed.values()) <= set(gradkern.registry.REGISTRY)


def _nine_d():
    """A 9-D view no two dims of which merge (the kernels take at most 8 after merging)."""
    torch.manual_seed(0)
    return torch.randn((2,) * 9, device=DEVICE, dtype=torch.float64).permute(*reversed(range(9)))


_BEYOND_THE_KERNELS = {  # routed calls whose problem the kernels reject: under enable() stock must run them
    "hardshrink forward, 9-D": lambda: F.hardshrink(_nine_d(), 0.5),
    "celu backward, 9-D": lambda: torch.autograd.grad(F.celu(x := _nine_d().requires_grad_()), x,
                                                      torch.ones_like(x)),
    "prelu backward, 9-D": lambda: torch.autograd.grad(
        F.prelu(x := _nine_d().requires_grad_(), torch.rand(2, device=DEVICE, dtype=torch.float64)), x,
        torch.ones_like(x)),
    "where backward, 9-D condition": lambda: torch.autograd.grad(
        torch.where(_nine_d() > 0, x := torch.ones((2,) * 9, device=DEVICE, dtype=torch.float64,
                                                   requires_grad=True), 0.0), x, torch.ones_like(x)),
    "repeat backward, 9 repeats": lambda: torch.autograd.grad(
        (x := torch.randn(2, 3, device=DEVICE, dtype=torch.float64, requires_grad=True)).repeat(1, 1, 1, 1, 1, 1, 1,
                                                                                                2, 2), x,
        torch.ones((1,) * 7 + (4, 6), device=DEVICE, dtype=torch.float64)),
    "lerp backward, 9-D weight": lambda: torch.autograd.grad(
        torch.lerp(x := torch.ones((2,) * 9, device=DEVICE, dtype=torch.float64, requires_grad=True),
                   2 * x.detach(), _nine_d().abs()), x, torch.ones_like(x)),
}


@pytest.mark.parametrize("name", sorted(_BEYOND_THE_KERNELS))
def test_problems_the_kernels_reject_run_stock_under_enable(name):
    """Bug: under enable(), a 9-D problem (stock takes any rank) raised gradkern.Unsupported. What the kernels
    reject now goes to stock PyTorch, which computes it."""
    call = _BEYOND_THE_KERNELS[name]
    want = call()
    with gradkern.use():
        got = call()
    # (stock's path there may be ATen's Python decomposition, whose float64 rounding can differ in the last bit)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_invalid_problems_are_runtime_errors_as_stocks_are():
    """Bug: under enable(), gradkern's checks raised InvalidProblem, a ValueError, where stock raises a
    RuntimeError, so `except RuntimeError` handlers stopped catching them. InvalidProblem is a RuntimeError too."""

    def inplace_elu_negative_alpha():
        x = torch.randn(5, device=DEVICE, dtype=torch.float64, requires_grad=True)
        F.elu(x * 1, alpha=-1.0, inplace=True).sum().backward()

    def hardshrink_lambda_overflows_half():
        F.hardshrink(torch.randn(5, device=DEVICE, dtype=torch.float16), 1e6)

    for call in (inplace_elu_negative_alpha, hardshrink_lambda_overflows_half):
        with pytest.raises(RuntimeError) as stock:
            call()
        with gradkern.use(), pytest.raises(RuntimeError) as ours:
            call()
        assert isinstance(ours.value, gradkern.InvalidProblem), (call.__name__, stock.value)
