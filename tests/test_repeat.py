"""repeat backward: gradkern.ops.repeat_backward against autograd's own formula, and Tensor.repeat's backward
through enable() (stock gradients, no autograd bypass)."""


import pytest
import torch
import torch.autograd.forward_ad as fwAD

import gradkern
from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import InvalidProblem, Unsupported, ops
from gradkern.kernels.repeat import _stock_repeat_backward
from gradkern.testing import assert_bitwise_equal, check_case, count_calls

# (input shape, repeats)
PROBLEMS = [
    ((5, 7), (3, 2)), ((5, 7), (1, 1)), ((5, 7), (2, 1, 3)), ((4,), (3, 2, 5)), ((3, 4, 5), (2, 1, 2)),
    ((), ()), ((), (4,)), ((), (2, 3)), ((6, 1), (1, 9)), ((2, 3), (0, 2)), ((2, 3), (3, 0, 2)),
    ((0, 3), (2, 2)), ((2, 2, 2, 2), (2, 1, 1, 3)), ((1, 2, 1, 2, 1, 2, 1, 2), (2, 1, 2, 1, 2, 1, 2, 1)),
    ((3,), (1, 1, 1, 1, 1, 1, 1, 2)), ((16, 16), (4, 4)), ((8, 4), (64, 1)), ((4, 4), (16, 16)),
]


def _grad_for(shape, reps, dtype, *, ints=False, seed=0):
    padded = (1,) * (len(reps) - len(shape)) + tuple(shape)
    gshape = tuple(r * s for r, s in zip(reps, padded, strict=True))
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-4, 5, gshape, generator=g).float() if ints else torch.randn(gshape, generator=g)
    return t.to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,reps", PROBLEMS, ids=lambda v: str(v).replace(" ", ""))
def test_matches_autograd_formula(shape, reps, dtype):
    grad = _grad_for(shape, reps, dtype)
    out = check_case("repeat_backward", (grad, list(reps), list(shape)), what=f"{shape} rep {reps}")
    assert tuple(out.shape) == tuple(shape) and out.dtype == dtype and out.is_contiguous()
    # small integers sum exactly in any order: bit-equal to the float64 formula rounded once
    gi = _grad_for(shape, reps, dtype, ints=True, seed=1)
    expected = _stock_repeat_backward(gi.double().cpu(), list(reps), list(shape)).to(dtype)
    assert_bitwise_equal(ops.repeat_backward(gi, reps, shape), expected, f"{shape} rep {reps} integers")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_one_term_is_an_exact_copy_and_zero_repeats_give_zeros(dtype):
    grad = _grad_for((6, 5), (1, 1), dtype) * 1e3
    assert_bitwise_equal(ops.repeat_backward(grad, (1, 1), (6, 5)), grad)
    assert_bitwise_equal(ops.repeat_backward(grad.view(1, 6, 5), (1, 1, 1), (6, 5)), grad)
    z = ops.repeat_backward(torch.empty(0, 15, dtype=dtype, device=DEVICE), (0, 3), (6, 5))
    assert z.shape == (6, 5) and bool((z == 0).all()) and z.dtype == dtype
    e = ops.repeat_backward(torch.empty(4, 0, dtype=dtype, device=DEVICE), (2, 3), (2, 0))
    assert e.shape == (2, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_grad_read_in_place(dtype):
    shape, reps = (6, 5), (3, 4)
    base = _grad_for(shape, reps, dtype)  # (18, 20)
    views = {
        "transposed": base.t().contiguous().t(),
        "sliced": _grad_for((6, 10), (3, 4), dtype)[:, ::2],  # (18, 40)[:, ::2] -> (18, 20)
        "offset": _grad_for((7, 6), (3, 4), dtype)[1:19, 2:22],
        "broadcast": _grad_for((1, 5), (1, 4), dtype).expand(18, 20),
        "channels_last": _grad_for((2, 3, 4, 5), (1, 2, 2, 1), dtype).to(memory_format=torch.channels_last),
    }
    for name, g in views.items():
        shp = (2, 3, 4, 5) if name == "channels_last" else shape
        rp = (1, 2, 2, 1) if name == "channels_last" else reps
        check_case("repeat_backward", (g, list(rp), list(shp)), what=name)


def test_deterministic():
    grad = _grad_for((16, 16), (4, 4), torch.float32) * 100
    first = ops.repeat_backward(grad, (4, 4), (16, 16))
    for _ in range(3):
        assert_bitwise_equal(ops.repeat_backward(grad, (4, 4), (16, 16)), first)


def test_bad_inputs_raise_named_errors():
    g = _grad_for((2, 3), (2, 2), torch.float32)
    with pytest.raises(InvalidProblem, match="repeat_backward.*repeats"):
        ops.repeat_backward(g, (2,), (2, 3))  # fewer repeats than input dims
    with pytest.raises(InvalidProblem, match="grad"):
        ops.repeat_backward(g, (2, 3), (2, 3))  # shape mismatch
    with pytest.raises(InvalidProblem, match="repeats"):
        ops.repeat_backward(g, (-2, 2), (2, 3))
    with pytest.raises(InvalidProblem, match="input_shape"):
        ops.repeat_backward(g, (2, 2), (2, -3))
    with pytest.raises(InvalidProblem, match="repeats"):
        ops.repeat_backward(g, 2, (2, 3))
    for reps in ((2.0, 2), ("2", 2), (True, 2)):  # ATen's int lists take none of these
        with pytest.raises(InvalidProblem, match="repeats"):
            ops.repeat_backward(g, reps, (2, 3))
    # ... not after the same values as ints were planned either (bug: 2.0 == 2 and True == 1 found the cached plan)
    ops.repeat_backward(g, (2, 2), (2, 3))
    ops.repeat_backward(_grad_for((2, 3), (1, 2), torch.float32), (1, 2), (2, 3))
    for reps, shape in (((2.0, 2.0), (2, 3)), ((2, 2), (2.0, 3)), ((True, 2), (2, 3))):
        with pytest.raises(InvalidProblem, match="repeats|input_shape"):
            ops.repeat_backward(g if reps[0] != 1 else _grad_for((2, 3), (1, 2), torch.float32), reps, shape)
    assert ops.repeat_backward(g, (torch.tensor(2), 2), torch.Size((2, 3))).shape == (2, 3)  # int-like values
    with pytest.raises(Unsupported, match="repeats"):
        ops.repeat_backward(torch.zeros((1,) * 9, device=DEVICE), (1,) * 9, (1,) * 9)
    with pytest.raises(Unsupported, match="grad"):
        ops.repeat_backward(g.to(torch.int32), (2, 2), (2, 3))
    with pytest.raises(Unsupported, match="grad"):
        ops.repeat_backward(None, (2, 2), (2, 3))


# ------------------------------------------------------------------------------------------------ through enable()
def _spy(monkeypatch):
    import gradkern.kernels.repeat as rep

    return count_calls(monkeypatch, rep, "repeat_backward")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_tensor_repeat_backward_through_enable(dtype, monkeypatch):
    calls = _spy(monkeypatch)
    for shape, reps in [((5, 7), (3, 2)), ((4,), (3, 2, 5)), ((3, 4, 5), (2, 1, 2)), ((), (2, 3)), ((2, 3), (0, 2))]:
        x = torch.randn(shape, device=DEVICE).to(dtype).requires_grad_()
        g = _grad_for(shape, reps, dtype, ints=True)
        with gradkern.use(mode="always"):
            y = x.repeat(*reps)
            (gx,) = torch.autograd.grad(y, x, g)
        y_ref = x.repeat(*reps)
        (gx_ref,) = torch.autograd.grad(y_ref, x, g)
        assert_bitwise_equal(y, y_ref, "forward")
        assert_bitwise_equal(gx, gx_ref, f"{shape} rep {reps}")  # integer grads: exact in every dtype
    assert len(calls) >= 4  # the kernel ran (not stock's formula)


def test_enable_gradients_float_values_and_only_requiring_inputs():
    x = torch.randn(4, 6, device=DEVICE, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, 18, device=DEVICE, dtype=torch.float64)  # does not require grad
    b = torch.randn(6, device=DEVICE, dtype=torch.float64, requires_grad=True)

    def f():
        return ((x.repeat(2, 3) * w).sin() + b.repeat(8, 3)).sum()

    with gradkern.use(mode="always"):
        gx, gb = torch.autograd.grad(f(), (x, b))
        out = f()
        out.backward()
    rx, rb = torch.autograd.grad(f(), (x, b))
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gb, rb, rtol=1e-12, atol=1e-12)
    assert w.grad is None and x.grad is not None


def test_no_grad_inference_and_other_dtypes_go_stock(monkeypatch):
    calls = _spy(monkeypatch)
    x = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    with gradkern.use(mode="always"):
        with torch.no_grad():
            y = x.repeat(2, 2)
        assert y.grad_fn is None and not y.requires_grad
        with torch.inference_mode():
            yi = x.detach().repeat(2, 2)
        assert torch.equal(y, yi) and torch.equal(y, x.detach().repeat(2, 2))
        xi = torch.arange(6, device=DEVICE).view(2, 3)
        assert torch.equal(xi.repeat(2, 1), torch.cat([xi, xi]))
        plain = torch.randn(3, 4, device=DEVICE)
        assert plain.repeat(1, 2).grad_fn is None
    assert not calls


def test_double_backward_equals_stock():
    x = torch.randn(3, 4, device=DEVICE, dtype=torch.float64, requires_grad=True)

    def second(enabled):
        with gradkern.use(enabled, mode="always"):
            y = x.repeat(2, 3)
            g = torch.linspace(-1, 1, y.numel(), device=DEVICE, dtype=torch.float64).view_as(y).requires_grad_()
            (gx,) = torch.autograd.grad((y * y).sum() * 0.5, x, create_graph=True)
            (ggx,) = torch.autograd.grad((gx ** 2).sum(), x)
            (gx2,) = torch.autograd.grad(y, x, g, create_graph=True)
            (gg,) = torch.autograd.grad((gx2 * x).sum(), g)
        return ggx, gg

    for a, b in zip(second(True), second(False), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_forward_mode_ad():
    x = torch.randn(3, 4, device=DEVICE, dtype=torch.float64)
    t = torch.randn(3, 4, device=DEVICE, dtype=torch.float64)
    with gradkern.use(mode="always"), fwAD.dual_level():
        y = fwAD.make_dual(x, t).repeat(2, 1, 3)
        tangent = fwAD.unpack_dual(y).tangent
    assert torch.equal(tangent, t.repeat(2, 1, 3))


def test_training_step_matches_stock():
    torch.manual_seed(0)
    emb = torch.nn.Parameter(torch.randn(8, 16, device=DEVICE))

    def step(enabled):
        p = torch.nn.Parameter(emb.detach().clone())
        with gradkern.use(enabled, mode="always"):
            loss = (p.repeat(4, 2).tanh() ** 2).mean()
            loss.backward()
        return p.grad

    torch.testing.assert_close(step(True), step(False), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ GPU sizes
@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_large_shapes_on_gpu(dtype):
    for shape, reps in [((1024, 1024), (4, 4)), ((4096, 256), (2, 8)), ((4096, 256), (64, 1)),
                        ((64, 64), (256, 256)), ((2, 64, 64, 32), (1, 3, 2, 1, 4))]:
        grad = _grad_for(shape, reps, dtype)
        out = check_case("repeat_backward", (grad, list(reps), list(shape)), what=f"{shape} rep {reps}")
        assert_bitwise_equal(ops.repeat_backward(grad, reps, shape), out, "again")


@gpu_only
def test_more_than_2_31_elements():
    """int64 offsets: a grad of more than 2^31 elements, summed over 2 tiles (a big output) and over 2^28 + 2^13
    tiles (a long reduction). Small integer values keep every fp32 partial sum exact, so any order gives the same
    bits."""
    n = 2**31 + 2**16
    if torch.cuda.mem_get_info()[0] < 8 * n:  # the grad, the output and the fp32 reference
        pytest.skip("not enough free GPU memory")
    g = torch.randint(-4, 5, (n,), device=DEVICE, dtype=torch.int8).to(torch.bfloat16)
    rows = 2**15
    out = ops.repeat_backward(g.view(2 * rows, -1), [2, 1], [rows, n // (2 * rows)])
    two = g.view(2, rows, -1)
    assert torch.equal(out, (two[0].float() + two[1].float()).bfloat16())
    del out, two
    tiles = (n - 2**16) // 8 + 2**13  # n = 8 * tiles
    assert 8 * tiles == n and tiles > 2**28
    out = ops.repeat_backward(g, [tiles], [8])
    assert torch.equal(out, g.view(tiles, 8).sum(0, dtype=torch.float32).bfloat16())


def test_cached_plans_keep_validation_and_read_tensor_values():
    """Bugs (cache-key review): after one call, a negative-bit view of the same layout skipped the check that
    refuses it (and was summed as -g); 0-d tensors among repeats / input_shape were keyed by identity, so values
    changed in place kept the first plan."""
    g = _grad_for((2, 3), (2, 2), torch.float32)
    ops.repeat_backward(g, (2, 2), (2, 3))
    with pytest.raises(Unsupported, match="negative-bit"):
        ops.repeat_backward(torch._neg_view(g), (2, 2), (2, 3))
    g4 = torch.randn(4, 4, device=DEVICE)
    r, s = torch.tensor(2), torch.tensor(2)
    assert ops.repeat_backward(g4, [r, 1], [s, 4]).shape == (2, 4)
    r.fill_(1)
    s.fill_(4)
    assert_bitwise_equal(ops.repeat_backward(g4, [r, 1], [s, 4]), g4, "values changed in place")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_negative_zero_where_nothing_is_summed(dtype):
    """autograd's repeat_backward sums nothing when there are no leading dims and every repeat is 1: the gradient is
    grad itself, -0.0 included (a sum from +0.0 would give +0.0). Where it does sum (a leading dim of 1, a repeat
    of 2), stock's sums give +0.0; gradkern's equal them bit for bit (found by scripts/fuzz.py: -0.0 came back
    +0.0 with one term)."""
    for reps, shape in (((1,), (3,)), ((1, 1), (2, 3)), ((), ()), ((1, 1), (3,)), ((2, 1), (3, 1))):
        g = torch.full([r * s for r, s in zip(reps, (1,) * (len(reps) - len(shape)) + shape, strict=True)], -0.0,
                       dtype=dtype, device=DEVICE)
        expected = _stock_repeat_backward(g, reps, shape).reshape(shape)
        assert_bitwise_equal(ops.repeat_backward(g, reps, shape), expected, f"{reps} {shape}")
        x = torch.zeros(shape, dtype=dtype, device=DEVICE, requires_grad=True)
        with gradkern.use(mode="always"):
            (gx,) = torch.autograd.grad(x.repeat(list(reps)), x, g)
        (ref,) = torch.autograd.grad(x.repeat(list(reps)), x, g)
        assert_bitwise_equal(gx, ref, f"enable() {reps} {shape}")
    g = torch.randn(2, 3, device=DEVICE).to(dtype)
    x = torch.zeros(2, 3, dtype=dtype, device=DEVICE, requires_grad=True)
    with gradkern.use(mode="always"):
        (gx,) = torch.autograd.grad(x.repeat(1, 1), x, g)
    assert gx.data_ptr() == g.data_ptr(), "enable(): a copy where autograd's formula hands grad on"
    t = torch.full((2, 3), -0.0, dtype=dtype, device=DEVICE).t()  # a strided grad: a fresh contiguous copy
    out = ops.repeat_backward(t, (1, 1), (3, 2))
    assert out.is_contiguous() and out.data_ptr() != t.data_ptr()
    assert_bitwise_equal(out, t)


# ------------------------------------------------------------------------------------------------ mutation-found gaps
def test_negative_repeats_and_sizes_whose_products_fit_the_grad_are_refused():
    """Negative repeats (or sizes) are refused before the shape check: (-1) x (-2) = 2 matches a grad of 2
    elements, which would otherwise reach the planner with negative sizes."""
    g = _grad_for((2,), (1,), torch.float32)
    with pytest.raises(InvalidProblem, match="repeats"):
        ops.repeat_backward(g, (-1,), (-2,))
    with pytest.raises(InvalidProblem, match="repeats"):
        ops.repeat_backward(_grad_for((2, 3), (1, 1), torch.float32), (-1, 1), (-2, 3))


def test_complex_repeat_backward_under_enable_is_stock():
    """A dtype the kernel does not take (complex, which can require grad) gets autograd's own formula."""
    x = torch.randn(3, 4, device=DEVICE, dtype=torch.complex64, requires_grad=True)
    g = torch.randn(6, 4, device=DEVICE, dtype=torch.complex64)
    with gradkern.use(mode="always"):
        (gx,) = torch.autograd.grad(x.repeat(2, 1), x, g)
    (ref,) = torch.autograd.grad(x.repeat(2, 1), x, g)
    assert torch.equal(gx, ref)
