"""Property-based tests (hypothesis) for the elementwise launcher through the pointwise ops: random shapes,
strides (slices, transposes, stride-0 broadcasts, views PyTorch materialised from negative steps), dtypes and
parameters, compared with stock PyTorch. Bounded for CI; GRADKERN_FUZZ_EXAMPLES raises the count (GPU profile)."""

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEVICE, DTYPES
from gradkern.testing import check_case

EXAMPLES = int(os.environ.get("GRADKERN_FUZZ_EXAMPLES", "30"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def tensors(draw, shape):
    """A tensor of `shape` in a random layout, with the same values whatever the layout."""
    dtype = draw(st.sampled_from(DTYPES))
    base = (torch.randn(shape, dtype=torch.float32) * draw(st.sampled_from([0.5, 3.0, 10.0]))).to(dtype)
    layout = draw(st.sampled_from(["contiguous", "sliced", "permuted", "flipped", "broadcast"]))
    if layout == "sliced" and base.dim():
        big = torch.zeros(*shape[:-1], shape[-1] * 3, dtype=dtype)
        big[..., 1::3] = base
        t = big.to(DEVICE)[..., 1::3]
    elif layout == "permuted" and base.dim() >= 2:
        perm = draw(st.permutations(range(base.dim())))
        inv = [perm.index(i) for i in range(base.dim())]
        t = base.permute(perm).contiguous().to(DEVICE).permute(inv)
    elif layout == "flipped" and base.dim():
        t = base.flip(-1).to(DEVICE).flip(-1)  # PyTorch materialises negative steps as a copy
    elif layout == "broadcast" and base.dim():
        t = base[..., :1].to(DEVICE).expand(*shape)
    else:
        t = base.to(DEVICE)
    return t


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@SETTINGS
@given(data=st.data(), shape=shapes, op=st.sampled_from(["softshrink_backward", "hardshrink_backward",
                                                          "hardsigmoid_backward", "elu_backward"]))
def test_backward_ops_fuzz(data, shape, op):
    g = data.draw(tensors(shape))
    x_shape = data.draw(st.sampled_from([shape, shape[1:], tuple(1 for _ in shape)]))
    x = data.draw(tensors(x_shape))
    if op == "elu_backward":
        alpha = data.draw(st.sampled_from([0.5, 1.0, 1.6732632423543772]))
        scale = data.draw(st.sampled_from([1.0, 1.0507009873554805]))
        is_result = data.draw(st.booleans())
        args = (g, alpha, scale, data.draw(st.sampled_from([1.0, 0.5])), is_result, x)
    elif op == "hardsigmoid_backward":
        args = (g, x)
    else:
        args = (g, x, data.draw(st.sampled_from([0.0, 0.3, 0.5, 2.0])))
    check_case(op, args, what=f"{op} g{tuple(g.shape)}:{g.stride()} x{tuple(x.shape)}:{x.stride()}")


@SETTINGS
@given(data=st.data(), shape=shapes)
def test_hardshrink_fuzz(data, shape):
    x = data.draw(tensors(shape))
    check_case("hardshrink", (x, data.draw(st.sampled_from([0.0, 0.3, 0.5, 2.0]))), what=f"x{tuple(x.shape)}")
