"""enable()/disable()/use(): scoping, nesting and non-re-entrance."""

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
