"""sparsemax: forward and backward against the float64 sort-based composite, in every dtype, any dim (negative
too), strided / transposed / broadcast inputs read in place, the split path of long rows, special values (NaN,
-inf, a row of -inf, +inf, ties at the threshold), autograd (gradcheck and the composite's autograd in float64),
determinism and bad inputs."""

import math

import pytest
import torch

import gradkern
from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import config, ops
from gradkern.kernels import sparsemax as sm
from gradkern.testing import assert_bitwise_equal, assert_close, check_case, layouts, run_reference

inf, nan = math.inf, math.nan

# (shape, dim): rows contiguous, strided (dim 0, middle dim), negative dims, rows of one entry, one row
SHAPES = [((6, 37), -1), ((37, 6), 0), ((4, 9, 5), 1), ((4, 9, 5), -3), ((3, 4, 2, 5), 2), ((8, 1), -1),
          ((1, 8), 0), ((50,), 0), ((5, 300), 1)]


def _x(shape, dtype, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(DEVICE)


def _bwd_case(shape, dtype, dim, seed=0):
    x = _x(shape, dtype, seed=seed)
    return _x(shape, dtype, scale=1.0, seed=seed + 1), ops.sparsemax_forward(x, dim)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,dim", SHAPES)
def test_forward_and_backward_match_reference(shape, dim, dtype):
    for scale in (0.01, 2.0, 50.0):  # dense support, typical, one or two entries
        y = check_case("sparsemax_forward", (_x(shape, dtype, scale), dim), what=f"forward {shape} dim={dim}")
        assert y.shape == shape and y.dtype == dtype
        assert_close(y.double().sum(dim), torch.ones(()).double().expand(y.sum(dim).shape), dtype, "sums to 1")
    g, y = _bwd_case(shape, dtype, dim)
    dx = check_case("sparsemax_backward", (g, y, dim), what=f"backward {shape} dim={dim}")
    assert dx.shape == shape and dx.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_layouts_read_in_place(dtype):
    """Strided (a slice), transposed (dense, not contiguous) and broadcast (stride 0) inputs, each along every
    dim: right values, and the result keeps a dense input's layout (else is contiguous)."""
    x0 = _x((5, 6, 7), dtype)
    variants = list(layouts(x0)) + [("broadcast", _x((5, 1, 7), dtype).expand(5, 6, 7)),
                                    ("permuted", x0.permute(2, 0, 1).contiguous().permute(1, 2, 0))]
    g_layouts = list(layouts(_x((5, 6, 7), dtype, scale=1.0, seed=3)))
    for name, x in variants:
        for dim in (0, 1, -1):
            y = check_case("sparsemax_forward", (x, dim), what=f"forward {name} dim={dim}")
            if name in ("transposed", "permuted", "contiguous"):
                assert y.stride() == x.stride(), f"{name}: layout not kept"
            else:
                assert y.is_contiguous(), name
            gname, g = g_layouts[(dim + len(variants)) % len(g_layouts)]
            check_case("sparsemax_backward", (g, y, dim), what=f"backward y:{name} g:{gname} dim={dim}")


def test_zero_d_and_empty():
    for dtype in DTYPES:
        x = torch.tensor(-3.5, device=DEVICE).to(dtype)
        y = check_case("sparsemax_forward", (x, 0), what="0-d")
        assert y.shape == () and y.item() == 1.0
        assert ops.sparsemax_forward(x, -1).item() == 1.0
        check_case("sparsemax_backward", (torch.tensor(2.0, device=DEVICE).to(dtype), y, -1), what="0-d backward")
        for shape, dim in (((0, 4), 1), ((0, 4), 0), ((3, 0), 1), ((3, 0), 0)):
            e = torch.empty(shape, device=DEVICE, dtype=dtype)
            assert ops.sparsemax_forward(e, dim).shape == shape
            assert ops.sparsemax_backward(e, e, dim).shape == shape
            assert gradkern.sparsemax(e, dim).shape == shape


SPECIAL_ROWS = [  # (row, expected sparsemax) - every expected value is exact in every dtype
    ([1.5, 0.5, 0.5, -1.0], [1.0, 0.0, 0.0, 0.0]),  # two entries tied exactly at the threshold get 0
    ([0.25, 0.25, 0.25, -0.75], [1 / 3, 1 / 3, 1 / 3, 0.0]),  # ties above it share the mass
    ([1.0, 1.0, 1.0, 1.0], [0.25, 0.25, 0.25, 0.25]),
    ([0.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]),
    ([nan, 1.0, 2.0, 3.0], [nan, nan, nan, nan]),  # a NaN poisons its row
    ([1.0, 2.0, -inf, nan], [nan, nan, nan, nan]),
    ([-inf, 1.0, -inf, 1.5], [0.0, 0.25, 0.0, 0.75]),  # -inf entries get 0
    ([-inf, -inf, -inf, -inf], [0.25, 0.25, 0.25, 0.25]),  # a row of -inf is uniform
    ([inf, 1.0, inf, 3.0], [0.5, 0.0, 0.5, 0.0]),  # the +inf entries share the mass
    ([inf, -inf, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]),
    ([-inf, 7.0, -inf, -inf], [0.0, 1.0, 0.0, 0.0]),
    ([3.0, -2.0, 100.0, 99.5], [0.0, 0.0, 0.75, 0.25]),
]


def _special_x(dtype):
    return torch.tensor([r for r, _ in SPECIAL_ROWS], dtype=torch.float64).to(dtype).to(DEVICE)


def _special_expected(dtype):
    return torch.tensor([e for _, e in SPECIAL_ROWS], dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_special_values_forward(dtype):
    x = _special_x(dtype)
    for dim, xv in ((-1, x), (0, x.t().contiguous()), (0, x.t())):  # rows contiguous, strided, transposed
        y = ops.sparsemax_forward(xv, dim)
        yr = y if dim == -1 else y.t()
        assert_close(yr, _special_expected(dtype), dtype, f"special rows dim={dim}")
        assert_close(yr, run_reference(sm.sparsemax_reference, (x, -1)), dtype, "reference agrees")
        exact = ~torch.isnan(_special_expected(dtype)) & (_special_expected(dtype) != 1 / 3)
        assert torch.equal(yr.cpu()[exact], _special_expected(dtype)[exact]), "exact values (0, 1/4, 1/2, ...)"


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf, on purpose
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_special_values_backward(dtype):
    y = torch.tensor([[0.5, 0.5, 0.0, 0.0], [nan, nan, nan, nan], [1.0, 0.0, 0.0, 0.0], [0.25, 0.75, 0.0, nan],
                      [0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=dtype, device=DEVICE)
    g = torch.tensor([[1.0, 3.0, nan, inf], [1.0, 2.0, 3.0, 4.0], [5.0, -inf, nan, 1.0], [1.0, 2.0, 3.0, 4.0],
                      [nan, 1.0, 2.0, 3.0], [inf, 1.0, 2.0, 3.0]], dtype=dtype, device=DEVICE)
    expected = torch.tensor([[-1.0, 1.0, 0.0, 0.0],  # outside S: 0 whatever g holds
                             [nan, nan, nan, nan],  # NaN y (a NaN row of the forward): NaN
                             [0.0, 0.0, 0.0, 0.0],  # |S| = 1: no gradient
                             [-0.5, 0.5, 0.0, nan],
                             [nan, nan, 0.0, 0.0],  # NaN g in S spreads over S only
                             [nan, -inf, 0.0, 0.0]], dtype=torch.float64)  # inf - inf, 1 - inf
    dx = check_case("sparsemax_backward", (g, y, -1), what="special backward")
    assert_bitwise_equal(dx.cpu(), expected.to(dtype), "special backward, exact")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_backward_vector_path(dtype):
    """Rows contiguous in y, g and dx take the vector kernel, which reads g only in the 16-byte vectors that hold
    some y > 0: with NaN and inf in g wherever y == 0 (in vectors it reads and in ones it skips), dx is 0 there and
    equals the row kernel's (g strided along dim, read in full), for rows shorter than a vector, of several and of
    a ragged number."""
    for n in (5, 40, 300):
        y = ops.sparsemax_forward(_x((6, n), dtype, seed=n), -1)
        g = _x((6, n), dtype, scale=1.0, seed=n + 1)
        g[y == 0] = nan
        g[:, ::3][y[:, ::3] == 0] = inf
        plan = sm._check_backward(g, y, -1)[0]
        assert plan.vec == min(16 // dtype.itemsize, plan.B) > 0, (n, plan)
        g_strided = torch.full((6, 2 * n), -1.0, dtype=dtype, device=DEVICE)[:, ::2]
        g_strided.copy_(g)
        assert sm._check_backward(g_strided, y, -1)[0].vec == 0
        dx = check_case("sparsemax_backward", (g, y, -1), what=f"vector path n={n}")
        assert not dx[y == 0].any(), n
        assert_close(dx, ops.sparsemax_backward(g_strided, y, -1), dtype, f"vector path vs row kernel n={n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_ties_at_the_threshold(dtype):
    """Entries equal to tau get exactly 0 whatever their count, in rows long enough to need several programs'
    worth of iterations too."""
    n = 64
    x = torch.full((3, n), -4.0, dtype=torch.float64)
    x[0, :2] = 1.0  # tau = 0.5: -4s far below
    x[1, 0], x[1, 1:] = 2.0, 1.0  # tau = 1: every 1.0 is tied at the threshold
    x[2, :4], x[2, 4:12] = 0.5, 0.25  # tau = 0.25: four entries of 1/4 and eight tied at tau
    expected = torch.zeros(3, n, dtype=torch.float64)
    expected[0, :2], expected[1, 0], expected[2, :4] = 0.5, 1.0, 0.25
    y = ops.sparsemax_forward(x.to(dtype).to(DEVICE), -1)
    assert_bitwise_equal(y.cpu(), expected.to(dtype), "ties")


def test_split_rows_match_whole_rows():
    """Rows longer than one program holds are split into chunks (forced here with a tiny block): the same values
    as whole rows, special rows included, along a contiguous and a strided dim, deterministically."""
    specials = torch.tensor([r + [-1.0] * 36 for r, _ in SPECIAL_ROWS[:8]], dtype=torch.float64)
    x = torch.cat([specials, torch.randn(2, 40, dtype=torch.float64) * 2]).to(DEVICE)
    whole = ops.sparsemax_forward(x, -1)
    g = torch.randn(x.shape, dtype=torch.float64, device=DEVICE)
    whole_dx = ops.sparsemax_backward(g, whole, -1)
    assert sm._check_forward(x, -1)[0].K == 1
    with config.override(sm.CONFIG, block_max=32, fwd_row_max=32):  # 16 in float64: three chunks a row
        assert sm._check_forward(x, -1)[0].K == 3
        for dim, xv in ((-1, x), (0, x.t())):
            split = ops.sparsemax_forward(xv, dim)
            split = split if dim == -1 else split.t()
            assert_close(split, whole, torch.float64, f"split forward dim={dim}")
            assert_close(split, run_reference(sm.sparsemax_reference, (x, -1)), torch.float64, "split vs reference")
            dx = ops.sparsemax_backward(g if dim == -1 else g.t(), whole if dim == -1 else whole.t(), dim)
            assert_close(dx if dim == -1 else dx.t(), whole_dx, torch.float64, f"split backward dim={dim}")
        check_case("sparsemax_forward", (x.to(torch.bfloat16), -1), what="split bf16")
    assert sm._check_forward(x, -1)[0].K == 1, "the shipped config is back"


def test_forward_holds_rows_up_to_fwd_row_max_whole():
    """The forward holds rows up to `fwd_row_max` whole (one launch) and splits longer ones in `block_max` chunks;
    the backward splits past `block_max`. Plans only (no launch)."""
    def plan(op, n, dtype=torch.float32):
        return sm._plan(op, (2, n), ((n, 1), (n, 1), (n, 1)) if op.endswith("backward") else ((n, 1), (n, 1)),
                        dtype, 1)
    with config.override(sm.CONFIG, block_max=64, fwd_row_max=256):
        assert (plan("sparsemax_forward", 65).K, plan("sparsemax_forward", 65).B) == (1, 128)
        assert (plan("sparsemax_forward", 256).K, plan("sparsemax_forward", 257).K) == (1, 5)
        assert plan("sparsemax_forward", 257).B == 64
        assert plan("sparsemax_forward", 129, torch.float64).K == 5  # (half the elements in fp64)
        assert plan("sparsemax_backward", 65).K == 2


def test_short_rows_take_more_warps():
    """The forward's contiguous rows of up to `fwd_short_row` entries take a warp per `fwd_short_warp_elems`
    elements of a tile, longer or strided ones per `fwd_warp_elems`. Plans only."""
    def warps(n, strides=None, **over):
        strides = strides or (n, 1)
        with config.override(sm.CONFIG, fwd_row_tile=2048, fwd_warp_elems=256, fwd_short_warp_elems=128, **over):
            return sm._plan("sparsemax_forward", (4096, n), (strides, strides), torch.float32, 1).consts["num_warps"]
    assert warps(3) == 16 and warps(21) == 16 and warps(33) == 8
    assert warps(3, fwd_short_row=0) == 8
    assert warps(3, (1, 4096)) != 16  # (rows strided: the column tiling)


@pytest.mark.parametrize("g", [2, 3, 8])
def test_thresholds_an_iteration_change_only_the_iterations(g):
    """Any count of thresholds an iteration (rows held whole and split rows) finds the same threshold: checked
    against the reference on rows where the Newton step alone is slow (a wide support) and where one entry
    dominates; the iteration cap narrows the bracket as far at every G."""
    assert sm._maxit(torch.float32, 4) == 24 and sm._maxit(torch.float64, 4) == 40
    assert 2.0 ** (-(sm._maxit(torch.float32, g) - 1) * math.log2(g)) <= 4.0 ** -23
    with config.override(sm.CONFIG, fwd_thresholds=g, split_thresholds=g):
        for scale in (0.05, 2.0):
            x = _x((3, 70), torch.float32, scale, seed=g)
            check_case("sparsemax_forward", (x, -1), what=f"G={g} scale {scale}")
            with config.override(sm.CONFIG, block_max=32, fwd_row_max=32):
                check_case("sparsemax_forward", (x, -1), what=f"G={g} split, scale {scale}")


def test_int64_offsets_path():
    """The int64 indexing the kernels switch to for tensors past 2^31 elements (forced with a tiny limit)."""
    with config.override(sm.CONFIG, i32_max=64):
        for shape, dim in (((6, 37), -1), ((37, 6), 0), ((4, 9, 5), 1)):
            x = _x(shape, torch.float32)
            assert sm._check_forward(x, dim)[0].i64
            y = check_case("sparsemax_forward", (x, dim), what=f"int64 forward {shape}")
            check_case("sparsemax_backward", (_x(shape, torch.float32, seed=4), y, dim), what="int64 backward")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_autograd_function(dtype):
    """gradkern.sparsemax's gradient against autograd through the float64 composite."""
    for shape, dim in (((6, 37), -1), ((4, 9, 5), 1), ((37, 6), -2)):
        x = _x(shape, dtype).requires_grad_(True)
        g = _x(shape, dtype, scale=1.0, seed=7)
        y = gradkern.sparsemax(x, dim)
        (dx,) = torch.autograd.grad(y, x, g)
        xr = x.detach().cpu().double().requires_grad_(True)
        yr = sm.sparsemax_reference(xr, dim)
        (dxr,) = torch.autograd.grad(yr, xr, g.cpu().double())
        assert_close(y, yr, dtype, f"forward {shape}")
        assert_close(dx, dxr, dtype, f"gradient {shape}")
        assert dx.dtype == dtype


def test_gradcheck_float64():
    x = _x((3, 5), torch.float64).requires_grad_(True)
    for dim in (0, -1):
        assert torch.autograd.gradcheck(lambda t, d=dim: gradkern.sparsemax(t, d), (x,), eps=1e-6, atol=1e-7)
    x2 = _x((6,), torch.float64, scale=0.05).requires_grad_(True)  # all entries in the support
    assert torch.autograd.gradcheck(gradkern.sparsemax, (x2,), eps=1e-6, atol=1e-7)


def test_autograd_through_a_model():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 10).to(DEVICE, torch.float64)
    x = torch.randn(8, 16, device=DEVICE, dtype=torch.float64)
    loss = (gradkern.sparsemax(lin(x)) * torch.arange(10, device=DEVICE)).sum()
    loss.backward()
    grads = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad()
    (sm.sparsemax_reference(lin(x)) * torch.arange(10, device=DEVICE)).sum().backward()
    for a, b in zip(grads, [p.grad for p in lin.parameters()], strict=True):
        assert_close(a, b, torch.float64, "parameter gradients")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_deterministic(dtype):
    x = _x((33, 300), dtype)
    y = ops.sparsemax_forward(x, -1)
    assert_bitwise_equal(ops.sparsemax_forward(x.clone(), -1), y, "forward rerun")
    g = _x((33, 300), dtype, seed=5)
    assert_bitwise_equal(ops.sparsemax_backward(g, y, -1), ops.sparsemax_backward(g.clone(), y.clone(), -1),
                         "backward rerun")


def test_guarantees_and_export():
    assert "sparsemax" in gradkern.__all__ and gradkern.sparsemax is sm.sparsemax
    for name in ("sparsemax_forward", "sparsemax_backward"):
        for dtype in DTYPES:
            gu = gradkern.guarantee(name, dtype)
            m = torch.float64 if dtype == torch.float64 else torch.float32
            assert gu.deterministic and gu.bit_stable and gu.math_dtype == m and gu.accumulator_dtype == m


def test_bad_inputs_raise_named_errors_before_running():
    x = torch.randn(4, 5, device=DEVICE)
    y = ops.sparsemax_forward(x, -1)
    g = torch.randn(4, 5, device=DEVICE)
    before = [t.clone() for t in (x, y, g)]
    cases = [
        (gradkern.InvalidProblem, "dim", lambda: ops.sparsemax_forward(x, 2)),
        (gradkern.InvalidProblem, "dim", lambda: ops.sparsemax_forward(x, -3)),
        (gradkern.InvalidProblem, "dim", lambda: gradkern.sparsemax(x, 5)),
        (gradkern.InvalidProblem, "dim", lambda: ops.sparsemax_forward(x, 1.0)),
        # bug (audit): a bool dim was taken as 0 or 1, where torch's dims refuse bools (as segment_max's axis does)
        (gradkern.InvalidProblem, "dim", lambda: ops.sparsemax_forward(x, True)),
        (gradkern.InvalidProblem, "dim", lambda: ops.sparsemax_backward(g, y, False)),
        (gradkern.InvalidProblem, "dim", lambda: gradkern.sparsemax(x, True)),
        (gradkern.InvalidProblem, "dim", lambda: ops.sparsemax_forward(torch.tensor(1.0, device=DEVICE), 1)),
        (gradkern.InvalidProblem, "dim", lambda: ops.sparsemax_backward(g, y, 2)),
        (gradkern.Unsupported, "dtype", lambda: ops.sparsemax_forward(x.to(torch.int32), -1)),
        (gradkern.Unsupported, "dtype", lambda: gradkern.sparsemax(x.to(torch.int64))),
        (gradkern.Unsupported, "dtype", lambda: ops.sparsemax_forward(x.to(torch.complex64), -1)),
        (gradkern.Unsupported, "Tensor", lambda: ops.sparsemax_forward([1.0, 2.0], -1)),
        (gradkern.Unsupported, "dtype", lambda: ops.sparsemax_backward(g.to(torch.int32), y, -1)),
        (gradkern.Unsupported, "dtype", lambda: ops.sparsemax_backward(g, y.to(torch.int32), -1)),
        (gradkern.Unsupported, "dtype", lambda: ops.sparsemax_backward(g.double(), y, -1)),
        (gradkern.InvalidProblem, "shape", lambda: ops.sparsemax_backward(g[:, :4], y, -1)),
        (gradkern.InvalidProblem, "shape", lambda: ops.sparsemax_backward(g, y[:3], -1)),
    ]
    if DEVICE == "cuda":
        cases.append((gradkern.Unsupported, "device cuda", lambda: ops.sparsemax_forward(x.cpu(), -1)))
        cases.append((gradkern.Unsupported, "device", lambda: ops.sparsemax_backward(g, y.cpu(), -1)))
    for err, word, call in cases:
        with pytest.raises(err, match=word) as info:
            call()
        assert str(info.value).split(":")[0] in ("sparsemax_forward", "sparsemax_backward")
    for a, b in zip((x, y, g), before, strict=True):
        assert_bitwise_equal(a, b, "a rejected call changed its inputs")
    assert issubclass(gradkern.InvalidProblem, ValueError) and issubclass(gradkern.Unsupported, TypeError)


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
def test_long_rows_on_gpu(dtype):
    """Real row lengths around and far past what one program holds (split across programs), 1M included."""
    for shape, dim in (((3, 16384), -1), ((3, 16385), -1), ((2, 1 << 20), -1), ((100_000, 4), 0),
                       ((2, 300_000, 3), 1)):
        for scale in (0.001, 2.0):
            x = _x(shape, dtype, scale)
            y = check_case("sparsemax_forward", (x, dim), what=f"forward {shape} scale={scale}")
            assert_bitwise_equal(ops.sparsemax_forward(x, dim), y, "rerun")
            g = _x(shape, dtype, 1.0, seed=2)
            check_case("sparsemax_backward", (g, y, dim), what=f"backward {shape}")
