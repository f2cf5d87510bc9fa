"""What the tests of the deterministic-mode ops (adaptive, max and average pooling, upsampling, nll_loss, pads)
share: a training step's input gradient, one step checked against stock under gradkern.use(), the loop over named
errors, and the registry entries' guarantees."""

import pytest
import torch

import gradkern
from conftest import DEVICE, DTYPES
from gradkern.registry import REGISTRY
from gradkern.testing import assert_close, assert_unchanged, run_reference


def input_grad(fn, x, w):
    """One training step's backward through `fn`: the gradient of (fn(x) * w).sum() with respect to x."""
    xi = x.clone().requires_grad_(True)
    (fn(xi) * w).sum().backward()
    return xi.grad


def check_training_step(fn, x, calls, op, label, *, mode="auto", deterministic=True, summed_from=0):
    """One step through `fn` under gradkern.use(mode=mode) with torch.use_deterministic_algorithms(deterministic):
    of the ops `calls` spies on (spy_on_ops), `op` alone ran, and x's gradient is stock's (the float64 CPU
    reference, within x's dtype's tolerance; `summed_from` as assert_close takes it) in stock's layout. The loss's
    weights come from torch's generator."""
    w = torch.randn(fn(x).shape, device=x.device).to(x.dtype)
    ref = run_reference(lambda a, b: input_grad(fn, a, b), (x, w))  # float64, CPU, stock
    stock = input_grad(fn, x, w)
    calls.clear()
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        with gradkern.use(mode=mode):
            ours = input_grad(fn, x, w)
    finally:
        torch.use_deterministic_algorithms(was)
    assert calls == [op], f"{label}: {calls}"
    assert_close(ours, ref, x.dtype, label, summed_from=summed_from)
    assert ours.stride() == stock.stride(), label


def check_refusals(cases, launches, ops, inputs=(), before=()):
    """Each (error class, message pattern, call) of `cases` raises that error, its message led by one of `ops`; no
    rejected call launched a kernel (`launches`: record_launches) or changed `inputs` (`before`: their clones)."""
    for err, pattern, call in cases:
        with pytest.raises(err, match=pattern) as info:
            call()
        assert str(info.value).split(":")[0] in ops
    assert not launches, "a rejected call launched a kernel"
    assert_unchanged(before, inputs, "a rejected call")


def check_registry_entries(ops, size="tiny"):
    """The entries of deterministic replacements for atomics-based stock kernels: their ATen op alone, summing and
    not exact, no route of their own, a route doc that names atomics and deterministic mode, deterministic and
    bit-stable in every dtype with float32 sums (float64's own), large cases of 256 MiB or more, and `size`'s first
    case planned onto gradkern."""
    for op in ops:
        info = REGISTRY[op]
        assert set(info.aten) == {op} and info.accumulates and not info.exact and info.route is None
        assert "atomics" in info.route_doc and "deterministic" in info.route_doc
        for dt in DTYPES:
            g = gradkern.guarantee(op, dt)
            assert g.deterministic and g.bit_stable
            assert g.accumulator_dtype == (torch.float64 if dt == torch.float64 else torch.float32)
        for case in info.cases("meta", torch.float32, "large"):
            assert case.bytes >= 256 * 2**20, (op, case.label)
        assert gradkern.plan(op, *info.cases(DEVICE, torch.float32, size)[0].args).route == "gradkern", op
