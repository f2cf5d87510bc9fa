"""The Python-level routes (gradkern.routing.interceptions): the decompositions torch.nn.functional takes in
deterministic mode, replaced while gradkern is enabled by a call of the ATen op whose backward gradkern serves; the
original kept for other devices, tensor subclasses and problems gradkern does not serve; installed by enable() and
removed by disable(). On CPU the functions are called directly (F takes these paths only for CUDA tensors)."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import gradkern
from conftest import DEVICE, gpu_only
from gradkern.registry import REGISTRY
from gradkern.testing import assert_bitwise_equal, assert_close

DECOMP = torch._decomp.decompositions

# (decomposition, its arguments after the input, input shape, the backward op gradkern serves instead)
ROUTES = [
    ("_replication_pad", ((1, 2, 0, 3),), (2, 3, 4, 5), "replication_pad2d_backward"),
    ("_upsample_linear_vec", (None, False, [1.7, 2.0]), (2, 3, 5, 4), "upsample_bilinear2d_backward"),
    ("_upsample_linear_vec", ([7, 3, 9], True, None), (1, 2, 4, 5, 6), "upsample_trilinear3d_backward"),
    ("_upsample_linear_vec", ([11], False, None), (2, 3, 5), "upsample_linear1d_backward"),
    ("max_pool3d_with_indices", ([2, 2, 2], [2, 1, 2], [1, 0, 1], [1, 1, 1], True), (2, 3, 5, 6, 7),
     "max_pool3d_with_indices_backward"),
]
# (F.max_pool3d takes its decomposition from torch 2.13 on; before, it calls the ATen op, which gradkern serves)
PARAMS = [pytest.param(*r, id=f"{r[0]}-{r[3]}", marks=pytest.mark.skipif(
    not hasattr(DECOMP, r[0]), reason="this torch has no such decomposition")) for r in ROUTES]


def _spy(monkeypatch, name: str) -> list:
    """Calls of decomposition `name`, counted by a spy put in its place before gradkern is enabled (so the route
    wraps the spy, and disable() puts the spy back)."""
    original = getattr(DECOMP, name)
    calls = []
    monkeypatch.setattr(DECOMP, name, lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    return calls


def _count_served(monkeypatch, op: str) -> list:
    """Calls of gradkern's implementation of ATen op `op` (routers read the registry's at each call)."""
    calls, aten = [], REGISTRY[op].aten
    for overload, impl in list(aten.items()):
        monkeypatch.setitem(aten, overload, lambda *a, _impl=impl, **k: (calls.append(1), _impl(*a, **k))[1])
    return calls


def _step(name: str, args: tuple, x: torch.Tensor):
    """Forward through decomposition `name` (looked up now, as F does) and backward of a fixed weighting."""
    x = x.clone().requires_grad_(True)
    out = getattr(DECOMP, name)(x, *args)
    y = out[0] if isinstance(out, tuple) else out
    w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).view(y.shape)
    (y * w).sum().backward()
    return (y.detach(), x.grad) + ((out[1],) if isinstance(out, tuple) else ())


@pytest.mark.parametrize("name, args, shape, backward", PARAMS)
def test_route_reaches_the_aten_op_and_gradkern_backward(name, args, shape, backward, monkeypatch):
    assert backward in REGISTRY
    original_calls = _spy(monkeypatch, name)
    spy = getattr(DECOMP, name)
    served = _count_served(monkeypatch, backward)
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEVICE, dtype=torch.float64)
    stock = _step(name, args, x)
    assert original_calls and not served
    original_calls.clear()
    with gradkern.use(mode="always"):
        assert getattr(DECOMP, name) is not spy
        ours = _step(name, args, x)
        assert served and not original_calls, "the route kept the decomposition"
        with gradkern.use(False):
            assert getattr(DECOMP, name) is spy
    assert getattr(DECOMP, name) is spy
    for a, b in zip(ours, stock, strict=True):
        if a.is_floating_point():
            assert_close(a, b, torch.float64, name)
        else:
            assert_bitwise_equal(a, b, name)


@pytest.mark.parametrize("name, args, shape, backward", PARAMS)
def test_route_keeps_the_original_for_other_devices_and_tensor_subclasses(name, args, shape, backward,
                                                                          monkeypatch):
    original_calls = _spy(monkeypatch, name)
    with gradkern.use(mode="always"):
        getattr(DECOMP, name)(torch.randn(shape, device="meta"), *args)
        assert len(original_calls) == 1, "meta tensor"
        with FakeTensorMode() as mode:
            getattr(DECOMP, name)(mode.from_tensor(torch.randn(shape, device=DEVICE)), *args)
        assert len(original_calls) == 2, "fake tensor"
        if name != "max_pool3d_with_indices":  # (whose decomposition cannot take an empty input either)
            getattr(DECOMP, name)(torch.randn((0,) + shape[1:], device=DEVICE), *args)
            assert len(original_calls) == 3, "empty input"


def test_route_keeps_the_original_where_gradkern_declares_no_backward(monkeypatch):
    """An input rank without a gradkern backward (here: the registry entry removed) keeps the decomposition."""
    original_calls = _spy(monkeypatch, "_upsample_linear_vec")
    monkeypatch.delitem(REGISTRY, "upsample_bilinear2d_backward")
    with gradkern.use(mode="always"):
        DECOMP._upsample_linear_vec(torch.randn(1, 2, 3, 4, device=DEVICE), [5, 6], False, None)
    assert original_calls


# ----------------------------------------------------------------------------------------------- GPU only
@gpu_only
def test_modules_train_in_deterministic_mode_without_the_decompositions(monkeypatch):
    """On CUDA in deterministic mode, F.interpolate(bilinear/trilinear), nn.Upsample and
    F.max_pool3d(return_indices=True) take a slow decomposition (or raise) in stock; under enable() they reach
    ATen's ops and gradkern's backwards, bit-identical from run to run."""
    calls = {n: _spy(monkeypatch, n) for n in ("_upsample_linear_vec", "max_pool3d_with_indices")
             if hasattr(DECOMP, n)}
    steps = [
        lambda t: F.interpolate(t, scale_factor=2, mode="bilinear", align_corners=False),
        lambda t: torch.nn.Upsample(size=(9, 10, 11), mode="trilinear")(t.unsqueeze(2).expand(-1, -1, 3, -1, -1)),
        lambda t: F.max_pool3d(t.unsqueeze(1), 3, 2, 1, return_indices=True)[0],
    ]
    x = torch.randn(2, 4, 32, 33, device=DEVICE)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with gradkern.use():
            for fn in steps:
                grads = []
                for _ in range(2):
                    xi = x.clone().requires_grad_(True)
                    fn(xi).square().sum().backward()
                    grads.append(xi.grad)
                assert_bitwise_equal(grads[0], grads[1], "repeat")
    finally:
        torch.use_deterministic_algorithms(was)
    assert not any(calls.values()), {k: len(v) for k, v in calls.items()}
