"""avg_pool3d backward: the output ranges and divisors, every small window (kernel, stride, padding) along each
dim with ceil_mode and count_include_pad both ways and divisor overrides against stock PyTorch, dtypes, strided
grad_output read in place, ATen's (contiguous) grad_input, unbatched and empty inputs, bitwise repeats (across
tilings and index widths too), bad inputs, and training through gradkern.use() in deterministic mode."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradkern
from _det_helpers import check_refusals, check_registry_entries, check_training_step
from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import config, ops
from gradkern.kernels import avg_pool as ap
from gradkern.registry import REGISTRY
from gradkern.testing import (
    assert_bitwise_equal,
    assert_close,
    assert_repeats_bitwise,
    check_case,
    layouts_nd,
    record_launches,
    spy_on_ops,
)

OP = "avg_pool3d_backward"
GPU = DEVICE == "cuda"

# every (kernel, stride, padding) along a dim with kernel 1..4, stride 1..3 and the pads ATen allows (<= k / 2)
WINDOWS = [(k, s, p) for k in range(1, 5) for s in range(1, 4) for p in range(k // 2 + 1)]


def _problem(shape, k, s=(), p=(0,), ceil_mode=False, count_include_pad=True, divisor=None, dtype=torch.float32,
             memory_format=torch.contiguous_format):
    """The op's arguments for pooling an input of `shape`: (grad_output, self, kernel_size, stride, padding,
    ceil_mode, count_include_pad, divisor_override)."""
    x = torch.randn(shape, device=DEVICE).to(dtype).contiguous(memory_format=memory_format)
    win = ap._window(k, s, p, ceil_mode)
    out = [ap.output_size(i, kk, ss, pp, ceil_mode)
           for i, kk, ss, pp in zip(shape[-3:], win.kernel, win.stride, win.padding, strict=True)]
    g = torch.randn(*shape[:-3], *out, device=DEVICE).to(dtype)
    return g, x, list(k), list(s), list(p), ceil_mode, count_include_pad, divisor


def _holding(i, size_out, k, s, p):
    """The kernel's range of the outputs whose windows hold input i."""
    return range(0 if i + p < k else (i + p - k) // s + 1, min((i + p) // s + 1, size_out))


def test_each_input_gets_the_outputs_whose_windows_hold_it_and_every_divisor_is_positive():
    """Output o's window is [o*s - p, o*s - p + k); the kernel's range [lo, hi) for input i is exactly the outputs
    whose windows hold i, never more than `taps` (exact where windows overlap fully). ATen's output sizes keep
    every window's extent positive (the kernel divides by it), ceil_mode's extra window included."""
    for k, s, p in WINDOWS:
        for size_in in range(k, k + 9):
            for ceil_mode in (False, True):
                size_out = ap.output_size(size_in, k, s, p, ceil_mode)
                most = 0
                for i in range(size_in):
                    holding = [o for o in range(size_out) if o * s - p <= i < o * s - p + k]
                    assert holding == list(_holding(i, size_out, k, s, p)), (k, s, p, size_in, ceil_mode, i)
                    most = max(most, len(holding))
                assert most <= ap.taps(k, s), (k, s, p, size_in)
                for o in range(size_out):
                    start, end = o * s - p, min(o * s - p + k, size_in + p)
                    assert end > start and min(end, size_in) > max(start, 0), (k, s, p, size_in, ceil_mode, o)


def _sweep(ceil_mode, count_include_pad, divisor):
    """Problems that give each dim every window of WINDOWS (three at once: D, H and W take different ones) over
    input sizes of k to k + 4."""
    n = len(WINDOWS)
    for j in range(n):
        wins = [WINDOWS[(j + shift) % n] for shift in (0, 7, 13)]
        sizes = [k + (j + shift) % 5 for (k, _, _), shift in zip(wins, (0, 2, 3), strict=True)]
        k, s, p = (tuple(w[a] for w in wins) for a in range(3))
        yield (2, 1, *sizes), k, s, p


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_every_window_along_each_dim_matches_stock(ceil_mode, count_include_pad):
    """Every kernel 1..4, stride 1..3 and pad <= k / 2 along D, H and W, over several input sizes, with ceil_mode
    windows that run past the padded input (clipped, and with count_include_pad not counted past it)."""
    partial = clipped = 0
    for shape, k, s, p in _sweep(ceil_mode, count_include_pad, None):
        args = _problem(shape, k, s, p, ceil_mode, count_include_pad)
        check_case(OP, args, what=f"{shape} k{k} s{s} p{p} ceil {ceil_mode} include pad {count_include_pad}")
        for i, kk, ss, pp in zip(shape[-3:], k, s, p, strict=True):
            o = ap.output_size(i, kk, ss, pp, ceil_mode)
            partial += o > ap.output_size(i, kk, ss, pp, False)
            clipped += (o - 1) * ss - pp + kk > i + pp
    assert (clipped and partial) or not ceil_mode


def test_divisor_override_matches_stock():
    """divisor_override (negative too) divides every term whatever the window; ceil_mode and pads as above."""
    for j, (shape, k, s, p) in enumerate(_sweep(False, True, None)):
        ceil_mode, divisor = bool(j % 2), (3, -2, 1, 7)[j % 4]
        check_case(OP, _problem(shape, k, s, p, ceil_mode, bool(j % 3), divisor),
                   what=f"{shape} k{k} s{s} p{p} divisor {divisor}")


# (self shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor): batched and unbatched, AvgPool3d(2),
# (3, 1, 1), ceil_mode without the pads, a divisor, a kernel of the whole input, one-element windows
SEMANTICS = [((2, 3, 6, 7, 8), (2,), (), (0,), False, True, None),
             ((3, 5, 6, 7), (3,), (1,), (1,), False, True, None),
             ((1, 2, 7, 9, 8), (3,), (2,), (1,), True, False, None),
             ((2, 2, 5, 6, 7), (2, 3, 2), (1, 2, 2), (0, 1, 1), False, True, 5),
             ((2, 1, 4, 5, 3), (4, 5, 3), (1,), (2, 1, 0), True, False, None),
             ((2, 3, 3, 4, 5), (1,), (2, 1, 3), (0,), True, True, None)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_matches_stock(dtype):
    for shape, k, s, p, ceil_mode, cip, divisor in SEMANTICS:
        res = check_case(OP, _problem(shape, k, s, p, ceil_mode, cip, divisor, dtype), what=f"{shape} k{k}")
        assert res.shape == shape and res.dtype == dtype and res.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_strided_grad_output_is_read_in_place(dtype, monkeypatch):
    g0, x, *window = _problem((2, 3, 5, 6, 7), (3,), (2,), (1,), True, False, dtype=dtype)
    launches = record_launches(monkeypatch, ap)
    for name, g in layouts_nd(g0, transpose=(-1, -3), plane=3):
        launches.clear()
        check_case(OP, (g, x, *window), what=f"grad_output {name}")
        read = launches[0].ptrs[1]  # the kernel's grad_output argument
        assert read.data_ptr() == g.data_ptr() and read.stride() == g.stride(), f"{name}: grad_output was copied"


def _selves():
    """(label, self) of several layouts: grad_input is contiguous for each, as stock's."""
    yield "contiguous", torch.randn(2, 3, 5, 6, 7, device=DEVICE)
    yield "channels_last_3d", torch.randn(2, 3, 5, 6, 7, device=DEVICE).contiguous(
        memory_format=torch.channels_last_3d)
    yield "sliced", torch.randn(2, 6, 5, 6, 9, device=DEVICE)[:, ::2, :, :, 1:8]
    yield "permuted", torch.randn(7, 6, 5, 3, 2, device=DEVICE).permute(4, 3, 2, 1, 0)
    yield "broadcast", torch.zeros((), device=DEVICE).expand(2, 3, 5, 6, 7)
    yield "unbatched", torch.randn(3, 5, 6, 7, device=DEVICE)
    yield "unbatched channels-last", torch.randn(5, 6, 7, 3, device=DEVICE).permute(3, 0, 1, 2)


def test_grad_input_is_contiguous_as_stocks_whatever_selfs_layout():
    for label, x in _selves():
        g = torch.randn(*x.shape[:-3], 2, 3, 3, device=DEVICE)
        args = (g, x, [2], [], [0], False, True, None)
        ours = check_case(OP, args, what=label)
        stock = torch.ops.aten.avg_pool3d_backward(g.cpu(), x.cpu(), *args[2:])
        assert ours.is_contiguous() and ours.stride() == stock.stride(), (label, ours.stride(), stock.stride())


def test_empty_batch(monkeypatch):
    """N = 0: an empty grad_input of stock's shape and strides, nothing launched."""
    launches = record_launches(monkeypatch, ap)
    for fmt in (torch.contiguous_format, torch.channels_last_3d):
        g, x, *window = _problem((0, 3, 5, 6, 7), (2,), memory_format=fmt)
        ours = ops.avg_pool3d_backward(g, x, *window)
        stock = torch.ops.aten.avg_pool3d_backward(g.cpu(), x.cpu(), *window)
        assert ours.shape == stock.shape == x.shape and ours.stride() == stock.stride()
    assert not launches


def test_window_arguments_as_aten_takes_them():
    """One int for all three dims or three; an empty stride is the kernel size; a plain int as one."""
    g, x, *_ = _problem((1, 2, 6, 6, 6), (2,))
    first = ops.avg_pool3d_backward(g, x, [2, 2, 2], [2, 2, 2], [0, 0, 0], False, True, None)
    for k, s, p in (([2], [], [0]), ((2,), (2,), (0,)), (2, 2, 0), ([2, 2, 2], [2], 0)):
        assert_bitwise_equal(ops.avg_pool3d_backward(g, x, k, s, p, False, True, None), first, f"{k} {s} {p}")


def test_windows_overlapping_along_w_at_stride_1_take_a_word_a_thread(monkeypatch):
    """A term's loads along W at stride 1 are runs shifted by a column (unaligned): tiles of one 4-byte word a
    thread there (one f32 element, two bf16), the overlapping windows' tile where W's stride is 2."""
    launches = record_launches(monkeypatch, ap)
    cfg = ap.CONFIG.current
    for dtype, s, per_thread in ((torch.float32, (1,), 1), (torch.bfloat16, (1,), 2), (torch.float32, (1, 1, 2), 0)):
        ops.avg_pool3d_backward(*_problem((1, 1, 4, 4, 32), (3,), s, (1,), dtype=dtype))  # (16 rows of 32: 512)
        c = launches[-1].consts
        assert c["BR"] * c["BW"] == (32 * cfg.warps * per_thread or cfg.tile), (dtype, s)


def test_rows_tell_the_kernel_the_power_of_two_dividing_w(monkeypatch):
    """W's power-of-two part (at most 16) goes to the kernel as W_DIV, W itself divided by it (so that stores along
    a row vectorise where W is not a multiple of 16); the same bits as without, in one column block or several."""
    launches = record_launches(monkeypatch, ap)
    for w, w_div in ((24, 8), (12, 4), (7, 1), (48, 16)):
        for settings in ({}, {"max_bw": 8}):
            args = _problem((1, 2, 3, 4, w), (1, 2, 2), (1, 2, 2))
            with config.override(ap.CONFIG, **settings):
                launches.clear()
                ours = ops.avg_pool3d_backward(*args)
                assert launches[0].consts["W_DIV"] == w_div and launches[0].ints[4][2] * w_div == w, (w, settings)
                with config.override(ap.CONFIG, row_align=False):
                    launches.clear()
                    assert_bitwise_equal(ops.avg_pool3d_backward(*args), ours, f"W {w} {settings}")
                    assert launches[0].consts["W_DIV"] == 1


def test_rows_take_the_column_block_that_pads_them_least(monkeypatch):
    """A row of W columns takes the widest column block (at most max_bw) unless a narrower one (at least min_bw)
    pads it less: rows of 96 as 3 blocks of 32, not one of 128; the same bits as the widest block."""
    launches = record_launches(monkeypatch, ap)
    for w, bw in ((96, 32), (150, 32), (64, 64), (40, 64), (100, 128), (12, 16)):
        args = _problem((1, 1, 2, 2, w), (1, 2, 2), (1, 2, 2))
        launches.clear()
        ours = ops.avg_pool3d_backward(*args)
        assert launches[0].consts["BW"] == bw, w
        with config.override(ap.CONFIG, min_bw=1024):
            launches.clear()
            assert_bitwise_equal(ops.avg_pool3d_backward(*args), ours, f"W {w}")
            assert launches[0].consts["BW"] == min(1 << (w - 1).bit_length(), ap.CONFIG.current.max_bw)


def test_repeats_tilings_and_index_widths_give_the_same_values(monkeypatch):
    """Each element sums its terms in one order whatever the tiling: runs repeated, tiles of several rows (the
    default here), of one row, two columns wide, programs that take several tiles in turn (the grid-stride loop,
    normally past 2^30 tiles) and int64 index math (normally past 2^31) each give the same bits run after run, and
    the same values across tilings (the tiling is a function of the problem; compiled, Triton's approximate float32
    division may round a term 1-2 ulp differently in another tiling, so across tilings equal within float32's
    tolerance)."""
    args = _problem((1, 2, 3, 4, 5), (3,), (1, 2, 1), (1,), True, False)
    first = ops.avg_pool3d_backward(*args)
    assert_bitwise_equal(ops.avg_pool3d_backward(*args), first, "run twice")
    launches = record_launches(monkeypatch, ap)
    knobs = [({}, lambda ints, consts: consts["BR"] > 1 and all(consts["MAGIC"])),  # (rows split by magic numbers)
             ({"tile": 4}, lambda ints, consts: consts["BR"] == 1),  # (windows overlap here)
             ({"max_bw": 2}, lambda ints, consts: consts["BW"] == 2),
             ({"tile": 4, "max_programs": 2}, lambda ints, consts: ints[0] > 2),  # (more tiles than programs)
             ({"i32_max": 16}, lambda ints, consts: consts["I64"]),
             ({"reciprocals": False}, lambda ints, consts: not consts["RECIP"]),  # (a division a term)
             ({"magic": False}, lambda ints, consts: not any(consts["MAGIC"]))]
    for settings, took in knobs:
        with config.override(ap.CONFIG, **settings):
            launches.clear()
            ours = ops.avg_pool3d_backward(*args)
            assert took(launches[0].ints, launches[0].consts), f"{settings}: the launch did not take the branch"
            assert_bitwise_equal(ops.avg_pool3d_backward(*args), ours, f"{settings}: run twice")
            assert_close(ours, first.double(), torch.float32, f"{settings}")


def test_bad_inputs_raise_named_errors_and_launch_nothing(monkeypatch):
    g, x, *window = _problem((2, 3, 6, 7, 8), (2,))
    names = ("grad_output", "self", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
             "divisor_override")

    def args(**changes):
        """The problem above (AvgPool3d(2) of a 2x3x6x7x8 input) with some arguments changed."""
        return tuple({**dict(zip(names, (g, x, *window), strict=True)), **changes}.values())

    before = [t.clone() for t in (g, x)]
    launches = record_launches(monkeypatch, ap)
    ip, un = gradkern.InvalidProblem, gradkern.Unsupported
    cases = [
        (ip, r"'kernel_size'.*a single int or three ints.*\[2, 2\]", args(kernel_size=[2, 2])),
        (ip, r"'kernel_size'.*\[\]", args(kernel_size=[])),
        (ip, r"'stride'.*or empty.*\[2, 2\]", args(stride=[2, 2])),
        (ip, r"'padding'.*\[0, 0\]", args(padding=[0, 0])),
        (ip, r"'padding'.*'a'", args(padding="a")),
        (ip, r"'kernel_size'.*greater than zero.*\(0, 2, 2\)", args(kernel_size=[0, 2, 2])),
        (ip, r"'stride'.*greater than zero.*\(2, 0, 2\)", args(stride=[2, 0, 2])),
        (ip, r"'stride'.*\(-1, -1, -1\)", args(stride=[-1])),
        (ip, r"'padding'.*at most half.*\(2, 2, 2\)", args(padding=[2])),
        (ip, r"'padding'.*\(0, -1, 0\)", args(padding=[0, -1, 0])),
        (ip, r"'divisor_override'.*non-zero.*0", args(divisor_override=0)),
        (ip, r"'divisor_override'.*2.5", args(divisor_override=2.5)),
        (ip, r"'self'.*4-D.*or 5-D.*3-D tensor of shape \(6, 7, 8\)", args(grad_output=g[0, 0], self=x[0, 0])),
        (ip, r"'self'.*6-D", args(grad_output=g[None], self=x[None])),
        (ip, r"'self'.*non-zero sizes.*\(2, 0, 6, 7, 8\)", args(grad_output=g[:, :0], self=x[:, :0])),
        (ip, r"'self'.*at least the kernel size \(7, 7, 7\)", args(kernel_size=[7], stride=[1])),
        (ip, r"'grad_output'.*shape \(2, 3, 3, 3, 4\).*\(2, 3, 3, 3, 3\)", args(grad_output=g[..., :3])),
        (ip, r"'grad_output'.*\(2, 3, 3, 4, 4\).*\(2, 3, 3, 3, 4\)", args(ceil_mode=True)),
        (ip, r"'grad_output'.*\(2, 3, 3, 3, 4\).*\(1, 3, 3, 3, 4\)", args(grad_output=g[:1])),
        (ip, r"'grad_output'.*\(2, 3, 3, 3, 4\).*\(2, 2, 3, 3, 4\)", args(grad_output=g[:, :2])),
        (ip, r"'grad_output'.*\(2, 3, 3, 3, 4\).*\(3, 3, 3, 4\)", args(grad_output=g[0])),
        (ip, r"'grad_output'.*\(0, 3, 3, 3, 4\).*\(2, 3, 3, 3, 4\)", args(self=x[:0])),
        (un, r"'grad_output'.*dtype torch.float32.*float64", args(grad_output=g.double())),
        (un, r"'self'.*dtype", args(self=x.int())),
        (un, r"'grad_output'.*torch.Tensor.*list", args(grad_output=g.tolist())),
        (un, r"'self'.*device", args(self=x.to("meta"))),
    ]
    if GPU:
        cases.append((un, r"'grad_output'.*device cuda", args(grad_output=g.cpu(), self=x.cpu())))
    check_refusals([(err, pattern, lambda bad=bad: ops.avg_pool3d_backward(*bad)) for err, pattern, bad in cases],
                   launches, [OP], (g, x), before)


def test_registry_entry():
    check_registry_entries([OP])
    case = REGISTRY[OP].cases(DEVICE, torch.float32, "tiny")[0]
    assert gradkern.plan(OP, *case.args).bytes == case.bytes


# ----------------------------------------------------------------------------------------------- training
def _pools():
    """(label, pooling function, input shape, memory format)."""
    cl = torch.channels_last_3d
    return [
        ("nn.AvgPool3d(2)", nn.AvgPool3d(2), (2, 3, 6, 8, 8), None),
        ("nn.AvgPool3d(3, 1, 1)", nn.AvgPool3d(3, stride=1, padding=1), (2, 2, 5, 6, 7), None),
        ("nn.AvgPool3d(3, 2, 1, ceil_mode, exclude pads) channels_last_3d",
         nn.AvgPool3d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), (1, 2, 7, 9, 8), cl),
        ("nn.AvgPool3d((1, 3, 3), (1, 2, 2), divisor_override=4) unbatched",
         nn.AvgPool3d((1, 3, 3), stride=(1, 2, 2), divisor_override=4), (3, 4, 7, 7), None),
        ("F.avg_pool3d((2, 3, 2), (1, 2, 2), 1)", lambda t: F.avg_pool3d(t, (2, 3, 2), (1, 2, 2), 1), (1, 2, 5, 7, 6),
         None),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_pooling_backward_in_deterministic_mode_runs_gradkern(dtype, monkeypatch):
    """Under gradkern.use(mode="always") with torch.use_deterministic_algorithms(True), avg_pool3d's backward
    runs gradkern's kernel and gives stock's gradient (layout included)."""
    if DEVICE == "cpu" and dtype in (torch.float16, torch.bfloat16):
        pytest.skip("stock avg_pool3d has no float16 / bfloat16 forward on CPU")
    torch.manual_seed(0)
    calls = spy_on_ops(monkeypatch, [OP])
    for label, fn, shape, fmt in _pools():
        x = torch.randn(shape, device=DEVICE).to(dtype)
        if fmt is not None:
            x = x.contiguous(memory_format=fmt)
        check_training_step(fn, x, calls, OP, label, mode="always")


def _step(model, x, y):
    """One SGD step of `model` on (x, y): the parameters after it and the input's gradient."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xi = x.clone().requires_grad_(True)
    F.mse_loss(model(xi), y).backward()
    opt.step()
    return [t.detach().clone() for t in model.parameters()], xi.grad


def test_a_3d_net_trains_one_step_in_deterministic_mode_as_stock(monkeypatch):
    """Conv3d -> AvgPool3d(3, 2, 1, ceil_mode, exclude pads) -> Linear, one SGD step: with gradkern.use(mode=
    "always") in deterministic mode, the same parameters and input gradient as stock (through gradkern's kernel)."""
    torch.manual_seed(0)

    def net(device=DEVICE, dtype=torch.float32):
        torch.manual_seed(1)
        return nn.Sequential(nn.Conv3d(2, 3, 3, padding=1), nn.ReLU(),
                             nn.AvgPool3d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
                             nn.Flatten(), nn.Linear(3 * 3 * 4 * 5, 5)).to(device=device, dtype=dtype)

    x, y = torch.randn(2, 2, 5, 7, 8, device=DEVICE), torch.randn(2, 5, device=DEVICE)
    # (the reference in float64 on CPU: on a GPU, deterministic mode picks other convolution algorithms than
    # stock's default, so two float32 GPU steps differ by more than rounding alone)
    stock_params, stock_grad = _step(net("cpu", torch.float64), x.cpu().double(), y.cpu().double())
    calls = spy_on_ops(monkeypatch, [OP])
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with gradkern.use(mode="always"):
            params, grad = _step(net(), x, y)
    finally:
        torch.use_deterministic_algorithms(was)
    assert calls == [OP]
    for i, (ours, stock) in enumerate(zip([*params, grad], [*stock_params, stock_grad], strict=True)):
        assert_close(ours, stock, torch.float32, f"tensor {i}")


# ----------------------------------------------------------------------------------------------- GPU only
@gpu_only
def test_stock_raises_in_deterministic_mode_and_gradkern_does_not():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        args = _problem((2, 3, 6, 7, 8), (3,), (1,), (1,))
        with pytest.raises(RuntimeError, match="deterministic"):
            torch.ops.aten.avg_pool3d_backward(*args)
        with gradkern.use():
            ours = torch.ops.aten.avg_pool3d_backward(*args)
        assert_bitwise_equal(ours, ops.avg_pool3d_backward(*args), OP)
        x = torch.randn(4, 16, 12, 30, 31, device=DEVICE, requires_grad=True)
        with gradkern.use():
            F.avg_pool3d(x, 3, 2, 1, ceil_mode=True).sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bitwise_identical_repeats_on_gpu(dtype):
    assert_repeats_bitwise([OP], dtype, DEVICE, "check")
