"""What the tests of the fused multi-output backwards (test_where, test_lerp, test_prelu, test_multi_pointwise,
test_fused_routing) share: inputs, the comparison against stock, the autograd check under enable(), a launch spy,
and prelu's small-split config."""


import torch

import gradkern
from conftest import DEVICE
from gradkern.engines import multi_pointwise, reduction
from gradkern.kernels import prelu as prelu_mod
from gradkern.testing import assert_bitwise_equal, assert_close, to_reference

NEEDS2 = [(True, True), (True, False), (False, True)]


def rand(shape, dtype, scale=1.0):
    return (torch.randn(shape, device=DEVICE) * scale).to(dtype)


def cond(shape):
    return torch.rand(shape, device=DEVICE) > 0.5


def compare(ours, ref, dtype, what, exact_against=None):
    """ours within dtype's tolerance of the float64 reference; bit-exact against `exact_against` if given."""
    assert_close(ours, ref, None, what)
    if exact_against is not None:
        assert_bitwise_equal(ours, exact_against, what)


def in_layout(t, kind):
    """t in a layout: None (as is), a torch memory format, "transposed" (dims 2 and 3 swapped in memory) or
    "channel_major" (dims 0 and 1 swapped: (C, N, ...) storage)."""
    if kind == "transposed":
        return t.transpose(2, 3).contiguous().transpose(2, 3)
    if kind == "channel_major":
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    return t.contiguous(memory_format=kind) if kind is not None else t


def launches(monkeypatch) -> list:
    """Record every kernel launch of the fused ops and of the sums after them (a rejected call must make none)."""
    calls = []

    def spy(real):
        return lambda *a, **k: (calls.append(a[0]), real(*a, **k))[1]

    for module in (multi_pointwise, prelu_mod, reduction):
        monkeypatch.setattr(module, "launch", spy(module.launch))
    return calls


def grads(fn, inputs, needs, g=None, dtype=None):
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
    gs = torch.autograd.grad(out, wanted, to_reference(g, dtype) if dtype is not None else g)
    return out, type(out.grad_fn).__name__, gs, g


def check_autograd(fn, inputs, needs, *, exact=False, fused=True):
    """Gradients with enable() equal stock PyTorch's for every input that requires grad: within the dtype's
    tolerance of stock in float64 (bit-exact against stock at the same dtype where `exact`); the forward is
    stock's, bit for bit; the fused backward ran (`fused`), and none of the gradients is missing or zero where
    stock's is not."""
    with gradkern.use(False):
        stock_out, stock_fn, stock, g = grads(fn, inputs, needs)
        ref = grads(fn, inputs, needs, g, dtype=torch.float64)[2]
    with gradkern.use(mode="always"):
        out, node, ours, _ = grads(fn, inputs, needs, g)
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
