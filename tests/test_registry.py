"""Registry-wide tests: every declared op against stock PyTorch, its guarantee, and its ATen registrations."""

import math

import pytest
import torch

import gradkern
from conftest import DEVICE, DTYPES, SIZE, dtype_id
from gradkern.registry import REGISTRY, Guarantee
from gradkern.routing.dispatch import routed_overloads
from gradkern.testing import assert_bitwise_equal, check_case
from test_upsample import _check_positions

OPS = sorted(REGISTRY)
# ops whose float32 results ATen computes from float32 source positions and weights, as gradkern does: on the GPU's
# larger problems those alone move a result from the float64 reference by more than the base tolerance (stock's
# too), so the comparison allows what they account for (test_upsample derives the bound and checks it on stock)
_FP32_POSITIONS = {op for op in OPS if op.startswith(("upsample_", "_upsample_"))}


def test_every_op_is_listed_with_guarantees():
    listed = {row["name"]: row for row in gradkern.supported_ops()}
    assert set(listed) == set(OPS) and OPS
    for name, _row in listed.items():
        assert REGISTRY[name].cases is not None, f"{name} has no example cases for check/bench"
        for dt in REGISTRY[name].dtypes:
            g = gradkern.guarantee(name, dt)
            assert isinstance(g, Guarantee) and g.deterministic and g.bit_stable
            assert g.math_dtype == (torch.float64 if dt == torch.float64 else torch.float32)
        assert hasattr(gradkern.ops, name)


def test_guarantee_errors_are_named():
    with pytest.raises(gradkern.InvalidProblem, match="op_name"):
        gradkern.guarantee("no_such_op", torch.float32)
    with pytest.raises(gradkern.Unsupported, match="dtype"):
        gradkern.guarantee(OPS[0], torch.int32)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", OPS)
def test_cases_match_stock_and_are_deterministic(name, dtype):
    """Each op on its example problems: equal to stock PyTorch (bit-exact for selection ops, else within the
    dtype's tolerance of the float64 reference), and bitwise identical when run again (the guarantee)."""
    info = REGISTRY[name]
    if dtype not in info.dtypes:
        pytest.skip("dtype not supported by this op")
    for case in info.cases(DEVICE, dtype, SIZE):
        if name in _FP32_POSITIONS and dtype == torch.float32:
            _check_positions(name, case.args, f"{name} {case.label}")
            first = info.fn(*case.args, **case.kwargs)
        else:
            first = check_case(name, case.args, dict(case.kwargs), what=f"{name} {case.label}")
        again = info.fn(*case.args, **case.kwargs)
        assert_bitwise_equal(again, first, f"{name} {case.label} run twice")


@pytest.mark.parametrize("overload", sorted(routed_overloads()))
def test_every_registration_is_live(overload, monkeypatch):
    """enable() must reach every implementation the registry declares (no dead registrations)."""
    info = REGISTRY[routed_overloads()[overload]]
    impl = info.aten[overload]
    if impl is info.fn:
        case = info.cases(DEVICE, torch.float32, "tiny")[0]
        args, kwargs = case.args, dict(case.kwargs)
    else:
        assert info.aten_examples is not None, f"{overload}: an adapter registration needs aten_examples"
        args, kwargs = info.aten_examples(DEVICE, torch.float32)[overload]
    calls = []

    def spy(*a, **k):
        calls.append(overload)
        return impl(*a, **k)

    monkeypatch.setitem(info.aten, overload, spy)
    packet, _, ov = overload.partition(".")
    aten_op = getattr(getattr(torch.ops.aten, packet), ov or "default")
    with gradkern.use(mode="always"):
        aten_op(*args, **kwargs)
    assert calls, f"enable() did not route aten::{overload} to gradkern"
    calls.clear()
    aten_op(*args, **kwargs)
    assert not calls, f"aten::{overload} still routed to gradkern after use() exited"


@pytest.mark.parametrize("name", OPS)
def test_deterministic_mode_does_not_fill_what_the_kernels_write(name):
    """Bug: in deterministic mode torch.empty (empty_like, empty_strided, and zeros before it zeroes) fills new
    memory with NaN, so every op allocating its results or workspaces through them paid an extra pass over each
    (where, lerp, prelu, sparsemax, repeat, the segment ops and the pointwise engines did; ATen's own kernels
    allocate below that fill). No NaN fill of anything but an empty tensor runs in an op's call, the first
    (validating, planning) or a repeated one; results as outside deterministic mode."""
    case = REGISTRY[name].cases(DEVICE, torch.float32, "small")[0]
    fn, args, kwargs = getattr(gradkern.ops, name), case.args, dict(case.kwargs)
    before = fn(*args, **kwargs)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            with torch.profiler.profile(record_shapes=True) as prof:
                out = fn(*args, **kwargs)
            fills = [(e.cpu_parent.name, e.input_shapes[0]) for e in prof.events() if e.name == "aten::fill_"
                     and e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::empty")]
            assert all(math.prod(shape) == 0 for _, shape in fills), fills
    finally:
        torch.use_deterministic_algorithms(was)
    for a, b in zip(*(o if isinstance(o, tuple) else (o,) for o in (before, out)), strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert_bitwise_equal(a, b, name)


@pytest.mark.parametrize("name", OPS)
def test_plain_ops_refuse_inputs_that_require_grad(name):
    """gradkern.ops.* carry no autograd graph: an input that requires grad (with grad mode on) is a named error
    instead of a silently detached result; under no_grad the same call runs."""
    info = REGISTRY[name]
    case = info.cases(DEVICE, torch.float32, "tiny")[0]
    pos = next(i for i, a in enumerate(case.args) if isinstance(a, torch.Tensor) and a.is_floating_point())
    args = list(case.args)
    args[pos] = args[pos].detach().clone().requires_grad_(True)
    with pytest.raises(gradkern.Unsupported, match="require grad"):
        getattr(gradkern.ops, name)(*args, **case.kwargs)
    with torch.no_grad():
        getattr(gradkern.ops, name)(*args, **case.kwargs)


@pytest.mark.parametrize("name", ["prelu_backward", "_prelu_kernel_backward", "segment_max_forward",
                                  "segment_max_backward", "_segment_reduce_backward"])
def test_bench_bytes_are_each_tensor_read_and_written_once(name):
    """The benchmark's GB/s and % of copy divide a case's stated minimum bytes by time. Bug (audit): these ops'
    formulas left out a small tensor (the offsets or lengths read, prelu's weight read and grad_weight written).
    For ops with no broadcast stand-ins, the minimum is every tensor argument read and every result written."""
    info = REGISTRY[name]
    for case in info.cases(DEVICE, torch.float32, "tiny"):
        ins = [t for t in (*case.args, *case.kwargs.values()) if isinstance(t, torch.Tensor)]
        outs = info.fn(*case.args, **case.kwargs)
        outs = [t for t in (outs if isinstance(outs, (tuple, list)) else [outs]) if isinstance(t, torch.Tensor)]
        want = sum(t.numel() * t.element_size() for t in (*ins, *outs))
        assert case.bytes == want, (name, case.label, case.bytes, want)
