"""torch.compile: code calling gradkern.ops.* compiles with fullgraph=True (no graph break) and gives the same
bits as eager; and what enable() means under torch.compile."""

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import gradkern
from conftest import DEVICE
from gradkern.registry import REGISTRY
from gradkern.testing import assert_bitwise_equal

# Inductor compiles C++ for CPU tensors (slow, and needs a compiler); under the interpreter the graph is
# exercised with AOT autograd + fake tensors, which is where graph breaks and fake-implementation bugs show.
BACKEND = "aot_eager" if DEVICE == "cpu" else "inductor"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_ops_compile_fullgraph_with_same_bits(name):
    info = REGISTRY[name]
    op = getattr(gradkern.ops, name)
    if name in gradkern.ops.NO_CUSTOM_OP:
        pytest.xfail(f"no custom op: {gradkern.ops.NO_CUSTOM_OP[name]}")
    torch._dynamo.reset()
    for case in info.cases(DEVICE, torch.float32, "small")[:1]:
        eager = op(*case.args, **case.kwargs)
        compiled = torch.compile(lambda *a: op(*a, **case.kwargs), fullgraph=True, backend=BACKEND)
        assert_bitwise_equal(compiled(*case.args), eager, f"{name} compiled")


def test_custom_ops_are_registered():
    """One custom op per op, or per Tensor/number combination of its arguments (where, lerp, prelu)."""
    assert not gradkern.ops.NO_CUSTOM_OP
    for name in REGISTRY:
        ops = getattr(gradkern.ops, name).custom_op
        for op in ops.values() if isinstance(ops, dict) else [ops]:
            assert op._qualname.startswith(f"gradkern::{name}"), name


@pytest.mark.parametrize("weight", ["tensor", "number"])
def test_fused_backwards_compile_fullgraph_every_argument_kind(weight):
    """The ops with Tensor-or-number arguments and optional outputs, compiled with each kind and output mask."""
    a, b, g = (torch.randn(6, 5, device=DEVICE) for _ in range(3))
    w = torch.rand(6, 1, device=DEVICE) if weight == "tensor" else 0.3
    c = torch.rand(6, 5, device=DEVICE) > 0.5
    pw = torch.rand(5, device=DEVICE)
    calls = [
        lambda: gradkern.ops.lerp_backward(g, a, b, w),
        lambda: gradkern.ops.lerp_backward(g, a, b, w, (False, True, True)),
        lambda: gradkern.ops.where_backward(g, c, a, b[:1]),
        lambda: gradkern.ops.where_backward(g, c, a, 2.0, (True, False)),
        lambda: gradkern.ops.where_backward(g, c, 1, b, (False, True)),
        lambda: gradkern.ops.prelu_backward(g, a, pw),
        lambda: gradkern.ops.prelu_backward(g, a, pw, (False, True)),
    ]
    for i, call in enumerate(calls):
        torch._dynamo.reset()
        eager = call()
        compiled = torch.compile(call, fullgraph=True, backend=BACKEND)()
        assert_bitwise_equal(compiled, eager, f"call {i}")


def test_enable_under_compile(monkeypatch):
    """What enable() means under torch.compile: the graph holds ATen ops, traced before dispatch. Inductor (the
    default backend, used on the GPU) lowers elu/hardsigmoid/... backward to its own generated kernels, so
    gradkern's registration is not reached from compiled code; a backend that runs the graph's ATen ops eagerly
    (aot_eager) reaches it. Either way gradients equal stock's, and eager code keeps using gradkern."""
    info = REGISTRY["hardsigmoid_backward"]
    calls = []
    impl = info.aten["hardsigmoid_backward"]
    monkeypatch.setitem(info.aten, "hardsigmoid_backward", lambda *a: (calls.append(1), impl(*a))[1])
    x = torch.randn(64, device=DEVICE, requires_grad=True)

    def f(x):
        return F.hardsigmoid(x * 4).sum()

    (ref,) = torch.autograd.grad(f(x), x)
    torch._dynamo.reset()
    with gradkern.use():
        (got,) = torch.autograd.grad(torch.compile(f, fullgraph=True, backend=BACKEND)(x), x)
        if BACKEND == "inductor":
            assert not calls, "Inductor's compiled graph reached gradkern's eager registration"
        else:
            assert calls, "aot_eager ran the backward graph's ATen op without gradkern"
        calls.clear()
        (eager,) = torch.autograd.grad(f(x), x)
        assert calls, "enable() did not route the eager backward"
    torch.testing.assert_close(got, ref)
    assert torch.equal(eager, ref)


def test_autograd_functions_compile_fullgraph():
    """gradkern.sparsemax and gradkern.segment_max, forward and backward, inside one compiled graph."""
    torch._dynamo.reset()
    x = torch.randn(4, 16, device=DEVICE, requires_grad=True)
    f = torch.compile(lambda x: gradkern.sparsemax(x, dim=0).square().sum(), fullgraph=True, backend=BACKEND)
    (got,) = torch.autograd.grad(f(x), x)
    (want,) = torch.autograd.grad(gradkern.sparsemax(x, dim=0).square().sum(), x)
    assert_bitwise_equal(got, want, "sparsemax compiled")

    d = torch.randn(7, 3, device=DEVICE, requires_grad=True)
    lengths = torch.tensor([2, 0, 5], device=DEVICE)
    h = torch.compile(lambda d: gradkern.segment_max(d, lengths=lengths)[0].square().sum(), fullgraph=True,
                      backend=BACKEND)
    (got,) = torch.autograd.grad(h(d), d)
    (want,) = torch.autograd.grad(gradkern.segment_max(d, lengths=lengths)[0].square().sum(), d)
    assert_bitwise_equal(got, want, "segment_max compiled")
