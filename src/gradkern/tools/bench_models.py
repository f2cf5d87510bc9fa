"""`python -m gradkern bench --models`: training steps of small real architectures, stock PyTorch vs gradkern.

A step is eager forward + backward + SGD step. Per model, batch (a host-bound small one and a GPU-bound large one,
whose GPU work is several times a step's host issue time), dtype and deterministic mode (off, then on), the stock
and gradkern steps are timed in turns (stock, gradkern, stock, ...), MIN_REPEATS to REPEATS runs each: warm-up
steps, a garbage collection, then with the collector off: synchronise, N steps back to back, synchronise; the wall
clock / N (host time included) and the CPU-issue time / N (the clock read before the final synchronisation) are
kept. A mode's ms is its fastest run (host noise only adds time), the median and every run are in the JSON. The
speedup is the median over rounds of stock's run / gradkern's run of the same round: a host-bound step's runs are
noisy, and the median of many adjacent pairs is steadier than the fastest against the fastest
(docs/tuning/routing.md). A deterministic row also compares gradkern's fastest with stock's fastest in the
deterministic-off row (the target: gradkern in deterministic mode as fast as stock without it). A mode that raises a
RuntimeError about deterministic algorithms is reported as "raises". Without a GPU it runs tiny models through
Triton's interpreter, one step each (those timings mean nothing)."""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import gc
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import _runtime
from ..routing import dispatch
from ..routing.dispatch import is_enabled, use
from .bench import _f
from .cli import _device_name, print_table

__all__ = ["MODELS", "Config", "Workload", "stock_sparsemax", "stock_pytorch", "measure", "link_det_off", "run_models",
           "list_lines"]

# On a GPU a row (model, config, dtype, deterministic mode) takes 2 modes x MIN_REPEATS to REPEATS timed runs of
# TARGET_S (at least MIN_STEPS steps) each, RUN_BUDGET_S a mode in all, plus warm-ups: a few seconds, so that all
# 72 rows (9 models x 2 sizes x 2 dtypes x 2 modes) finish in about ten minutes, first-call compiles included.
# Short runs and many rounds, because a host-bound step's runs are noisy (docs/tuning/routing.md, "The bench's
# noise, measured").
TARGET_S = 0.035  # seconds of timed steps per (row, mode, repeat)
MIN_STEPS, MAX_STEPS = 3, 2000
REPEATS = 21  # at most this many timed runs per mode (rounds), stock and gradkern in turns
MIN_REPEATS = 7  # at least this many, however long a run
RUN_BUDGET_S = 0.75  # seconds of timed steps per (row, mode): runs of slow steps (GPU-bound rows) take fewer rounds
WARMUP = 3  # steps before the step-time estimate (the first gradkern call of a shape compiles its kernels)
RUN_WARMUP = 2  # steps before each timed run


@dataclass(frozen=True)
class Config:
    batch: int
    shape: str  # the input's size per sample, for the table
    kw: dict = field(default_factory=dict)  # make()'s other arguments (input size, model width)


@dataclass
class Workload:
    model: nn.Module
    inputs: tuple
    loss_fn: Callable[[torch.Tensor], torch.Tensor]


def _rand(*shape) -> torch.Tensor:
    return torch.randn(*shape)  # (on CPU under the caller's seed, then moved: the same values on every device)


def _workload(model: nn.Module, inputs: tuple, target: torch.Tensor, loss: Callable, dtype, device) -> Workload:
    model = model.to(device=device, dtype=dtype)
    inputs = tuple(t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype) for t in inputs)
    target = target.to(device=device, dtype=dtype if target.is_floating_point() else target.dtype)
    return Workload(model, inputs, lambda out: loss(out, target))


# ------------------------------------------------------------------------------------------------- models
class _ResBlock(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(ch, ch, 3), nn.InstanceNorm2d(ch), nn.ReLU(True),
            nn.ReflectionPad2d(1), nn.Conv2d(ch, ch, 3), nn.InstanceNorm2d(ch))

    def forward(self, x):
        return x + self.body(x)


class ResnetGenerator(nn.Module):
    """CycleGAN / pix2pix ResNet generator (Zhu et al. 2017), reduced: reflect-padded 7x7 stem, two stride-2
    convs, residual blocks, two transposed convs, Tanh; InstanceNorm throughout; L1 loss to a target image."""

    name = "resnet-gen"
    what = "CycleGAN ResNet generator: ReflectionPad2d, Conv2d, InstanceNorm2d, ConvTranspose2d, Tanh; L1 loss"
    routes = ("reflection_pad2d_backward",)
    # large: ~510 GFLOP and ~20 GB of traffic a step (f32), an estimated 20-35 ms of GPU time on an H100
    configs = {"small": Config(1, "3x64x64", {"hw": 64}), "large": Config(16, "3x256x256", {"hw": 256}),
               "tiny": Config(1, "3x8x8", {"hw": 8, "width": 2, "blocks": 1})}

    def __init__(self, width: int = 32, blocks: int = 3, channels: int = 3):
        super().__init__()

        def norm_relu(ch):
            return [nn.InstanceNorm2d(ch), nn.ReLU(True)]

        w = width
        layers = [nn.ReflectionPad2d(3), nn.Conv2d(channels, w, 7), *norm_relu(w)]
        for m in (1, 2):
            layers += [nn.Conv2d(w * m, w * m * 2, 3, stride=2, padding=1), *norm_relu(w * m * 2)]
        layers += [_ResBlock(4 * w) for _ in range(blocks)]
        for m in (4, 2):
            layers += [nn.ConvTranspose2d(w * m, w * m // 2, 3, stride=2, padding=1, output_padding=1),
                       *norm_relu(w * m // 2)]
        layers += [nn.ReflectionPad2d(3), nn.Conv2d(w, channels, 7), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)

    @classmethod
    def make(cls, batch: int, dtype, device, hw: int = 64, width: int = 32, blocks: int = 3) -> Workload:
        x = torch.rand(batch, 3, hw, hw) * 2 - 1
        target = torch.rand(batch, 3, hw, hw) * 2 - 1
        return _workload(cls(width, blocks), (x,), target, F.l1_loss, dtype, device)


class _PadConv3d(nn.Sequential):
    """V-Net's 'same' convolution as a replicate pad and an unpadded Conv3d, with a per-channel PReLU."""

    def __init__(self, cin: int, cout: int, k: int):
        super().__init__(nn.ReplicationPad3d(k // 2), nn.Conv3d(cin, cout, k, padding=0), nn.PReLU(cout))


class VNet(nn.Module):
    """V-Net (Milletari et al. 2016), reduced to two levels: replicate-padded 5^3 convolutions, PReLU, stride-2
    convolutions down, ConvTranspose3d up, residual blocks and skip connections; soft Dice loss."""

    name = "vnet"
    what = "V-Net 3-D segmentation: ReplicationPad3d, Conv3d, PReLU, ConvTranspose3d, skips; Dice loss"
    routes = ("replication_pad3d_backward", "_prelu_kernel")
    # large: ~93 GFLOP of small-channel 3-D convolutions a step (f32), 16.8 ms of GPU time measured on an H100
    configs = {"small": Config(1, "1x32x32x32", {"size": 32}), "large": Config(2, "1x64x64x64", {"size": 64}),
               "tiny": Config(1, "1x8x8x8", {"size": 8, "width": 2, "k": 3})}

    def __init__(self, width: int = 8, k: int = 5, classes: int = 2):
        super().__init__()
        w = width
        self.inp = _PadConv3d(1, w, k)
        self.down1 = nn.Sequential(nn.Conv3d(w, 2 * w, 2, stride=2), nn.PReLU(2 * w))
        self.enc1 = _PadConv3d(2 * w, 2 * w, k)
        self.down2 = nn.Sequential(nn.Conv3d(2 * w, 4 * w, 2, stride=2), nn.PReLU(4 * w))
        self.enc2 = _PadConv3d(4 * w, 4 * w, 3)
        self.up2 = nn.Sequential(nn.ConvTranspose3d(4 * w, 2 * w, 2, stride=2), nn.PReLU(2 * w))
        self.dec1 = _PadConv3d(4 * w, 2 * w, k)
        self.up1 = nn.Sequential(nn.ConvTranspose3d(2 * w, w, 2, stride=2), nn.PReLU(w))
        self.dec0 = _PadConv3d(2 * w, w, k)
        self.out = nn.Conv3d(w, classes, 1)

    def forward(self, x):
        x0 = self.inp(x)
        x1 = self.down1(x0)
        x1 = x1 + self.enc1(x1)
        x2 = self.down2(x1)
        x2 = x2 + self.enc2(x2)
        u1 = self.dec1(torch.cat([self.up2(x2), x1], 1))
        u0 = self.dec0(torch.cat([self.up1(u1), x0], 1))
        return self.out(u0)

    @staticmethod
    def dice_loss(logits, target):
        p = logits.softmax(1)[:, 1]
        return 1 - (2 * (p * target).sum() + 1) / (p.square().sum() + target.square().sum() + 1)

    @classmethod
    def make(cls, batch: int, dtype, device, size: int = 32, width: int = 8, k: int = 5) -> Workload:
        x = _rand(batch, 1, size, size, size)
        target = (_rand(batch, size, size, size) > 0.5).float()
        return _workload(cls(width, k), (x,), target, cls.dice_loss, dtype, device)


class _GatedMlp(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.norm, self.fc_in, self.gate = nn.LayerNorm(d), nn.Linear(d, h), nn.Linear(d, h)
        self.act, self.gate_act, self.shrink = nn.PReLU(h), nn.Hardsigmoid(), nn.Softshrink(0.05)
        self.fc_out = nn.Linear(h, d)
        self.norm2, self.fc2_in, self.fc2_out = nn.LayerNorm(d), nn.Linear(d, h), nn.Linear(h, d)
        self.act2 = nn.Hardshrink(0.25)

    def forward(self, x):
        y = self.norm(x)
        x = x + self.fc_out(self.shrink(self.act(self.fc_in(y)) * self.gate_act(self.gate(y))))
        return x + self.fc2_out(self.act2(self.fc2_in(self.norm2(x))))


class MlpBlocks(nn.Module):
    """Transformer-style MLP blocks over tokens (tokens x features, so PReLU's channel dim is the features):
    pre-LayerNorm, a PReLU branch gated by Hardsigmoid then Softshrink, a Hardshrink MLP, residuals; MSE loss."""

    name = "mlp-block"
    what = "gated MLP blocks: Linear, PReLU(hidden), Hardsigmoid gate, Softshrink, Hardshrink, LayerNorm; MSE"
    routes = ("_prelu_kernel", "hardsigmoid_backward", "softshrink_backward", "hardshrink", "hardshrink_backward")
    # large: 65536 tokens, ~1 TFLOP (f32 matmuls) and ~32 GB of traffic a step, an estimated 25-35 ms on an H100
    configs = {"small": Config(1, "128 tokens x 256", {}), "large": Config(512, "128 tokens x 256", {}),
               "tiny": Config(1, "8 tokens x 8", {"seq": 8, "d": 8, "hidden": 16})}

    def __init__(self, d: int = 256, hidden: int = 1024, depth: int = 2):
        super().__init__()
        self.blocks = nn.Sequential(*(_GatedMlp(d, hidden) for _ in range(depth)))

    def forward(self, x):
        return self.blocks(x.flatten(0, -2))

    @classmethod
    def make(cls, batch: int, dtype, device, seq: int = 128, d: int = 256, hidden: int = 1024) -> Workload:
        x = _rand(batch, seq, d)
        return _workload(cls(d, hidden), (x,), _rand(batch * seq, d), F.mse_loss, dtype, device)


class _SortSparsemax(torch.autograd.Function):
    """Sparsemax as PyTorch users write it (the `entmax` package's SparsemaxFunction): the sort-based threshold
    in the forward, the closed-form gradient 1_S * (g - mean_S g) in the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        z = x - x.amax(dim, keepdim=True)
        zs = z.sort(dim, descending=True).values
        cs = zs.cumsum(dim) - 1
        shape = [1] * z.dim()
        shape[dim] = z.shape[dim]
        k = torch.arange(1, z.shape[dim] + 1, device=z.device, dtype=z.dtype).view(shape)
        support = (k * zs > cs).sum(dim, keepdim=True)
        tau = cs.gather(dim, support - 1) / support.to(z.dtype)
        y = (z - tau).clamp_min(0)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (y,) = ctx.saved_tensors
        s = y > 0
        mean = torch.where(s, g, 0).sum(ctx.dim, keepdim=True) / s.sum(ctx.dim, keepdim=True).to(g.dtype)
        return torch.where(s, g - mean, 0), None


def stock_sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The stock-PyTorch sparsemax the benchmark times against `gradkern.sparsemax` (PyTorch has none)."""
    return _SortSparsemax.apply(x, dim % x.dim())


class SparsemaxAttention(nn.Module):
    """A pre-norm self-attention block whose attention weights are sparsemax (Martins & Astudillo 2016) instead of
    softmax: gradkern.sparsemax under gradkern, a sort-based composite otherwise; a learned position embedding
    added with `repeat` over the batch (as DETR does its queries); MSE loss."""

    name = "sparsemax-attn"
    what = "sparsemax self-attention: Linear, LayerNorm, sparsemax over scores, pos.repeat(B,1,1); MSE"
    routes = ("gradkern.sparsemax", "repeat")
    # large: 2^28 attention scores (1 GiB in f32) a step, ~45 GB of traffic (stock's sort-based sparsemax
    # dominates), an estimated 20-30 ms on an H100
    configs = {"small": Config(2, "64 tokens x 128", {}), "large": Config(64, "1024 tokens x 128", {"seq": 1024}),
               "tiny": Config(1, "8 tokens x 8", {"seq": 8, "d": 8, "heads": 2})}

    def __init__(self, d: int = 128, heads: int = 4, seq: int = 64):
        super().__init__()
        self.heads = heads
        self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.1)
        self.norm, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        from ..kernels.sparsemax import sparsemax

        b, t, d = x.shape
        x = x + self.pos.repeat(b, 1, 1)
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5
        p = sparsemax(scores, dim=-1) if is_enabled() else stock_sparsemax(scores, dim=-1)
        return x + self.proj((p @ v).transpose(1, 2).reshape(b, t, d))

    @classmethod
    def make(cls, batch: int, dtype, device, seq: int = 64, d: int = 128, heads: int = 4) -> Workload:
        model = cls(d, heads, seq)
        return _workload(model, (_rand(batch, seq, d),), _rand(batch, seq, d), F.mse_loss, dtype, device)


class _EdgeConv(nn.Module):
    def __init__(self, din: int, dout: int):
        super().__init__()
        self.msg, self.upd = nn.Linear(2 * din, dout), nn.Linear(din + dout, dout)
        self.msg_act, self.upd_act = nn.ELU(), nn.CELU(0.5)

    def forward(self, x, src, dst, lengths):
        xi, xj = x.index_select(0, dst), x.index_select(0, src)
        m = self.msg_act(self.msg(torch.cat([xi, xj - xi], -1)))
        agg = torch.segment_reduce(m, "max", lengths=lengths, unsafe=True)  # (unsafe: no host-side check, no sync)
        return self.upd_act(self.upd(torch.cat([x, agg], -1)))


class SegmentMaxGnn(nn.Module):
    """Message passing with max aggregation (EdgeConv / GraphSAGE-max style) over a random graph whose edges are
    sorted by destination, so each node's incoming messages are one segment of `torch.segment_reduce(..., "max")`;
    ELU on messages, CELU on updates; node regression, MSE loss."""

    name = "gnn-segmax"
    what = "message passing, segment_reduce max over sorted edges, Linear, ELU, CELU; MSE"
    routes = ("_segment_reduce_backward", "elu_backward")
    configs = {"small": Config(1, "512 nodes deg 8", {"nodes": 512}),
               # large: 4.2M edges, ~62 GB of traffic a step (f32), an estimated 25 ms on an H100
               "large": Config(1, "262144 nodes deg 16", {"nodes": 262144, "degree": 16}),
               "tiny": Config(1, "12 nodes deg 3", {"nodes": 12, "degree": 3, "d": 4, "hidden": 8})}

    def __init__(self, d: int = 32, hidden: int = 64, layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(_EdgeConv(d if i == 0 else hidden, hidden) for i in range(layers))
        self.head = nn.Linear(hidden, d)

    def forward(self, x, src, dst, lengths):
        for layer in self.layers:
            x = layer(x, src, dst, lengths)
        return self.head(x)

    @classmethod
    def make(cls, batch: int, dtype, device, nodes: int = 512, degree: int = 8, d: int = 32,
             hidden: int = 64) -> Workload:
        n = batch * nodes
        # a self loop per node (no empty segment) plus degree - 1 random sources, sorted by destination
        dst = torch.arange(n).repeat_interleave(degree)
        src = torch.randint(0, n, (n * degree,))
        src[::degree] = torch.arange(n)
        lengths = torch.full((n,), degree)
        return _workload(cls(d, hidden), (_rand(n, d), src, dst, lengths), _rand(n, d), F.mse_loss, dtype, device)


class GatedRecurrent(nn.Module):
    """A gated recurrent cell unrolled over a padded batch of sequences: h = lerp(h, tanh(c), sigmoid(z)) (a GRU
    update with a tensor weight), padded steps keep h through `torch.where`, and an exponential moving average
    of h (lerp with a scalar weight) is read out; MSE loss."""

    name = "gated-rnn"
    what = "gated recurrent cell, 8 steps: Linear, lerp(h, cand, gate), where(mask, ...), EMA lerp(scalar); MSE"
    routes = ("lerp.Tensor", "lerp.Scalar", "where.self")
    # large: ~650 GFLOP (f32 matmuls) and ~56 GB of traffic a step, an estimated 30-40 ms on an H100
    configs = {"small": Config(4, "8 steps x 64", {}), "large": Config(24576, "8 steps x 64", {}),
               "tiny": Config(2, "3 steps x 4", {"steps": 3, "d": 4, "hidden": 8})}

    def __init__(self, d: int = 64, hidden: int = 512):
        super().__init__()
        self.inp, self.rec = nn.Linear(d, 2 * hidden), nn.Linear(hidden, 2 * hidden, bias=False)
        self.head = nn.Linear(hidden, d)

    def forward(self, x, mask):
        gx = self.inp(x)
        h = ema = x.new_zeros(x.shape[0], self.rec.in_features)
        for t in range(x.shape[1]):
            z, c = (gx[:, t] + self.rec(h)).chunk(2, -1)
            h = torch.where(mask[:, t, None], torch.lerp(h, torch.tanh(c), torch.sigmoid(z)), h)
            ema = torch.lerp(ema, h, 0.25)
        return self.head(ema)

    @classmethod
    def make(cls, batch: int, dtype, device, steps: int = 8, d: int = 64, hidden: int = 512) -> Workload:
        lengths = torch.randint(1, steps + 1, (batch, 1))
        mask = torch.arange(steps) < lengths
        return _workload(cls(d, hidden), (_rand(batch, steps, d), mask), _rand(batch, d), F.mse_loss, dtype, device)


class _InvertedResidual(nn.Module):
    """MobileNetV3's block with ELU/CELU in place of hardswish: 1x1 expand, depthwise 3x3, squeeze-excite gated
    by Hardsigmoid, 1x1 project, residual."""

    def __init__(self, ch: int, expand: int = 4):
        super().__init__()
        e = ch * expand
        self.expand = nn.Sequential(nn.Conv2d(ch, e, 1, bias=False), nn.BatchNorm2d(e), nn.ELU())
        self.dw = nn.Sequential(nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e), nn.CELU())
        self.se = nn.Sequential(nn.Conv2d(e, e // 4, 1), nn.ReLU(), nn.Conv2d(e // 4, e, 1), nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(e, ch, 1, bias=False), nn.BatchNorm2d(ch))

    def forward(self, x):
        y = self.dw(self.expand(x))
        # a mean, not AdaptiveAvgPool2d: that one's CUDA backward raises in deterministic mode
        y = y * self.se(y.mean((2, 3), keepdim=True))
        return x + self.project(y)


class MobileNetSE(nn.Module):
    """A small MobileNetV3-like classifier: strided SELU stem, inverted residual blocks with ELU/CELU and
    Hardsigmoid squeeze-excite, global mean pool, Linear; soft-target cross entropy (no NLLLoss, whose CUDA kernel
    raises in deterministic mode)."""

    name = "mobilenet-se"
    what = "MobileNetV3-like: Conv2d, BatchNorm2d, SELU/ELU/CELU, Hardsigmoid squeeze-excite; cross entropy"
    routes = ("elu_backward", "hardsigmoid_backward")
    # large: ~280 GFLOP (much of it depthwise) and ~40 GB of traffic a step (f32), an estimated 30-40 ms on an H100
    configs = {"small": Config(2, "3x64x64", {"hw": 64}), "large": Config(256, "3x128x128", {"hw": 128}),
               "tiny": Config(2, "3x8x8", {"hw": 8, "width": 4, "blocks": 1})}

    def __init__(self, width: int = 16, blocks: int = 3, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.SELU())
        self.blocks = nn.Sequential(*(_InvertedResidual(width) for _ in range(blocks)))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))

    @classmethod
    def make(cls, batch: int, dtype, device, hw: int = 64, width: int = 16, blocks: int = 3) -> Workload:
        target = _rand(batch, 10).softmax(-1)
        return _workload(cls(width, blocks), (_rand(batch, 3, hw, hw),), target, F.cross_entropy, dtype, device)


def _conv_bn_relu(dims: int, cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    conv, bn = (nn.Conv3d, nn.BatchNorm3d) if dims == 3 else (nn.Conv2d, nn.BatchNorm2d)
    return [conv(cin, cout, 3, stride=stride, padding=1, bias=False), bn(cout), nn.ReLU(True)]


class UNet3d(nn.Module):
    """A 3-D U-Net for volumetric segmentation (Cicek et al. 2016), reduced to three levels: MaxPool3d then
    AvgPool3d down, a global-context branch (AdaptiveAvgPool3d to 2^3, 1x1 conv, trilinear upsampling back),
    trilinear Upsample up with skip connections; CrossEntropy over voxels (nll_loss2d on 5-D logits)."""

    name = "unet3d-seg"
    what = ("3-D U-Net: Conv3d, BatchNorm3d, MaxPool3d, AvgPool3d, AdaptiveAvgPool3d, trilinear Upsample; "
            "CrossEntropy")
    routes = ("max_pool3d_with_indices_backward", "avg_pool3d_backward", "_adaptive_avg_pool3d_backward",
              "upsample_trilinear3d_backward", "nll_loss2d_forward")
    configs = {"small": Config(1, "1x32x32x32", {"size": 32}), "large": Config(4, "1x64x64x64", {"size": 64}),
               "tiny": Config(1, "1x8x8x8", {"size": 8, "width": 2})}

    def __init__(self, width: int = 8, classes: int = 4):
        super().__init__()
        w = width
        self.enc0 = nn.Sequential(*_conv_bn_relu(3, 1, w))
        self.enc1 = nn.Sequential(nn.MaxPool3d(2), *_conv_bn_relu(3, w, 2 * w))
        self.enc2 = nn.Sequential(nn.AvgPool3d(3, stride=2, padding=1, count_include_pad=False),
                                  *_conv_bn_relu(3, 2 * w, 4 * w))
        self.context = nn.Sequential(nn.AdaptiveAvgPool3d(2), nn.Conv3d(4 * w, 4 * w, 1))
        self.up = nn.Upsample(scale_factor=2, mode="trilinear", align_corners=False)
        self.dec1 = nn.Sequential(*_conv_bn_relu(3, 6 * w, 2 * w))
        self.dec0 = nn.Sequential(*_conv_bn_relu(3, 3 * w, w))
        self.out = nn.Conv3d(w, classes, 1)

    def forward(self, x):
        x0 = self.enc0(x)
        x1 = self.enc1(x0)
        x2 = self.enc2(x1)
        x2 = x2 + F.interpolate(self.context(x2), size=x2.shape[2:], mode="trilinear", align_corners=False)
        u1 = self.dec1(torch.cat([self.up(x2), x1], 1))
        return self.out(self.dec0(torch.cat([self.up(u1), x0], 1)))

    @classmethod
    def make(cls, batch: int, dtype, device, size: int = 32, width: int = 8, classes: int = 4) -> Workload:
        x = _rand(batch, 1, size, size, size)
        target = torch.randint(0, classes, (batch, size, size, size))
        return _workload(cls(width, classes), (x,), target, F.cross_entropy, dtype, device)


class PspNet(nn.Module):
    """PSPNet (Zhao et al. 2017), reduced: a stride-8 convolutional backbone, the pyramid pooling module
    (AdaptiveAvgPool2d to 1, 2, 3 and 6, 1x1 convs, bilinear upsampling back, concatenated), a 3x3 head and
    bilinear upsampling to the input size; CrossEntropy with ignore_index 255 (unlabelled pixels)."""

    name = "psp-seg"
    what = "PSPNet: Conv2d, BatchNorm2d, AdaptiveAvgPool2d pyramid, bilinear F.interpolate; CrossEntropy(ignore)"
    routes = ("_adaptive_avg_pool2d_backward", "upsample_bilinear2d_backward", "nll_loss2d_forward")
    configs = {"small": Config(2, "3x128x128", {"hw": 128}), "large": Config(16, "3x256x256", {"hw": 256}),
               "tiny": Config(2, "3x12x12", {"hw": 12, "width": 4})}  # (batch 2: BatchNorm after the 1x1 bin)
    bins = (1, 2, 3, 6)

    def __init__(self, width: int = 32, classes: int = 21):
        super().__init__()
        w = width
        self.backbone = nn.Sequential(*_conv_bn_relu(2, 3, w, 2), *_conv_bn_relu(2, w, 2 * w, 2),
                                      *_conv_bn_relu(2, 2 * w, 4 * w, 2), *_conv_bn_relu(2, 4 * w, 4 * w))
        self.stages = nn.ModuleList(nn.Sequential(nn.AdaptiveAvgPool2d(b), nn.Conv2d(4 * w, w, 1, bias=False),
                                                  nn.BatchNorm2d(w), nn.ReLU(True)) for b in self.bins)
        self.head = nn.Sequential(*_conv_bn_relu(2, 4 * w + len(self.bins) * w, w), nn.Conv2d(w, classes, 1))

    def forward(self, x):
        f = self.backbone(x)
        pyramid = [F.interpolate(s(f), size=f.shape[2:], mode="bilinear", align_corners=False) for s in self.stages]
        logits = self.head(torch.cat([f, *pyramid], 1))
        return F.interpolate(logits, size=x.shape[2:], mode="bilinear", align_corners=False)

    @classmethod
    def make(cls, batch: int, dtype, device, hw: int = 128, width: int = 32, classes: int = 21) -> Workload:
        target = torch.randint(0, classes, (batch, hw, hw))
        target[torch.rand(batch, hw, hw) < 0.1] = 255
        loss = functools.partial(F.cross_entropy, ignore_index=255)
        return _workload(cls(width, classes), (_rand(batch, 3, hw, hw),), target, loss, dtype, device)


MODELS: dict[str, type[nn.Module]] = {m.name: m for m in (
    ResnetGenerator, VNet, MlpBlocks, SparsemaxAttention, SegmentMaxGnn, GatedRecurrent, MobileNetSE, UNet3d,
    PspNet)}


def list_lines() -> list[str]:
    width = max(map(len, MODELS))
    return [f"{name.ljust(width)}  {m.what}  [gradkern: {', '.join(m.routes)}]" for name, m in MODELS.items()]


# ------------------------------------------------------------------------------------------------- timing
@contextlib.contextmanager
def stock_pytorch():
    """Stock PyTorch inside the block, as users without gradkern have it: gradkern's registrations removed, not
    only switched off (a router switched off still costs host time on each routed op). use() restores on exit."""
    with use(False):
        dispatch.unregister()
        yield


def _sync(gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


def _step_fn(work: Workload) -> Callable[[], None]:
    opt = torch.optim.SGD(work.model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        work.loss_fn(work.model(*work.inputs)).backward()
        opt.step()

    return step


def _time(step: Callable, n: int, gpu: bool) -> tuple[float, float]:
    """(wall ms, CPU-issue ms) per step over n steps run back to back."""
    _sync(gpu)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    _sync(gpu)
    t2 = time.perf_counter()
    return (t2 - t0) / n * 1e3, (t1 - t0) / n * 1e3


def _timed_run(step: Callable, n: int, warmup: int, gpu: bool) -> tuple[float, float]:
    """One timed run: `warmup` steps, a full garbage collection, then `_time` with the collector off (a collection
    inside the timed steps is host noise; the collector is restored after)."""
    for _ in range(warmup):
        step()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        return _time(step, n, gpu)
    finally:
        if was:
            gc.enable()


def _steps(fast_ms: float, slow_ms: float) -> int:
    """Steps a timed run: TARGET_S of the faster mode, as long as the slower one stays within 5x that."""
    n = min(math.ceil(TARGET_S * 1e3 / fast_ms), math.floor(5 * TARGET_S * 1e3 / slow_ms))
    return min(MAX_STEPS, max(MIN_STEPS, n))


def _rounds(n: int, step_ms: float, most: int) -> int:
    """Rounds of timed runs for n steps of step_ms: RUN_BUDGET_S of timed steps, MIN_REPEATS to `most`."""
    return max(min(MIN_REPEATS, most), min(most, math.floor(RUN_BUDGET_S * 1e3 / (n * step_ms))))


def _is_determinism_error(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "deterministic" in str(e).lower()


@dataclass
class _Mode:
    name: str  # "stock" | "gradkern"
    step: Callable
    status: str = "ok"  # "ok" | "raises" (deterministic mode) | "error: ..."
    wall: list = field(default_factory=list)
    issue: list = field(default_factory=list)

    def run(self, fn: Callable):
        if self.status != "ok":
            return None
        try:
            with use() if self.name == "gradkern" else stock_pytorch():
                return fn()
        except Exception as e:  # noqa: BLE001 - a mode that raises is a table cell, not the end of the run
            self.status = "raises" if _is_determinism_error(e) else f"error: {type(e).__name__}: {e}"[:200]
            if self.status != "raises":
                print(f"    {self.name} {self.status}", file=sys.stderr, flush=True)
            return None

    def fields(self) -> dict:
        """The record's fields of this mode: the headline is the fastest run (host noise only adds time), with the
        issue time of that run; medians and every run beside it."""
        ok = self.status == "ok" and bool(self.wall)
        best = min(range(len(self.wall)), key=self.wall.__getitem__) if ok else None
        return {f"{self.name}_status": self.status,
                f"{self.name}_ms": self.wall[best] if ok else None,
                f"{self.name}_ms_median": statistics.median(self.wall) if ok else None,
                f"{self.name}_issue_ms": self.issue[best] if ok else None,
                f"{self.name}_issue_ms_median": statistics.median(self.issue) if ok else None,
                f"{self.name}_wall_ms_all": self.wall, f"{self.name}_issue_ms_all": self.issue}


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def measure(cls, size: str, dtype: torch.dtype, deterministic: bool, device, gpu: bool,
            repeats: int = REPEATS, steps: int | None = None, warmup: int = WARMUP,
            run_warmup: int = RUN_WARMUP) -> dict:
    """One table row: stock and gradkern training steps of model `cls` at config `size`, timed in turns. `warmup`
    steps per mode first (compiles), then (unless `steps` is given) a 2-step estimate that sets the steps per run;
    then rounds of one timed run per mode (stock, gradkern, stock, ...), each after `run_warmup` steps: `repeats`
    of them where `steps` is given, else `_rounds` of the estimate with `repeats` the most."""
    cfg = cls.configs[size]
    torch.manual_seed(0)
    work = cls.make(cfg.batch, dtype, device, **cfg.kw)
    twin = Workload(copy.deepcopy(work.model), work.inputs, work.loss_fn)  # same initial weights and inputs
    modes = [_Mode("stock", _step_fn(work)), _Mode("gradkern", _step_fn(twin))]
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        estimates = []
        for m in modes:
            m.run(lambda m=m: [m.step() for _ in range(warmup)])
            est = None if steps else m.run(lambda m=m: _time(m.step, 2, gpu)[0])
            if est is not None:
                estimates.append(est)
        n = steps or (_steps(min(estimates), max(estimates)) if estimates else 0)
        if not steps and estimates:
            repeats = _rounds(n, max(estimates), repeats)
        for _ in range(repeats):
            for m in modes:  # in turns, so that drift (clocks, other load) hits both
                t = m.run(lambda m=m: _timed_run(m.step, n, run_warmup, gpu))
                if t is not None:
                    m.wall.append(t[0])
                    m.issue.append(t[1])
    finally:
        torch.use_deterministic_algorithms(was)
    rec = {"model": cls.name, "config": size, "batch": cfg.batch, "shape": cfg.shape,
           "dtype": _runtime.DTYPE_NAMES[dtype], "deterministic": deterministic, "steps": n, "repeats": repeats,
           "run_warmup": run_warmup}
    for m in modes:
        rec.update(m.fields())
    rec["speedup"] = _paired(modes)  # the headline
    rec["speedup_min"] = _ratio(rec["stock_ms"], rec["gradkern_ms"])
    rec["speedup_median"] = _ratio(rec["stock_ms_median"], rec["gradkern_ms_median"])
    rec["stock_det_off_ms"] = rec["det_vs_stock_det_off"] = None  # (deterministic rows: set by link_det_off)
    return rec


def _paired(modes: list[_Mode]) -> float | None:
    """The median over rounds of stock's wall / gradkern's (None unless both modes ran every round)."""
    stock, gk = modes
    if stock.status != "ok" or gk.status != "ok" or not stock.wall or len(stock.wall) != len(gk.wall):
        return None
    return statistics.median(s / g for s, g in zip(stock.wall, gk.wall, strict=True))


def link_det_off(records: list[dict]) -> None:
    """Each deterministic row's "det_vs_stock_det_off": stock's fastest step with deterministic mode off (the row
    of the same model, config and dtype) / gradkern's fastest with it on, the issue's target (>= 1)."""
    off = {(r["model"], r["config"], r["dtype"]): r for r in records if not r["deterministic"]}
    for r in records:
        o = off.get((r["model"], r["config"], r["dtype"])) if r["deterministic"] else None
        r["stock_det_off_ms"] = o["stock_ms"] if o else None
        r["det_vs_stock_det_off"] = _ratio(r["stock_det_off_ms"], r["gradkern_ms"])


def _cell(rec: dict, mode: str, key: str) -> str:
    status = rec[f"{mode}_status"]
    return _f(rec[f"{mode}_{key}"], ".3f") if status == "ok" else ("raises" if status == "raises" else "error")


def _speedup_cell(rec: dict) -> str:
    if rec["speedup"] is not None:
        return f"{rec['speedup']:.2f}x"
    return next((f"{m} {rec[f'{m}_status'].split(':')[0]}" for m in ("stock", "gradkern")
                 if rec[f"{m}_status"] != "ok"), "-")


def _det_off_cell(rec: dict) -> str:
    if not rec["deterministic"]:
        return "-"
    if rec["det_vs_stock_det_off"] is not None:
        return f"{rec['det_vs_stock_det_off']:.2f}x"
    return "gradkern " + rec["gradkern_status"].split(":")[0] if rec["gradkern_status"] != "ok" else "-"


HEADERS = ["model", "batch", "input", "dtype", "det", "stock min ms", "gradkern min ms",
           "speedup (median of paired runs)", "det vs stock det-off", "stock issue ms", "gradkern issue ms",
           "steps"]


def _row(rec: dict) -> list:
    return [rec["model"], rec["batch"], rec["shape"], rec["dtype"], "on" if rec["deterministic"] else "off",
            _cell(rec, "stock", "ms"), _cell(rec, "gradkern", "ms"), _speedup_cell(rec), _det_off_cell(rec),
            _cell(rec, "stock", "issue_ms"), _cell(rec, "gradkern", "issue_ms"), rec["steps"]]


def run_models(names: list[str] | None = None, dtypes: list[torch.dtype] | None = None,
               sizes: tuple[str, ...] = ("small", "large"), det_modes: tuple[bool, ...] = (False, True),
               json_path: str | None = None, plot_path: str | None = None) -> int:
    """The model benchmark; returns the exit status (1 if a mode failed other than by deterministic mode)."""
    # deterministic cuBLAS needs this before its first handle, else deterministic mode raises in every matmul
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    gpu = _runtime.has_gpu()
    device = _runtime.default_device()
    dev_name = _device_name()
    if gpu:
        repeats, steps, warmup, run_warmup = REPEATS, None, WARMUP, RUN_WARMUP
        dtypes = dtypes or [torch.float32, torch.bfloat16]
    else:
        repeats, steps, warmup, run_warmup = 1, 1, 1, 0
        dtypes = dtypes or [torch.float32]
        print("No CUDA GPU: tiny models, one step each, through Triton's interpreter on CPU; the timings say "
              "nothing about GPU performance.", flush=True)
    print(f"device: {dev_name}; training step = forward + backward + SGD step, wall clock (host included)",
          flush=True)
    sizes = sizes if gpu else ("tiny",)
    det_modes = tuple(sorted(det_modes))  # off before on: a deterministic row is compared with the det-off one
    work = [(MODELS[n], s, d, det) for n in (names or MODELS) for s in sizes for d in dtypes for det in det_modes]
    records = []
    t_start = time.perf_counter()
    for i, (cls, size, dtype, det) in enumerate(work, 1):
        dt = _runtime.DTYPE_NAMES[dtype]
        print(f"[{i}/{len(work)}] {cls.name} {size} {dt} det={'on' if det else 'off'} ...", file=sys.stderr,
              end="", flush=True)
        t0 = time.perf_counter()
        rec = measure(cls, size, dtype, det, device, gpu, repeats, steps, warmup, run_warmup)
        rec["elapsed_s"] = time.perf_counter() - t0  # (the row's whole time: building, compiles, warm-ups, runs)
        records.append(rec)
        link_det_off(records)
        print(f" stock {_cell(rec, 'stock', 'ms')} ms, gradkern {_cell(rec, 'gradkern', 'ms')} ms (min), "
              f"{_speedup_cell(rec)}{f', vs stock det-off {_det_off_cell(rec)}' if det else ''} "
              f"[{rec['elapsed_s']:.1f} s]", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t_start
    print()
    print_table(HEADERS, [_row(r) for r in records])
    runs = f"{MIN_REPEATS} to {repeats}, by step time" if gpu else f"{repeats}"
    print(f"\nmin ms: wall clock per training step (host included) of a mode's fastest timed run ({runs}: each "
          f"row's count is in the JSON),\n  stock and gradkern in turns, each after {run_warmup} warm-up steps and a "
          "garbage collection, the collector off while timed\n  (host noise only adds time; the medians and every run "
          "are in the JSON)\n"
          "speedup: the median over rounds of stock's run / gradkern's run of the round, the same deterministic mode\n"
          "  (each round's two runs are adjacent in time; speedup_min, stock min / gradkern min, is in the JSON)\n"
          "det vs stock det-off (deterministic rows): stock's min ms with deterministic mode off (the same model, "
          "batch and dtype)\n  / gradkern's min ms with it on (the target: >= 1)\n"
          "issue ms: CPU time to issue a step in the fastest run (the clock read before the final synchronisation)\n"
          "raises: a RuntimeError about deterministic algorithms")
    print(f"({len(records)} rows in {elapsed:.0f} s)")
    import triton

    from .. import __version__

    result = {"benchmark": "models", "device": dev_name, "torch": torch.__version__, "triton": triton.__version__,
              "gradkern": __version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "interpreter": not gpu, "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
              "target_s": TARGET_S if gpu else None, "repeats": repeats, "run_warmup": run_warmup,
              "headline": "ms fields: min over a row's repeats (*_ms_median and *_all beside); speedup: median of the "
                          "rounds' stock / gradkern (speedup_min, speedup_median beside)", "elapsed_s": elapsed,
              "records": records}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {json_path}")
    if plot_path:
        plot(records, dev_name, plot_path)
    return 1 if any(r[f"{m}_status"].startswith("error") for r in records for m in ("stock", "gradkern")) else 0


# ------------------------------------------------------------------------------------------------- plot
def plot(records: list[dict], dev_name: str, path: str) -> None:
    """One panel per model: speedup (median of paired runs) bars per batch and dtype, deterministic mode off and
    on, and on each deterministic bar a mark at stock's deterministic-off min / gradkern's deterministic min."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    models = list(dict.fromkeys(r["model"] for r in records))
    ncols = min(3, len(models))
    nrows = math.ceil(len(models) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False)
    width, colors = 0.38, {False: "tab:blue", True: "tab:orange"}
    speedups = [v for r in records for v in (r["speedup"], r.get("det_vs_stock_det_off")) if v] or [1.0]
    lo, hi = min(min(speedups), 1.0) / 1.6, max(max(speedups), 1.0) * 1.6
    for ax, model in zip(axes.flat, models):
        recs = [r for r in records if r["model"] == model]
        groups = list(dict.fromkeys((r["config"], r["batch"], r["shape"], r["dtype"]) for r in recs))
        for r in recs:
            x = groups.index((r["config"], r["batch"], r["shape"], r["dtype"]))
            x += width / 2 if r["deterministic"] else -width / 2
            s = r["speedup"]
            if s is not None:  # bars from 1.0 (log scale): up where gradkern is faster, down where slower
                ax.bar(x, s - 1, width, bottom=1, color=colors[r["deterministic"]])
                ax.text(x, s, f"{s:.3g}", ha="center", va="bottom" if s >= 1 else "top", fontsize=7)
            else:  # a mode raised: say which, where the bar would be
                ax.text(x, 1, _speedup_cell(r).replace(" ", "\n"), ha="center", va="center", fontsize=7,
                        color="tab:red", bbox={"fc": "white", "ec": "tab:red", "lw": 0.5})
            if r["det_vs_stock_det_off"] is not None:  # deterministic gradkern against stock without determinism
                ax.plot(x, r["det_vs_stock_det_off"], marker="_", ms=14, mew=2, color="k")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlim(-0.6, len(groups) - 0.4)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"batch {b}\n{s}\n{d}" for _c, b, s, d in groups], fontsize=7)
        ax.set_title(model, fontsize=10)
        ax.set_ylabel("speedup (median of paired runs)", fontsize=8)
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    handles = [*(plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()),
               plt.Line2D([], [], marker="_", ms=14, mew=2, color="k", ls="")]
    note = "; interpreter: the timings mean nothing" if "interpreter" in dev_name else ""
    fig.suptitle(f"training step, stock PyTorch vs gradkern, on {dev_name} (fastest run's wall clock, host "
                 f"included; > 1: gradkern faster{note})", fontsize=10)
    fig.legend(handles, ["deterministic off", "deterministic on",
                         "deterministic gradkern vs stock with deterministic off"], loc="upper center", ncol=3,
               fontsize=8, bbox_to_anchor=(0.5, 0.975), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
