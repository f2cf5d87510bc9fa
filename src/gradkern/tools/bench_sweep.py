"""`python -m gradkern bench --sweep`: every op over many seeded shapes and layouts, judged per op by the minimum and
the geometric mean, never by one shape.

Cases. Per op and dtype at least 24, from real model shapes (ResNet / MobileNet / EfficientNet / V-Net activations,
transformer MLP and attention tensors, CycleGAN and V-Net pads, DETR's `pos.repeat`, global and pyramid pooling, ViT
and LM-vocabulary rows for sparsemax, GNN edge lists for the segment ops) and adversarial ones: numel not a multiple
of 16 and prime sizes, non-power-of-two planes, 64K elements up to cases moving more than 256 MB (in 16-bit dtypes
too), transposed, permuted, channels_last, strided (stride 2, every other row, a padded row pitch) and misaligned
(storage offset 1) operands, expanded and broadcast operands, operands of different layouts, pads 0-7 asymmetric
and negative, segment widths (the size after the segment axis) 1, 3, 40, 64, 100, 256, 1000 with empty-heavy,
unit, uniform, power-law, fixed and single-segment lengths (int32 offsets, segments along axis 1 too), sparsemax
along the first, middle and last dims over rows of 3 to 1M with sparse and whole-row supports. Each family has its
generator (`GENERATORS`, keyed by op name); an op without one gets the registry's own `cases()` at two sizes, each
as given, strided and transposed where its tensors allow (`_registry_cases`), so that a newly registered op still
appears. A case is a label and a builder: nothing is allocated until the case runs (listing builds nothing, except
for an op on the registry fallback), and its tensors are freed after it. Values are seeded per (op, label), so every
dtype sees the same problem, and every run the same values. Each op's cases are listed in a spread order (the
generators' lists are grouped by kind; `spread_order`), so that the first N of them, `--cases N`, sample every kind.
The same generators take a scale: full on a GPU, tiny (about 1e4 elements at most, few planes and segments) under
Triton's interpreter, where a run does a couple of cases per op (its timings mean nothing: it is a smoke test).

Bytes: the minimum the op must move (what "% of the copy ceiling" divides by): every input the result depends on
read once, every output written once; an expanded or broadcast operand counts its distinct elements only (stride-0
dims once); arguments of which only the shape, dtype or layout are read (where's self/other, lerp's self/end with a
Python weight, the pads' and pools' `self`) count nothing. Per family:
* activation backwards (elu, softshrink, hardshrink, hardsigmoid; hardshrink's forward): grad_output and self read,
  grad_input written at the broadcast shape;
* where_backward: grad and condition (1 byte an element) read; grad_self and grad_other written at self's and
  other's shapes (summed down there);
* lerp_backward: grad read; a tensor weight read, and self and end too (grad_weight needs them); grad_self,
  grad_end (and grad_weight) written at their inputs' shapes. A Python weight: grad read, two gradients written;
* prelu_backward: grad_output, self and weight read, grad_input and grad_weight (C elements) written;
  _prelu_kernel_backward: the same reads, grad_input and the full-shape grad_weight written;
* pad backwards: grad_output read, grad_input written (each grad_output element lands in one grad_input element,
  also where negative pads crop); adaptive average pool backwards: grad_output read, grad_input written;
* repeat_backward: grad read, the input-shaped result written;
* sparsemax_forward: x read, y written. sparsemax_backward: y read, dx written, and grad only where the support
  needs it: the |S| elements with y > 0 (dx is 0 elsewhere whatever grad holds), so bytes = (2n + |S|) * element
  size (|S| is counted on the built case: n for a whole-row support, a few per row for typical inputs);
* segment_max_forward: data and the offsets read, values and int64 indices written;
  segment_max_backward: grad and the int64 indices read, grad_data (every row) written; the offsets are not counted
  (the indices alone place every gradient, the rest is zeros);
* _segment_reduce_backward: grad, output, data and the lengths (or offsets) read, grad_data written.
Where stock does less: segment_max_forward's baseline, `torch.segment_reduce`, writes no indices.

Timing (GPU): `gradkern.ops.<name>` under torch.no_grad (through the native router where built, as any
`gradkern.ops` call on CUDA: a repeated call replays from C++), stock eager (`OpInfo.stock()`: the ATen op, or the
op's stock composite) and `torch.compile(stock, dynamic=False)` (dynamo reset before each case), each the median of
`triton.testing.do_bench` after `HOT_MS` of calls back to back (a call of `SLOW_MS` or more: the faster of two
calls); the copy ceiling is measured in the same run. Each case is first checked once against the op's reference on
the device (loose tolerance: it catches garbage, not ulps; the ops in `_CHECK_IN_F32` take a float32 reference for
16-bit cases; a reference that raises on the device runs on CPU copies); a case that fails or raises is marked and
not timed. The compiled code is inspected: "inductor" (Inductor generated every kernel), "mixed" (its own kernels
beside ATen fallbacks, e.g. a sort), "fallback" (no kernel of its own, or the stock ATen op itself kept beside
helper kernels). Speedups vs torch.compile are summarised only over "inductor" and "mixed" cases. Each case also
records who serves it under `enable()` (mode "auto": the op's route, a function of the descriptor), and its speedup
as a user of enable() sees it: the kernel's where gradkern serves it, 1.0 where the route sends it to stock. Per op
the summary gives min and geometric mean of the speedups (the kernel's, and as enable() routes) and of % of the copy
ceiling (and of % copy over cases moving >= 64 MiB), the case of the minimum, and the Triton variants gradkern
compiled during the op's cases (shared kernels compiled by an earlier op are not counted again). """

from __future__ import annotations

import datetime
import gc
import json
import math
import re
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .. import _runtime
from ..plan import route_of
from ..registry import REGISTRY
from ..routing.dispatch import use
from ..testing import ARRANGEMENTS, arrange, run_reference, tensors_of
from .bench import _f, _safe, copy_ceiling_gbs
from .cli import _device_name, print_table

__all__ = ["SweepCase", "Built", "GENERATORS", "FAMILIES", "sweep_cases", "list_lines", "measure_case",
           "summarize", "run_sweep", "plot", "classify_compiled", "SWEEP_DTYPES", "MIN_CASES"]

SWEEP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MIN_CASES = 24  # per op and dtype, at either scale
INTERP_CASES = 2  # cases per (op, dtype) a run without a GPU does unless --cases says otherwise
WARMUP_MS, REP_MS = 5, 25  # do_bench per timing: a sweep is ~2,000 cases; the median of 25 ms of runs is stable
# calls at least this long are timed twice, the faster kept (the first may pay a lazy start-up): do_bench makes 8
# calls at the least, tens of seconds a case for stock's segment_reduce at 64M power-law rows (seconds a call)
SLOW_MS = 50.0
# before do_bench, a call runs back to back, unsynchronised, for this long (its steady state, as in a training
# loop): without it small cases (< 50 us) in a long process read up to 1.4-5x their time in a fresh one (H200,
# scripts/tune.py's TUNE_HOT_MS, docs/tuning/README.md)
HOT_MS = 50.0
LARGE_BYTES = 64 << 20  # the summary's "large" cases: moving at least this many bytes

# plot panels: op family -> ops (an op in none of them goes to "other")
FAMILIES: dict[str, tuple[str, ...]] = {
    "activation backwards": ("elu_backward", "softshrink_backward", "hardshrink_backward", "hardsigmoid_backward",
                             "hardshrink"),
    "where, lerp, prelu, repeat (gradients summed to broadcast shapes)": (
        "where_backward", "lerp_backward", "prelu_backward", "_prelu_kernel_backward", "repeat_backward"),
    "pad backwards": ("replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward",
                      "reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward"),
    "sparsemax": ("sparsemax_forward", "sparsemax_backward"),
    "segment max": ("segment_max_forward", "segment_max_backward", "_segment_reduce_backward"),
    "adaptive average pool backwards": ("_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward"),
    "max and 3-D pool backwards": ("max_pool3d_with_indices_backward", "avg_pool3d_backward",
                                   "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward"),
    "upsampling backwards": ("upsample_linear1d_backward", "upsample_bilinear2d_backward",
                             "upsample_bicubic2d_backward", "_upsample_bilinear2d_aa_backward",
                             "upsample_trilinear3d_backward"),
    "segmentation loss": ("nll_loss2d_forward",),
}


def family_of(op: str) -> str:
    return next((f for f, ops in FAMILIES.items() if op in ops), "other")


# ----------------------------------------------------------------------------------------------- cases
@dataclass
class Built:
    """A case's tensors: the op's arguments, its minimum bytes, and (where the stock baseline takes other arguments)
    the stock call as (fn, args, kwargs)."""

    args: tuple
    kwargs: dict
    bytes: int
    stock: tuple | None = None
    extra: dict = field(default_factory=dict)  # more fields for the record (segments, support size, ...)


@dataclass(frozen=True)
class SweepCase:
    op: str
    dtype: torch.dtype
    index: int
    label: str
    make: Callable[[_Ctx], Built] = field(repr=False)

    @property
    def seed(self) -> int:
        return zlib.crc32(f"{self.op}|{self.label}".encode())  # (not the dtype: every dtype sees the same values)

    def build(self, device) -> Built:
        return self.make(_Ctx(device, self.dtype, self.seed))


class Scale:
    """Shapes of the full (GPU) or tiny (interpreter) version of a case: `S(full, tiny)`."""

    def __init__(self, full: bool):
        self.full = full

    def __call__(self, full, tiny):
        return full if self.full else tiny


class _Ctx:
    """What a case's builder makes its tensors with: device, dtype, seeded generators."""

    def __init__(self, device, dtype: torch.dtype, seed: int):
        self.device, self.dtype, self.seed = torch.device(device), dtype, seed
        # (on the meta device, which sizes full-scale cases without memory, there is no generator)
        self.gen = torch.Generator(device=self.device).manual_seed(seed) if self.device.type != "meta" else None
        self.el = torch.empty((), dtype=dtype).element_size()

    def randn(self, shape, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.randn(tuple(shape), device=self.device, generator=self.gen)
        if scale != 1.0:
            t.mul_(scale)
        return t.to(dtype or self.dtype)

    def rand(self, shape) -> torch.Tensor:
        return torch.rand(tuple(shape), device=self.device, generator=self.gen).to(self.dtype)

    def mask(self, shape) -> torch.Tensor:
        return torch.rand(tuple(shape), device=self.device, generator=self.gen) > 0.5

    def stand_in(self, shape) -> torch.Tensor:
        """Only shape and dtype are read: one element, expanded."""
        return torch.zeros((), device=self.device, dtype=self.dtype).expand(tuple(shape))

    def arrange(self, shape, kind: str = "contig", make: Callable | None = None) -> torch.Tensor:
        """A tensor of logical shape `shape` whose memory is laid out as `kind` (LAYOUTS), values from
        `make(storage_shape)` (default: standard normal): `gradkern.testing.arrange`."""
        return arrange(shape, kind, make or self.randn)


LAYOUTS = ARRANGEMENTS  # layout name -> its words in the labels (the sweep uses the fixed ones, not "*_rand")


def distinct_bytes(t) -> int:
    """Bytes of the distinct elements of `t` (a stride-0 dim counts once); 0 for anything else."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return 0
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _dims(shape) -> str:
    return "x".join(map(str, shape)) if len(shape) else "0-d"


def _numel(shape) -> int:
    return math.prod(shape)


# -------------------------------------------------------------------------- activation backwards (pointwise)
# (note, full shape, tiny shape, grad's layout, self's layout); unary ops (hardshrink) take self's layout, or grad's
# where self's is contiguous
_PW = [
    ("64K", (65536,), (4096,), "contig", "contig"),
    ("prime", (65537,), (4099,), "contig", "contig"),
    ("2^16-1", (65535,), (4095,), "contig", "contig"),
    ("2^20+3", (1048579,), (9973,), "contig", "contig"),
    ("16M", (1 << 24,), (8192,), "contig", "contig"),
    ("2^26+5, >256MB", ((1 << 26) + 5,), (10007,), "contig", "contig"),
    ("ResNet-50 stage 1", (32, 256, 56, 56), (2, 8, 14, 14), "contig", "contig"),
    ("ResNet-50 stage 1", (32, 256, 56, 56), (2, 8, 14, 14), "cl", "cl"),
    ("ResNet-50 stage 4 (7x7 planes)", (256, 2048, 7, 7), (4, 16, 7, 7), "cl", "cl"),
    ("MobileNetV3", (128, 72, 56, 56), (2, 12, 14, 14), "cl", "contig"),
    ("V-Net 61^3", (2, 16, 61, 61, 61), (1, 2, 9, 11, 13), "contig", "contig"),
    ("3-D", (2, 32, 32, 48, 48), (1, 4, 6, 7, 9), "cl", "cl"),
    ("LLaMA MLP", (4, 1024, 11008), (2, 7, 600), "contig", "contig"),
    ("attention heads (B,S,H,D)", (8, 1024, 16, 64), (2, 12, 4, 16), "perm", "perm"),
    ("2-D", (4099, 4096), (61, 67), "t", "t"),
    ("2-D", (8191, 2048), (67, 61), "contig", "t"),
    ("2-D", (8191, 2048), (67, 61), "t", "contig"),
    ("batch-broadcast", (64, 256, 32, 32), (4, 8, 9, 11), "contig", "exp0"),
    ("per-row", (16384, 1000), (100, 37), "contig", "bcast_col"),
    ("grad of a mean", (8192, 4096), (50, 80), "exp_row", "contig"),
    ("2-D", (4096, 2048), (64, 48), "s2", "s2"),
    ("2-D", (4096, 2048), (64, 48), "rows2", "rows2"),
    ("2-D", (4097, 4097), (63, 65), "off1", "off1"),
    ("2-D", (10000, 1000), (50, 70), "pitch", "pitch"),
    ("odd 2-D", (12345, 1001), (97, 101), "contig", "contig"),
    ("EfficientNet, >256MB", (32, 192, 112, 112), (2, 6, 16, 17), "cl", "cl"),
    ("2-D, >256MB", (6000, 8192), (41, 43), "t", "t"),
    ("batch-broadcast, >256MB", (512, 128, 32, 32), (6, 4, 10, 10), "contig", "exp0"),
    ("5-D", (8, 16, 24, 30, 36), (2, 3, 4, 5, 6), "perm01", "perm01"),
]


def _pw_label(note: str, shape, gl: str, xl: str, unary: bool) -> str:
    if unary:
        lay = LAYOUTS[xl]
    elif gl == xl:
        lay = LAYOUTS[gl]
    else:
        lay = f"grad {LAYOUTS[gl]}, self {LAYOUTS[xl]}"
    return f"{_dims(shape)} {lay} ({note})"


def _pointwise_cases(op: str, S: Scale) -> list[tuple[str, Callable]]:
    unary = op == "hardshrink"
    out = []
    for i, (note, full, tiny, gl, xl) in enumerate(_PW):
        shape = S(full, tiny)
        if unary:
            xl = {"contig": gl, "bcast_col": "exp_col"}.get(xl, xl)
        variant, scalars = _pw_scalars(op, i)
        label = _pw_label(note, shape, gl, xl, unary) + (f" {variant}" if variant else "")
        out.append((label, _pw_builder(op, shape, gl, xl, unary, scalars)))
    return _dedupe(out)


def _pw_scalars(op: str, i: int) -> tuple[str, tuple]:
    if op == "elu_backward":
        return [("elu", (1.0, 1.0, 1.0, False)), ("celu a=2", (2.0, 1.0, 0.5, False)),
                ("selu is_result", (1.6732632423543772, 1.0507009873554805, 1.0, True))][i % 3]
    if op in ("softshrink_backward", "hardshrink_backward", "hardshrink"):
        lam = (0.5, 0.1, 1.5)[i % 3]
        return f"lambd={lam}", (lam,)
    return "", ()


def _pw_builder(op, shape, gl, xl, unary, scalars):
    def make(c: _Ctx) -> Built:
        x = c.arrange(shape, xl, lambda s: c.randn(s, 2.0))
        if unary:
            return Built((x, *scalars), {}, distinct_bytes(x) + _numel(x.shape) * c.el)
        g = c.arrange(shape, gl)
        out = _numel(torch.broadcast_shapes(g.shape, x.shape)) * c.el
        args = (g, *scalars[:4], x) if op == "elu_backward" else (g, x, *scalars)
        return Built(args, {}, distinct_bytes(g) + distinct_bytes(x) + out)
    return make


def _dedupe(cases: list) -> list:
    seen, out = set(), []
    for label, make in cases:
        if label not in seen:
            seen.add(label)
            out.append((label, make))
    return out


def _shape_of(spec: str, shape) -> tuple:
    """An operand's shape from grad's: per dim '*' keeps it, '1' makes it 1, '-' drops it ('' is 0-d)."""
    return tuple(n if c == "*" else 1 for c, n in zip(spec, shape) if c != "-")


# ----------------------------------------------------------------------------------------------- where
# (note, full, tiny, grad layout, condition spec, self spec, other spec, condition expanded)
_WHERE = [
    ("64K", (256, 256), (64, 64), "contig", "**", "**", "**", False),
    ("prime-ish", (4099, 4096), (61, 67), "contig", "**", "**", "**", False),
    ("prime 1-D", (65537,), (4099,), "contig", "*", "*", "*", False),
    ("2^26+5 1-D, >256MB", ((1 << 26) + 5,), (10007,), "contig", "*", "*", "*", False),
    ("other per row", (4096, 4096), (64, 80), "contig", "**", "**", "*1", False),
    ("other per column", (4096, 4096), (64, 80), "contig", "**", "**", "-*", False),
    ("other 0-d (masked_fill)", (8192, 2048), (50, 70), "contig", "**", "**", "", False),
    ("self per column, other per row", (4096, 4099), (61, 67), "contig", "**", "1*", "*1", False),
    ("attention padding mask", (8, 16, 512, 512), (2, 3, 16, 17), "contig", "*11*", "****", "", False),
    ("causal mask, >256MB", (4, 16, 1024, 1024), (2, 2, 24, 24), "contig", "11**", "****", "", False),
    ("grad transposed", (4099, 4096), (61, 67), "t", "**", "**", "**", False),
    ("per-channel other, grad channels_last", (32, 64, 56, 56), (2, 4, 9, 10), "cl", "****", "****", "1*11", False),
    ("condition expanded", (4096, 4096), (64, 80), "contig", "*1", "**", "**", True),
    ("attention heads, grad in (B,H,S,D) storage", (8, 1024, 16, 64), (2, 12, 4, 16), "perm", "****", "****", "****",
     False),
    ("rows of 100", (655360, 100), (97, 100), "contig", "**", "**", "-*", False),
    ("full reduction 3-D", (256, 256, 256), (17, 19, 23), "contig", "***", "***", "111", False),
    ("self (C,1,1)", (32, 64, 56, 56), (2, 4, 9, 10), "contig", "****", "-*11", "****", False),
    ("grad stride 2", (4096, 2048), (64, 48), "s2", "**", "**", "**", False),
    ("grad storage offset 1", (4097, 4097), (63, 65), "off1", "**", "**", "**", False),
    ("same shape, >256MB", (8192, 8192), (97, 103), "contig", "**", "**", "**", False),
    ("other per row, >256MB", (16384, 4096), (100, 90), "contig", "**", "**", "*1", False),
    ("V-Net per-channel", (2, 16, 61, 61, 61), (1, 2, 9, 11, 13), "contig", "*****", "*****", "1*111", False),
    ("LLaMA MLP bias", (4, 1024, 11008), (2, 7, 600), "contig", "***", "***", "--*", False),
    ("grad expanded rows", (8192, 4096), (50, 80), "exp_row", "**", "**", "**", False),
    ("1-D prime, other 0-d", (1000003,), (9973,), "contig", "*", "*", "", False),
    ("same shape, grad channels_last", (32, 64, 56, 56), (2, 4, 9, 10), "cl", "****", "****", "****", False),
]


def _where_cases(op: str, S: Scale) -> list:
    out = []
    for note, full, tiny, gl, cs, ss, os_, cexp in _WHERE:
        shape = S(full, tiny)
        label = f"{_dims(shape)} {note}"

        def make(c: _Ctx, shape=shape, gl=gl, cs=cs, ss=ss, os_=os_, cexp=cexp) -> Built:
            g = c.arrange(shape, gl)
            cond = c.mask(_shape_of(cs, shape))
            if cexp:
                cond = cond.expand(shape)
            sshape, oshape = _shape_of(ss, shape), _shape_of(os_, shape)
            nbytes = distinct_bytes(g) + distinct_bytes(cond) + (_numel(sshape) + _numel(oshape)) * c.el
            return Built((g, cond, c.stand_in(sshape), c.stand_in(oshape)), {}, nbytes)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- lerp
# (note, full, tiny, weight: "scalar" or its spec, self spec, end spec, grad layout, weight layout, self layout)
_LERP = [
    ("64K", (256, 256), (64, 64), "scalar", "**", "**", "contig", "contig", "contig"),
    ("prime 1-D", (65537,), (4099,), "scalar", "*", "*", "contig", "contig", "contig"),
    ("2^26+5 1-D, >256MB", ((1 << 26) + 5,), (10007,), "scalar", "*", "*", "contig", "contig", "contig"),
    ("tensor weight", (4096, 4099), (61, 67), "**", "**", "**", "contig", "contig", "contig"),
    ("tensor weight 1-D", (1048579,), (9973,), "*", "*", "*", "contig", "contig", "contig"),
    ("weight per row", (4096, 4096), (64, 80), "*1", "**", "**", "contig", "contig", "contig"),
    ("weight per column", (4096, 4096), (64, 80), "-*", "**", "**", "contig", "contig", "contig"),
    ("0-d weight", (8192, 2048), (50, 70), "", "**", "**", "contig", "contig", "contig"),
    ("self broadcast (1, N)", (4096, 4096), (64, 80), "**", "1*", "**", "contig", "contig", "contig"),
    ("end broadcast (N,)", (4096, 4096), (64, 80), "**", "**", "-*", "contig", "contig", "contig"),
    ("tensor weight, all transposed", (4099, 4096), (61, 67), "**", "**", "**", "t", "t", "t"),
    ("per-channel weight, grad and self channels_last", (32, 64, 56, 56), (2, 4, 9, 10), "1*11", "****", "****", "cl",
     "contig", "cl"),
    ("attention heads, grad in (B,H,S,D) storage", (8, 1024, 16, 64), (2, 12, 4, 16), "scalar", "****", "****",
     "perm", "contig", "contig"),
    ("tensor weight and self transposed, grad contiguous", (8191, 2048), (67, 61), "**", "**", "**", "contig", "t",
     "t"),
    ("weight expanded rows", (4096, 4096), (64, 80), "**", "**", "**", "contig", "exp_row", "contig"),
    ("rows of 100, weight (100,)", (655360, 100), (97, 100), "-*", "**", "**", "contig", "contig", "contig"),
    ("tensor weight, >256MB", (5000, 4099), (61, 67), "**", "**", "**", "contig", "contig", "contig"),
    ("scalar weight, >256MB", (8192, 6000), (41, 43), "scalar", "**", "**", "contig", "contig", "contig"),
    ("V-Net per-channel weight", (2, 16, 61, 61, 61), (1, 2, 9, 11, 13), "1*111", "*****", "*****", "contig",
     "contig", "contig"),
    ("LLaMA MLP", (4, 1024, 11008), (2, 7, 600), "scalar", "***", "***", "contig", "contig", "contig"),
    ("scalar weight, grad stride 2", (4096, 2048), (64, 48), "scalar", "**", "**", "s2", "contig", "contig"),
    ("tensor weight, all at storage offset 1", (4097, 4097), (63, 65), "**", "**", "**", "off1", "off1", "off1"),
    ("self transposed, end contiguous", (8191, 2048), (67, 61), "**", "**", "**", "contig", "contig", "t"),
    ("scalar weight 1-D prime", (1000003,), (9973,), "scalar", "*", "*", "contig", "contig", "contig"),
    ("0-d weight 1-D", (1 << 24,), (8192,), "", "*", "*", "contig", "contig", "contig"),
    ("per-channel weight, grad channels_last, self contiguous", (64, 64, 56, 56), (2, 4, 9, 10), "1*11", "****",
     "****", "cl", "contig", "contig"),
]


def _lerp_cases(op: str, S: Scale) -> list:
    out = []
    for note, full, tiny, ws, ss, es, gl, wl, sl in _LERP:
        shape = S(full, tiny)
        label = f"{_dims(shape)} {note}"

        def make(c: _Ctx, shape=shape, ws=ws, ss=ss, es=es, gl=gl, wl=wl, sl=sl) -> Built:
            g = c.arrange(shape, gl)
            sshape, eshape = _shape_of(ss, shape), _shape_of(es, shape)
            if ws == "scalar":
                return Built((g, c.stand_in(sshape), c.stand_in(eshape), 0.3), {},
                             distinct_bytes(g) + (_numel(sshape) + _numel(eshape)) * c.el)
            wshape = _shape_of(ws, shape)
            w = c.arrange(wshape, wl if len(wshape) >= 2 else "contig", c.rand) if wshape else c.rand(())
            start = c.arrange(sshape, sl if len(sshape) >= 2 and sshape == shape else "contig")
            end = c.randn(eshape)
            reads = distinct_bytes(g) + distinct_bytes(w) + distinct_bytes(start) + distinct_bytes(end)
            writes = (_numel(sshape) + _numel(eshape) + _numel(wshape)) * c.el
            return Built((g, start, end, w), {}, reads + writes)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- prelu
# (note, full, tiny, one weight, grad layout, self layout)
_PRELU = [
    ("64K tokens", (256, 256), (64, 64), False, "contig", "contig"),
    ("ResNet", (32, 64, 56, 56), (2, 8, 14, 14), False, "contig", "contig"),
    ("ResNet", (32, 64, 56, 56), (2, 8, 14, 14), False, "cl", "cl"),
    ("ResNet, one weight", (32, 64, 56, 56), (2, 8, 14, 14), True, "contig", "contig"),
    ("V-Net 61^3", (2, 16, 61, 61, 61), (1, 2, 9, 11, 13), False, "contig", "contig"),
    ("V-Net", (2, 32, 32, 48, 48), (1, 4, 6, 7, 9), False, "cl", "cl"),
    ("MLP hidden (tokens, C)", (65536, 1024), (97, 64), False, "contig", "contig"),
    ("1-D conv (N, C, L)", (64, 256, 1000), (3, 8, 101), False, "contig", "contig"),
    ("3 channels", (64, 3, 224, 224), (2, 3, 30, 31), False, "contig", "contig"),
    ("C=1000, 7x7 planes", (128, 1000, 7, 7), (4, 100, 3, 3), False, "contig", "contig"),
    ("prime rows (N, C)", (65537, 640), (101, 40), False, "contig", "contig"),
    ("prime planes", (16, 64, 61, 67), (2, 3, 11, 13), False, "contig", "contig"),
    ("(N, C)", (65536, 256), (97, 40), False, "t", "t"),
    ("mixed layouts", (32, 64, 56, 56), (2, 8, 14, 14), False, "contig", "cl"),
    ("mixed layouts", (32, 64, 56, 56), (2, 8, 14, 14), False, "cl", "contig"),
    ("", (64, 64, 32, 32), (4, 8, 9, 11), False, "contig", "exp0"),
    ("1-D, one weight", (1048579,), (9973,), True, "contig", "contig"),
    (">=256MB", (64, 64, 128, 128), (2, 4, 24, 25), False, "contig", "contig"),
    (">=256MB", (64, 64, 128, 128), (2, 4, 24, 25), False, "cl", "cl"),
    ("2^26+5 1-D one weight, >256MB", ((1 << 26) + 5,), (10007,), True, "contig", "contig"),
    ("(N, C=64)", (1 << 20, 64), (150, 64), False, "contig", "contig"),
    ("", (32, 64, 56, 56), (2, 8, 14, 14), False, "off1", "off1"),
    ("", (32, 64, 56, 56), (2, 8, 14, 14), False, "s2", "s2"),
    ("channel-major (C, N, H, W) storage", (32, 64, 56, 56), (2, 8, 14, 14), False, "perm01", "perm01"),
    ("V-Net, one weight", (2, 16, 61, 61, 61), (1, 2, 9, 11, 13), True, "contig", "contig"),
    ("", (64, 128, 28, 28), (2, 8, 9, 10), False, "pitch", "pitch"),
]


def _prelu_cases(op: str, S: Scale) -> list:
    full_weight = op == "_prelu_kernel_backward"  # (its weight broadcasts to self: (1, C, 1, ...))
    out = []
    for note, full, tiny, one, gl, xl in _PRELU:
        shape = S(full, tiny)
        lay = LAYOUTS[gl] if gl == xl else f"grad {LAYOUTS[gl]}, self {LAYOUTS[xl]}"
        label = f"{_dims(shape)} {lay}" + (f" ({note})" if note else "")

        def make(c: _Ctx, shape=shape, one=one, gl=gl, xl=xl) -> Built:
            g, x = c.arrange(shape, gl), c.arrange(shape, xl)
            ch = 1 if one or len(shape) < 2 else shape[1]
            if full_weight:
                wshape = (1,) if one or len(shape) < 2 else (1, ch) + (1,) * (len(shape) - 2)
                w = c.randn(wshape, 0.25)
                return Built((g, x, w), {}, distinct_bytes(g) + distinct_bytes(x) + distinct_bytes(w)
                             + 2 * _numel(shape) * c.el)
            w = c.randn((ch,), 0.25)
            return Built((g, x, w), {}, distinct_bytes(g) + distinct_bytes(x) + (_numel(shape) + 2 * ch) * c.el)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- pads
# per padded dims: (note, full input shape, tiny input shape, padding (last dim first), grad_output's layout)
_PADS = {
    2: [
        ("CycleGAN stem", (1, 3, 256, 256), (1, 3, 20, 22), (3, 3, 3, 3), "contig"),
        ("CycleGAN res block", (4, 128, 64, 64), (1, 4, 12, 12), (1, 1, 1, 1), "contig"),
        ("res block, batch 16", (16, 256, 64, 64), (2, 4, 10, 10), (1, 1, 1, 1), "contig"),
        (">=256MB", (64, 256, 64, 64), (2, 6, 12, 12), (1, 1, 1, 1), "contig"),
        ("asymmetric", (8, 64, 97, 101), (1, 3, 11, 13), (3, 1, 0, 5), "contig"),
        ("negative", (8, 64, 97, 101), (1, 3, 11, 13), (-2, 3, 1, -1), "contig"),
        ("pad 7", (8, 64, 97, 101), (1, 3, 15, 17), (7, 7, 7, 7), "contig"),
        ("zero pads", (16, 64, 128, 128), (2, 3, 8, 8), (0, 0, 0, 0), "contig"),
        ("unbatched", (256, 100, 100), (5, 11, 13), (2, 1, 3, 2), "contig"),
        ("", (16, 64, 128, 128), (2, 4, 9, 10), (2, 2, 2, 2), "cl"),
        ("", (16, 64, 128, 128), (2, 4, 9, 10), (1, 2, 1, 2), "t"),
        ("", (16, 64, 128, 128), (2, 4, 9, 10), (2, 2, 2, 2), "perm01"),
        ("", (16, 64, 128, 128), (2, 4, 9, 10), (1, 1, 1, 1), "exp0"),
        ("", (16, 64, 128, 128), (2, 4, 9, 10), (3, 0, 2, 1), "s2"),
        ("", (16, 64, 128, 128), (2, 4, 9, 10), (1, 1, 1, 1), "off1"),
        ("7x7 planes", (1024, 64, 7, 7), (2, 4, 5, 5), (1, 1, 1, 1), "contig"),
        ("wide rows", (2, 16, 8, 16384), (1, 2, 3, 500), (7, 2, 1, 0), "contig"),
        ("tall planes", (2, 16, 16384, 8), (1, 2, 300, 6), (0, 3, 5, 1), "contig"),
        ("prime planes", (32, 64, 127, 131), (1, 3, 13, 17), (5, 6, 7, 4), "contig"),
        ("1-row planes", (64, 64, 1, 1000), (4, 4, 1, 300), (4, 4, 0, 0), "contig"),
        ("mixed negative", (16, 64, 128, 128), (2, 3, 12, 13), (-7, 7, -3, 2), "contig"),
        ("asymmetric, >=256MB", (64, 64, 128, 129), (2, 4, 11, 12), (1, 2, 3, 0), "contig"),
        (">=256MB", (64, 256, 64, 64), (2, 6, 12, 12), (1, 1, 1, 1), "cl"),
        ("3-channel image", (8, 3, 512, 512), (1, 3, 30, 31), (3, 3, 3, 3), "contig"),
        ("many small planes", (128, 32, 32, 32), (2, 4, 6, 6), (2, 2, 2, 2), "contig"),
        ("", (32, 32, 250, 250), (1, 2, 17, 19), (4, 4, 4, 4), "pitch"),
    ],
    1: [
        ("audio", (16, 64, 16000), (2, 4, 500), (2, 2), "contig"),
        ("text conv", (64, 512, 1000), (3, 8, 101), (1, 1), "contig"),
        ("short rows", (4096, 64, 9), (8, 8, 9), (3, 3), "contig"),
        ("causal (k-1, 0)", (16, 256, 4096), (2, 5, 200), (6, 0), "contig"),
        ("right only", (8, 64, 16384), (2, 3, 301), (0, 7), "contig"),
        ("negative", (8, 64, 16384), (2, 3, 301), (-3, 5), "contig"),
        ("both negative", (8, 64, 16384), (2, 3, 301), (-7, -2), "contig"),
        ("zero pads", (8, 64, 16384), (2, 3, 301), (0, 0), "contig"),
        ("unbatched", (512, 30000), (7, 1000), (5, 3), "contig"),
        ("(N, L, C) storage", (16, 256, 4096), (2, 5, 200), (2, 2), "t"),
        ("", (16, 256, 4096), (2, 5, 200), (2, 2), "perm01"),
        ("", (16, 256, 4096), (2, 5, 200), (2, 2), "exp0"),
        ("", (16, 256, 4096), (2, 5, 200), (3, 1), "s2"),
        ("", (16, 256, 4096), (2, 5, 200), (2, 2), "off1"),
        ("C=1", (65536, 1, 64), (30, 1, 20), (4, 4), "contig"),
        ("W=1", (655, 100, 1), (4, 5, 1), (3, 2), "contig"),
        ("prime W", (4, 64, 1000003), (1, 2, 4999), (3, 5), "contig"),
        (">=256MB", (64, 256, 4096), (3, 8, 333), (2, 2), "contig"),
        ("asymmetric, >=256MB", (128, 128, 4099), (2, 4, 601), (7, 1), "contig"),
        ("(N, L, C) storage, >=256MB", (64, 256, 4096), (3, 8, 333), (2, 2), "t"),
        ("64K", (2, 16, 2048), (2, 4, 64), (2, 2), "contig"),
        ("rows of 100, pad 7", (32, 32, 100), (4, 8, 100), (7, 7), "contig"),
        ("16-wide rows", (1024, 1024, 16), (8, 8, 16), (1, 1), "contig"),
        ("", (256, 512, 128), (8, 8, 60), (4, 1), "pitch"),
        ("unbatched long rows", (3, 1 << 20), (2, 5000), (1, 2), "contig"),
    ],
    3: [
        ("V-Net", (2, 16, 64, 64, 64), (1, 2, 5, 6, 7), (2, 2, 2, 2, 2, 2), "contig"),
        ("V-Net 128^3", (1, 8, 128, 128, 128), (1, 1, 8, 9, 10), (1, 1, 1, 1, 1, 1), "contig"),
        ("video, H and W only", (4, 64, 16, 112, 112), (1, 2, 4, 10, 11), (1, 1, 1, 1, 0, 0), "contig"),
        ("video, time only", (4, 64, 16, 112, 112), (1, 2, 4, 10, 11), (0, 0, 0, 0, 1, 1), "contig"),
        (">=256MB", (16, 32, 32, 64, 64), (1, 2, 6, 7, 8), (2, 2, 2, 2, 2, 2), "contig"),
        ("1 GB", (16, 64, 16, 128, 128), (1, 2, 4, 9, 10), (1, 1, 1, 1, 1, 1), "contig"),
        ("asymmetric", (2, 16, 33, 45, 57), (1, 2, 5, 7, 9), (2, 1, 0, 3, 1, 2), "contig"),
        ("negative", (2, 16, 33, 45, 57), (1, 2, 5, 7, 9), (1, -2, 0, 3, -1, 2), "contig"),
        ("64K, pad 7", (2, 4, 8, 32, 32), (1, 1, 9, 10, 11), (7, 7, 7, 7, 7, 7), "contig"),
        ("zero pads", (2, 16, 32, 64, 64), (1, 2, 4, 5, 6), (0, 0, 0, 0, 0, 0), "contig"),
        ("unbatched", (16, 48, 48, 48), (2, 5, 6, 7), (1, 2, 0, 1, 2, 1), "contig"),
        ("", (4, 32, 32, 48, 48), (1, 2, 4, 6, 7), (1, 1, 1, 1, 1, 1), "cl"),
        ("", (4, 32, 32, 48, 48), (1, 2, 4, 6, 7), (1, 2, 2, 1, 1, 1), "t"),
        ("", (4, 32, 32, 48, 48), (1, 2, 4, 6, 7), (1, 1, 1, 1, 1, 1), "perm01"),
        ("", (4, 32, 32, 48, 48), (2, 2, 4, 6, 7), (1, 1, 1, 1, 1, 1), "exp0"),
        ("", (4, 32, 32, 48, 48), (1, 2, 4, 6, 7), (2, 1, 1, 1, 1, 1), "s2"),
        ("", (4, 32, 32, 48, 48), (1, 2, 4, 6, 7), (1, 1, 1, 1, 1, 1), "off1"),
        ("power-of-two planes", (4, 32, 16, 32, 32), (1, 2, 3, 8, 8), (1, 1, 1, 1, 1, 1), "contig"),
        ("4x1024 planes", (2, 16, 16, 4, 1024), (1, 2, 3, 2, 64), (2, 2, 1, 1, 1, 1), "contig"),
        ("prime planes", (2, 16, 17, 61, 67), (1, 2, 3, 7, 11), (3, 2, 1, 4, 2, 0), "contig"),
        ("D=1", (8, 32, 1, 256, 256), (1, 2, 1, 12, 13), (1, 1, 1, 1, 0, 0), "contig"),
        (">=256MB", (16, 32, 32, 64, 64), (1, 2, 6, 7, 8), (2, 2, 2, 2, 2, 2), "cl"),
        ("mixed negative", (2, 16, 33, 45, 57), (1, 2, 6, 7, 9), (-3, 3, 2, -2, -1, 1), "contig"),
        ("many 8^3 volumes", (512, 16, 8, 8, 8), (2, 2, 4, 4, 4), (1, 1, 1, 1, 1, 1), "contig"),
        ("", (2, 16, 40, 60, 90), (1, 2, 4, 6, 7), (2, 2, 2, 2, 2, 2), "pitch"),
    ],
}


def _pad_cases(op: str, S: Scale) -> list:
    from ..kernels.pad import padded_shape

    dims = int(op.split("_pad")[1][0])
    reflect = op.startswith("reflection")
    out = []
    for note, full, tiny, pads, gl in _PADS[dims]:
        shape = S(full, tiny)
        if reflect:  # a reflected pad must be shorter than its dim
            pads = tuple(min(p, shape[-1 - k // 2] - 1) for k, p in enumerate(pads))
        gshape = padded_shape(shape, pads)
        lay = "" if gl == "contig" else f" grad {LAYOUTS[gl]}"
        label = f"{_dims(shape)} pad {tuple(pads)}{lay}" + (f" ({note})" if note else "")

        def make(c: _Ctx, shape=shape, pads=pads, gl=gl, gshape=gshape) -> Built:
            g = c.arrange(gshape, gl)
            return Built((g, c.stand_in(shape), list(pads)), {}, distinct_bytes(g) + _numel(shape) * c.el)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- repeat
# (note, full (input shape, repeats), tiny (input shape, repeats), grad layout)
_REPEAT = [
    ("DETR pos.repeat(B, 1, 1)", ((1, 100, 256), (64, 1, 1)), ((1, 10, 16), (8, 1, 1)), "contig"),
    ("", ((1024, 1024), (4, 4)), ((24, 20), (4, 4)), "contig"),
    ("", ((4096, 256), (2, 8)), ((32, 8), (2, 8)), "contig"),
    ("", ((4096, 256), (64, 1)), ((16, 8), (64, 1)), "contig"),
    ("tiny input, many tiles", ((64, 64), (256, 256)), ((4, 4), (16, 16)), "contig"),
    ("new leading dims", ((70001,), (16, 1, 2)), ((7,), (3, 1, 2)), "contig"),
    ("no tiling (a copy)", ((4096, 4096), (1, 1)), ((50, 60), (1, 1)), "contig"),
    ("prime", ((97, 101), (3, 7)), ((13, 17), (3, 7)), "contig"),
    ("1-D", ((1000,), (1000,)), ((100,), (37,)), "contig"),
    ("sum over batch and planes", ((64, 1, 1), (32, 1, 56, 56)), ((4, 1, 1), (2, 1, 5, 6)), "contig"),
    ("rank 5", ((8, 16, 20, 24, 30), (2, 1, 3, 1, 2)), ((2, 3, 4, 5, 6), (2, 1, 3, 1, 2)), "contig"),
    ("", ((2048, 2048), (2, 2)), ((30, 40), (2, 2)), "t"),
    ("", ((64, 64, 56, 56), (2, 1, 1, 1)), ((2, 4, 9, 10), (2, 1, 1, 1)), "cl"),
    ("", ((1024, 1024), (4, 4)), ((24, 20), (4, 4)), "exp0"),
    ("", ((2048, 1024), (2, 2)), ((30, 40), (2, 2)), "s2"),
    ("rank 8", ((4, 6, 4, 6, 4, 6, 4, 6), (2, 1, 2, 1, 2, 1, 2, 1)),
     ((2, 2, 2, 2, 2, 2, 2, 2), (2, 1, 2, 1, 2, 1, 2, 1)), "contig"),
    (">=256MB", ((8192, 1024), (16, 1)), ((40, 16), (16, 1)), "contig"),
    (">=256MB", ((16384, 512), (1, 16)), ((40, 16), (1, 16)), "contig"),
    ("rows of 100", ((65536, 100), (1, 3)), ((64, 100), (1, 3)), "contig"),
    ("prime tiles", ((50, 70, 110), (13, 3, 2)), ((5, 7, 11), (13, 3, 2)), "contig"),
    ("", ((4096, 1024), (2, 2)), ((30, 40), (2, 2)), "off1"),
    ("65536 tiles", ((4, 8), (65536, 1)), ((4, 8), (300, 1)), "contig"),
    ("2x2 tiles (upsampling-like)", ((32, 128, 128), (1, 2, 2)), ((4, 10, 12), (1, 2, 2)), "contig"),
    ("new leading dim", ((512, 512), (64, 1, 1)), ((20, 30), (8, 1, 1)), "contig"),
    ("one element tiled", ((1, 1), (8192, 8192)), ((1, 1), (90, 100)), "contig"),
    ("", ((64, 32, 32, 64), (1, 2, 1, 1)), ((2, 6, 5, 8), (1, 2, 1, 1)), "perm01"),
]


def _repeat_cases(op: str, S: Scale) -> list:
    out = []
    for note, full, tiny, gl in _REPEAT:
        shape, reps = S(full, tiny)
        padded = (1,) * (len(reps) - len(shape)) + tuple(shape)
        gshape = tuple(r * s for r, s in zip(reps, padded))
        lay = "" if gl == "contig" else f" grad {LAYOUTS[gl]}"
        label = f"{_dims(shape)} rep {tuple(reps)}{lay}" + (f" ({note})" if note else "")

        def make(c: _Ctx, shape=shape, reps=reps, gshape=gshape, gl=gl) -> Built:
            g = c.arrange(gshape, gl)
            return Built((g, list(reps), list(shape)), {}, distinct_bytes(g) + _numel(shape) * c.el)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- sparsemax
# (note, full shape, tiny shape, dim, layout, value scale: N(0, scale^2) inputs; 1e-7 gives a whole-row support)
_SPARSEMAX = [
    ("rows of 100", (655, 100), (40, 100), -1, "contig", 2.0),
    ("", (32768, 1024), (9, 1024), -1, "contig", 2.0),
    ("ViT-B attention (197 tokens)", (768, 197, 197), (4, 41, 41), -1, "contig", 2.0),
    ("LM vocabulary 32000", (64, 32000), (2, 3001), -1, "contig", 2.0),
    ("GPT-2 vocabulary 50257", (128, 50257), (1, 5003), -1, "contig", 2.0),
    ("rows of 1M", (64, 1 << 20), (1, 9973), -1, "contig", 2.0),
    ("prime rows", (16, 1000003), (2, 4999), -1, "contig", 2.0),
    ("", (1024, 32768), (100, 97), 0, "contig", 2.0),
    ("middle dim", (64, 1000, 256), (4, 100, 23), 1, "contig", 2.0),
    ("middle dim of 4", (32, 197, 12, 64), (2, 37, 3, 16), 1, "contig", 2.0),
    ("", (4096, 1024), (30, 64), -1, "t", 2.0),
    ("scores (B,S,H,S) storage", (8, 16, 512, 512), (2, 3, 24, 24), -1, "perm", 2.0),
    ("21 classes", (16, 21, 256, 256), (2, 21, 12, 13), 1, "cl", 2.0),
    ("21 classes", (16, 21, 256, 256), (2, 21, 12, 13), 1, "contig", 2.0),
    ("rows of 3", (1 << 22, 3), (3000, 3), -1, "contig", 2.0),
    ("rows of 40", (1 << 20, 40), (200, 40), -1, "contig", 2.0),
    ("rows of 16385 (split rows)", (1024, 16385), (1, 9001), -1, "contig", 2.0),
    ("rows of 100000", (8, 100000), (1, 7001), -1, "contig", 2.0),
    ("wide support", (32768, 1024), (9, 1024), -1, "contig", 0.05),
    ("whole-row support", (32768, 1024), (9, 1024), -1, "contig", 1e-7),
    ("identical rows", (4096, 1024), (16, 200), -1, "exp0", 2.0),
    ("", (4096, 1024), (20, 100), -1, "s2", 2.0),
    ("", (4099, 1000), (13, 500), -1, "off1", 2.0),
    ("dim 0 of 3", (1000, 64, 64), (50, 8, 9), 0, "contig", 2.0),
    (">=256MB", (65536, 2048), (4, 2048), -1, "contig", 2.0),
    ("10007 rows of 1000", (10007, 1000), (9, 1000), -1, "contig", 2.0),
    ("long strided rows", (2, 1 << 20, 4), (2, 1500, 3), 1, "contig", 2.0),
    ("", (16, 1 << 20), (2, 3000), -1, "pitch", 2.0),
]


def _sparsemax_label(note, shape, dim, layout) -> str:
    lay = "" if layout == "contig" else f" {LAYOUTS[layout]}"
    return f"{_dims(shape)} dim={dim}{lay}" + (f" ({note})" if note else "")


def _sparsemax_forward_cases(op: str, S: Scale) -> list:
    out = []
    for note, full, tiny, dim, lay, scale in _SPARSEMAX:
        shape = S(full, tiny)

        def make(c: _Ctx, shape=shape, dim=dim, lay=lay, scale=scale) -> Built:
            x = c.arrange(shape, lay, lambda s: c.randn(s, scale))
            return Built((x, dim), {}, distinct_bytes(x) + _numel(shape) * c.el)
        out.append((_sparsemax_label(note, shape, dim, lay), make))
    return out


def _sparsemax_backward_cases(op: str, S: Scale) -> list:
    out = []
    extra = [("whole-row support, rows of 100", (655, 100), (40, 100), -1, "contig", 1e-7),
             ("grad contiguous", (4096, 1024), (30, 64), -1, "t", 2.0)]
    for i, (note, full, tiny, dim, lay, scale) in enumerate(_SPARSEMAX + extra):
        shape = S(full, tiny)
        grad_contig = i == len(_SPARSEMAX) + 1

        def make(c: _Ctx, shape=shape, dim=dim, lay=lay, scale=scale, grad_contig=grad_contig) -> Built:
            from .. import ops

            x = c.arrange(shape, lay, lambda s: c.randn(s, scale))
            with torch.no_grad():
                y = ops.sparsemax_forward(x, dim)
            del x
            g = c.randn(shape) if grad_contig else c.arrange(shape, lay if lay not in ("exp0",) else "contig")
            support = int((y > 0).sum())
            return Built((g, y, dim), {}, (distinct_bytes(y) + _numel(shape) * c.el) + support * c.el,
                         extra={"support": support, "support_per_row": support / max(1, _numel(shape)
                                                                                       // shape[dim])})
        out.append((_sparsemax_label(note, shape, dim, lay), make))
    return out


# ----------------------------------------------------------------------------------------------- segments
_WIDTHS = (1, 3, 40, 64, 100, 256)
_DISTS = ("empty", "unit", "uniform", "power-law")
_SEG_FULL = (1 << 16, 1 << 22, 1 << 24, 1 << 26)  # elements of data (cycled over the width x lengths matrix)
_SEG_TINY = (2048, 4096, 6000, 8000)


def segment_lengths(dist: str, n: int, gen: torch.Generator | None = None, device="cpu") -> torch.Tensor:
    """Segment lengths (int64, on `device`, drawn with `gen`) summing to n: "empty" (about half the segments empty,
    the others 1-64 rows; two empty ones first and last too), "unit" (every segment one row), "uniform" (1-63 rows),
    "power-law" (a Pareto tail, P(len >= k) = k^-1.2: a few segments hold most rows), "degree" (1-31 rows, a graph's
    in-degrees), "fixed16" (16 rows, the last one shorter), "one" (a single segment of n rows)."""
    i64 = {"dtype": torch.int64, "device": torch.device(device)}
    if dist == "unit":
        return torch.ones(n, **i64)
    if dist == "one":
        return torch.full((1,), n, **i64)
    if dist == "fixed16":
        q, r = divmod(n, 16)
        lens = torch.full((q,), 16, **i64)
        return torch.cat([lens, torch.full((1,), r, **i64)]) if r else lens
    if n == 0:
        return torch.zeros(1, **i64)
    kw = {"generator": gen, "device": i64["device"]}
    if dist == "uniform":
        draw = torch.randint(1, 64, (n,), **kw)
    elif dist == "degree":
        draw = torch.randint(1, 32, (n,), **kw)
    elif dist == "empty":
        draw = torch.randint(1, 65, (n,), **kw) * (torch.rand(n, **kw) < 0.5)
    elif dist == "power-law":
        draw = torch.rand(n, **kw).clamp_min(1e-12).pow(-1 / 1.2).floor().clamp(1, n).to(torch.int64)
    else:
        raise ValueError(f"unknown segment lengths {dist!r}")
    cum = draw.cumsum(0)
    total = int(cum[-1])
    if total < n:  # (the draws fell short: one more segment)
        lens = torch.cat([draw, torch.full((1,), n - total, **i64)])
    else:
        k = int(torch.searchsorted(cum, torch.full((1,), n, **i64)).item())  # the draw that reaches n
        lens = draw[:k + 1].clone()
        lens[k] = n - (int(cum[k - 1]) if k else 0)  # cut to fit
    if dist == "empty":
        lens = torch.cat([torch.zeros(2, **i64), lens, torch.zeros(2, **i64)])
    return lens


_DIST_TEXT = {"empty": "empty-heavy", "unit": "unit", "uniform": "uniform 1-63", "power-law": "power-law",
              "degree": "degree 1-31", "fixed16": "fixed 16", "one": "one segment"}


# extra segment cases: (note, full (N, D), tiny (N, D), lengths, data layout, outer B for axis 1, int32 offsets)
_SEG_EXTRA = [
    ("GNN, 262144 nodes", (1 << 22, 64), (200, 16), "degree", "contig", 0, False),
    ("", (1 << 20, 64), (100, 24), "uniform", "t", 0, False),
    ("axis 1, 8 outer slices", (1 << 19, 64), (50, 16), "uniform", "contig", 8, False),
    ("int32 offsets", (1 << 20, 40), (120, 40), "uniform", "contig", 0, False),
    ("", (1 << 20, 64), (300, 16), "one", "contig", 0, False),
    ("", (1 << 16, 1000), (8, 1000), "uniform", "contig", 0, False),
    (">=256MB", (1 << 19, 256), (30, 256), "fixed16", "contig", 0, False),
]


def _seg_specs(S: Scale) -> list[tuple]:
    """(label, N, D, lengths, layout, outer, int32)."""
    specs = []
    for k in range(len(_WIDTHS) * len(_DISTS)):  # every (width, lengths) pair, both varying from one to the next
        i, j = k % len(_WIDTHS), (k + k // len(_WIDTHS)) % len(_DISTS)
        d, dist = _WIDTHS[i], _DISTS[j]
        elems = S(_SEG_FULL, _SEG_TINY)[(i + j) % 4]
        n = max(1, elems // d) if S.full else max(1, min(elems // d, 300))  # (interpreter: few segments)
        specs.append((f"N={n} D={d} lengths {_DIST_TEXT[dist]}", n, d, dist, "contig", 0, False))
    for note, full, tiny, dist, lay, outer, i32 in _SEG_EXTRA:
        n, d = S(full, tiny)
        lay_s = "" if lay == "contig" else f", data {LAYOUTS[lay]}"
        label = f"N={n} D={d} lengths {_DIST_TEXT[dist]}{lay_s}" + (f" ({note})" if note else "")
        specs.append((label, n, d, dist, lay, outer, i32))
    return specs


def _seg_data(c: _Ctx, n: int, d: int, lay: str, outer: int, ties: bool = False) -> torch.Tensor:
    shape = (outer, n, d) if outer else (n, d)
    make = (lambda s: (c.randn(s, 2.0, torch.float32).round_() / 2).to(c.dtype)) if ties else None
    return c.arrange(shape, lay if not outer else "contig", make)


def _seg_lengths(c: _Ctx, dist: str, n: int) -> torch.Tensor:
    return segment_lengths(dist, n, c.gen, c.device)


def _offsets(lens: torch.Tensor, dtype=torch.int64) -> torch.Tensor:
    return torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(dtype)


def _seg_problem(c: _Ctx, n: int, d: int, dist: str, lay: str, outer: int, i32: bool):
    """(data, offsets) of a segment_max case: offsets int32 or int64."""
    return _seg_data(c, n, d, lay, outer), _offsets(_seg_lengths(c, dist, n), torch.int32 if i32 else torch.int64)


def _segment_max_forward_cases(op: str, S: Scale) -> list:
    from ..kernels.segment_max import _bench_segment_reduce_max

    out = []
    for label, n, d, dist, lay, outer, i32 in _seg_specs(S):
        def make(c: _Ctx, n=n, d=d, dist=dist, lay=lay, outer=outer, i32=i32) -> Built:
            data, offs = _seg_problem(c, n, d, dist, lay, outer, i32)
            s = offs.numel() - 1
            nbytes = distinct_bytes(data) + s * d * max(1, outer) * (c.el + 8) + distinct_bytes(offs)
            stock = None
            if outer:  # stock segment_reduce wants one row of offsets per outer slice
                stock = (_bench_segment_reduce_max, (data, offs.expand(outer, s + 1).contiguous(), 1), {})
            return Built((data, offs, 1 if outer else 0), {}, nbytes, stock=stock, extra={"segments": s})
        out.append((label, make))
    return out


def _segment_max_backward_cases(op: str, S: Scale) -> list:
    out = []
    for label, n, d, dist, lay, outer, i32 in _seg_specs(S):
        def make(c: _Ctx, n=n, d=d, dist=dist, lay=lay, outer=outer, i32=i32) -> Built:
            from .. import ops

            data, offs = _seg_problem(c, n, d, dist, lay, outer, i32)
            axis = 1 if outer else 0
            with torch.no_grad():
                _vals, idx = ops.segment_max_forward(data, offs, axis)
            del data, _vals
            g = c.randn(idx.shape)
            nbytes = distinct_bytes(g) + distinct_bytes(idx) + n * d * max(1, outer) * c.el
            return Built((g, idx, offs, n, axis), {}, nbytes, extra={"segments": offs.numel() - 1})
        out.append((label, make))
    return out


def _segment_reduce_backward_cases(op: str, S: Scale) -> list:
    specs = _seg_specs(S)
    n, d = S((1 << 20, 64), (200, 16))
    specs += [(f"N={n} D={d} lengths uniform 1-63 (ties)", n, d, "uniform", "contig", 0, "ties"),
              (f"N={n} D={d} lengths uniform 1-63 (offsets=)", n, d, "uniform", "contig", 0, "offsets")]
    out = []
    for label, n, d, dist, lay, outer, mode in specs:
        def make(c: _Ctx, n=n, d=d, dist=dist, lay=lay, outer=outer, mode=mode) -> Built:
            data = _seg_data(c, n, d, lay, outer, ties=mode == "ties")
            if outer:  # each outer slice its own lengths (each summing to n), padded with empty segments to one S
                rows = [_seg_lengths(c, dist, n) for _ in range(outer)]
                s = max(r.numel() for r in rows)
                lens = torch.stack([torch.cat([r, r.new_zeros(s - r.numel())]) for r in rows])
            else:
                lens = _seg_lengths(c, dist, n)
            axis = lens.dim() - 1
            with use(False):
                output = torch.segment_reduce(data, "max", lengths=lens, axis=axis, unsafe=True)
            g = c.randn(output.shape)
            if mode == "offsets":
                seg = _offsets(lens)
                kwargs = {"offsets": seg, "axis": axis}
            else:
                seg = lens.to(torch.int32) if mode is True else lens
                kwargs = {"lengths": seg, "axis": axis}
            nbytes = (distinct_bytes(g) + distinct_bytes(output) + distinct_bytes(data) + distinct_bytes(seg)
                      + _numel(data.shape) * c.el)
            return Built((g, output, data, "max"), kwargs, nbytes, extra={"segments": output.shape[axis]})
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- adaptive pool
# per pooled dims: (note, full self shape, tiny self shape, output size (full, tiny), grad layout, self channels_last)
_POOL = {
    2: [
        ("ResNet global pool", (128, 2048, 7, 7), (2, 4, 7, 7), ((1, 1), (1, 1)), "contig", False),
        ("SE block", (256, 1024, 14, 14), (1, 4, 14, 14), ((1, 1), (1, 1)), "contig", False),
        ("AlexNet 13 -> 6", (128, 256, 13, 13), (2, 3, 13, 13), ((6, 6), (6, 6)), "contig", False),
        ("64 -> 7", (32, 512, 64, 64), (1, 2, 36, 36), ((7, 7), (7, 7)), "contig", False),
        ("upsampling-like", (16, 64, 20, 30), (1, 3, 10, 14), ((45, 61), (23, 29)), "contig", False),
        ("self channels_last", (128, 256, 56, 56), (2, 3, 21, 22), ((7, 7), (7, 7)), "cl", True),
        ("unbatched", (512, 100, 100), (3, 40, 41), ((3, 3), (3, 3)), "contig", False),
        ("prime planes", (32, 64, 97, 101), (1, 3, 29, 31), ((5, 7), (5, 7)), "contig", False),
        ("global along H", (64, 64, 128, 128), (2, 3, 24, 25), ((1, 128), (1, 25)), "contig", False),
        ("identity (a copy)", (32, 64, 56, 56), (2, 4, 13, 14), ((56, 56), (13, 14)), "contig", False),
        ("1 x 7", (64, 256, 30, 40), (2, 4, 15, 20), ((1, 7), (1, 7)), "contig", False),
        ("PSPNet bins 6", (16, 512, 60, 60), (1, 4, 30, 30), ((6, 6), (6, 6)), "contig", False),
        ("PSPNet bins 3", (16, 512, 60, 60), (1, 4, 30, 30), ((3, 3), (3, 3)), "contig", False),
        ("", (32, 512, 64, 64), (1, 3, 30, 31), ((7, 7), (7, 7)), "t", False),
        ("", (32, 512, 64, 64), (2, 3, 30, 31), ((7, 7), (7, 7)), "exp0", False),
        ("", (32, 512, 64, 64), (1, 3, 30, 31), ((7, 7), (7, 7)), "s2", False),
        ("", (32, 512, 64, 64), (1, 3, 30, 31), ((7, 7), (7, 7)), "off1", False),
        ("", (32, 512, 64, 64), (2, 3, 30, 31), ((7, 7), (7, 7)), "perm01", False),
        (">=256MB", (256, 256, 56, 56), (2, 4, 40, 41), ((7, 7), (7, 7)), "contig", False),
        (">=256MB, self channels_last", (256, 256, 56, 56), (2, 4, 40, 41), ((7, 7), (7, 7)), "cl", True),
        ("64K, 1-row planes", (1, 64, 1, 1024), (2, 3, 1, 300), ((1, 10), (1, 10)), "contig", False),
        ("channels_last, uneven", (64, 96, 30, 41), (1, 4, 30, 41), ((6, 45), (6, 45)), "cl", True),
        ("many 3x3 planes", (1024, 64, 3, 3), (2, 5, 3, 3), ((2, 2), (2, 2)), "contig", False),
        ("1x1 planes to 7x7", (64, 512, 1, 1), (1, 4, 1, 1), ((7, 7), (7, 7)), "contig", False),
        ("big windows", (2, 64, 512, 512), (1, 1, 96, 96), ((32, 32), (6, 6)), "contig", False),
        ("DETR backbone", (8, 2048, 25, 34), (2, 3, 25, 34), ((1, 1), (1, 1)), "pitch", False),
    ],
    3: [
        ("video global pool", (8, 512, 4, 7, 7), (1, 3, 4, 7, 7), ((1, 1, 1), (1, 1, 1)), "contig", False),
        ("", (8, 64, 32, 64, 64), (1, 2, 8, 16, 16), ((4, 7, 7), (3, 5, 6)), "contig", False),
        ("", (4, 128, 16, 96, 96), (1, 2, 4, 24, 24), ((2, 5, 5), (2, 5, 5)), "contig", False),
        ("upsampling-like", (8, 16, 5, 6, 7), (1, 2, 5, 6, 7), ((9, 11, 13), (9, 11, 13)), "contig", False),
        ("unbatched", (16, 20, 30, 40), (2, 10, 15, 20), ((3, 4, 5), (3, 4, 5)), "contig", False),
        ("prime", (4, 32, 17, 31, 37), (1, 2, 5, 11, 13), ((3, 5, 7), (3, 5, 7)), "contig", False),
        ("identity (a copy)", (2, 32, 16, 32, 32), (1, 2, 5, 7, 9), ((16, 32, 32), (5, 7, 9)), "contig", False),
        ("time only", (4, 64, 16, 56, 56), (1, 2, 8, 9, 10), ((1, 56, 56), (1, 9, 10)), "contig", False),
        ("space only", (4, 64, 16, 56, 56), (1, 2, 8, 9, 10), ((16, 1, 1), (8, 1, 1)), "contig", False),
        ("", (8, 64, 32, 64, 64), (1, 2, 8, 16, 16), ((4, 7, 7), (3, 5, 6)), "t", False),
        ("", (8, 64, 32, 64, 64), (2, 2, 8, 16, 16), ((4, 7, 7), (3, 5, 6)), "exp0", False),
        ("", (8, 64, 32, 64, 64), (1, 2, 8, 16, 16), ((4, 7, 7), (3, 5, 6)), "s2", False),
        ("", (8, 64, 32, 64, 64), (1, 2, 8, 16, 16), ((4, 7, 7), (3, 5, 6)), "off1", False),
        ("", (8, 64, 32, 64, 64), (2, 2, 8, 16, 16), ((4, 7, 7), (3, 5, 6)), "perm01", False),
        ("", (8, 64, 32, 64, 64), (1, 2, 8, 16, 16), ((4, 7, 7), (3, 5, 6)), "cl", False),
        (">=256MB", (16, 64, 32, 64, 64), (1, 2, 10, 20, 24), ((4, 7, 7), (4, 7, 7)), "contig", False),
        ("many 4^3 volumes", (512, 32, 4, 4, 4), (2, 2, 4, 4, 4), ((2, 2, 2), (2, 2, 2)), "contig", False),
        ("D=1", (8, 64, 1, 128, 128), (1, 2, 1, 40, 41), ((1, 7, 7), (1, 7, 7)), "contig", False),
        ("64K, V-Net bottleneck", (1, 128, 8, 8, 8), (1, 2, 8, 8, 8), ((1, 1, 1), (1, 1, 1)), "contig", False),
        ("uneven", (4, 64, 10, 30, 30), (1, 2, 5, 15, 15), ((3, 7, 7), (3, 7, 7)), "contig", False),
        ("partly upsampling", (4, 16, 8, 10, 12), (1, 2, 4, 10, 12), ((8, 20, 6), (8, 20, 6)), "contig", False),
        ("", (8, 256, 8, 14, 14), (1, 2, 4, 14, 14), ((2, 3, 3), (2, 3, 3)), "contig", False),
        ("1 GB", (16, 64, 16, 128, 128), (1, 2, 8, 20, 24), ((2, 5, 5), (2, 5, 5)), "contig", False),
        ("64^3 -> 16^3", (1, 8, 64, 64, 64), (1, 1, 16, 20, 24), ((16, 16, 16), (4, 5, 6)), "contig", False),
        ("", (8, 64, 32, 64, 64), (1, 2, 8, 16, 16), ((4, 7, 7), (3, 5, 6)), "pitch", False),
    ],
}


def _adaptive_problems(op: str, S: Scale):
    """(label, dims, self shape, output size, grad_output layout, self channels_last) of the adaptive pools'
    problems (`_POOL`), average and max alike."""
    dims = 3 if "3d" in op else 2
    for note, full, tiny, osizes, gl, cl in _POOL[dims]:
        shape, osize = S(full, tiny), S(*osizes)
        lay = f" grad {LAYOUTS[gl]}" if gl != "contig" else ""
        yield f"{_dims(shape)} -> {_dims(osize)}{lay}" + (f" ({note})" if note else ""), dims, shape, osize, gl, cl


def _adaptive_pool_cases(op: str, S: Scale) -> list:
    out = []
    for label, dims, shape, osize, gl, cl in _adaptive_problems(op, S):
        gshape = tuple(shape[:len(shape) - dims]) + tuple(osize)

        def make(c: _Ctx, shape=shape, gshape=gshape, gl=gl, cl=cl) -> Built:
            g = c.arrange(gshape, gl)
            # self lends its shape, dtype and (2d) layout only: a broadcast zero, or a channels_last tensor
            x = torch.empty(shape, device=c.device, dtype=c.dtype, memory_format=torch.channels_last).zero_() \
                if cl else c.stand_in(shape)
            return Built((g, x), {}, distinct_bytes(g) + _numel(shape) * c.el)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- upsampling
def _tiny_sizes(sizes: Sequence[int], cap: int = 24) -> tuple[int, ...]:
    """Spatial sizes shrunk for the interpreter, ratios kept: all divided by one factor so that the largest is at
    most `cap` (a size of 1 stays 1)."""
    k = max(1, -(-max(sizes) // cap))
    return tuple(max(1, round(s / k)) if s > 1 else 1 for s in sizes)


def _shrink(full: tuple, lead: int) -> tuple:
    """A full input shape's tiny version: batch and channels at most 2 and 3, spatial sizes by `_tiny_sizes`."""
    return (min(full[0], 2),) + ((min(full[1], 3),) if lead == 2 else ()) + _tiny_sizes(full[lead:])


# per spatial dims: (note, full input shape, output sizes or scale factors, align_corners, grad layout); a float
# entry is a scale factor given to the op (output = floor(input * scale), as F.interpolate computes it)
_UPSAMPLE = {
    1: [
        ("x2", (32, 64, 1024), (2048,), False, "contig"),
        ("x2 align_corners", (64, 256, 500), (1000,), True, "contig"),
        ("downsample 1/4.1", (32, 64, 4096), (1000,), False, "contig"),
        ("x1.7", (64, 128, 577), (981,), False, "contig"),
        ("prime", (16, 32, 997), (1499,), True, "contig"),
        ("scale 2.5 given", (32, 64, 800), (2.5,), False, "contig"),
        ("scale 0.3 given", (32, 64, 4000), (0.3,), False, "contig"),
        ("identity", (64, 64, 1024), (1024,), False, "contig"),
        ("1 -> 100", (256, 256, 1), (100,), False, "contig"),
        ("1 -> 100 align_corners", (256, 256, 1), (100,), True, "contig"),
        ("2 -> 9", (512, 128, 2), (9,), False, "contig"),
        ("audio x4", (8, 32, 16000), (64000,), False, "contig"),
        ("", (32, 64, 1024), (2048,), False, "t"),
        ("", (32, 64, 1024), (2048,), False, "s2"),
        ("", (32, 64, 1024), (2048,), False, "off1"),
        ("", (32, 64, 1024), (2048,), False, "perm01"),
        ("", (32, 64, 1024), (2048,), False, "pitch"),
        ("", (32, 64, 1024), (2048,), False, "exp0"),
        (">=256MB", (64, 256, 2048), (4096,), False, "contig"),
        (">=256MB downsample", (64, 256, 8192), (2048,), True, "contig"),
        ("many short rows", (4096, 64, 7), (14,), False, "contig"),
        ("odd", (33, 17, 1001), (2003,), False, "contig"),
        ("downsample 1/2", (32, 64, 4096), (2048,), False, "contig"),
        ("64K", (1, 64, 512), (1024,), False, "contig"),
    ],
    2: [
        ("segmentation head x2", (16, 21, 64, 64), (128, 128), False, "contig"),
        ("PSPNet logits x8", (8, 21, 64, 64), (512, 512), False, "contig"),
        ("x2 align_corners", (16, 64, 64, 64), (128, 128), True, "contig"),
        ("FPN x2", (8, 256, 50, 68), (100, 136), False, "contig"),
        ("downsample 1/2", (16, 64, 128, 128), (64, 64), False, "contig"),
        ("downsample 225 -> 64", (8, 32, 225, 225), (64, 64), False, "contig"),
        ("x1.7", (16, 32, 57, 61), (97, 104), False, "contig"),
        ("scale 2.5 given", (16, 32, 60, 60), (2.5, 2.5), False, "contig"),
        ("scale 0.3 given", (16, 32, 200, 200), (0.3, 0.3), False, "contig"),
        ("PSPNet pyramid 1 -> 60", (16, 512, 1, 1), (60, 60), False, "contig"),
        ("PSPNet pyramid 6 -> 60", (16, 512, 6, 6), (60, 60), False, "contig"),
        ("pyramid 3 -> 60 align_corners", (16, 512, 3, 3), (60, 60), True, "contig"),
        ("identity", (32, 64, 56, 56), (56, 56), False, "contig"),
        ("1-row planes", (4, 64, 1, 1024), (1, 2048), False, "contig"),
        ("prime", (4, 16, 97, 101), (211, 199), True, "contig"),
        ("", (16, 64, 64, 64), (128, 128), False, "cl"),
        ("", (16, 64, 64, 64), (128, 128), False, "t"),
        ("", (16, 64, 64, 64), (128, 128), False, "s2"),
        ("", (16, 64, 64, 64), (128, 128), False, "off1"),
        ("", (16, 64, 64, 64), (128, 128), False, "perm01"),
        (">=256MB", (32, 64, 128, 128), (256, 256), False, "contig"),
        (">=256MB downsample", (32, 64, 256, 256), (128, 128), True, "contig"),
        ("super-resolution x4", (16, 3, 64, 64), (256, 256), False, "contig"),
        ("many 7x7 planes", (4096, 16, 7, 7), (14, 14), False, "contig"),
        ("wide", (2, 8, 16, 4096), (32, 8192), False, "contig"),
        ("64K", (1, 16, 32, 32), (64, 64), False, "contig"),
    ],
    3: [
        ("U-Net x2", (2, 32, 32, 32, 32), (64, 64, 64), False, "contig"),
        ("U-Net x2 align_corners", (2, 32, 32, 32, 32), (64, 64, 64), True, "contig"),
        ("bottleneck x2", (4, 128, 8, 8, 8), (16, 16, 16), False, "contig"),
        ("video", (4, 16, 8, 64, 64), (16, 128, 128), False, "contig"),
        ("downsample 1/2", (2, 16, 64, 64, 64), (32, 32, 32), False, "contig"),
        ("anisotropic", (2, 32, 20, 64, 64), (40, 96, 96), False, "contig"),
        ("scale 1.5 given", (2, 16, 30, 30, 30), (1.5, 1.5, 1.5), False, "contig"),
        ("scale 0.4 given", (2, 16, 60, 60, 60), (0.4, 0.4, 0.4), True, "contig"),
        ("global 1 -> 16", (8, 256, 1, 1, 1), (16, 16, 16), False, "contig"),
        ("2 -> 16", (8, 128, 2, 2, 2), (16, 16, 16), True, "contig"),
        ("identity", (2, 32, 32, 32, 32), (32, 32, 32), False, "contig"),
        ("prime", (2, 8, 17, 19, 23), (37, 41, 43), False, "contig"),
        ("", (2, 32, 32, 32, 32), (64, 64, 64), False, "cl"),
        ("", (2, 32, 32, 32, 32), (64, 64, 64), False, "t"),
        ("", (2, 32, 32, 32, 32), (64, 64, 64), False, "s2"),
        ("", (2, 32, 32, 32, 32), (64, 64, 64), False, "off1"),
        ("", (2, 32, 32, 32, 32), (64, 64, 64), False, "perm01"),
        (">=256MB", (4, 32, 32, 64, 64), (64, 128, 128), False, "contig"),
        (">=256MB downsample", (4, 32, 64, 128, 128), (32, 64, 64), True, "contig"),
        ("D only", (4, 32, 16, 64, 64), (32, 64, 64), False, "contig"),
        ("x1.3", (2, 16, 40, 40, 40), (52, 52, 52), False, "contig"),
        ("many 4^3 volumes", (512, 32, 4, 4, 4), (8, 8, 8), False, "contig"),
        ("1-D-like", (2, 8, 1, 1, 4096), (1, 1, 8192), False, "contig"),
        ("64K", (1, 8, 8, 16, 16), (16, 32, 32), False, "contig"),
    ],
}
_UPSAMPLE_DIMS = {"upsample_linear1d_backward": 1, "upsample_bilinear2d_backward": 2,
                  "upsample_bicubic2d_backward": 2, "_upsample_bilinear2d_aa_backward": 2,
                  "upsample_trilinear3d_backward": 3}


def _upsample_cases(op: str, S: Scale) -> list:
    dims = _UPSAMPLE_DIMS[op]
    out = []
    for note, full, size, align, gl in _UPSAMPLE[dims]:
        shape = S(full, _shrink(full, 2))
        scales = tuple(float(s) for s in size) if isinstance(size[0], float) else None
        if scales:
            osize = tuple(math.floor(i * s) for i, s in zip(shape[2:], scales))
        else:
            osize = size if S.full else tuple(max(1, round(o * t / f)) for o, t, f in zip(size, shape[2:], full[2:]))
        lay = f" grad {LAYOUTS[gl]}" if gl != "contig" else ""
        label = (f"{_dims(shape)} -> {_dims(osize)}{' align_corners' if align else ''}{lay}"
                 + (f" ({note})" if note else ""))

        def make(c: _Ctx, shape=shape, osize=osize, align=align, scales=scales, gl=gl) -> Built:
            g = c.arrange(shape[:2] + osize, gl)
            args = (g, list(osize), list(shape), align, *(scales or (None,) * dims))
            return Built(args, {}, distinct_bytes(g) + _numel(shape) * c.el)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- 3-D pools
# (note, full input shape, kernel, stride, padding, dilation / (ceil_mode, count_include_pad, divisor_override),
# ceil_mode, input layout); the tiny shape by `_shrink`
_POOL3D = [
    ("U-Net MaxPool3d(2)", (2, 32, 64, 64, 64), 2, 2, 0, False, "contig"),
    ("overlapping 3/2/1", (2, 32, 64, 64, 64), 3, 2, 1, False, "contig"),
    ("3/1/1 (same size)", (2, 16, 32, 32, 32), 3, 1, 1, False, "contig"),
    ("ceil_mode", (2, 32, 33, 33, 33), 2, 2, 0, True, "contig"),
    ("ceil_mode overlapping", (2, 32, 31, 45, 45), 3, 2, 1, True, "contig"),
    ("video (1,2,2)", (8, 64, 16, 56, 56), (1, 2, 2), (1, 2, 2), 0, False, "contig"),
    ("video (3,3,3)/(1,2,2)", (8, 64, 16, 56, 56), 3, (1, 2, 2), 1, False, "contig"),
    ("anisotropic", (2, 32, 20, 64, 64), (2, 3, 3), (2, 2, 2), (0, 1, 1), False, "contig"),
    ("kernel 5", (2, 16, 40, 40, 40), 5, 2, 2, False, "contig"),
    ("kernel 4 stride 4", (2, 16, 64, 64, 64), 4, 4, 0, False, "contig"),
    ("prime", (2, 8, 37, 41, 43), 2, 2, 0, False, "contig"),
    ("bottleneck", (16, 256, 8, 8, 8), 2, 2, 0, False, "contig"),
    ("", (2, 32, 64, 64, 64), 2, 2, 0, False, "cl"),
    ("", (2, 32, 64, 64, 64), 3, 2, 1, False, "cl"),
    ("", (2, 32, 64, 64, 64), 2, 2, 0, False, "perm01"),
    ("", (2, 32, 64, 64, 64), 2, 2, 0, False, "t"),
    ("", (2, 32, 64, 64, 64), 2, 2, 0, False, "s2"),
    ("", (2, 32, 64, 64, 64), 2, 2, 0, False, "off1"),
    (">=256MB", (4, 32, 128, 128, 64), 2, 2, 0, False, "contig"),
    (">=256MB overlapping", (4, 32, 96, 96, 96), 3, 2, 1, False, "contig"),
    ("unbatched", (32, 32, 64, 64), 2, 2, 0, False, "contig"),
    ("D=1", (8, 64, 1, 128, 128), (1, 3, 3), (1, 2, 2), (0, 1, 1), False, "contig"),
    ("many 4^3 volumes", (512, 32, 4, 4, 4), 2, 2, 0, False, "contig"),
    ("64K", (1, 8, 16, 32, 32), 2, 2, 0, False, "contig"),
    ("global-ish 8", (4, 64, 16, 16, 16), 8, 8, 0, False, "contig"),
]
# per op, the variant of each row (by index, cycling): max pool: dilation; avg pool: (count_include_pad,
# divisor_override)
_MAX3D_DILATION = (1, 1, 1, 2, 1, 1, 1, (1, 2, 2), 1, 1)
_AVG3D_VARIANT = ((True, None), (False, None), (True, None), (True, 3), (False, None))


def _pool3d_shape(full: tuple, S: Scale) -> tuple:
    if S.full:
        return full
    lead = 2 if len(full) == 5 else 1
    return (min(full[0], 2),) * (lead == 2) + (min(full[lead - 1], 3),) + _tiny_sizes(full[lead:], 12)


def _pool3d_cases(op: str, S: Scale) -> list:
    maxpool = op == "max_pool3d_with_indices_backward"
    out = []
    for i, (note, full, k, s, p, ceil, xl) in enumerate(_POOL3D):
        shape = _pool3d_shape(full, S)
        k3, s3, p3 = (_triple(v) for v in (k, s, p))
        k3 = tuple(min(kk, n) for kk, n in zip(k3, shape[-3:]))  # (tiny shapes: windows fit, pads at most k/2)
        p3 = tuple(min(pp, kk // 2) for pp, kk in zip(p3, k3))
        if maxpool:
            d3 = _triple(_MAX3D_DILATION[i % len(_MAX3D_DILATION)])
            d3 = tuple(dd if (kk - 1) * dd + 1 <= n + 2 * pp else 1 for dd, kk, n, pp in zip(d3, k3, shape[-3:], p3))
            extra = (list(d3), ceil)
            variant = f" dilation {d3}" if max(d3) > 1 else ""
        else:
            include, divisor = _AVG3D_VARIANT[i % len(_AVG3D_VARIANT)]
            extra = (ceil, include, divisor)
            variant = ("" if include else " count_include_pad=False") + (f" divisor {divisor}" if divisor else "")
        lay = f" {LAYOUTS[xl]}" if xl != "contig" else ""
        label = (f"{_dims(shape)} k{_dims(k3)} s{_dims(s3)} p{_dims(p3)}{' ceil_mode' if ceil else ''}{variant}{lay}"
                 + (f" ({note})" if note else ""))
        out.append((label, _pool3d_builder(maxpool, shape, k3, s3, p3, extra, xl)))
    return _dedupe(out)


def _pool_format(y: torch.Tensor) -> torch.memory_format:
    cl = y.dim() == 5 and y.is_contiguous(memory_format=torch.channels_last_3d) and not y.is_contiguous()
    return torch.channels_last_3d if cl else torch.contiguous_format


def _triple(v) -> tuple:
    return tuple(v) if isinstance(v, tuple) else (v,) * 3


def _pool3d_builder(maxpool, shape, k3, s3, p3, extra, xl):
    def make(c: _Ctx) -> Built:
        x = c.arrange(shape, xl)
        window = (list(k3), list(s3), list(p3))
        if maxpool:
            y, idx = torch.ops.aten.max_pool3d_with_indices(x, *window, *extra)
        else:
            y = torch.ops.aten.avg_pool3d(x, *window, *extra)
        g = c.randn(y.shape).contiguous(memory_format=_pool_format(y))  # (grad_output in the forward's layout)
        # grad_output (and max pooling's int64 indices) read, grad_input written; self only lends its layout
        nbytes = distinct_bytes(g) + _numel(shape) * c.el
        if maxpool:
            return Built((g, x, *window, *extra, idx), {}, nbytes + idx.numel() * 8)
        return Built((g, x, *window, *extra), {}, nbytes)
    return make


# ----------------------------------------------------------------------------------------------- adaptive max pool
def _adaptive_max_pool_cases(op: str, S: Scale) -> list:
    """The adaptive pools' problems for max pooling: self real (the forward's indices come from it), and the
    indices read besides grad_output."""
    out = []
    for label, dims, shape, osize, gl, cl in _adaptive_problems(op, S):

        def make(c: _Ctx, shape=shape, osize=osize, gl=gl, cl=cl, dims=dims) -> Built:
            x = c.arrange(shape, "cl" if cl else "contig")
            fwd = torch.ops.aten.adaptive_max_pool3d if dims == 3 else torch.ops.aten.adaptive_max_pool2d
            _, idx = fwd(x, list(osize))
            g = c.arrange(idx.shape, gl) if not cl else c.randn(idx.shape).contiguous(memory_format=torch.channels_last)
            return Built((g, x, idx), {}, distinct_bytes(g) + idx.numel() * 8 + _numel(shape) * c.el)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- nll_loss2d
# (note, full logits shape, weighted, ignore_index (None: no target is ignored), reduction, logits layout); 5-D
# problems as nll_loss_nd hands them on: (N, C, 1, D*H*W)
_NLL = [
    ("VOC 21 classes", (16, 21, 128, 128), False, None, 1, "contig"),
    ("VOC, ignore 255", (16, 21, 128, 128), False, 255, 1, "contig"),
    ("VOC, weighted, ignore 255", (16, 21, 128, 128), True, 255, 1, "contig"),
    ("Cityscapes 19", (8, 19, 256, 512), False, 255, 1, "contig"),
    ("Cityscapes weighted", (8, 19, 256, 512), True, 255, 1, "contig"),
    ("ADE20K 150", (8, 150, 128, 128), False, -100, 1, "contig"),
    ("binary", (32, 2, 256, 256), False, None, 1, "contig"),
    ("sum", (16, 21, 128, 128), False, None, 2, "contig"),
    ("sum weighted", (16, 21, 128, 128), True, 255, 2, "contig"),
    ("none", (16, 21, 128, 128), False, 255, 0, "contig"),
    ("none weighted", (16, 21, 128, 128), True, None, 0, "contig"),
    ("3-D 64^3, 4 classes", (2, 4, 1, 262144), False, None, 1, "contig"),
    ("3-D 96^3, 14 classes weighted", (2, 14, 1, 884736), True, None, 1, "contig"),
    ("3-D 128^3, 3 classes", (1, 3, 1, 2097152), False, -100, 2, "contig"),
    ("", (16, 21, 128, 128), False, 255, 1, "cl"),
    ("", (16, 21, 128, 128), True, 255, 1, "cl"),
    ("", (16, 21, 128, 128), False, 255, 1, "perm01"),
    ("", (16, 21, 128, 128), False, 255, 1, "t"),
    ("", (16, 21, 128, 128), False, 255, 1, "s2"),
    ("", (16, 21, 128, 128), False, 255, 1, "off1"),
    ("prime", (7, 13, 97, 101), True, 255, 1, "contig"),
    ("one class", (8, 1, 128, 128), False, None, 1, "contig"),
    ("1000 classes", (2, 1000, 32, 32), True, None, 1, "contig"),
    ("64K pixels", (1, 21, 256, 256), False, 255, 1, "contig"),
    ("large", (32, 21, 512, 512), False, 255, 1, "contig"),
]


def _nll_cases(op: str, S: Scale) -> list:
    out = []
    for note, full, weighted, ignore, reduction, xl in _NLL:
        shape = S(full, (min(full[0], 2), min(full[1], 5), *_tiny_sizes(full[2:], 16)))
        lay = f" {LAYOUTS[xl]}" if xl != "contig" else ""
        label = (f"{_dims(shape)} {('none', 'mean', 'sum')[reduction]}{' weighted' if weighted else ''}"
                 f"{f' ignore {ignore}' if ignore is not None else ''}{lay}" + (f" ({note})" if note else ""))

        def make(c: _Ctx, shape=shape, weighted=weighted, ignore=ignore, reduction=reduction, xl=xl) -> Built:
            n, classes = shape[0], shape[1]
            x = c.arrange(shape, xl)
            gen = torch.Generator().manual_seed(c.seed)
            target = torch.randint(0, classes, (n, *shape[2:]), generator=gen)
            if ignore is not None:
                target[torch.rand(target.shape, generator=gen) < 0.1] = ignore
            target = target.to(c.device)
            weight = c.rand((classes,)) + 0.5 if weighted else None
            pixels = target.numel()
            # the target read once, one logit a pixel (the target's class: C-fold fewer than the logits), the
            # weight; the loss (per pixel under reduction none) and total_weight written
            nbytes = pixels * (8 + c.el) + (classes * c.el if weighted else 0) \
                + (pixels if reduction == 0 else 2) * c.el
            return Built((x, target, weight, reduction, -100 if ignore is None else ignore), {}, nbytes)
        out.append((label, make))
    return out


# ----------------------------------------------------------------------------------------------- fallback
def _registry_cases(op: str, S: Scale, dtype: torch.dtype) -> list:
    """An op without a generator: its registry cases (sizes "check" and "large" on a GPU, "small" otherwise), each
    as given, with its float tensor arguments in a strided slice (rank >= 1), and transposed (rank >= 2); bytes as the
    registry counts them. Listing builds the registry's cases once (on the meta device where its builders allow) for
    their labels and ranks, and frees them; each case rebuilds its size's list when it runs."""
    info = REGISTRY[op]
    if info.cases is None:
        return []
    out = []
    for size in S(("check", "large"), ("small",)):
        try:
            cases = info.cases(torch.device("meta"), dtype, size)
        except Exception:  # noqa: BLE001 - builders that run kernels cannot run on meta tensors
            cases = info.cases(_runtime.default_device(), dtype, size)
        for i, case in enumerate(cases):
            ranks = [t.dim() for t in (*case.args, *dict(case.kwargs).values()) if _relayable(t)]
            variants = ["as given"] + [v for v, r in (("strided", 1), ("transposed", 2)) if any(d >= r for d in ranks)]
            for variant in variants:
                out.append((f"registry {size}: {case.label} ({variant})", _registry_builder(info, size, i, variant)))
        del cases
    return _dedupe(out)


def _relayable(t) -> bool:
    """A float tensor whose every element is distinct in memory (stand-ins and expanded operands keep theirs)."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0 \
        and distinct_bytes(t) == t.numel() * t.element_size()


def _registry_builder(info, size: str, i: int, variant: str):
    from ..testing import layouts

    def relayout(t):
        if variant == "as given" or not _relayable(t) or t.dim() < (2 if variant == "transposed" else 1):
            return t
        return dict(layouts(t))[variant]

    def make(c: _Ctx) -> Built:
        torch.manual_seed(c.seed)  # (registry builders draw from the global generator)
        case = info.cases(c.device, c.dtype, size)[i]
        args = tuple(relayout(a) for a in case.args)
        return Built(args, {k: relayout(v) for k, v in dict(case.kwargs).items()}, case.bytes)
    return make


# ----------------------------------------------------------------------------------------------- generators
GENERATORS: dict[str, Callable[[str, Scale], list]] = {
    **{op: _pointwise_cases for op in FAMILIES["activation backwards"]},
    "where_backward": _where_cases,
    "lerp_backward": _lerp_cases,
    "prelu_backward": _prelu_cases,
    "_prelu_kernel_backward": _prelu_cases,
    "repeat_backward": _repeat_cases,
    **{op: _pad_cases for op in FAMILIES["pad backwards"]},
    "sparsemax_forward": _sparsemax_forward_cases,
    "sparsemax_backward": _sparsemax_backward_cases,
    "segment_max_forward": _segment_max_forward_cases,
    "segment_max_backward": _segment_max_backward_cases,
    "_segment_reduce_backward": _segment_reduce_backward_cases,
    "_adaptive_avg_pool2d_backward": _adaptive_pool_cases,
    "_adaptive_avg_pool3d_backward": _adaptive_pool_cases,
    **{op: _upsample_cases for op in _UPSAMPLE_DIMS},
    "max_pool3d_with_indices_backward": _pool3d_cases,
    "avg_pool3d_backward": _pool3d_cases,
    "adaptive_max_pool2d_backward": _adaptive_max_pool_cases,
    "adaptive_max_pool3d_backward": _adaptive_max_pool_cases,
    "nll_loss2d_forward": _nll_cases,
}


def sweep_cases(op: str, dtype: torch.dtype, full: bool | None = None) -> list[SweepCase]:
    """Op `op`'s sweep cases in `dtype`, full-size (a GPU; default where there is one) or tiny (the interpreter);
    nothing is built."""
    S = Scale(_runtime.has_gpu() if full is None else full)
    gen = GENERATORS.get(op)
    pairs = gen(op, S) if gen is not None else _registry_cases(op, S, dtype)
    pairs = [pairs[i] for i in spread_order(len(pairs))]
    return [SweepCase(op, dtype, i, label, make) for i, (label, make) in enumerate(pairs)]


def spread_order(n: int) -> list[int]:
    """0..n-1 in the order of the van der Corput sequence (0, 1/2, 1/4, 3/4, ... of the way through): the generators
    list their cases by kind (sizes, models, layouts, the largest), so that the first N cases of this order sample
    every kind, and `--cases N` is a fair quick sweep."""
    order, seen, k = [], set(), 0
    while len(order) < n:
        v, denom, i = 0.0, 1.0, k
        while i:
            denom *= 2
            v += (i & 1) / denom
            i >>= 1
        j = int(v * n)
        if j not in seen:
            seen.add(j)
            order.append(j)
        k += 1
    return order


def list_lines(ops: Sequence[str], dtypes: Sequence[torch.dtype], n_cases: int | None = None,
               full: bool | None = None) -> list[str]:
    """`<op> <dtype> <case>`, one line per case."""
    return [f"{op} {_runtime.DTYPE_NAMES[dt]} {c.label}" for op in ops for dt in dtypes
            if dt in REGISTRY[op].dtypes for c in sweep_cases(op, dt, full)[:n_cases]]


# ----------------------------------------------------------------------------------------------- measuring
_CHECK_TOL = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2}
# ops whose stock reference, run in a 16-bit dtype, is itself inexact: the check's reference runs in float32 for
# them, rounded to the case's dtype (sparsemax_forward: a sort-based threshold summed in bf16; the upsampling
# backwards: CUDA's atomics round at every add, far outside the check where 3600 outputs land on one input:
# PSPNet's 1 -> 60 bin; nll_loss2d_forward: stock sums total_weight in the dtype, so an f16 mean over more than
# 65504 elements divides by inf and is 0, CPU and CUDA alike; prelu_backward: stock rounds each g * x term of
# grad_weight to the dtype before the sum, whose cancelling sum over 1M f16 terms then misses by 25 of its ulps)
_CHECK_IN_F32 = {"sparsemax_forward", "upsample_linear1d_backward", "upsample_bilinear2d_backward",
                 "upsample_trilinear3d_backward", "upsample_bicubic2d_backward", "_upsample_bilinear2d_aa_backward",
                 "nll_loss2d_forward", "prelu_backward"}


def _outputs(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def compare(ours, ref, dtype: torch.dtype) -> str | None:
    """None where `ours` matches `ref` (loosely: within tol * (|ref| + max |ref|), tol by dtype; integer outputs
    exactly), else what differs."""
    tol = _CHECK_TOL.get(dtype, 1e-3)
    a_all, e_all = _outputs(ours), _outputs(ref)
    if len(a_all) != len(e_all):
        return f"{len(a_all)} outputs, expected {len(e_all)}"
    for i, (a, e) in enumerate(zip(a_all, e_all)):
        if a is None or e is None:
            if (a is None) != (e is None):
                return f"output {i}: {type(a).__name__}, expected {type(e).__name__}"
            continue
        if tuple(a.shape) != tuple(e.shape):
            return f"output {i}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        e = e.to(a.device)
        if not a.is_floating_point():
            if not torch.equal(a, e.to(a.dtype)):
                return f"output {i}: {int((a != e).sum())} of {a.numel()} elements differ"
            continue
        a32, e32 = a.float(), e.to(a.dtype).float()
        finite = e32[torch.isfinite(e32)]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        try:
            torch.testing.assert_close(a32, e32, rtol=tol, atol=tol * max(scale, 1e-30), equal_nan=True)
        except AssertionError as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            return f"output {i}: " + "; ".join(lines[:3])[:300]
    return None


# outputs stock leaves undefined for some arguments, not compared: (op) -> a function of the op's arguments giving
# their positions. nll_loss2d_forward's total_weight under reduction none (ATen's CUDA kernel never writes it)
_UNDEFINED_OUTPUTS = {"nll_loss2d_forward": lambda self, target, weight, reduction, ignore_index:
                      (1,) * (reduction == 0)}


def _off_cpu(args: tuple, kwargs: dict) -> bool:
    return any(t.device.type != "cpu" for t in tensors_of((args, kwargs)))


def _reference(ref_fn: Callable, args: tuple, kwargs: dict):
    """The reference's result, from CPU copies (`run_reference`, dtypes kept) where stock raises on the device
    (torch 2.11's CUDA reflection_pad1d_backward cannot launch 65536 planes of one channel: 'invalid argument';
    gradkern's kernel serves them)."""
    try:
        return ref_fn(*args, **kwargs)
    except RuntimeError:
        if not _off_cpu(args, kwargs):
            raise
        return run_reference(ref_fn, args, kwargs, dtype=None)


def check_result(op: str, dtype: torch.dtype, args: tuple, kwargs: dict, ours) -> str | None:
    """The sweep's check of `ours`, op's result on a case's `args` and `kwargs`: None where it matches stock's
    (`compare`), else what differs. `scripts/tune.py` checks sweep cases with it too."""
    info = REGISTRY[op]
    if op in _CHECK_IN_F32 and dtype in (torch.float16, torch.bfloat16):
        up = lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        args, kwargs = tuple(up(a) for a in args), {k: up(v) for k, v in kwargs.items()}
    ref = _reference(info.reference_fn(), args, kwargs)
    undefined = _UNDEFINED_OUTPUTS.get(op, lambda *a, **k: ())(*args, **kwargs)
    if undefined:
        ours, ref = ([o for i, o in enumerate(_outputs(x)) if i not in undefined] for x in (ours, ref))
    return compare(ours, ref, dtype)


def run_hot(fn: Callable, ms: float) -> None:
    """Call `fn` back to back, unsynchronised, for `ms` milliseconds of host time (HOT_MS: why)."""
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        fn()


def _time_ms(fn: Callable, gpu: bool) -> float:
    """ms a call: the median of do_bench's runs, or the faster of two calls where both take at least SLOW_MS."""
    if gpu:
        import triton.testing

        best = math.inf
        for _ in range(2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            t = start.elapsed_time(end)
            if t < SLOW_MS:
                run_hot(fn, HOT_MS)
                return float(triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))
            best = min(best, t)
        return best
    t0 = time.perf_counter()  # (the interpreter: one call; the figure means nothing)
    fn()
    return (time.perf_counter() - t0) * 1e3


def gpu_host_us(fn: Callable, calls: int = 50) -> tuple[float, float]:
    """(GPU us, host us) a call, on a GPU: the time the kernels that torch.profiler records over `calls` calls
    cover (busy_us: where PDL lets a kernel start while the one before ends, the overlap counts once; idle gaps
    not at all), and the host's time to issue a call, `calls` back to back without synchronisation (where the GPU
    is the slower, a full launch queue makes this the GPU's time). A call whose host time exceeds its GPU time is
    host-bound: do_bench then reads the host's time, which moves with the process (docs/tuning/README.md, "Timing
    small cases")."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    gpu = busy_us((e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA)
    return gpu / calls, host


def busy_us(intervals) -> float:
    """The length of the union of (start, end) intervals."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


_BENIGN_ATEN = {"empty", "empty_strided", "as_strided", "view", "reshape", "_reshape_alias", "alias", "copy_",
                "fill_", "zeros", "full", "expand", "permute", "t", "transpose", "squeeze", "unsqueeze", "select",
                "slice"}


def classify_compiled(code: str, stock_op: str | None = None) -> str:
    """What Inductor's output code runs: "inductor" (only kernels it generated), "mixed (aten.x, ...)" (its kernels
    and ATen fallbacks), "fallback (aten.x)" (no kernel of its own, or the stock ATen op `stock_op` itself kept as
    a fallback beside helper kernels), "none" (no code: nothing compiled)."""
    kernels = len(re.findall(r"async_compile\.(?:triton|cpp\w*)\(", code))
    calls = set(re.findall(r"\baten\.(\w+)\.\w+\(", code)) | set(re.findall(r"extern_kernels\.(\w+)\(", code))
    calls = sorted(c for c in calls if c not in _BENIGN_ATEN)
    names = ", ".join(f"aten.{c}" for c in calls)
    if stock_op in calls:
        return f"fallback ({names}" + (f"; {kernels} helper kernel(s) of its own)" if kernels else ")")
    if kernels and calls:
        return f"mixed ({names})"
    if kernels:
        return "inductor"
    return f"fallback ({names})" if calls else "none"


def _compile(fn: Callable, args: tuple, kwargs: dict, stock_op: str | None) -> tuple[Callable, str]:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()  # (each case compiles afresh: no recompile limit, no guards of earlier cases)
    compiled = torch.compile(fn, dynamic=False)
    _result, codes = run_and_get_code(compiled, *args, **kwargs)
    return compiled, classify_compiled("\n".join(codes), stock_op)


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def measure_case(case: SweepCase, device, gpu: bool, ceiling: float, compile_ok: bool,
                 gpu_time: bool = False) -> dict:
    """One case: build, run gradkern once and check it against the reference, then (if it matched) time gradkern,
    stock eager and torch.compile of stock; with `gpu_time` (on a GPU), gradkern's and stock eager's GPU and host
    time a call too (gpu_host_us). The record's status: "ok", "FAIL: ..." (a wrong result) or "error: ..."
    (gradkern raised, or the case could not be built); only "ok" cases are timed."""
    from .. import ops

    info = REGISTRY[case.op]
    dt = _runtime.DTYPE_NAMES[case.dtype]
    rec = {"op": case.op, "family": family_of(case.op), "dtype": dt, "case": case.label, "index": case.index,
           "status": "ok", "bytes": None, "gradkern_ms": None, "aten_ms": None, "compile_ms": None,
           "compile_kernel": None}
    t0 = time.perf_counter()
    built = None
    try:
        built = case.build(device)
    except Exception as e:  # noqa: BLE001 - a case that cannot be built is a row, not the end of the sweep
        rec["status"] = f"error: building the case: {_err(e)}"
    if built is not None:
        rec["bytes"] = built.bytes
        rec.update(built.extra)
        fn = getattr(ops, case.op)
        a, kw = built.args, built.kwargs
        sfn, sa, skw = built.stock or (info.stock(), a, kw)
        rec["route"] = route_of(info, a, kw)
        with torch.no_grad(), use(False):
            try:
                ours = fn(*a, **kw)
            except Exception as e:  # noqa: BLE001
                rec["status"] = f"error: gradkern raised {_err(e)}"
            else:
                try:
                    fail = check_result(case.op, case.dtype, built.args, built.kwargs, ours)
                    if fail:
                        rec["status"] = f"FAIL: {fail}"
                except Exception as e:  # noqa: BLE001
                    rec["status"] = f"error: the reference raised {_err(e)}"
                del ours
            if rec["status"] == "ok":
                rec["gradkern_ms"] = _time_ms(lambda: fn(*a, **kw), gpu)
                rec["aten_ms"] = _safe(lambda: _time_ms(lambda: sfn(*sa, **skw), gpu), f"{case.op} stock eager")
                if gpu and gpu_time:
                    rec["gradkern_gpu_us"], rec["gradkern_host_us"] = gpu_host_us(lambda: fn(*a, **kw))
                    if rec["aten_ms"] is not None and rec["aten_ms"] < SLOW_MS:
                        rec["aten_gpu_us"], rec["aten_host_us"] = gpu_host_us(lambda: sfn(*sa, **skw))
                if compile_ok:
                    try:
                        aten_op = case.op if built.stock is None and hasattr(torch.ops.aten, case.op) else None
                        compiled, rec["compile_kernel"] = _compile(sfn, sa, skw, aten_op)
                        rec["compile_ms"] = _time_ms(lambda: compiled(*sa, **skw), gpu)
                    except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
                        rec["compile_kernel"] = f"error: {_err(e)}"
                    finally:
                        compiled = None
                        torch._dynamo.reset()
    del built
    _derive(rec, ceiling)
    rec["elapsed_s"] = time.perf_counter() - t0
    if gpu and (rec["bytes"] or 0) >= 1 << 30:
        gc.collect()
        torch.cuda.empty_cache()  # (after a large case: give its memory back to the next)
    return rec


def _derive(rec: dict, ceiling: float) -> None:
    """GB/s, % of the copy ceiling and speedups from a record's bytes and times."""
    b = rec["bytes"]
    for k in ("gradkern", "aten", "compile"):
        ms = rec[f"{k}_ms"]
        gbs = b / (ms * 1e-3) / 1e9 if ms and b else None
        rec[f"{k}_gbs"] = gbs
        rec[f"{k}_pct_copy"] = 100 * gbs / ceiling if gbs else None
    rec["pct_copy"] = rec["gradkern_pct_copy"]
    ours = rec["gradkern_ms"]
    rec["speedup_vs_aten"] = rec["aten_ms"] / ours if ours and rec["aten_ms"] else None
    # what a user of enable() (mode "auto") gets: stock's own time where the route sends the problem to stock
    routed_stock = rec.get("route") == "stock" and rec["speedup_vs_aten"] is not None
    rec["speedup_routed"] = 1.0 if routed_stock else rec["speedup_vs_aten"]
    own = (rec["compile_kernel"] or "").startswith(("inductor", "mixed"))
    rec["compile_own_kernel"] = own
    rec["speedup_vs_compile"] = rec["compile_ms"] / ours if ours and rec["compile_ms"] else None
    ours_gpu, aten_gpu = rec.get("gradkern_gpu_us"), rec.get("aten_gpu_us")
    if ours_gpu and aten_gpu:
        rec["speedup_gpu_vs_aten"] = aten_gpu / ours_gpu
        rec["host_bound"] = rec["gradkern_host_us"] > ours_gpu


# ----------------------------------------------------------------------------------------------- summary
def _geomean(vals: list[float]) -> float | None:
    vals = [v for v in vals if v and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def _min_case(recs: list[dict], key: str) -> tuple[float | None, str | None]:
    pairs = [(r[key], f"{r['dtype']} {r['case']}") for r in recs if r.get(key)]
    return min(pairs) if pairs else (None, None)


def summarize(records: list[dict], variants: dict | None = None) -> dict:
    """Per op (all dtypes together) and per (op, dtype): min and geometric mean of the speedups and of % copy (the
    speedups vs torch.compile only over cases where Inductor generated a kernel of its own), and for the cases
    moving >= 64 MiB the geometric mean and min of % copy."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["op"], "all"), []).append(r)
        groups.setdefault((r["op"], r["dtype"]), []).append(r)
    out = {"per_op": [], "per_op_dtype": []}
    for (op, dt), recs in groups.items():
        ok = [r for r in recs if r["status"] == "ok"]
        comp = [r for r in ok if r.get("compile_own_kernel")]
        large = [r for r in ok if (r["bytes"] or 0) >= LARGE_BYTES]
        row = {"op": op, "family": family_of(op), "dtype": dt, "cases": len(recs), "ok": len(ok),
               "failed": sum(r["status"].startswith("FAIL") for r in recs),
               "errors": sum(r["status"].startswith("error") for r in recs)}
        row["vs_aten_min"], row["vs_aten_min_case"] = _min_case(ok, "speedup_vs_aten")
        row["vs_aten_geomean"] = _geomean([r["speedup_vs_aten"] for r in ok])
        row["gpu_vs_aten_min"], row["gpu_vs_aten_min_case"] = _min_case(ok, "speedup_gpu_vs_aten")
        row["gpu_vs_aten_geomean"] = _geomean([r.get("speedup_gpu_vs_aten") for r in ok])
        row["gpu_cases"] = sum(r.get("speedup_gpu_vs_aten") is not None for r in ok)
        row["host_bound_cases"] = sum(bool(r.get("host_bound")) for r in ok)
        row["routed_min"], _ = _min_case(ok, "speedup_routed")
        row["routed_geomean"] = _geomean([r.get("speedup_routed") for r in ok])
        row["routed_stock_cases"] = sum(r.get("route") == "stock" for r in ok)
        row["vs_compile_min"], row["vs_compile_min_case"] = _min_case(comp, "speedup_vs_compile")
        row["vs_compile_geomean"] = _geomean([r["speedup_vs_compile"] for r in comp])
        row["compile_cases"] = sum(r["speedup_vs_compile"] is not None for r in comp)
        row["compile_fallback_cases"] = sum((r["compile_kernel"] or "").startswith("fallback") for r in ok)
        row["pct_copy_min"], row["pct_copy_min_case"] = _min_case(ok, "pct_copy")
        row["pct_copy_geomean"] = _geomean([r["pct_copy"] for r in ok])
        row["large_cases"] = len(large)
        row["large_pct_copy_geomean"] = _geomean([r["pct_copy"] for r in large])
        row["large_pct_copy_min"], _ = _min_case(large, "pct_copy")
        if dt == "all":
            row["variants"] = (variants or {}).get(op)
        out["per_op" if dt == "all" else "per_op_dtype"].append(row)
    return out


def _table_rows(rows: list[dict], with_dtype: bool, gpu_col: bool = False) -> list[list]:
    out = []
    for s in rows:
        comp = (f"{_f(s['vs_compile_min'], '.2f', 'x')} / {_f(s['vs_compile_geomean'], '.2f', 'x')} "
                f"({s['compile_cases']})") if s["compile_cases"] else (
            f"- (fallback {s['compile_fallback_cases']})" if s["compile_fallback_cases"] else "-")
        cells = [s["op"]] + ([s["dtype"]] if with_dtype else []) + [
            f"{s['ok']}/{s['cases']}" + (f" FAIL {s['failed']}" if s["failed"] else "")
            + (f" err {s['errors']}" if s["errors"] else ""),
            f"{_f(s['vs_aten_min'], '.2f', 'x')} / {_f(s['vs_aten_geomean'], '.2f', 'x')}",
            f"{_f(s['routed_min'], '.2f', 'x')} / {_f(s['routed_geomean'], '.2f', 'x')} ({s['routed_stock_cases']})",
            comp,
            *([f"{_f(s.get('gpu_vs_aten_min'), '.2f', 'x')} / {_f(s.get('gpu_vs_aten_geomean'), '.2f', 'x')} "
               f"({s.get('host_bound_cases', 0)}/{s.get('gpu_cases', 0)})"] if gpu_col else []),
            f"{_f(s['pct_copy_min'], '.0f', '%')} / {_f(s['pct_copy_geomean'], '.0f', '%')}",
            (f"{_f(s['large_pct_copy_min'], '.0f', '%')} / {_f(s['large_pct_copy_geomean'], '.0f', '%')} "
             f"({s['large_cases']})") if s["large_cases"] else "-"]
        if not with_dtype:
            cells.append(_f(s.get("variants"), "d"))
        cells.append(s["vs_aten_min_case"] or "-")
        out.append(cells)
    return out


def print_summary(summary: dict) -> None:
    gpu_col = any(r.get("gpu_cases") for r in summary["per_op"])
    heads = ["cases ok", "vs ATen min / geomean", "enable() min / geomean (n stock)", "vs compile min / geomean (n)",
             *(["GPU time vs ATen min / geomean (host-bound/n)"] if gpu_col else []), "% copy min / geomean",
             ">=64MiB % copy min / geomean (n)"]
    print_table(["op", *heads, "variants", "worst vs ATen"], _table_rows(summary["per_op"], False, gpu_col))
    print()
    print_table(["op", "dtype", *heads, "worst vs ATen"], _table_rows(summary["per_op_dtype"], True, gpu_col))


# ----------------------------------------------------------------------------------------------- variants
def jit_variants() -> int | None:
    """Compiled specialisations of gradkern's Triton kernels in this process (None under the interpreter)."""
    if _runtime.INTERPRET:
        return None
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    seen, total, readable = set(), 0, False
    for name, mod in list(sys.modules.items()):
        if not name.startswith("gradkern") or mod is None:
            continue
        for v in list(vars(mod).values()):
            if not isinstance(v, JITFunction) or id(v) in seen:
                continue
            seen.add(id(v))
            if hasattr(v, "device_caches"):  # device -> (kernel cache, ...), Triton 3.2 to 3.9 at least
                readable = True
                total += sum(len(e[0]) for e in v.device_caches.values() if isinstance(e, tuple))
            elif isinstance(getattr(v, "cache", None), dict):  # device -> kernel cache, older Triton
                readable = True
                total += sum(len(c) for c in v.cache.values())
    return total if readable else None


# ----------------------------------------------------------------------------------------------- run
def _result(records, variants, dev_name, ceiling, gpu, elapsed, complete, compile_ok, compile_cases=None) -> dict:
    import triton

    from .. import __version__

    return {"benchmark": "sweep", "device": dev_name, "torch": torch.__version__, "triton": triton.__version__,
            "gradkern": __version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "interpreter": not gpu, "copy_ceiling_gbs": ceiling,
            "timing": {"do_bench_warmup_ms": WARMUP_MS, "do_bench_rep_ms": REP_MS, "return_mode": "median",
                       "slow_ms": SLOW_MS, "torch_compile": compile_ok, "compile_cases": compile_cases,
                       "large_bytes": LARGE_BYTES},
            "bytes_rule": "minimum bytes the op must move; per family in gradkern.tools.bench_sweep's docstring",
            "elapsed_s": elapsed, "complete": complete, "variants": variants,
            "summary": summarize(records, variants), "records": records}


def _write_json(path: str | None, result: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def run_sweep(ops: Sequence[str] | None = None, dtypes: Sequence[torch.dtype] | None = None,
              n_cases: int | None = None, json_path: str | None = None, plot_path: str | None = None,
              compile_ok: bool | None = None, time_limit_s: float | None = None,
              compile_cases: int | None = None, gpu_time: bool = False) -> int:
    """The sweep; returns the exit status (1 if a case failed its check or raised). The JSON is rewritten after
    each op (so a run cut short keeps what it measured); `time_limit_s` stops starting new cases after that long;
    `compile_cases` times torch.compile on the first that many cases of each (op, dtype) only; `gpu_time` adds
    each call's GPU and host time (gpu_host_us) for gradkern and stock eager."""
    gpu = _runtime.has_gpu()
    device = _runtime.default_device()
    dev_name = _device_name()
    ops = list(ops or sorted(REGISTRY))
    if not gpu:
        print("No CUDA GPU: tiny cases through Triton's interpreter on CPU, a few per op; the timings say nothing "
              "about GPU performance.", flush=True)
        dtypes = dtypes or [torch.float32]
        n_cases = n_cases or INTERP_CASES
    dtypes = list(dtypes or SWEEP_DTYPES)
    compile_ok = gpu if compile_ok is None else compile_ok
    ceiling = copy_ceiling_gbs(gpu)
    work = [c for op in ops for dt in dtypes if dt in REGISTRY[op].dtypes
            for c in sweep_cases(op, dt, gpu)[:n_cases]]
    comp = "no torch.compile baseline" if not compile_ok else "torch.compile on every case" \
        if compile_cases is None else f"torch.compile on the first {compile_cases} cases per op and dtype"
    print(f"device: {dev_name}; copy ceiling {ceiling:.0f} GB/s (read + write); {len(work)} cases "
          f"({len(ops)} ops x {'/'.join(_runtime.DTYPE_NAMES[d] for d in dtypes)}); {comp}", flush=True)
    records: list[dict] = []
    variants: dict[str, int | None] = {}
    t_start = time.perf_counter()
    complete, before, current = True, None, None
    for i, case in enumerate(work, 1):
        if time_limit_s is not None and time.perf_counter() - t_start > time_limit_s:
            print(f"time limit of {time_limit_s:g} s reached: {len(work) - i + 1} cases not run", file=sys.stderr,
                  flush=True)
            complete = False
            break
        if case.op != current:
            if current is not None:
                variants[current] = _delta(before, jit_variants())
                _write_json(json_path, _result(records, variants, dev_name, ceiling, gpu,
                                               time.perf_counter() - t_start, False, compile_ok, compile_cases))
            current, before = case.op, jit_variants()
        rec = measure_case(case, device, gpu, ceiling, compile_ok and (compile_cases is None
                                                                      or case.index < compile_cases), gpu_time)
        records.append(rec)
        print(f"[{i}/{len(work)}] {case.op} {rec['dtype']} {case.label}: {_progress(rec)} "
              f"[{rec['elapsed_s']:.1f} s]", file=sys.stderr, flush=True)
    if current is not None:
        variants[current] = _delta(before, jit_variants())
    elapsed = time.perf_counter() - t_start
    result = _result(records, variants, dev_name, ceiling, gpu, elapsed, complete, compile_ok, compile_cases)
    report(result)
    _write_json(json_path, result)
    if json_path:
        print(f"\nwrote {json_path}")
    if plot_path:
        plot(records, dev_name, plot_path)
    return 1 if any(r["status"] != "ok" for r in records) else 0


def _delta(before, after):
    return after - before if before is not None and after is not None else None


def _progress(rec: dict) -> str:
    if rec["status"] != "ok":
        return rec["status"]
    comp = ""
    if rec["compile_kernel"] is not None:
        comp = f", compile {_f(rec['compile_ms'], '.4f')} ms ({rec['compile_kernel']})"
    return (f"gradkern {rec['gradkern_ms']:.4f} ms, ATen {_f(rec['aten_ms'], '.4f')} ms{comp}, "
            f"{_f(rec['pct_copy'], '.0f', '%')} of copy, {_f(rec['speedup_vs_aten'], '.2f', 'x')} vs ATen")


def report(result: dict) -> None:
    """The per-op tables and how to read them."""
    print()
    print(f"sweep on {result['device']}, copy ceiling {result['copy_ceiling_gbs']:.0f} GB/s"
          + ("" if result["complete"] else " (INCOMPLETE: stopped at the time limit)"))
    print_summary(result["summary"])
    print("\nvs ATen / vs compile: stock time / gradkern time (median of do_bench; calls of "
          f"{SLOW_MS:.0f} ms or more: the faster of two), min and geometric mean over the "
          "op's cases\n  (vs compile: only cases where Inductor generated a kernel of its own; fallback n: cases "
          "where it ran ATen's op)\n% copy: the op's minimum bytes / gradkern's time, against the copy ceiling "
          "measured in the same run\nvariants: Triton specialisations gradkern compiled during the op's cases; "
          "worst vs ATen: the case of the min")
    if any(r.get("gpu_cases") for r in result["summary"]["per_op"]):
        print("GPU time vs ATen: stock's kernel time / gradkern's (torch.profiler, the time a call's kernels cover; "
              f"stock calls of\n  {SLOW_MS:.0f} ms or more not profiled); host-bound: cases where gradkern's host "
              "issues a call slower than the GPU\n  runs it (there do_bench reads the host's time, which moves "
              "between processes)")
    failed = [r for r in result["records"] if r["status"] != "ok"]
    if failed:
        print(f"\n{len(failed)} case(s) not ok:")
        for r in failed:
            print(f"  {r['op']} {r['dtype']} {r['case']}: {r['status']}")
    n = len(result["records"])
    print(f"({n} cases in {result['elapsed_s']:.0f} s)")


def merge(paths: Sequence[str], json_path: str | None = None, plot_path: str | None = None) -> int:
    """Several sweep JSONs (say, one per GPU command) as one: records concatenated (a case measured twice keeps the
    later file's), the summary recomputed, tables printed, JSON and plot written."""
    records: dict[tuple, dict] = {}
    variants: dict = {}
    results = []
    for p in paths:
        with open(p) as f:
            res = json.load(f)
        results.append(res)
        for r in res["records"]:
            records[(r["op"], r["dtype"], r["case"])] = r
        variants.update(res.get("variants") or {})
    recs = list(records.values())
    devices = sorted({r["device"] for r in results})
    merged = {**results[-1], "device": " + ".join(devices), "merged_from": list(paths),
              "copy_ceiling_gbs": results[-1]["copy_ceiling_gbs"],
              "copy_ceilings_gbs": [r["copy_ceiling_gbs"] for r in results],
              "elapsed_s": sum(r["elapsed_s"] for r in results), "complete": all(r["complete"] for r in results),
              "variants": variants, "summary": summarize(recs, variants), "records": recs}
    report(merged)
    _write_json(json_path, merged)
    if json_path:
        print(f"\nwrote {json_path}")
    if plot_path:
        plot(recs, merged["device"], plot_path)
    return 1 if any(r["status"] != "ok" for r in recs) else 0


# ----------------------------------------------------------------------------------------------- plot
_DTYPE_COLORS = {"f32": "tab:blue", "bf16": "tab:orange", "f16": "tab:green", "f64": "tab:purple"}


def plot(records: list[dict], dev_name: str, path: str) -> None:
    """One panel per op family: per op, its cases side by side (grouped by dtype), speedup vs ATen eager (filled
    dots) and vs torch.compile where Inductor generated its own kernel (hollow triangles) on a log axis, with each
    (op, dtype)'s geometric mean vs ATen as a bar across its cases and failed cases as red crosses at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    from matplotlib.lines import Line2D

    fams = [f for f in [*FAMILIES, "other"] if any(r["family"] == f for r in records)]
    ratios = [v for r in records for v in (r.get("speedup_vs_aten"), r.get("speedup_vs_compile")) if v] or [1.0]
    lo, hi = min(min(ratios), 1.0) / 1.5, max(max(ratios), 1.0) * 1.5
    decades = math.log10(hi / lo)
    subs = (1.0, 2.0, 5.0) if decades <= 3 else (1.0, 3.0) if decades <= 5 else (1.0,)
    height = 3.4 * len(fams) + 0.8
    fig, axes = plt.subplots(len(fams), 1, figsize=(16, height), squeeze=False)
    dt_gap, op_gap = 2, 5  # empty positions between dtype groups, and between ops
    for ax, fam in zip(axes[:, 0], fams):
        recs = [r for r in records if r["family"] == fam]
        ops = list(dict.fromkeys(r["op"] for r in recs))
        x, centers, bounds = 0, [], []
        for op in ops:
            start = x
            for dt in [d for d in _DTYPE_COLORS if any(r["op"] == op and r["dtype"] == d for r in recs)]:
                group = [r for r in recs if r["op"] == op and r["dtype"] == dt]
                xs = list(range(x, x + len(group)))
                color = _DTYPE_COLORS[dt]
                for xi, r in zip(xs, group):
                    if r["status"] != "ok":
                        ax.plot(xi, 1.0, marker="x", color="tab:red", ms=7, mew=2)
                        continue
                    if r["speedup_vs_aten"]:
                        ax.plot(xi, r["speedup_vs_aten"], marker="o", color=color, ms=3.5, ls="")
                    if r.get("compile_own_kernel") and r["speedup_vs_compile"]:
                        ax.plot(xi, r["speedup_vs_compile"], marker="^", mfc="none", color=color, ms=4.5, ls="")
                gm = _geomean([r["speedup_vs_aten"] for r in group if r["status"] == "ok"])
                if gm:
                    ax.hlines(gm, xs[0] - 0.4, xs[-1] + 0.4, color=color, lw=2, alpha=0.6)
                last = xs[-1]
                x = last + 1 + dt_gap
            centers.append((start + last) / 2)
            bounds.append(last + (op_gap + 1) / 2)
            x = last + 1 + op_gap
        for b in bounds[:-1]:
            ax.axvline(b, color="0.8", lw=0.8)
        ax.axhline(1.0, color="k", lw=0.9)
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=subs))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlim(-1.5, last + 1.5)
        ax.set_xticks(centers)
        ax.set_xticklabels(ops, fontsize=9)
        ax.set_title(fam, fontsize=10)
        ax.set_ylabel("speedup (stock / gradkern)", fontsize=8)
        ax.grid(axis="y", which="major", color="0.9", lw=0.6)
    handles = [Line2D([], [], marker="o", color=c, ls="", label=d) for d, c in _DTYPE_COLORS.items()
               if any(r["dtype"] == d for r in records)]
    handles += [Line2D([], [], marker="o", color="0.4", ls="", label="vs ATen eager"),
                Line2D([], [], marker="^", mfc="none", color="0.4", ls="", label="vs torch.compile (own kernel)"),
                Line2D([], [], color="0.4", lw=2, alpha=0.6, label="geometric mean vs ATen (per dtype)"),
                Line2D([], [], marker="x", color="tab:red", ls="", mew=2, label="failed check / error")]
    note = "; interpreter: the timings mean nothing" if "interpreter" in dev_name else ""
    top = 1 - 0.75 / height  # (title and legend: 0.75 inch)
    fig.suptitle(f"gradkern sweep on {dev_name}: speedup per case, each op's cases side by side per dtype "
                 f"(> 1: gradkern faster; log scale){note}", fontsize=11, y=1 - 0.12 / height)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               bbox_to_anchor=(0.5, 1 - 0.38 / height), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
