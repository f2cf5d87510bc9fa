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
    with gradkern.use(mode="always"):
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


def _layout_cases():
    """(custom op, args) with inputs whose layouts differ (a channels_last x with a contiguous grad, transposed
    operands): where the kernels keep no input's layout."""
    g = torch.randn(2, 3, 4, 5, device=DEVICE)
    x = torch.randn(2, 3, 4, 5, device=DEVICE).contiguous(memory_format=torch.channels_last)
    ops = gradkern.ops
    data = torch.randn(3, 10, device=DEVICE).t()  # (10, 3), transposed
    lengths = torch.tensor([4, 6], device=DEVICE)
    out = torch.segment_reduce(data, "max", lengths=lengths)
    c = (torch.rand(5, 6, device=DEVICE) > 0.5).t()
    a, b, h = (torch.randn(6, 5, device=DEVICE) for _ in range(3))
    return [
        ("hardsigmoid_backward", ops.hardsigmoid_backward.custom_op, (g, x)),
        ("elu_backward", ops.elu_backward.custom_op, (g, 1.0, 1.0, 1.0, False, x)),
        ("softshrink_backward", ops.softshrink_backward.custom_op, (g, x, 0.5)),
        ("hardshrink_backward", ops.hardshrink_backward.custom_op, (g, x, 0.5)),
        ("_prelu_kernel_backward", ops._prelu_kernel_backward.custom_op,
         (g, x, torch.rand(1, 3, 1, 1, device=DEVICE))),
        ("_segment_reduce_backward", ops._segment_reduce_backward.custom_op,
         (torch.ones_like(out), out, data, "max", lengths, None, 0, None)),
        ("where_backward", ops.where_backward.custom_op[(True, True)], (h, c, a, b, [True, True])),
        ("lerp_backward", ops.lerp_backward.custom_op[(True,)], (h.t().contiguous().t(), a, b, a, [True] * 3)),
        ("prelu_backward", ops.prelu_backward.custom_op[()], (g, x, torch.rand(3, device=DEVICE), [True, True])),
    ]


@pytest.mark.parametrize("case", range(9))
def test_fake_results_have_the_real_results_layout(case):
    """Bug: the custom ops whose fake is the reference (often ATen's op) declared the reference's output layout
    (a channels_last x: channels_last), while the kernels keep an input's layout only where every input shares
    it: Inductor's stride asserts failed, and aot_eager traced views on the wrong strides. Those ops now return
    contiguous results, real and fake; _segment_reduce_backward's own fake now says contiguous too."""
    name, op, args = _layout_cases()[case]
    torch.library.opcheck(op, args, test_utils=("test_faketensor",))


def test_shrink_backwards_compile_with_dynamic_shapes():
    """Bug: their fake was ATen's op, which has no meta for symbolic shapes: dynamic=True (and the automatic
    dynamic recompile on a second shape) failed to trace."""
    for name in ("softshrink_backward", "hardshrink_backward"):
        op = getattr(gradkern.ops, name)
        torch._dynamo.reset()
        f = torch.compile(lambda g, x: op(g, x, 0.5), fullgraph=True, backend="aot_eager", dynamic=True)
        for n in (8, 13):
            g, x = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
            assert_bitwise_equal(f(g, x), op(g, x, 0.5), f"{name} n={n}")


def test_out_arguments_of_another_dtype_are_refused_under_compile():
    """Bug: under torch.compile an out= / grad_input= of another dtype was written with a silent cast (eager
    refuses it)."""
    g, x = torch.randn(4, 5, device=DEVICE), torch.randn(4, 5, device=DEVICE) * 4
    torch._dynamo.reset()
    f = torch.compile(lambda g, x, o: gradkern.ops.hardsigmoid_backward(g, x, grad_input=o), fullgraph=True,
                      backend="aot_eager")
    with pytest.raises(Exception, match="grad_input.*dtype"):
        f(g, x, torch.zeros(4, 5, device=DEVICE, dtype=torch.int32))
