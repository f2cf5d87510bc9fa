"""NLL loss over spatial maps, forward: ATen's `nll_loss2d_forward`, as a fixed-order two-stage sum (no atomics).

`nll_loss2d_forward(self, target, weight, reduction, ignore_index)` takes log-probabilities self (N, C, H, W) and
int64 class indices target (N, H, W). Each element's loss is -w[t] * self[n, t, h, w] (w = 1 without a weight), and
0 where t == ignore_index. reduction 0 (none) returns the losses (N, H, W); 2 (sum) their sum; 1 (mean) that sum
divided by total_weight, the sum of w[t] over the elements not ignored (0 / 0 = NaN when every element is ignored).
The second result, total_weight, is that sum (a 0-d tensor; 0 for reduction none); an empty problem gives NaN
(mean) or 0 (sum) and total_weight 0, as ATen does. nn.CrossEntropyLoss and F.nll_loss reach this op for inputs of
3 or more dims (nll_loss_nd reshapes (N, C, d1, ..., dk) to (N, C, 1, d1*...*dk) where k != 2).

ATen's CUDA kernel sums with atomicAdd, so it raises under torch.use_deterministic_algorithms(True) whenever
reduction != none (its backward, nll_loss2d_backward, writes each gradient element once: deterministic, left to
stock). Here the M = N*H*W elements, in row-major (n, h, w) order, are cut into fixed chunks of `steps` blocks of
BLOCK: program p owns chunk p, each lane carries its own partial sums of the loss and of the weight across the
steps, and a tree sum over the lanes gives the chunk's two partials. One more program adds the partials in chunk
order (where the problem fits one chunk, the one program finishes itself). Sums are in fp32 for f16/bf16/f32 and in
fp64 for f64; without a weight, total_weight is the count of elements not ignored, summed exactly. The launch
parameters depend on the shapes, strides and dtype only (never on timing) and the summation order on M alone: the
terms are added in flat (n, h, w) order whatever the layouts, so a problem gives the same bits on a device in every
layout and every run. Target and self are read once, in place through their strides (channels_last and other
layouts too), and of self only the N*H*W elements the targets pick, never the C-fold rest.

Deviations from ATen, on purpose: the one rounding to a 16-bit dtype comes at the end (ATen rounds each product
w * x and each block's partial weight to the dtype, and divides the rounded sums), so 16-bit results are closer to
the exact value than ATen's (an f16 mean over more than 65504 elements: ATen's total_weight is inf and its mean 0;
here total_weight is inf as well, and the mean the mean). A target outside [0, C) that is not ignore_index (ATen:
a device-side assert on CUDA, an IndexError on CPU) makes that element's loss NaN, and so the reduced loss and
total_weight NaN: checking the values on the host would cost a device synchronisation every call, and clamping or
skipping would hide the error.
Nothing outside the tensors is read for such an element. A reduction other than 0, 1 and 2 is an InvalidProblem
(ATen sums for any value but 0 and 1)."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._cases import Draw, describe, randn, refuse
from .._runtime import cdiv, math_dtype
from ..config import GridLimits, PlanCache, Tunable
from ..errors import InvalidProblem, Unsupported
from ..launch.alloc import empty
from ..launch.checks import check_like, check_tensor, reach
from ..launch.launcher import launch, launch_consts
from ..launch.tl_helpers import TL_MATH, cast_out
from ..registry import Case, register_op

_OP = "nll_loss2d_forward"


@dataclass(frozen=True)
class NllLossConfig(GridLimits):
    """nll_loss2d_forward's launch heuristics, read once per plan: first choices from the design, not yet measured
    on a GPU (what to try: docs/tuning/nll_loss.md)."""

    #: elements a program takes a step (8 a thread at 4 warps: the target load, then the gather, in flight)
    block: int = 1024
    #: warps a program, both kernels
    warps: int = 4
    #: a reducing launch runs up to about this many programs (some 16 an SM on an H100: enough loads in flight to
    #: hide DRAM latency without relying on software pipelining); beyond, each program's chunk grows
    target_programs: int = 2048
    #: ... and each program takes at least this many steps (a small problem: one program, one launch)
    min_steps: int = 2
    #: partials the finishing program adds a step (2048 partials: two steps)
    finish_block: int = 1024


CONFIG = Tunable("nll_loss", NllLossConfig())
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


# ----------------------------------------------------------------------------------------------- kernels
@triton.jit
def _nll_loss2d_kernel(x, tgt, wt, out, tw, ws, M, L, W, C, ignore_index, steps,
                       sxN, sxC, sxH, sxW, stN, stH, stW, swC,
                       BLOCK: tl.constexpr, SPLIT: tl.constexpr, HAS_W: tl.constexpr, REDUCTION: tl.constexpr,
                       ONE: tl.constexpr, ACC: tl.constexpr, I64: tl.constexpr):
    # program p owns elements [p*steps*BLOCK, (p+1)*steps*BLOCK) of the flat (n, h, w) index, L = H*W; SPLIT: h and
    # w take separate strides (else the plane position q = h*W + w has one, passed as sxW and stW)
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    base = pid * steps * BLOCK
    lanes = tl.arange(0, BLOCK)
    acc_l = tl.zeros([BLOCK], dtype=ACC)
    acc_w = tl.zeros([BLOCK], dtype=ACC)
    for s in range(0, steps):
        i = base + s * BLOCK + lanes
        inb = i < M
        ic = tl.minimum(i, M - 1)  # (lanes past the end: in-range index math, their loads masked)
        n = ic // L
        q = ic - n * L
        if SPLIT:
            h = q // W
            w = q - h * W
            x_off = n * sxN + h * sxH + w * sxW
            t_off = n * stN + h * stH + w * stW
        else:
            x_off = n * sxN + q * sxW
            t_off = n * stN + q * stW
        t = tl.load(tgt + t_off, mask=inb, other=0)
        kept = inb & (t != ignore_index)
        good = kept & (t >= 0) & (t < C)
        c = tl.where(good, t, 0)
        if not I64:
            c = c.to(tl.int32)
        v = tl.load(x + x_off + c * sxC, mask=good, other=0.0).to(ACC)
        if HAS_W:
            wv = tl.load(wt + c * swC, mask=good, other=0.0).to(ACC)
            loss = tl.where(good, -(v * wv), 0.0)
        else:
            wv = good.to(ACC)
            loss = tl.where(good, -v, 0.0)
        bad = kept & ~good  # a target outside [0, C): NaN, never a read out of bounds
        loss = tl.where(bad, float("nan"), loss)
        if REDUCTION == 0:
            tl.store(out + i, cast_out(loss, out.dtype.element_ty), mask=inb)
        else:
            acc_l += loss
            acc_w += tl.where(bad, float("nan"), wv)
    if REDUCTION == 0:
        if pid == 0:
            tl.store(tw, tl.zeros([], dtype=tw.dtype.element_ty))
    else:
        part_l = tl.sum(acc_l, axis=0)
        part_w = tl.sum(acc_w, axis=0)  # (without a weight: a count of at most steps*BLOCK, exact)
        if ONE:
            _finish(out, tw, part_l, part_w, REDUCTION)
        else:
            tl.store(ws + pid, part_l)
            tl.store(ws + tl.num_programs(0) + pid, part_w)


@triton.jit
def _finish(out, tw, loss, weight, REDUCTION: tl.constexpr):
    """Store the sum (divided by the total weight for mean) and the total weight, each rounded once."""
    if REDUCTION == 1:
        loss = loss / weight
    tl.store(out, cast_out(loss, out.dtype.element_ty))
    tl.store(tw, cast_out(weight, tw.dtype.element_ty))


@triton.jit
def _nll_loss2d_finish_kernel(ws, out, tw, P, BLOCK: tl.constexpr, REDUCTION: tl.constexpr, ACC: tl.constexpr,
                              WACC: tl.constexpr):
    # ws holds P loss partials, then P weight partials; added in one fixed order (lanes across steps, then a tree)
    lanes = tl.arange(0, BLOCK)
    acc_l = tl.zeros([BLOCK], dtype=ACC)
    acc_w = tl.zeros([BLOCK], dtype=WACC)
    for k in range(0, P, BLOCK):
        j = k + lanes
        m = j < P
        acc_l += tl.load(ws + j, mask=m, other=0.0)
        acc_w += tl.load(ws + P + j, mask=m, other=0.0).to(WACC)
    _finish(out, tw, tl.sum(acc_l, axis=0), tl.sum(acc_w, axis=0).to(ACC), REDUCTION)


# ----------------------------------------------------------------------------------------------- host
@dataclass(frozen=True, eq=False)  # hashed by identity: keys the relaunch cache
class _Plan:
    reduction: int
    out_shape: tuple[int, ...]  # (N, H, W) for none, () otherwise
    out_stride: tuple[int, ...]  # contiguous (given to alloc.empty, which would otherwise work it out each call)
    empty: bool  # no element: nothing to launch
    flat_weight: bool  # the weight is not 1-D: read through weight.reshape(-1)
    grid: int = 0
    args: tuple = ()
    consts: dict | None = None
    n_partials: int = 0  # programs whose partials the finishing kernel adds (0: none, or one program finished)
    acc: torch.dtype = torch.float32
    finish_consts: dict | None = None


def _check(self, target, weight, reduction, ignore_index) -> tuple[int, int]:
    """Every check, as named errors, before anything is allocated or launched; (reduction, ignore_index) as ints."""
    check_tensor(_OP, "self", self)
    check_tensor(_OP, "target", target, (torch.int64,))
    if target.device != self.device:
        raise Unsupported(_OP, "target", f"a tensor on {self.device} (the device of self)", target.device)
    if self.dim() != 4:
        raise InvalidProblem(_OP, "self", "a 4-D tensor (N, C, H, W)", f"a {self.dim()}-D tensor of shape "
                             f"{tuple(self.shape)}")
    n, c, h, w = self.shape
    if tuple(target.shape) != (n, h, w):
        raise InvalidProblem(_OP, "target", f"shape {(n, h, w)} (self's N, H, W)", f"shape {tuple(target.shape)}")
    if weight is not None:
        check_tensor(_OP, "weight", weight)
        check_like(_OP, "weight", weight, "self", self)
        if weight.numel() != c:
            raise InvalidProblem(_OP, "weight", f"{c} elements (one a class of self)",
                                 f"shape {tuple(weight.shape)}")
    try:
        reduction, ignore_index = operator.index(reduction), operator.index(ignore_index)
    except TypeError:
        raise Unsupported(_OP, "reduction/ignore_index", "ints",
                          f"{type(reduction).__name__}, {type(ignore_index).__name__}") from None
    if reduction not in _REDUCTIONS:
        raise InvalidProblem(_OP, "reduction", "0 (none), 1 (mean) or 2 (sum)", reduction)
    if not -(2**63) <= ignore_index < 2**63:
        raise InvalidProblem(_OP, "ignore_index", "an int64", ignore_index)
    return reduction, ignore_index


def _plan(x_shape: tuple, x_stride: tuple, t_stride: tuple, w_shape: tuple | None, w_stride: tuple | None,
          dtype: torch.dtype, reduction: int, ignore_index: int) -> _Plan:
    """The launches of a validated problem under the config in force."""
    cfg = CONFIG.current
    n, c, h, w = x_shape
    m = n * h * w
    out_shape = (n, h, w) if reduction == 0 else ()
    out_stride = (h * w, w, 1) if reduction == 0 else ()
    flat_weight = w_shape is not None and len(w_shape) != 1
    if m == 0:
        return _Plan(reduction, out_shape, out_stride, True, flat_weight)
    sxn, sxc, sxh, sxw = x_stride
    stn, sth, stw = t_stride
    # one stride for the plane position h*W + w where both tensors allow it (a size-1 dim's stride never counts)
    if h == 1 or (w > 1 and sxh == w * sxw and sth == w * stw):
        split = False
    elif w == 1:
        split, sxw, stw = False, sxh, sth
    else:
        split = True
    swc = 0
    if w_shape is not None:  # (weight.reshape(-1): a view where the strides allow it, else a contiguous copy)
        swc = torch.empty_strided(w_shape, w_stride, device="meta").reshape(-1).stride()[0] if flat_weight \
            else w_stride[0]
    block = min(cfg.block, triton.next_power_of_2(m))
    n_blocks = cdiv(m, block)
    if reduction == 0:
        steps = cdiv(n_blocks, cfg.max_programs)
    else:
        steps = max(cfg.min_steps, cdiv(n_blocks, cfg.target_programs))
    grid = cdiv(n_blocks, steps)
    span = grid * steps * block
    # 32-bit index math unless a flat index or an offset into self, target or weight can pass 2^31
    i64 = max(span, reach(x_shape, x_stride), reach((n, h, w), t_stride), (c - 1) * swc) > cfg.i32_max
    acc = math_dtype(dtype)
    tl_acc = TL_MATH[acc]
    one = reduction != 0 and grid == 1
    consts = launch_consts({"BLOCK": block, "SPLIT": split, "HAS_W": w_shape is not None, "REDUCTION": reduction,
                            "ONE": one, "ACC": tl_acc, "I64": i64}, cfg.warps)
    args = (m, h * w, w, c, ignore_index, steps, sxn, sxc, sxh, sxw, stn, sth, stw, swc)
    if reduction == 0 or one:
        return _Plan(reduction, out_shape, out_stride, False, flat_weight, grid, args, consts)
    # counts (no weight) added in fp64: exact past 2^24 elements
    finish = launch_consts({"BLOCK": min(cfg.finish_block, triton.next_power_of_2(grid)), "REDUCTION": reduction,
                            "ACC": tl_acc, "WACC": tl_acc if w_shape is not None else tl.float64}, cfg.warps)
    return _Plan(reduction, out_shape, out_stride, False, flat_weight, grid, args, consts, grid, acc, finish)


# a problem's (layouts, reduction, ignore_index) -> its plan, checked once


_VALIDATED = PlanCache("kernels.nll_loss._VALIDATED")



def _key(self, target, weight, reduction, ignore_index) -> tuple:
    wk = None if weight is None else (weight.shape, weight.stride(), weight.dtype, weight.device, weight.is_neg())
    return (self.shape, self.stride(), self.dtype, self.device, self.is_neg(), target.shape, target.stride(),
            target.dtype, target.device, wk, reduction, type(reduction), ignore_index, type(ignore_index))


def _empty_result(plan: _Plan, self: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's result for a problem without elements: losses (N, H, W) of none, NaN for mean, 0 for sum."""
    total_weight = torch.zeros((), dtype=self.dtype, device=self.device)
    if plan.reduction == 0:
        return torch.empty(plan.out_shape, dtype=self.dtype, device=self.device), total_weight
    fill = float("nan") if plan.reduction == 1 else 0.0
    return torch.full((), fill, dtype=self.dtype, device=self.device), total_weight


def nll_loss2d_forward(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                       ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NLL loss of (N, C, H, W) log-probabilities against (N, H, W) class targets: a fixed-order two-stage sum of
    -w[t] * self[n, t, h, w] and of w[t] (no atomics); (output, total_weight) as ATen's."""
    try:
        key = _key(self, target, weight, reduction, ignore_index)
        plan = _VALIDATED.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable: validation names the argument
        key = plan = None
    if plan is None:
        red, ign = _check(self, target, weight, reduction, ignore_index)
        plan = _VALIDATED.remember(key, _plan(
            tuple(self.shape), self.stride(), target.stride(), None if weight is None else tuple(weight.shape),
            None if weight is None else weight.stride(), self.dtype, red, ign))
    if plan.empty:
        return _empty_result(plan, self)
    dtype, device = self.dtype, self.device
    out = empty(plan.out_shape, dtype, device, plan.out_stride)
    total_weight = empty((), dtype, device, ())
    if weight is None:
        weight = self  # (not read: HAS_W is off)
    elif plan.flat_weight:
        weight = weight.reshape(-1)
    ws = empty((2 * plan.n_partials,), plan.acc, device, (1,)) if plan.n_partials else out
    dev = self.get_device()
    launch(_nll_loss2d_kernel, (plan.grid,), (self, target, weight, out, total_weight, ws), plan.args, plan.consts,
           dev, (plan, dev))
    if plan.n_partials:
        launch(_nll_loss2d_finish_kernel, (1,), (ws, out, total_weight), (plan.n_partials,), plan.finish_consts,
               dev, (plan, "finish", dev))
    return out, total_weight


# ----------------------------------------------------------------------------------------------- cases
# (self shape, channels_last, weight, ignore_index, reduction): segmentation maps (VOC's 21 classes, Cityscapes' 19,
# ADE's 150), 3-D volumes as nll_loss_nd passes them ((N, C, D, H, W) -> (N, C, 1, D*H*W)), 3-D sequences
# ((N, C, L) -> (N, C, 1, L)), channels_last logits, odd sizes, with and without weights and ignored pixels
_SHAPES = {
    "tiny": [((4, 4, 32, 32), False, True, -100, 1)],
    "small": [((2, 5, 12, 13), False, True, -100, 1), ((2, 5, 12, 13), False, False, -100, 2),
              ((3, 21, 9, 17), False, True, 255, 1), ((1, 7, 1, 300), False, True, -100, 1),
              ((2, 6, 9, 11), True, True, 255, 2), ((2, 3, 1, 257), False, False, -100, 1),
              ((4, 3, 5, 7), False, True, 1, 2), ((2, 5, 7, 6), False, True, -100, 0)],
    "check": [((16, 21, 128, 128), False, True, 255, 1), ((2, 4, 1, 64 * 64 * 64), False, True, -100, 1),
              ((8, 19, 256, 256), True, False, 255, 2), ((4, 150, 64, 64), False, False, -100, 1),
              ((64, 10, 1, 4096), False, True, -100, 2)],
    "large": [((16, 19, 1024, 2048), False, True, 255, 1), ((4, 4, 1, 192 * 192 * 192), False, True, -100, 1),
              ((16, 21, 768, 1024), True, False, 255, 1)],
}
_IGNORED = 0.05  # share of pixels set to ignore_index in the cases
_PATCH = 8  # the cases' class maps are constant over 8 x 8 patches, as segmentation labels are (not random noise)


def _target(n: int, c: int, h: int, w: int, ignore_index: int, device) -> torch.Tensor:
    """A class map of patches, with a share of ignored pixels."""
    coarse = torch.randint(0, c, (n, cdiv(h, _PATCH), cdiv(w, _PATCH)), device=device)
    t = coarse.repeat_interleave(_PATCH, 1).repeat_interleave(_PATCH, 2)[:, :h, :w].contiguous()
    return torch.where(torch.rand(t.shape, device=device) < _IGNORED, ignore_index, t)


def _moved_bytes(self, target, weight, reduction, ignore_index) -> int:
    # the gathered elements of self (one a target element; the C-fold rest is never read), target, the weight;
    # the losses or the two scalars written
    n, c, h, w = self.shape
    m, el = n * h * w, self.element_size()
    out = m + 1 if reduction == 0 else 2
    return m * (el + target.element_size()) + (0 if weight is None else c * el) + out * el


def _cases(device, dtype, size: str) -> list[Case]:
    out = []
    for shape, cl, weighted, ignore_index, reduction in _SHAPES[size]:
        n, c, h, w = shape
        x = randn(shape, device, dtype)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        t = _target(n, c, h, w, ignore_index, device)
        wt = (torch.rand(c, device=device) + 0.25).to(dtype) if weighted else None
        label = (f"{'x'.join(map(str, shape))}{' channels_last' if cl else ''}{' weight' if weighted else ''} "
                 f"ignore_index={ignore_index} {_REDUCTIONS[reduction]}")
        args = (x, t, wt, reduction, ignore_index)
        out.append(Case(label, args, bytes=_moved_bytes(*args), elements=n * h * w))
    return out


def _samples(rng, device, dtype):
    """(N, C, H, W) log-probabilities (an empty batch or plane too) in every layout (channels_last too), targets
    in [0, C) with some ignore_index (-100, 255 or a class), a weight (sometimes strided) or none, every
    reduction."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        n, c, h, w = d.sizes(4, edge, hi=6)
        c = max(c, 1)  # (a class count of 0 leaves no valid target)
        x = d.tensor((n, c, h, w), kinds=("grid", "normal", "special"), huge=False)
        ignore_index = rng.choice((-100, 255, rng.randrange(c)))
        t = d.ints(0, c, (n, h, w))
        t = d.place(torch.where(torch.rand(t.shape, generator=d.gen) < 0.2, ignore_index, t), ("contig", "t",
                                                                                               "slice_rand"))
        weight = d.place(d.values((c,), "grid").abs() + 0.25) if rng.random() < 0.6 else None
        reduction = rng.choice((0, 1, 2))
        yield Case(describe(self=x, target=t, weight=weight, reduction=reduction, ignore_index=ignore_index),
                   (x, t, weight, reduction, ignore_index))


def _errors(device):
    x = torch.randn(2, 3, 4, 5, device=device)
    t = torch.zeros(2, 4, 5, dtype=torch.int64, device=device)
    return [refuse("int32 target", Unsupported, "target", x, t.int(), None, 1, -100),
            refuse("target of another shape", InvalidProblem, "target", x, t[:, :3], None, 1, -100),
            refuse("a weight of another count", InvalidProblem, "weight", x, t, torch.ones(4, device=device), 1, -100),
            refuse("reduction 3", InvalidProblem, "reduction", x, t, None, 3, -100),
            refuse("a 3-D self", InvalidProblem, "self", x[0], t[0], None, 1, -100),
            refuse("a weight of another dtype", Unsupported, "weight", x, t, torch.ones(3, device=device).double(),
                   1, -100),
            refuse("reduction a string", Unsupported, "reduction/ignore_index", x, t, None, "mean", -100)]


def _route(self, target, weight, reduction, ignore_index) -> bool:
    return reduction in (1, 2)


register_op(_OP, aten=(_OP,), accumulates=True, cases=_cases, moved_bytes=_moved_bytes, route=_route,
            samples=_samples, errors=_errors,
            route_doc="gradkern for reduction mean and sum: stock's CUDA kernel sums with atomics "
                      "(nondeterministic, and raising under torch.use_deterministic_algorithms(True)); stock for "
                      "reduction none (elementwise and deterministic)")(nll_loss2d_forward)
