"""CUDA graphs (what a host-bound training loop uses): a training step under enable(), captured with
torch.cuda.graph and replayed, gives the gradients that eager stock PyTorch gives - on the captured inputs and on
new data copied into them (so the replay really recomputes). Nothing gradkern runs on a routed path may
synchronise the host, allocate outside the graph's pool or launch on another stream."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradkern
from conftest import gpu_only
from gradkern.launch import launcher
from gradkern.routing import native

pytestmark = gpu_only


class _Net(nn.Module):
    """Every op family enable() routes on a training step: pads, prelu, where, lerp, repeat, the activations."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3)
        self.rep2 = nn.ReplicationPad2d((2, 1, 1, 2))
        self.ref2 = nn.ReflectionPad2d(1)
        self.rep3 = nn.ReplicationPad3d(1)
        self.prelu = nn.PReLU(c)
        self.prelu1 = nn.PReLU()
        self.mix = nn.Parameter(torch.rand(c, 1, 1))

    def forward(self, x):
        y = self.prelu(self.rep2(self.conv(x)))  # (N, C, H + 1, W + 1)
        y = F.celu(self.ref2(y), 0.7)  # (N, C, H + 3, W + 3)
        y = self.rep3(y.unsqueeze(1)).squeeze(1)[:, 1:-1]  # (N, C, H + 5, W + 5)
        y = torch.lerp(y, F.softshrink(y, 0.2), self.mix) + torch.lerp(y, F.hardsigmoid(y), 0.25)
        y = torch.where(y > 0, y, self.prelu1(y))
        y = F.hardshrink(y.repeat(1, 2, 1, 1), 0.1)
        return (y * y).mean()


def _step(model, x):
    model.zero_grad(set_to_none=False)
    loss = model(x)
    loss.backward()
    return loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_step_captured_and_replayed(dtype, monkeypatch):
    torch.manual_seed(0)
    model = _Net().cuda().to(dtype)
    inputs = [torch.randn(4, 8, 12, 12, device="cuda", dtype=dtype) for _ in range(2)]
    params = list(model.parameters())

    def stock_grads(x):
        with gradkern.use(False):
            _step(model, x)
        return [p.grad.clone() for p in params]

    expected = [stock_grads(x) for x in inputs]
    static_x = inputs[0].clone()
    with gradkern.use(mode="always"):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (compiles and caches every launch) off the default stream
            for _ in range(3):
                _step(model, static_x)
        torch.cuda.current_stream().wait_stream(side)
        # count the launches captured through gradkern's direct-launch cache (every kernel after its first call)
        # and the descriptors the native router replays (routing/native.py: backend-key ops from their third call)
        captured = []
        for key, call in list(launcher._fast_cache.items()):
            monkeypatch.setitem(launcher._fast_cache, key,
                                lambda *a, _k=key, _c=call: (captured.append(_k), _c(*a))[1])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _step(model, static_x)
    # pads, prelu and its sums, fused where/lerp, repeat's sum, ...
    assert len(set(captured)) + native.programs() >= 10, captured
    # replayed outside enable(): the graph holds gradkern's kernels, not the routing
    for x, want in zip(inputs, expected, strict=True):
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        for p, w in zip(params, want, strict=True):
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(p.grad, w, rtol=tol, atol=tol)
    # and bit for bit what gradkern computes eagerly
    with gradkern.use(mode="always"):
        _step(model, static_x)
    eager = [p.grad.clone() for p in params]
    graph.replay()
    for p, e in zip(params, eager, strict=True):
        assert torch.equal(p.grad, e)
