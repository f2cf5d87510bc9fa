"""nll_loss2d_forward: every reduction, with and without weights, ignored targets (none, some, all: total_weight 0),
every dtype, self and target read in place through their strides, empty problems, out-of-range targets (NaN),
bitwise repeats (across layouts, tilings and index widths too), bad inputs, routing, and nn.CrossEntropyLoss
training on 3-D, 4-D and 5-D logits through enable() in deterministic mode."""

import math

import pytest
import torch
import torch.nn as nn

import gradkern
from _det_helpers import check_refusals
from conftest import DEVICE, DTYPES, dtype_id, gpu_only
from gradkern import config, ops
from gradkern.kernels import nll_loss as nl
from gradkern.registry import REGISTRY
from gradkern.testing import (
    assert_bitwise_equal,
    assert_close,
    assert_repeats_bitwise,
    check_case,
    record_launches,
    run_reference,
    spy_on_ops,
)

OP = "nll_loss2d_forward"
GPU = DEVICE == "cuda"
# (the interpreter computes 0 / 0, a mean over no element, in numpy, which warns)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
MEAN, SUM, NONE = 1, 2, 0


def _problem(shape, dtype=torch.float32, *, weight=True, ignore_index=-100, ignored=0.2, seed=0):
    """(self, target, weight) for an (N, C, H, W) problem: log-probabilities, targets with a share `ignored` of
    ignore_index, positive weights (or None)."""
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    x = torch.randn(shape, generator=g).log_softmax(1).to(dtype).to(DEVICE)
    t = torch.randint(0, max(c, 1), (n, h, w), generator=g)
    t = torch.where(torch.rand(t.shape, generator=g) < ignored, ignore_index, t).to(DEVICE)
    wt = (torch.rand(c, generator=g) + 0.25).to(dtype).to(DEVICE) if weight else None
    return x, t, wt


# (self shape, weight, ignore_index): odd sizes, one class, H or W of 1 (nll_loss_nd's (N, C, 1, L)), ignore_index
# inside the class range, ATen's default and the segmentation datasets' 255
SEMANTICS = [((2, 5, 7, 9), True, -100), ((3, 4, 6, 5), False, -100), ((1, 7, 1, 40), True, 255),
             ((2, 3, 11, 1), False, 255), ((2, 6, 4, 4), True, 2), ((3, 1, 5, 3), True, -100)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_matches_stock(dtype):
    """Output and total_weight against stock in float64, every reduction; shapes and dtypes as ATen's (0-d results
    for mean and sum, (N, H, W) and a 0-d zero total_weight for none)."""
    for shape, weighted, ignore_index in SEMANTICS:
        x, t, w = _problem(shape, dtype, weight=weighted, ignore_index=ignore_index)
        for reduction in (MEAN, SUM, NONE):
            what = f"{shape} weight={weighted} ignore_index={ignore_index} reduction={reduction}"
            out, total = check_case(OP, (x, t, w, reduction, ignore_index), what=what)
            n, _, h, ww = shape
            assert out.shape == ((n, h, ww) if reduction == NONE else ()) and out.dtype == dtype, what
            assert total.shape == () and total.dtype == dtype, what
            if reduction == NONE:
                assert out.is_contiguous() and total.item() == 0, what


def test_reduction_none_is_bit_exact():
    """Each loss is one product (-w[t] * self), rounded once as ATen rounds it: bit-exact against stock at the same
    dtype; ignored elements are +0."""
    for dtype in DTYPES:
        for shape, weighted, ignore_index in SEMANTICS[:3]:
            x, t, w = _problem(shape, dtype, weight=weighted, ignore_index=ignore_index)
            ours = ops.nll_loss2d_forward(x, t, w, NONE, ignore_index)
            stock = run_reference(torch.ops.aten.nll_loss2d_forward, (x, t, w, NONE, ignore_index), dtype=None)
            assert_bitwise_equal(ours, stock, f"{dtype} {shape}")


def test_total_weight_without_weights_is_the_exact_count():
    x, t, _ = _problem((3, 4, 9, 11), ignored=0.3)
    for reduction in (MEAN, SUM):
        _, total = ops.nll_loss2d_forward(x, t, None, reduction, -100)
        assert total.item() == int((t != -100).sum())


def test_ignored_targets_none_some_all():
    """No target ignored, some, every one: mean is 0 / 0 = NaN when all are ignored (as ATen), sum +0, total_weight
    0; a zero total_weight from zero weights gives NaN too."""
    for ignored in (0.0, 0.5, 1.0):
        x, t, w = _problem((2, 4, 5, 6), ignored=ignored, ignore_index=255)
        for weight in (w, None):
            for reduction in (MEAN, SUM, NONE):
                out, total = check_case(OP, (x, t, weight, reduction, 255), what=f"ignored {ignored} {reduction}")
                if ignored == 1.0:
                    assert total.item() == 0
                    if reduction == MEAN:
                        assert math.isnan(out.item())
                    else:
                        assert (out == 0).all() and not torch.signbit(out).any()
    x, t, w = _problem((2, 4, 5, 6), ignored=0.0)
    zero = torch.zeros_like(w)
    out, total = check_case(OP, (x, t, zero, MEAN, -100), what="zero weights")
    assert math.isnan(out.item()) and total.item() == 0


def _layouts(x, t, w):
    """(label, self, target, weight) views of one problem's values in other layouts (read in place)."""
    cl = torch.channels_last
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    wide[..., ::2] = x
    tt = t.transpose(1, 2).contiguous().transpose(1, 2)
    yield "self channels_last", x.contiguous(memory_format=cl), t, w
    yield "self strided", wide[..., ::2], t, w
    yield "self transposed (H, W)", x.transpose(2, 3).contiguous().transpose(2, 3), t, w
    yield "self permuted (N, C)", x.transpose(0, 1).contiguous().transpose(0, 1), t, w
    yield "target transposed", x, tt, w
    yield "target sliced", x, torch.stack([t, t], -1)[..., 0], w
    yield "both transposed", x.transpose(2, 3).contiguous().transpose(2, 3), tt, w
    yield "weight strided", x, t, torch.stack([w, w], -1)[:, 1]
    yield "weight (1, C)", x, t, w[None]
    yield "weight (C, 1) strided", x, t, torch.stack([w, w], -1)[:, :1]


def test_layouts_are_read_in_place_and_give_the_contiguous_bits(monkeypatch):
    """self, target and weight of any layout are read through their strides (no copy), and every element is summed
    in the same (n, h, w) order whatever the layout: the contiguous problem's bits."""
    x, t, w = _problem((2, 5, 7, 6))
    launches = record_launches(monkeypatch, nl)
    for reduction in (MEAN, SUM, NONE):
        first = ops.nll_loss2d_forward(x, t, w, reduction, -100)
        for label, xx, tt, ww in _layouts(x, t, w):
            launches.clear()
            what = f"{label} reduction={reduction}"
            ours = check_case(OP, (xx, tt, ww, reduction, -100), what=what)
            assert_bitwise_equal(ours, first, what)
            ptrs = launches[0].ptrs
            for given, read in ((xx, ptrs[0]), (tt, ptrs[1])):
                assert read.data_ptr() == given.data_ptr() and read.stride() == given.stride(), f"{what}: copied"
            if ww.dim() == 1:
                assert ptrs[2].data_ptr() == ww.data_ptr(), f"{what}: weight copied"


@pytest.mark.parametrize("reduction", [MEAN, SUM, NONE])
def test_empty_problems(reduction, monkeypatch):
    """N = 0, H = 0: ATen's results (mean NaN, sum 0, none an empty (N, H, W); total_weight 0), nothing launched.
    C = 0 with every target ignored: nothing to gather, ATen's results."""
    launches = record_launches(monkeypatch, nl)
    for shape in ((0, 3, 4, 5), (2, 3, 0, 5)):
        x, t, w = _problem(shape)
        out, total = check_case(OP, (x, t, w, reduction, -100), what=f"{shape}")
        assert total.shape == () and total.item() == 0
    assert not launches
    x, t, _ = _problem((2, 0, 3, 4), weight=False, ignored=1.0)
    check_case(OP, (x, t, None, reduction, -100), what="C = 0")


def test_out_of_range_targets_give_nan():
    """A target outside [0, C) that is not ignore_index (ATen: device-side assert, CPU IndexError) makes its loss,
    and so the sum, mean and total_weight, NaN; every other loss is stock's."""
    x, t, w = _problem((2, 4, 5, 6), ignored=0.0)
    for bad in (4, -1, 2**40, -(2**40)):
        tb = t.clone()
        tb[1, 2, 3] = bad
        for weight in (w, None):
            for reduction in (MEAN, SUM):
                out, total = ops.nll_loss2d_forward(x, tb, weight, reduction, -100)
                assert math.isnan(out.item()) and math.isnan(total.item()), (bad, reduction)
            out, total = ops.nll_loss2d_forward(x, tb, weight, NONE, -100)
            assert torch.isnan(out[1, 2, 3]) and int(torch.isnan(out).sum()) == 1 and total.item() == 0
            keep = tb.clone()
            keep[1, 2, 3] = -100
            assert_bitwise_equal(torch.where(keep == -100, 0.0, out), torch.where(
                keep == -100, 0.0, ops.nll_loss2d_forward(x, keep, weight, NONE, -100)[0]), f"{bad}")


def test_ignore_index_beyond_int32():
    x, t, w = _problem((2, 3, 4, 5), ignore_index=2**40)
    for reduction in (MEAN, SUM, NONE):
        check_case(OP, (x, t, w, reduction, 2**40), what=f"reduction={reduction}")


def test_repeats_tilings_and_index_widths(monkeypatch):
    """Runs repeat bit for bit; the multi-program path (partials, then the finishing program), a finishing program
    that takes several steps and int64 index math all match stock, and int64 index math gives int32's bits."""
    x, t, w = _problem((2, 3, 5, 7))
    for reduction in (MEAN, SUM):
        first = check_case(OP, (x, t, w, reduction, -100))
        assert_bitwise_equal(ops.nll_loss2d_forward(x, t, w, reduction, -100), first, "run twice")
    launches = record_launches(monkeypatch, nl)
    # (70 elements: 2 programs of 3 blocks of 16; 18 programs of one block of 4, their partials added 4 a step)
    for knobs in ({"block": 16, "target_programs": 2, "min_steps": 1},
                  {"block": 4, "target_programs": 64, "min_steps": 1, "finish_block": 4}):
        for weight in (w, None):
            for reduction in (MEAN, SUM):
                launches.clear()
                with config.override(nl.CONFIG, **knobs):
                    split = check_case(OP, (x, t, weight, reduction, -100), what=f"{knobs}")
                assert len(launches) == 2 and launches[0].grid[0] > 1, knobs
                launches.clear()
                with config.override(nl.CONFIG, **knobs, i32_max=16):
                    assert_bitwise_equal(ops.nll_loss2d_forward(x, t, weight, reduction, -100), split,
                                         f"{knobs} I64")
                assert launches[0].consts["I64"]


def test_bad_inputs_raise_named_errors_and_launch_nothing(monkeypatch):
    x, t, w = _problem((2, 3, 4, 5))
    f = ops.nll_loss2d_forward
    before = [v.clone() for v in (x, t, w)]
    launches = record_launches(monkeypatch, nl)
    cases = [
        (gradkern.InvalidProblem, r"self.*4-D tensor \(N, C, H, W\).*3-D", lambda: f(x[0], t[0], w, MEAN, -100)),
        (gradkern.InvalidProblem, r"target.*shape \(2, 4, 5\).*\(2, 4, 4\)", lambda: f(x, t[..., :4], w, MEAN, -100)),
        (gradkern.InvalidProblem, r"target.*\(1, 4, 5\)", lambda: f(x, t[:1], w, MEAN, -100)),
        (gradkern.InvalidProblem, r"weight.*3 elements.*\(2,\)", lambda: f(x, t, w[:2], MEAN, -100)),
        (gradkern.InvalidProblem, r"weight.*3 elements.*\(2, 3\)", lambda: f(x, t, w.expand(2, 3), SUM, -100)),
        (gradkern.InvalidProblem, r"reduction.*0 \(none\), 1 \(mean\) or 2 \(sum\).*3", lambda: f(x, t, w, 3, -100)),
        (gradkern.InvalidProblem, r"reduction.*-1", lambda: f(x, t, w, -1, -100)),
        (gradkern.Unsupported, r"reduction/ignore_index.*ints.*float", lambda: f(x, t, w, 1.0, -100)),
        (gradkern.Unsupported, r"reduction/ignore_index.*str", lambda: f(x, t, w, MEAN, "-100")),
        (gradkern.Unsupported, r"target.*dtype int64.*int32", lambda: f(x, t.int(), w, MEAN, -100)),
        (gradkern.Unsupported, r"target.*dtype int64.*float32", lambda: f(x, t.float(), w, MEAN, -100)),
        (gradkern.Unsupported, r"weight.*dtype torch.float32.*float64", lambda: f(x, t, w.double(), MEAN, -100)),
        (gradkern.Unsupported, r"self.*dtype", lambda: f(x.int(), t, None, MEAN, -100)),
        (gradkern.Unsupported, r"self.*torch.Tensor.*list", lambda: f(x.tolist(), t, w, MEAN, -100)),
        (gradkern.Unsupported, r"target.*device", lambda: f(x, t.to("meta"), w, MEAN, -100)),
        (gradkern.Unsupported, r"self.*device", lambda: f(x.to("meta"), t, w, MEAN, -100)),
        (gradkern.Unsupported, r"self.*negation", lambda: f(torch._neg_view(x), t, w, MEAN, -100)),
    ]
    if GPU:
        cases.append((gradkern.Unsupported, r"target.*device", lambda: f(x, t.cpu(), w, MEAN, -100)))
    check_refusals(cases, launches, [OP], (x, t, w), before)


def test_registry_entry_and_routes():
    info = REGISTRY[OP]
    assert set(info.aten) == {OP} and info.accumulates and not info.exact
    assert "atomics" in info.route_doc and "deterministic" in info.route_doc
    for dt in DTYPES:
        g = gradkern.guarantee(OP, dt)
        assert g.deterministic and g.bit_stable
        assert g.accumulator_dtype == (torch.float64 if dt == torch.float64 else torch.float32)
    x, t, w = _problem((2, 3, 4, 5))
    for reduction, route in ((MEAN, "gradkern"), (SUM, "gradkern"), (NONE, "stock")):
        plan = gradkern.plan(OP, x, t, w, reduction, -100)
        assert plan.route == route and plan.kernels[0].kernel == "_nll_loss2d_kernel"
        n_out = 2 * 4 * 5 + 1 if reduction == NONE else 2
        assert plan.bytes == 2 * 4 * 5 * (4 + 8) + 3 * 4 + n_out * 4  # (the gathered elements of self only)
    for size in ("check", "large"):
        assert all(case.args[0].dim() == 4 for case in info.cases("meta", torch.float32, size))
    assert max(case.bytes for case in info.cases("meta", torch.float32, "large")) >= 256 * 2**20


def _spy(monkeypatch) -> list[int]:
    """The reductions of the nll_loss2d_forward calls that reach gradkern's implementation from here on."""
    return spy_on_ops(monkeypatch, [OP], record=lambda op, args: args[3])


def test_enable_routes_reducing_calls_and_leaves_none_to_stock(monkeypatch):
    """Mode auto: mean and sum reach gradkern, none (deterministic in stock) stays stock's; mode always: all."""
    calls = _spy(monkeypatch)
    x, t, w = _problem((2, 3, 4, 5))
    with gradkern.use():
        for reduction in (MEAN, SUM, NONE):
            torch.ops.aten.nll_loss2d_forward(x, t, w, reduction, -100)
        assert calls == [MEAN, SUM]
        calls.clear()
        with gradkern.use(mode="always"):
            torch.ops.aten.nll_loss2d_forward(x, t, w, NONE, -100)
        assert calls == [NONE]
    calls.clear()
    torch.ops.aten.nll_loss2d_forward(x, t, w, MEAN, -100)
    assert not calls


# ----------------------------------------------------------------------------------------------- training
def _losses():
    """(label, loss module, logits shape): the CrossEntropyLoss settings segmentation models use, on 3-D, 4-D and
    5-D logits (nll_loss_nd reshapes all but the 4-D ones to (N, C, 1, L))."""
    w = torch.rand(5, generator=torch.Generator().manual_seed(1)) + 0.25
    return [
        ("4-D mean, weight, ignore_index=255", nn.CrossEntropyLoss(weight=w, ignore_index=255), (2, 5, 6, 7)),
        ("4-D sum, label_smoothing=0.1", nn.CrossEntropyLoss(reduction="sum", label_smoothing=0.1), (2, 5, 4, 6)),
        ("4-D mean, weight, ignore_index=255, label_smoothing=0.1",
         nn.CrossEntropyLoss(weight=w, ignore_index=255, label_smoothing=0.1), (2, 5, 5, 3)),
        ("5-D mean, weight, label_smoothing=0.1", nn.CrossEntropyLoss(weight=w, label_smoothing=0.1), (2, 5, 3, 4, 5)),
        ("5-D sum, ignore_index=255", nn.CrossEntropyLoss(reduction="sum", ignore_index=255), (1, 5, 2, 3, 7)),
        ("3-D mean", nn.CrossEntropyLoss(), (3, 5, 11)),
    ]


def _step(loss_fn, logits, target):
    x = logits.detach().clone().requires_grad_(True)
    loss = loss_fn(x, target)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_cross_entropy_training_in_deterministic_mode(dtype, monkeypatch):
    """nn.CrossEntropyLoss forward and backward under gradkern.use(mode="always") with
    torch.use_deterministic_algorithms(True) runs gradkern's forward and gives stock's loss and gradient (stock
    without deterministic mode, which on CUDA raises in the forward)."""
    calls = _spy(monkeypatch)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        for label, loss_fn, shape in _losses():
            loss_fn = loss_fn.to(DEVICE, dtype)
            g = torch.Generator().manual_seed(2)
            logits = torch.randn(shape, generator=g, dtype=dtype).to(DEVICE)
            target = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
            target = torch.where(torch.rand(target.shape, generator=g) < 0.2, loss_fn.ignore_index, target).to(DEVICE)
            stock = _step(loss_fn, logits, target)
            calls.clear()
            torch.use_deterministic_algorithms(True)
            with gradkern.use(mode="always"):
                ours = _step(loss_fn, logits, target)
            torch.use_deterministic_algorithms(was)
            assert calls == [SUM if loss_fn.reduction == "sum" else MEAN], f"{label}: {calls}"
            assert_close(ours[0], stock[0], dtype, f"{label} loss", summed_from=logits.numel())
            assert_close(ours[1], stock[1], dtype, f"{label} grad")
    finally:
        torch.use_deterministic_algorithms(was)


# ----------------------------------------------------------------------------------------------- GPU only
@gpu_only
def test_stock_raises_in_deterministic_mode_and_gradkern_does_not():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        x, t, w = _problem((4, 21, 64, 64), ignore_index=255)
        with pytest.raises(RuntimeError, match="deterministic"):
            torch.ops.aten.nll_loss2d_forward(x, t, w, MEAN, 255)
        with gradkern.use():
            ours = torch.ops.aten.nll_loss2d_forward(x, t, w, MEAN, 255)
            logits = torch.randn(2, 4, 8, 32, 32, device=DEVICE, requires_grad=True)
            target = torch.randint(0, 4, (2, 8, 32, 32), device=DEVICE)
            nn.CrossEntropyLoss(label_smoothing=0.1)(logits, target).backward()
        assert_bitwise_equal(ours, ops.nll_loss2d_forward(x, t, w, MEAN, 255), "routed")
    finally:
        torch.use_deterministic_algorithms(was)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bitwise_identical_repeats_on_gpu(dtype):
    assert_repeats_bitwise([OP], dtype, DEVICE, "check")


@gpu_only
def test_large_problem_matches_stock():
    """Many programs with several steps each (and the finishing program) at a segmentation size."""
    x, t, w = _problem((16, 19, 512, 512), ignore_index=255)
    for reduction in (MEAN, SUM):
        check_case(OP, (x, t, w, reduction, 255), what=f"reduction={reduction}")
