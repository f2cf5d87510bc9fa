"""The pointwise family (elu/celu/selu, softshrink, hardshrink, hardsigmoid): boundaries, layouts, broadcast,
0-d/empty, out=, dtype promotion, bad inputs, and training through enable()."""

import itertools
import math

import pytest
import torch
import torch.nn as nn

import gradkern
from conftest import DEVICE, DTYPES, dtype_id
from gradkern import config, ops
from gradkern.engines import elementwise
from gradkern.kernels import pointwise as pointwise_mod
from gradkern.launch.checks import contiguous_strides
from gradkern.testing import (
    arrange,
    assert_bitwise_equal,
    assert_close,
    boundary_values,
    check_case,
    layouts,
    poison_like,
    run_reference,
)

# op name -> (build the op's arguments from (grad, x), boundary points of x)
BACKWARDS = {
    "elu_backward": (lambda g, x: (g, 1.0, 1.0, 1.0, False, x), ()),
    "celu": (lambda g, x: (g, 2.0, 1.0, 0.5, False, x), ()),
    "selu_result": (lambda g, x: (g, 1.6732632423543772, 1.0507009873554805, 1.0, True, x), ()),
    "celu_result": (lambda g, x: (g, 2.0, 1.0, 0.5, True, x), ()),  # in-place celu: input_scale != 1 with a result
    "softshrink_backward": (lambda g, x: (g, x, 0.5), (0.5,)),
    "softshrink_backward_lambd_0.3": (lambda g, x: (g, x, 0.3), (0.3,)),
    "hardshrink_backward": (lambda g, x: (g, x, 0.3), (0.3,)),
    "hardsigmoid_backward": (lambda g, x: (g, x), (3.0,)),
}


def _op(key):
    return "elu_backward" if key in ("celu", "selu_result", "celu_result") else key.split("_lambd")[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("key", sorted(BACKWARDS))
def test_boundary_values(key, dtype):
    make, points = BACKWARDS[key]
    x = boundary_values(dtype, *points, 3.0).to(DEVICE)
    g = torch.linspace(-2, 2, x.numel(), device=DEVICE).to(dtype)
    out = check_case(_op(key), make(g, x), what=f"{key} boundaries")
    nan = torch.isnan(x)
    if _op(key) != "hardsigmoid_backward":  # ATen's CUDA convention: NaN x takes the "else" branch, g*scale
        scale = make(g, x)[2] if _op(key) == "elu_backward" else 1.0
        assert_close(out[nan], g[nan].double() * scale, dtype, f"{key} NaN x")
    else:
        assert (out[nan] == 0).all()
    # grad_output NaN/inf pass through exactly as stock does
    g2 = boundary_values(dtype).to(DEVICE)
    x2 = torch.linspace(-4, 4, g2.numel(), device=DEVICE).to(dtype)
    check_case(_op(key), make(g2, x2), what=f"{key} special grads")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_hardshrink_forward_boundaries(dtype):
    x = boundary_values(dtype, 0.5, 0.3).to(DEVICE)
    for lam in (0.5, 0.3, 0.0):
        check_case("hardshrink", (x, lam), what=f"hardshrink lambd={lam}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_lambd_is_rounded_to_dtype(dtype):
    """lambda = 0.3 is not representable in 16 bits: the band edge is lambda rounded to the dtype."""
    lam = 0.3
    edge = torch.tensor(lam, dtype=dtype)
    x = torch.stack([edge, torch.nextafter(edge.float(), torch.tensor(1.0)).to(dtype), -edge]).to(DEVICE)
    g = torch.ones(3, dtype=dtype, device=DEVICE)
    out = ops.hardshrink_backward(g, x, lam)
    assert out[0].item() == 0 and out[2].item() == 0
    assert_bitwise_equal(out, run_reference(torch.ops.aten.hardshrink_backward, (g, x, lam), dtype=None))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("key", sorted(BACKWARDS))
def test_layouts_and_broadcast(key, dtype):
    make, _ = BACKWARDS[key]
    g0 = torch.randn(6, 5, 7, device=DEVICE).to(dtype)
    x0 = (torch.randn(6, 5, 7, device=DEVICE) * 3).to(dtype)
    for lname, g in layouts(g0):
        for xname, x in layouts(x0):
            check_case(_op(key), make(g, x), what=f"{key} g:{lname} x:{xname}")
    check_case(_op(key), make(g0, x0[:, :1, :]), what=f"{key} broadcast x")  # stride-0 dim
    check_case(_op(key), make(g0[0, 0, 0], x0), what=f"{key} 0-d grad")
    check_case(_op(key), make(g0.expand(2, 6, 5, 7), x0), what=f"{key} expanded grad")
    cl = g0.reshape(2, 3, 5, 7).contiguous(memory_format=torch.channels_last)
    out = check_case(_op(key), make(cl, x0.reshape(2, 3, 5, 7).contiguous(memory_format=torch.channels_last)),
                     what=f"{key} channels_last")
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("key", sorted(BACKWARDS))
def test_zero_dim_and_empty(key):
    make, _ = BACKWARDS[key]
    g, x = torch.tensor(0.7, device=DEVICE), torch.tensor(-0.2, device=DEVICE)
    out = check_case(_op(key), make(g, x), what=f"{key} 0-d")
    assert out.shape == ()
    e = torch.empty(0, 3, device=DEVICE)
    assert ops.__dict__[_op(key)](*make(e, e)).shape == (0, 3)


def test_rank_8_strided_and_rank_9():
    shape = (2, 1, 2, 3, 1, 2, 2, 3)
    g = torch.randn(*shape, 2, device=DEVICE)[..., 0]  # strided, rank 8
    x = torch.randn(shape, device=DEVICE).permute(7, 6, 5, 4, 3, 2, 1, 0).contiguous().permute(7, 6, 5, 4, 3, 2, 1, 0)
    check_case("hardsigmoid_backward", (g, x * 4), what="rank 8")
    # rank 9 whose dims merge is fine; rank 9 that cannot be merged is Unsupported, before any launch
    big = torch.randn([2] * 9, device=DEVICE)
    check_case("hardsigmoid_backward", (big, big), what="rank 9 contiguous")
    nonmerge = torch.randn([3] * 9, device=DEVICE)[(slice(None, None, 2),) * 9]
    with pytest.raises(gradkern.Unsupported, match="rank"):
        ops.hardsigmoid_backward(nonmerge, nonmerge)


def test_int64_offsets_give_the_same_bits():
    """The flat and the strided pass in int64 index math (used where offsets can pass 2^31), forced by lowering the
    threshold: the same bits as in int32 (the plans show which width they took)."""
    g0, x0 = torch.randn(30, 70, device=DEVICE), torch.randn(30, 70, device=DEVICE) * 4
    for what, g, x in (("flat", g0, x0), ("strided", g0[:, ::2], x0[:, ::2])):
        engine = pointwise_mod._HARDSIGMOID_BACKWARD
        config.clear_plans()
        want = ops.hardsigmoid_backward(g, x)
        with config.override(elementwise.CONFIG, i32_max=64):
            got = ops.hardsigmoid_backward(g, x)
            (plan,) = engine._plans.values()
        assert plan.i64 and plan.flat == (what == "flat"), what
        assert_bitwise_equal(got, want, f"{what} int64")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_an_input_across_the_output_layout_takes_tiles(dtype):
    """Where an input's unit stride is on another dim than the output's (a transposed or channels_last input next to
    a contiguous one), the strided pass walks 2-D tiles of those two dims (`tile_dims`): ragged tile edges (37 x 45,
    dims of 72 and 9), dims walked a program each (4-D), the transposed input first or second, an out= result laid
    out across both inputs, int64 offsets. Same bits as the flat pass over contiguous copies (the same math), and
    stock's strides."""
    engine = pointwise_mod._HARDSIGMOID_BACKWARD
    cases = [(37, 45, "t"), (2, 3, 72, 20, "t"), (2, 9, 5, 13, "cl")]
    for *shape, kind in cases:
        a = (arrange(shape, kind, lambda st: torch.randn(st, device=DEVICE)) * 4).to(dtype)
        b = (torch.randn(shape, device=DEVICE) * 4).to(dtype)
        want = ops.hardsigmoid_backward(b.contiguous(), a.contiguous())
        for (g, x), lim in itertools.product(((b, a), (a, b)), (elementwise.CONFIG.current.i32_max, 64)):
            config.clear_plans()
            with config.override(elementwise.CONFIG, i32_max=lim):
                got = ops.hardsigmoid_backward(g, x)
                (plan,) = engine._plans.values()
            what = f"{shape} {kind} {g.stride()} {x.stride()} i32_max {lim}"
            assert plan.tile_dim >= 0 and plan.i64 == (lim == 64), what
            assert got.stride() == torch.ops.aten.hardsigmoid_backward(g, x).stride(), what
            assert_bitwise_equal(got, want if g is b else ops.hardsigmoid_backward(a.contiguous(), b.contiguous()),
                                 what)
    g, x = (torch.randn(33, 40, device=DEVICE) for _ in range(2))
    out = torch.empty(40, 33, device=DEVICE).t()
    config.clear_plans()
    ops.hardsigmoid_backward(g, x, grad_input=out)
    (plan,) = engine._plans.values()
    assert plan.tile_dim >= 0
    assert_bitwise_equal(out, ops.hardsigmoid_backward(g, x), "out= transposed")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_out_argument_writes_every_element(dtype):
    g = torch.randn(33, 17, device=DEVICE).to(dtype)
    x = (torch.randn(33, 17, device=DEVICE) * 3).to(dtype)
    for out in (poison_like(g), poison_like(g.t().contiguous()).t()):
        res = ops.hardsigmoid_backward(g, x, grad_input=out)
        assert res is out
        assert not torch.isnan(out).any()
        assert_bitwise_equal(out.contiguous(), ops.hardsigmoid_backward(g, x))
    out = poison_like(x)
    ops.hardshrink(x, 0.5, out=out)
    assert_bitwise_equal(out, ops.hardshrink(x, 0.5))


def test_mixed_dtypes_promote_like_aten():
    g = torch.randn(50, device=DEVICE, dtype=torch.float16)
    x = torch.randn(50, device=DEVICE, dtype=torch.float32) * 3
    out = check_case("hardsigmoid_backward", (g, x), what="f16 grad, f32 x")
    assert out.dtype == torch.float32
    out = check_case("softshrink_backward", (x.double(), g, 0.5), what="f64 grad, f16 x")
    assert out.dtype == torch.float64
    # a 0-d tensor takes part only when no tensor has dims (found by fuzzing: f32 (0,) with f64 0-d gave f64)
    for n in (0, 5):
        out = check_case("hardsigmoid_backward", (x[:n], torch.tensor(-1.25, device=DEVICE, dtype=torch.float64)),
                         what=f"f32 ({n},) grad, f64 0-d x")
        assert out.dtype == torch.float32
    out = check_case("hardshrink_backward", (torch.tensor(2.0, device=DEVICE, dtype=torch.float64),
                                             torch.tensor(1.0, device=DEVICE, dtype=torch.float16), 0.5),
                     what="two 0-d tensors")
    assert out.dtype == torch.float64
    # a 0-d operand of another 16-bit dtype is rounded to the common dtype first, as ATen casts it: f16 2.998 is
    # 3.0 in bf16, so hardsigmoid's open interval gives 0 (not g/6 as the unrounded value would)
    out = check_case("hardsigmoid_backward", (torch.ones(4, device=DEVICE, dtype=torch.bfloat16),
                                              torch.tensor(2.998046875, device=DEVICE, dtype=torch.float16)),
                     what="bf16 grad, f16 0-d x")
    assert out.dtype == torch.bfloat16 and (out == 0).all()
    # f64 -> f16 goes through f32 (as c10's Half converts a double): 1 + 2^-11 + 2^-40 is 1 + 2^-11 in f32, a tie
    # that rounds to 1.0 = lambd (in the band: 0); rounded once it would be the next f16 above 1 (outside: g)
    out = check_case("hardshrink_backward", (torch.ones(3, device=DEVICE, dtype=torch.float16),
                                             torch.tensor(1 + 2**-11 + 2**-40, device=DEVICE, dtype=torch.float64),
                                             1.0), what="f16 grad, f64 0-d x at a double-rounding tie")
    assert out.dtype == torch.float16 and (out == 0).all()


def test_bad_inputs_raise_named_errors_and_write_nothing():
    g = torch.randn(4, 5, device=DEVICE)
    x = torch.randn(4, 5, device=DEVICE)
    out = poison_like(g)
    cases = [
        (gradkern.InvalidProblem, "broadcast", lambda: ops.hardsigmoid_backward(g, x[:, :3], grad_input=out)),
        (gradkern.InvalidProblem, "shape", lambda: ops.hardsigmoid_backward(g, x, grad_input=out[:2])),
        (gradkern.Unsupported, "dtype", lambda: ops.hardsigmoid_backward(g, x, grad_input=out.double())),
        (gradkern.Unsupported, "dtype", lambda: ops.elu_backward(g, 1.0, 1.0, 1.0, False, x.to(torch.int32))),
        (gradkern.Unsupported, "dtype", lambda: ops.hardshrink(x.to(torch.complex64))),
        (gradkern.Unsupported, "Tensor", lambda: ops.hardsigmoid_backward(g, [1.0, 2.0])),
        (gradkern.InvalidProblem, "lambd", lambda: ops.softshrink_backward(g, x, -0.5, grad_input=out)),
        (gradkern.InvalidProblem, "alpha", lambda: ops.elu_backward(g, -1.0, 1.0, 1.0, True, x, grad_input=out)),
    ]
    if DEVICE == "cuda":
        cases.append((gradkern.Unsupported, "device cuda", lambda: ops.hardsigmoid_backward(g.cpu(), x.cpu())))
    for err, word, call in cases:
        with pytest.raises(err, match=word) as info:
            call()
        msg = str(info.value)
        assert msg.split(":")[0] in ("hardsigmoid_backward", "elu_backward", "hardshrink", "softshrink_backward")
        assert torch.isnan(out).all(), f"a rejected call wrote its output: {msg}"
    assert issubclass(gradkern.InvalidProblem, ValueError) and issubclass(gradkern.Unsupported, TypeError)


MODULES = {
    "CELU": lambda: nn.CELU(alpha=1.7),
    "ELU": lambda: nn.ELU(alpha=0.8),
    "ELU_inplace": lambda: nn.ELU(alpha=0.8, inplace=True),
    "SELU": lambda: nn.SELU(),
    "Softshrink": lambda: nn.Softshrink(0.4),
    "Hardshrink": lambda: nn.Hardshrink(0.4),
    "Hardsigmoid": lambda: nn.Hardsigmoid(),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_train_with_stock_gradients(name, dtype, monkeypatch):
    """nn modules under enable() give stock PyTorch's gradients, and really ran gradkern's kernels."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to(DEVICE, dtype)
    act = MODULES[name]()
    x = torch.randn(16, 8, device=DEVICE).to(dtype) * 3

    def step():
        lin.zero_grad()
        xi = x.clone().requires_grad_(True)
        act(lin(xi)).square().sum().backward()
        return [xi.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]

    stock = step()
    calls = []
    for info in gradkern.registry.REGISTRY.values():
        for ov, impl in list(info.aten.items()):
            monkeypatch.setitem(info.aten, ov, lambda *a, _i=impl, _o=ov, **k: (calls.append(_o), _i(*a, **k))[1])
    with gradkern.use(mode="always"):
        ours = step()
    assert calls, f"{name}: no gradkern kernel ran"
    for a, b in zip(ours, stock, strict=False):
        if dtype in (torch.float32, torch.float64):
            assert_close(a, b, dtype, name)
        else:  # both sides carry the low-precision forward; compare loosely
            torch.testing.assert_close(a.float(), b.float(), atol=0.1, rtol=0.05)


def test_cached_plan_does_not_skip_the_device_check():
    """A tensor on another device with the same shape, strides and dtype as a call seen before must still be
    rejected: the plan cache was keyed by get_device(), -1 for cpu and meta alike, and skipped validation."""
    for transpose in (False, True):  # a flat plan, then a strided one
        g = torch.randn(4, 8, device=DEVICE)
        x = torch.randn(4, 8, device=DEVICE)
        g, x = (g.t(), x.t()) if transpose else (g, x)
        ops.hardsigmoid_backward(g, x)
        with pytest.raises(gradkern.Unsupported, match="device"):
            ops.hardsigmoid_backward(g, x.to("meta"))
        with pytest.raises(gradkern.Unsupported, match="device"):
            ops.hardsigmoid_backward(g.to("meta"), x)


def test_out_overlap_rules_follow_aten():
    """In place (out is an input, same layout) works as in ATen; an out that partly overlaps an input, or whose
    elements share memory (expanded), is a named error where ATen raises, with nothing written."""
    g, x = torch.randn(64, device=DEVICE), torch.randn(64, device=DEVICE) * 4
    expected = ops.hardsigmoid_backward(g, x)
    g2 = g.clone()
    assert ops.hardsigmoid_backward(g2, x, grad_input=g2) is g2
    assert_bitwise_equal(g2, expected)
    buf = torch.randn(65, device=DEVICE)
    before = buf.clone()
    with pytest.raises(gradkern.InvalidProblem, match="grad_input.*partly share memory with 'grad_output'"):
        ops.hardsigmoid_backward(buf[:64], x, grad_input=buf[1:])
    with pytest.raises(gradkern.InvalidProblem, match="grad_input.*do not overlap in memory"):
        ops.hardsigmoid_backward(g, x, grad_input=buf[:1].expand(64))
    assert torch.equal(buf, before)


def test_celu_alpha_zero_is_stock_error():
    x = torch.randn(4, device=DEVICE, requires_grad=True)
    with gradkern.use(mode="always"), pytest.raises(RuntimeError):
        torch.nn.functional.celu(x, alpha=0.0)


def test_lambda_the_dtype_cannot_hold_is_rejected_like_aten():
    x = torch.tensor([1e4, -1e4, 1.0, math.inf], device=DEVICE, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="overflow"):
        run_reference(torch.ops.aten.hardshrink, (x, 1e6), dtype=None)
    with pytest.raises(gradkern.InvalidProblem, match="lambd"):
        ops.hardshrink(x, 1e6)
    check_case("hardshrink", (x, 6e4), what="lambda near the f16 maximum")


def test_relaunch_cache_respects_alignment_scalars_and_shapes():
    """The compiled-kernel relaunch path is keyed by what Triton specialises on: a view at an odd offset (not
    16-byte aligned), a scalar whose bits change integer width (0.0), or a new length must not reuse a kernel
    compiled for something else."""
    buf = torch.randn(4099, device=DEVICE) * 2
    grad = torch.randn(4099, device=DEVICE)
    for lam in (0.5, 0.5, 0.0, 0.0, 1.5):
        for start, n in ((0, 4096), (0, 4096), (1, 4096), (3, 4093), (0, 4096)):
            x, g = buf[start:start + n], grad[start:start + n]
            check_case("hardshrink_backward", (g, x, lam), what=f"lambd={lam} offset={start} n={n}")
            check_case("hardshrink", (x, lam), what=f"hardshrink lambd={lam} offset={start} n={n}")


def test_flat_calls_off_alignment_and_out_calls_relaunch_directly(monkeypatch):
    """A flat problem whose operand sits off 16-byte alignment (a view at a storage offset), or an out= call, goes
    through launch with a specialisation key (its direct relaunch keyed by the pointers' alignment), as a fresh
    aligned one has its own relaunch entry. (They took Triton's JIT launch on every call: docs/tuning/pointwise.md.)"""
    keys = []
    real = elementwise.launch

    def spy(kernel, grid, ptrs, ints, consts, device, spec_key=None):
        keys.append(spec_key)
        return real(kernel, grid, ptrs, ints, consts, device, spec_key)

    monkeypatch.setattr(elementwise, "launch", spy)
    buf = torch.randn(4099, device=DEVICE) * 2
    x = buf[1:4097]
    check_case("hardshrink", (x, 0.5), what="offset 1")
    out = torch.empty(4096, device=DEVICE)
    ops.hardshrink(buf[:4096], 0.5, out=out)
    assert_bitwise_equal(out, torch.nn.functional.hardshrink(buf[:4096], 0.5))
    assert len(keys) >= 2 and all(k is not None and k[0] is elementwise._flat_kernel for k in keys), keys


def test_strided_relaunch_keys_follow_scalar_specialisation():
    """The strided path is relaunched directly too, keyed by what Triton specialises the scalars' float64 bits on:
    5e-324's bits are 1, which Triton compiles in as a constant, and 0.0's are 0. A kernel compiled for one must
    not serve the other: |x| = 5e-324 passes lambd = 0 and not lambd = 5e-324. Non-contiguous views (the strided
    path), at two offsets."""
    tiny = 5e-324
    buf = torch.randn(2, 33, 65, device=DEVICE, dtype=torch.float64)
    buf[:, :, ::3] = tiny
    grad = torch.randn(2, 33, 65, device=DEVICE, dtype=torch.float64)
    for lam in (tiny, 0.0, tiny, 0.5, 0.1, 0.0, tiny):
        for start in (0, 1, 0):
            x, g = buf[:, start:start + 32, ::2], grad[:, start:start + 32, ::2]
            check_case("hardshrink_backward", (g, x, lam), what=f"lambd={lam} offset={start}")
            check_case("hardshrink", (x, lam), what=f"hardshrink lambd={lam} offset={start}")


def test_launch_keys_direct_relaunch_by_pointer_alignment(monkeypatch):
    """`launcher.launch` adds the pointers' 16-byte alignment to the caller's key and relaunches with the
    pointers as ints: a cached launcher serves only pointers aligned as those it was made for (others take the
    JIT path). Checked with stand-ins, so on any machine."""
    from gradkern.launch import launcher

    class Ptr:
        def __init__(self, addr):
            self.addr = addr

        def data_ptr(self):
            return self.addr

    direct, jit = [], []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: jit.append((grid, args, kw))

    monkeypatch.setattr(launcher, "_FAST_OK", True)
    monkeypatch.setattr(launcher, "hooks_idle", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)  # (CPU builds lack them)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 99, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launcher, "_fast_cache", {("key", True, False): lambda *a: direct.append(a)})
    consts = {"X": 7, "__values__": (7,), "num_warps": 4}
    launcher.launch(Kernel(), (3,), (Ptr(32), Ptr(17)), (5,), consts, 0, "key")
    assert direct == [(3, 99, 32, 17, 5, 7)] and not jit
    launcher.launch(Kernel(), (3,), (Ptr(32), Ptr(48)), (5,), consts, 0, "key")  # aligned otherwise: JIT
    assert len(direct) == 1 and len(jit) == 1 and jit[0][1][2] == 5 and jit[0][2] == {"X": 7, "num_warps": 4}


# ------------------------------------------------------------------------------------------------ cache keys (bug hunt)
def test_a_cached_layout_does_not_let_a_negative_bit_view_through():
    """Bug: check_tensor's negative-bit test ran only when a plan was made, and the plan caches' keys did not hold
    the bit: after one call with a plain tensor, a negative-bit view of the same layout was read as -x."""
    g = torch.randn(4, 6, device=DEVICE)
    x = torch.randn(4, 6, device=DEVICE) * 4
    ops.hardsigmoid_backward(g, x)
    with pytest.raises(gradkern.Unsupported, match="negative-bit"):
        ops.hardsigmoid_backward(torch._neg_view(g), x)
    with pytest.raises(gradkern.Unsupported, match="negative-bit"):
        ops.hardsigmoid_backward(g, x, grad_input=torch._neg_view(torch.empty_like(g)))


def test_a_cached_layout_does_not_let_an_out_of_another_shape_through():
    """Bug: the plan key held out's strides, dtype and device but not its shape: after a call with a (2, 4)
    grad_input, a (3, 4) one of the same strides was accepted and written in part."""
    g, x = torch.randn(2, 4, device=DEVICE), torch.randn(2, 4, device=DEVICE) * 4
    ops.hardsigmoid_backward(g, x, grad_input=torch.empty(2, 4, device=DEVICE))
    bad = torch.full((3, 4), math.nan, device=DEVICE)
    with pytest.raises(gradkern.InvalidProblem, match="shape"):
        ops.hardsigmoid_backward(g, x, grad_input=bad)
    assert bool(bad.isnan().all())


def test_zero_scalars_keep_their_sign_whatever_came_first():
    """Bug: the scalar caches took 0.0 and -0.0 for one key, so the sign of a zero scalar depended on which came
    first (elu_backward's scale, lerp's scalar weight: their results are bit-exact against stock)."""
    g, x = torch.randn(8, device=DEVICE), torch.randn(8, device=DEVICE)
    for scale in (0.0, -0.0, 0.0):
        assert_bitwise_equal(ops.elu_backward(g, 1.0, scale, 1.0, False, x),
                             torch.ops.aten.elu_backward(g, 1.0, scale, 1.0, False, x), f"elu scale {scale}")
    for alpha in (0.0, -0.0, 0.0):  # (alpha * scale is the kernel's negcoef: its sign is the result's)
        assert_bitwise_equal(ops.elu_backward(g, alpha, 1.0, 1.0, False, x),
                             torch.ops.aten.elu_backward(g, alpha, 1.0, 1.0, False, x), f"elu alpha {alpha}")
    for w in (0.0, -0.0, 0.0):
        ge = ops.lerp_backward(g, x, x, w)[1]
        assert_bitwise_equal(ge, g * w, f"lerp weight {w}")


def test_a_tensor_lambd_is_read_on_every_call():
    """Bug: lambd was cached by the object, so a 0-d tensor lambd changed in place kept its first value."""
    x = torch.tensor([0.2, 0.7, 1.5], device=DEVICE)
    lam = torch.tensor(0.5)
    assert ops.hardshrink(x, lam).tolist() == pytest.approx([0.0, 0.7, 1.5])
    lam.fill_(1.0)
    assert ops.hardshrink(x, lam).tolist() == pytest.approx([0.0, 0.0, 1.5])
    assert ops.hardshrink_backward(torch.ones_like(x), x, lam).tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=dtype_id)
def test_a_wider_zero_dim_operand_is_rounded_to_the_common_dtype_first(dtype):
    """Bug: a 0-d operand of a wider dtype (type promotion leaves it out) went into the math unrounded, where
    ATen's TensorIterator casts every input to the common dtype first: hardsigmoid_backward of an f16 g at an f32
    x = 2.9999 (3.0 in f16) gave g/6 for ATen's 0; the shrinks likewise at x just above lambd; an f64 0-d g
    rounded twice differed by one ulp."""
    wide = torch.float64 if dtype == torch.float32 else torch.float32
    g = torch.randn(64, device=DEVICE).to(dtype)
    torch.manual_seed(0)
    for xv in (2.9999, -2.9999, 3.0001, 0.50001, -0.50001, 0.49999):
        x = torch.tensor(xv, device=DEVICE, dtype=wide)
        assert_bitwise_equal(ops.hardsigmoid_backward(g, x), torch.ops.aten.hardsigmoid_backward(g, x), f"x={xv}")
        for op in ("hardshrink_backward", "softshrink_backward"):
            assert_bitwise_equal(getattr(ops, op)(g, x, 0.5), getattr(torch.ops.aten, op)(g, x, 0.5), f"{op} {xv}")
    xs = (torch.rand(64, device=DEVICE) * 8 - 4).to(dtype)
    for _ in range(20):
        g0 = torch.randn((), device=DEVICE, dtype=wide) * 3
        assert_bitwise_equal(ops.hardsigmoid_backward(g0, xs), torch.ops.aten.hardsigmoid_backward(g0, xs), "0-d g")


def test_elu_backward_refuses_what_aten_refuses():
    """Bug: a NaN alpha with is_result=True, and scalars that float32 (the math type of 16- and 32-bit inputs)
    cannot hold, went through where ATen raises."""
    g, r = torch.randn(3, device=DEVICE), torch.tensor([-0.5, 1.0, -0.1], device=DEVICE)
    calls = [lambda: ops.elu_backward(g, math.nan, 1.0, 1.0, True, r),
             lambda: ops.elu_backward(g, 1e40, 1.0, 1.0, False, r),
             lambda: ops.elu_backward(g, 1e300, 1e-300, 1.0, False, r),
             lambda: ops.elu_backward(g, 1.0, 1.0, -1e39, False, r)]
    for call in calls:
        with pytest.raises(gradkern.InvalidProblem):
            call()
    # float64 inputs take double scalars, as ATen does
    ops.elu_backward(g.double(), 1e300, 1e-300, 1.0, False, r.double())


def test_scalar_arguments_that_are_not_numbers_are_named_errors():
    """Bug (audit): a scalar argument that is not a real number (None, a string, a complex, a tensor of several
    elements) raised float()'s bare TypeError/ValueError, which names neither the op nor the argument."""
    g, x = torch.randn(3, device=DEVICE), torch.randn(3, device=DEVICE)
    out = poison_like(g)
    calls = {
        ("elu_backward", "alpha"): lambda v: ops.elu_backward(g, v, 1.0, 1.0, False, x, grad_input=out),
        ("elu_backward", "scale"): lambda v: ops.elu_backward(g, 1.0, v, 1.0, False, x, grad_input=out),
        ("elu_backward", "input_scale"): lambda v: ops.elu_backward(g, 1.0, 1.0, v, False, x, grad_input=out),
        ("softshrink_backward", "lambd"): lambda v: ops.softshrink_backward(g, x, v, grad_input=out),
        ("hardshrink_backward", "lambd"): lambda v: ops.hardshrink_backward(g, x, v, grad_input=out),
        ("hardshrink", "lambd"): lambda v: ops.hardshrink(x, v, out=out),
    }
    for (op, arg), call in calls.items():
        out.fill_(math.nan)
        for bad in (None, "0.5", 1j, torch.ones(2, device=DEVICE)):
            with pytest.raises(gradkern.Unsupported, match=rf"^{op}: argument '{arg}': expected a real number"):
                call(bad)
        assert torch.isnan(out).all(), f"{op}: a rejected call wrote its output"
        call(torch.tensor(0.5, device=DEVICE))  # a one-element tensor is a number, as before


@pytest.mark.parametrize("layout", ["channels_last grad", "transposed grad", "channels_last self"])
def test_fresh_result_follows_the_first_dense_input(layout):
    """Inputs of different layouts (the strided pass): the result takes the layout of the first input that covers
    the shape densely, as ATen's does (stock's strides), and the pass walks it in memory order; values within
    tolerance of stock's (its CPU kernels round differently from the CUDA ones gradkern follows). Contiguous results
    before: one of the inputs was read across its layout either way, but strides differed from stock's."""
    if layout == "transposed grad":
        g, x = torch.randn(7, 5, device=DEVICE).t(), torch.randn(5, 7, device=DEVICE)
    else:
        a = torch.randn(2, 3, 4, 5, device=DEVICE)
        b = torch.randn(2, 3, 4, 5, device=DEVICE).contiguous(memory_format=torch.channels_last)
        g, x = (b, a) if layout == "channels_last grad" else (a, b)
    for ours, stock in ((ops.hardsigmoid_backward(g, x), torch.ops.aten.hardsigmoid_backward(g, x)),
                        (ops.elu_backward(g, 1.0, 1.0, 1.0, False, x),
                         torch.ops.aten.elu_backward(g, 1.0, 1.0, 1.0, False, x))):
        assert ours.stride() == g.stride() == stock.stride(), f"{layout}: {ours.stride()} (stock {stock.stride()})"
        assert_close(ours, stock, None, layout)


@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 0, 4), (2, 1, 7), (4, 3, 2, 1, 6), (1, 1), (0, 0, 3)])
def test_contiguous_strides_are_torchs(shape):
    """launch.checks.contiguous_strides, which the engines, pads, pools and allocations take a fresh result's
    layout from, gives c10's strides (a size-0 dim counts as 1)."""
    assert contiguous_strides(shape) == torch.empty(shape, device="meta").stride()
