"""PReLU backward: ATen's `_prelu_kernel_backward`, and the fused `prelu_backward` that `enable()` uses.

`_prelu_kernel_backward(g, x, w)` keeps ATen's signature and result: gi = x > 0 ? g : w*g and the full-shape
gw = x > 0 ? 0 : x*g (w broadcast to x), in one elementwise pass. Autograd would then sum gw to the weight's shape
in a second kernel; `prelu_backward(g, x, weight)` instead reduces grad_weight in the same pass: each program sums
its tile's x*g per channel in fp32 (fp64 for f64) and writes one partial per channel; a fixed-order second pass
(the shared reduction) adds the partials. No atomics; the split depends on the shape only, so results are
bitwise reproducible. The channel is dim 1 (a 1-D or 0-d input has one channel), as `torch.prelu` defines it -
never guessed from where the weight's size happens to match (a C == W input would otherwise go wrong).

Fused layouts: any dense x with grad in the same layout, seen in memory as (A, C, L) (`_channel_view`): contiguous
(A = dim 0, L = the trailing dims), channels_last / channels_last_3d (C innermost: L = 1), channel-major (C, N, H, W)
storage (A = 1); a scalar weight likewise. Anything else (gaps, mixed layouts) takes the elementwise pass plus a
deterministic sum. With `enable()`, `F.prelu` / `nn.PReLU` reach the `_prelu_kernel` override on the autograd key
(`prelu` itself is CompositeImplicitAutograd: it checks and reshapes the weight to (1, C, 1, ...), then calls
`_prelu_kernel`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from .._cases import Draw, describe, rand_on, randn, refuse
from .._runtime import FLOAT_DTYPES, I32_MAX, cdiv, math_dtype, meta_key, next_pow2
from ..config import PlanCache, Tunable
from ..engines.multi_pointwise import MultiPointwise, check_output_mask
from ..engines.reduction import plan_view, run_plan
from ..errors import InvalidProblem, Unsupported
from ..launch import alloc
from ..launch.checks import _dense_strides, broadcast_shape, check_tensor, contiguous_strides
from ..launch.launcher import launch, launch_consts
from ..launch.tl_helpers import TL_MATH, cast_out
from ..registry import Case, register_op
from ..routing import native
from ..routing.autograd import STOCK_IN_AUTO, fused_autograd

_OP = "prelu_backward"
_OP_FULL = "_prelu_kernel_backward"


# ------------------------------------------------------------------------------------- elementwise (ATen's op)
@triton.jit
def _prelu_backward_math(g, x, w, _d, _s0, _s1, _flag: tl.constexpr):
    pos = x > 0
    return tl.where(pos, g, w * g), tl.where(pos, 0.0, x * g), g


_PRELU_FULL = MultiPointwise(_OP_FULL, _prelu_backward_math, ("grad_output", "self", "weight"),
                             ("grad_input", "grad_weight"))


def _kernel_backward_cases(device, dtype, size: str) -> list[Case]:
    shape = _SHAPES[size]
    n = math.prod(shape)
    el = torch.empty((), dtype=dtype).element_size()
    g, x = randn(shape, device, dtype), randn(shape, device, dtype)
    w = randn((1, shape[1], 1, 1), device, dtype, scale=0.25)
    return [Case(f"{'x'.join(map(str, shape))} weight (1, C, 1, 1)", (g, x, w), {}, bytes=(4 * n + w.numel()) * el,
                 elements=n)]


def _kernel_backward_samples(rng, device, dtype):
    """grad_output, self and weight of shapes that broadcast together (any of them the full shape), in every layout,
    special values too."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        shape = d.shape(edge)
        shapes = [shape, d.operand(shape), d.operand(shape)]
        rng.shuffle(shapes)
        g, x, w = (d.tensor(s) for s in shapes)
        yield Case(describe(grad_output=g, self=x, weight=w), (g, x, w))


def _kernel_backward_errors(device):
    t = rand_on(device)
    return [
        refuse("weight of another dtype", Unsupported, "weight", t(2, 3), t(2, 3), t(3, dtype=torch.float64)),
        refuse("shapes that do not broadcast", InvalidProblem, "grad_output/self/weight", t(2, 3), t(2, 3), t(2)),
        refuse("an int self", Unsupported, "self", t(2, 3), t(2, 3, dtype=torch.int64), t(3)),
    ]


# enable()'s route for _prelu_kernel_backward (stock's is deterministic): every problem where the native router replays
# the call (its host time is below stock's, and the kernel's GPU time at or below ATen's on every sweep case, H200:
# docs/tuning/prelu.md); on the Python router only from the size where the device time saved passes its extra host
# time (~20 us a call, H100), near 6M elements (f32, f64) and 3M (16-bit)
_PYTHON_ROUTE_MIN = {2: 3 << 20, 4: 6 << 20, 8: 6 << 20}


def _full_route(grad_output, self, weight) -> bool:
    return native.available() or (isinstance(self, torch.Tensor)
                                  and self.numel() >= _PYTHON_ROUTE_MIN.get(self.element_size(), 0))


@register_op(_OP_FULL, aten=(_OP_FULL,), exact=True, cases=_kernel_backward_cases, route=_full_route,
             samples=_kernel_backward_samples, errors=_kernel_backward_errors,
             route_doc="gradkern where the native router is built; on the Python router from 6M elements (f32, f64) "
                       "or 3M (16-bit), where the device time it saves passes the Python router's extra host time; "
                       "stock (deterministic) below")
def _prelu_kernel_backward(grad_output: torch.Tensor, self: torch.Tensor, weight: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's prelu backward: (x > 0 ? g : w*g, x > 0 ? 0 : x*g), both at the broadcast shape (w broadcast to x)."""
    spec = _checked.checked((_OP_FULL, *meta_key((grad_output, self, weight))),
                   lambda: _kernel_backward_spec(grad_output, self, weight))
    return _PRELU_FULL((grad_output, self, weight), (spec, spec))


_checked = PlanCache("kernels.prelu._checked")  # validated problems of both ops -> what their validation found


def _kernel_backward_spec(grad_output, self, weight) -> tuple:
    """_prelu_kernel_backward's validation; the results' (shape, dtype)."""
    named = (("grad_output", grad_output), ("self", self), ("weight", weight))
    for name, t in named:
        check_tensor(_OP_FULL, name, t)
    for name, t in named:
        if t.dtype != self.dtype:
            raise Unsupported(_OP_FULL, name, f"dtype {self.dtype} (the dtype of self)", t.dtype)
    return broadcast_shape(_OP_FULL, [n for n, _ in named], [t.shape for _, t in named]), self.dtype


# ------------------------------------------------------------------------------------- fused kernels
@triton.jit
def _prelu_rows_kernel(g, x, w, gi, part, A, C, L, NB, TILES, TPP, S,
                       MATH: tl.constexpr, HAS_GI: tl.constexpr, HAS_GW: tl.constexpr,
                       BA: tl.constexpr, BL: tl.constexpr, I64: tl.constexpr):
    # x is (A, C, L) contiguous. Program c*S + s walks tiles [s*TPP, (s+1)*TPP) of channel c's (A, L) plane, a
    # tile being BA rows x BL columns; it writes channel c's partial grad_weight to part[c, s] (part is (C, S)).
    pid = tl.program_id(0)
    c = pid // S
    s = pid - c * S
    wc = tl.load(w + c).to(MATH)
    acc = tl.zeros([BL], dtype=MATH)  # summed over the tile's rows each step: few registers, high occupancy
    for t in range(s * TPP, tl.minimum(s * TPP + TPP, TILES)):
        ab = t // NB
        a = ab * BA + tl.arange(0, BA)
        i = (t - ab * NB) * BL + tl.arange(0, BL)
        if I64:
            a = a.to(tl.int64)
        off = (a[:, None] * C + c) * L + i[None, :]
        mask = (a[:, None] < A) & (i[None, :] < L)
        xv = tl.load(x + off, mask=mask, other=0.0).to(MATH)
        gv = tl.load(g + off, mask=mask, other=0.0).to(MATH)
        pos = xv > 0
        if HAS_GI:
            tl.store(gi + off, cast_out(tl.where(pos, gv, wc * gv), gi.dtype.element_ty), mask=mask)
        if HAS_GW:
            acc += tl.sum(tl.where(pos, 0.0, xv * gv), axis=0)
    if HAS_GW:
        tl.store(part + pid, tl.sum(acc, axis=0))


@triton.jit
def _prelu_cols_kernel(g, x, w, gi, part, A, K, L, RPP, NKB, S,
                       MATH: tl.constexpr, HAS_GI: tl.constexpr, HAS_GW: tl.constexpr,
                       BA: tl.constexpr, BK: tl.constexpr, I64: tl.constexpr):
    # x is (A, K) row-major, column k of channel k // L. Program s*NKB + kb walks rows [s*RPP, (s+1)*RPP) of
    # columns [kb*BK, (kb+1)*BK), BA rows at a time, each step's loads issued before the previous step's math
    # and stores; it writes column k's partial to part[k, s]. part is (C, L, S): a channel's partials are
    # contiguous, so the second pass is one launch of a program a channel (although these stores do not
    # coalesce: bf16 channels_last 123.7 -> 107.9 us a call against (S, C, L), H200; docs/tuning/prelu.md)
    pid = tl.program_id(0)
    s = pid // NKB
    k = (pid - s * NKB) * BK + tl.arange(0, BK)
    kmask = k < K
    wk = tl.load(w + k // L, mask=kmask, other=0.0).to(MATH)
    acc = tl.zeros([BA, BK], dtype=MATH)  # rows are summed once at the end (a per-step sum crosses warps)
    a_end = tl.minimum(s * RPP + RPP, A)
    off, mask = _cols_step(s * RPP, a_end, k, kmask, K, BA, I64)
    xr = tl.load(x + off, mask=mask, other=0.0)
    gr = tl.load(g + off, mask=mask, other=0.0)
    for a0 in range(s * RPP, a_end, BA):
        off_n, mask_n = _cols_step(a0 + BA, a_end, k, kmask, K, BA, I64)  # (past the end: all masked)
        xn = tl.load(x + off_n, mask=mask_n, other=0.0)
        gn = tl.load(g + off_n, mask=mask_n, other=0.0)
        xv = xr.to(MATH)
        gv = gr.to(MATH)
        pos = xv > 0
        if HAS_GI:
            tl.store(gi + off, cast_out(tl.where(pos, gv, wk[None, :] * gv), gi.dtype.element_ty), mask=mask)
        if HAS_GW:
            acc += tl.where(pos, 0.0, xv * gv)
        off, mask, xr, gr = off_n, mask_n, xn, gn
    if HAS_GW:
        tl.store(part + k * S + s, tl.sum(acc, axis=0), mask=kmask)


@triton.jit
def _cols_step(a0, a_end, k, kmask, K, BA: tl.constexpr, I64: tl.constexpr):
    """The offsets and mask of the column kernel's step at row a0."""
    a = a0 + tl.arange(0, BA)
    if I64:
        a = a.to(tl.int64)
    return a[:, None] * K + k[None, :], (a[:, None] < a_end) & kmask[None, :]


@dataclass(frozen=True)
class PreluConfig:
    """The fused kernels' launch heuristics: functions of the shape and dtype only (never of timing), so the
    summation order is fixed. Figures: H200; the column kernel runs at about 90% of the copy ceiling, and the
    variants that found nothing faster are in docs/tuning/prelu.md."""

    tile_bytes: int = 8192  # the row kernel's bytes of each operand a program loads per loop step
    rows_tpp: int = 2  # tiles per program of the row kernel (one partial per program) ...
    # ... but, for the element sizes named, at most this many partials a channel (bf16, 64M elements, one weight:
    # 16384 took 7.2 us to sum; 8192: 0.1079 -> 0.1058 ms a call; f32 is fastest uncapped)
    rows_max_partials: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({2: 8192}))
    # (A, C, L) inputs with L >= this walk rows of L (the row kernel); smaller L (channels_last: L = 1) walk columns
    rows_min_l: int = 32
    # the column kernel: elements per loop step (any dtype), and it splits the rows until about this many programs
    # run (4096 / 4096 against 2048 / 2048: 1.03-1.07x)
    cols_tile: int = 4096
    cols_target_programs: int = 4096
    cols_min_rows: int = 256  # ... but at least this many rows a program (each writes BK partials, uncoalesced)
    # the column kernel's widest column block (wider rows take several programs a range of rows): 262144x256 bf16
    # 114.7 -> 108.3 us against one program of 256 columns
    cols_bk: int = 64
    rows_warps: int = 4  # the row kernel's warps
    cols_warps: int = 4  # the column kernel's
    i32_max: int = I32_MAX  # offsets past this take int64 index math (tests lower it to run that path)


CONFIG = Tunable("prelu", PreluConfig())


@dataclass(frozen=True)
class _Fused:
    rows: bool  # which kernel
    programs: int  # a 1-D grid
    args: tuple  # the kernel's integer arguments after the five pointers
    block: tuple[int, int]  # (BA, BL) or (BA, BK)
    warps: int
    part_shape: tuple[int, ...]  # the fp32/fp64 partials: (C, S) or (C, L, S)
    part_dims: tuple[int, ...]  # the dims of part that a channel's partials span
    i64: bool
    uid: int  # identifies the plan (so its kernel's specialisation) in the relaunch cache


_plans = PlanCache("kernels.prelu._plans")
_uids = itertools.count(1)


def _rows_plan(A: int, C: int, L: int, esize: int, cfg: PreluConfig) -> _Fused:
    tile = cfg.tile_bytes // esize
    bl = min(next_pow2(L), tile // 2)
    ba = min(next_pow2(A), max(1, tile // bl))
    nb = cdiv(L, bl)
    tiles = cdiv(A, ba) * nb
    split = cdiv(tiles, cfg.rows_tpp)
    split = min(split, cfg.rows_max_partials.get(esize, split))
    tpp = cdiv(tiles, split)
    split = cdiv(tiles, tpp)
    return _Fused(True, C * split, (A, C, L, nb, tiles, tpp, split), (ba, bl), cfg.rows_warps, (C, split), (1,),
                  A * C * L + tile > cfg.i32_max, next(_uids))


def _cols_plan(A: int, C: int, L: int, cfg: PreluConfig) -> _Fused:
    K = C * L
    bk = min(next_pow2(K), cfg.cols_bk)
    ba = min(next_pow2(A), max(1, cfg.cols_tile // bk))
    nkb = cdiv(K, bk)
    split = max(1, min(cdiv(cfg.cols_target_programs, nkb), cdiv(A, max(ba, cfg.cols_min_rows))))
    rpp = cdiv(cdiv(A, split), ba) * ba
    split = cdiv(A, rpp)
    tile = ba * bk
    return _Fused(False, nkb * split, (A, K, L, rpp, nkb, split), (ba, bk), cfg.cols_warps, (C, L, split), (1, 2),
                  A * K + tile > cfg.i32_max, next(_uids))


def _fused_plan(x: torch.Tensor, g: torch.Tensor, C: int) -> _Fused | None:
    """How the fused kernels see x (and g, in the same layout) for a weight of C elements; None if they can't."""
    key = (x.shape, x.stride(), g.stride(), x.dtype, C)
    if key in _plans:
        return _plans[key]
    plan = None
    n = x.numel()
    cfg = CONFIG.current
    same = all(a == b for k, a, b in zip(x.shape, x.stride(), g.stride(), strict=True) if k > 1)
    if same and _dense_strides(x):
        if C == 1:  # one weight: read flat
            plan = _rows_plan(1, 1, n, x.element_size(), cfg)
        else:
            A, L = _channel_view(x, C)
            plan = _rows_plan(A, C, L, x.element_size(), cfg) if L >= cfg.rows_min_l else _cols_plan(A, C, L, cfg)
    return _plans.remember(key, plan)


def _channel_view(x: torch.Tensor, C: int) -> tuple[int, int]:
    """(A, L) such that x, dense, is (A, C, L) in memory: A the elements of the dims stored outside dim 1 (the
    channels), L those inside it. Contiguous: (N, H*W...); channels_last: (N*H*W..., 1); channel-major (C, N, H, W)
    storage: (1, N*H*W); every element of x, g and grad_input (which share x's strides) at the same offset."""
    stride = x.stride(1) if x.shape[1] > 1 else 0
    A = math.prod(n for n, st in zip(x.shape, x.stride(), strict=True) if n > 1 and st > stride)
    return A, x.numel() // (A * C)


def _channel_shape(x: torch.Tensor, C: int) -> list[int]:
    """The shape `prelu` gives the weight to broadcast over x: 1 everywhere but C at dim 1."""
    shape = [1] * x.dim()
    if x.dim() > 1:
        shape[1] = C
    return shape


def _prelu_grads(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, need_input: bool, need_weight: bool):
    """(grad_input, grad_weight), grad_weight in weight's shape; weight holds 1 or x.size(1) elements, the
    channels of dim 1; grad has x's shape and dtype."""
    if x.numel() == 0:
        return (torch.empty_like(x) if need_input else None,
                torch.zeros_like(weight) if need_weight else None)
    key = ("call", x.shape, x.stride(), grad.stride(), x.dtype, grad.dtype, x.device, weight.shape, weight.stride(),
           need_input, need_weight)
    call = _plans.get(key)
    if call is None:
        call = _plans.remember(key, _call_plan(grad, x, weight, need_input, need_weight))
    if call.fused is None:  # a layout the fused kernels do not walk: elementwise pass + deterministic sum
        w = weight.reshape(call.w_shape)
        gi, gw = _PRELU_FULL((grad, x, w), ((x.shape, x.dtype) if need_input else None,
                                             (w.shape, w.dtype) if need_weight else None))
        return gi, gw.view(weight.shape) if gw is not None else None
    # the kernels index the weight densely (w + c): a weight that is not contiguous is copied
    w = weight if call.w_dense else weight.reshape(-1).contiguous()
    dev = x.device
    gi = alloc.empty(call.shape, x.dtype, dev, call.gi_strides) if need_input else None
    part = alloc.empty(call.fused.part_shape, call.acc, dev) if need_weight else None
    # after its first launch the compiled kernel is called directly: the call plan fixes the integer arguments
    # (so their specialisation), the pointers' dtypes, the output mask and the device (launch adds the alignment)
    launch(call.kernel, call.grid, (grad, x, w, gi if need_input else x, part if need_weight else x),
           call.fused.args, call.consts, call.device, (call.kernel, call))
    if not need_weight:
        return gi, None
    # the second, fixed-order pass over the per-program partials
    return gi, run_plan(call.rplan, part, call.w_out)


@dataclass(frozen=True, eq=False)  # hashed by identity: part of the relaunch key
class _Call:
    """What `_prelu_grads` does for one problem (layouts, dtypes, device, weight, output mask), worked out once."""

    fused: _Fused | None  # None: the elementwise pass and a sum
    w_shape: list  # (elementwise pass) the weight as it broadcasts over x
    w_dense: bool  # the weight's elements are contiguous: read in place
    shape: tuple  # x's, and grad_input's
    gi_strides: tuple  # grad_input's (empty_like(x)'s)
    acc: torch.dtype  # the partials'
    kernel: object
    grid: tuple
    consts: dict | None
    rplan: object  # the sum over the partials (None without grad_weight)
    w_out: tuple  # grad_weight's shape
    device: int


def _call_plan(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, need_input: bool, need_weight: bool
               ) -> _Call:
    C = weight.numel()
    plan = _fused_plan(x, grad, C)
    consts, rplan = _launch_consts(plan, x.dtype, need_input, need_weight) if plan is not None else (None, None)
    return _Call(fused=plan, w_shape=_channel_shape(x, C), w_dense=weight.is_contiguous(), shape=tuple(x.shape),
                 gi_strides=torch.empty_like(x, device="meta").stride(), acc=math_dtype(x.dtype),
                 kernel=_prelu_rows_kernel if plan is None or plan.rows else _prelu_cols_kernel,
                 grid=(plan.programs,) if plan is not None else (), consts=consts, rplan=rplan,
                 w_out=tuple(weight.shape), device=x.get_device())


def _launch_consts(plan: _Fused, dtype: torch.dtype, need_input: bool, need_weight: bool) -> tuple:
    """The fused kernel's constexprs and the plan of the sum over its partials (None without grad_weight)."""
    mdt = math_dtype(dtype)
    consts = launch_consts({"MATH": TL_MATH[mdt], "HAS_GI": need_input, "HAS_GW": need_weight,
                            "BA": plan.block[0], ("BL" if plan.rows else "BK"): plan.block[1], "I64": plan.i64},
                           plan.warps)
    strides = contiguous_strides(plan.part_shape)
    rplan = plan_view(plan.part_shape, strides, mdt, plan.part_dims, op=_OP, out_dtype=dtype) if need_weight else None
    return consts, rplan


# ------------------------------------------------------------------------------------- the fused op
def _check_prelu(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """PyTorch's rule for prelu's weight: 0-d or 1-D, one element or x.size(1) of them (1 for a 1-D x)."""
    if weight.dim() > 1:
        raise InvalidProblem(op, "weight", "a 0-d or 1-D tensor", f"a {weight.dim()}-d tensor")
    if weight.numel() != 1:
        if x.dim() == 0:
            raise InvalidProblem(op, "weight", "one element for a 0-d input", f"{weight.numel()} elements")
        channels = x.shape[1] if x.dim() > 1 else 1
        if weight.numel() != channels:
            raise InvalidProblem(op, "weight", f"1 or {channels} elements (the channels: dim 1 of the input)",
                                 f"{weight.numel()} elements")


def _prelu_backward_reference(grad_output, self, weight, output_mask=(True, True)):
    """What stock autograd computes: prelu reshapes the weight to (1, C, 1, ...), `_prelu_kernel_backward` gives
    the full-shape grad_weight, autograd sums it to the weight's shape."""
    w = weight.reshape(_channel_shape(self, weight.numel())) if self.dim() != weight.dim() else weight
    gi, gw = torch.ops.aten._prelu_kernel_backward(grad_output, self, w)
    return gi if output_mask[0] else None, gw.sum_to_size(w.shape).view(weight.shape) if output_mask[1] else None


_SHAPES = {"tiny": (2, 8, 16, 16), "small": (2, 8, 16, 16), "check": (16, 64, 32, 32), "large": (64, 64, 128, 128)}


def _prelu_cases(device, dtype, size: str) -> list[Case]:
    shape = _SHAPES[size]
    n, C = math.prod(shape), shape[1]
    el = torch.empty((), dtype=dtype).element_size()
    g, x = randn(shape, device, dtype), randn(shape, device, dtype)
    w = randn((C,), device, dtype, scale=0.25)
    cl = torch.channels_last
    g2, x2 = g.view(n // 256, 256), x.view(n // 256, 256)
    w2 = randn((256,), device, dtype, scale=0.25)
    label = "x".join(map(str, shape))
    nbytes = lambda c: (3 * n + 2 * c) * el  # g and x read, grad_input written; the weight read, grad_weight written
    return [
        Case(f"{label} per-channel", (g, x, w), {}, bytes=nbytes(C), elements=n),
        Case(f"{label} channels_last", (g.contiguous(memory_format=cl), x.contiguous(memory_format=cl), w), {},
             bytes=nbytes(C), elements=n),
        Case(f"{label} one weight", (g, x, w[:1]), {}, bytes=nbytes(1), elements=n),
        Case(f"{n // 256}x256 (N, C)", (g2, x2, w2), {}, bytes=nbytes(256), elements=n),
    ]


def _prelu_samples(rng, device, dtype):
    """self of rank 0 to 5 (channels_last too) with one weight or one a channel (dim 1), as a 1-D or 0-d tensor;
    grad_output sometimes self itself; every output_mask. Values on the k/8 grid (x = 0 too: the w * g branch),
    which keeps the weight's sums exact, or special ones."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        shape = d.shape(edge, ranks=(0, 5))
        n_w = rng.choice((1, shape[1] if len(shape) > 1 else 1))
        w = d.tensor(rng.choice(((1,), ())) if n_w == 1 else (n_w,), "grid")
        x = d.tensor(shape, kinds=("grid", "grid", "special"), huge=False)
        g = x if rng.random() < 0.2 else d.tensor(shape, kinds=("grid", "grid", "special"), huge=False)
        mask = (rng.random() < 0.8, rng.random() < 0.8)
        yield Case(describe(grad_output=g, self=x, weight=w, output_mask=mask), (g, x, w, mask))


def _prelu_errors(device):
    t = rand_on(device)
    return [
        refuse("a 2-D weight", InvalidProblem, "weight", t(2, 3, 4), t(2, 3, 4), t(1, 3)),
        refuse("a weight per dim 2 entry", InvalidProblem, "weight", t(2, 3, 4), t(2, 3, 4), t(4)),
        refuse("three weights for a 0-d self", InvalidProblem, "weight", t(), t(), t(3)),
        refuse("grad_output of another shape", InvalidProblem, "grad_output", t(2, 3, 5), t(2, 3, 4), t(3)),
        refuse("weight of another dtype", Unsupported, "weight", t(2, 3, 4), t(2, 3, 4), t(3, dtype=torch.float16)),
        refuse("output_mask of one", InvalidProblem, "output_mask", t(2, 3, 4), t(2, 3, 4), t(3), (True,)),
    ]


def _canonical(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `_prelu_kernel`'s weight is prelu's: one element, or x.size(1) of them along dim 1 only."""
    if weight.numel() == 1:
        return True
    return (x.dim() >= 2 and weight.dim() == x.dim() and weight.shape[1] == x.shape[1]
            and weight.numel() == x.shape[1])


def _kernel_accepts(self, weight) -> bool:
    return self.dtype in FLOAT_DTYPES and weight.dtype == self.dtype


def _kernel_save(ctx, _needs, self, weight) -> None:
    ctx.save_for_backward(self, weight)


def _kernel_fused(ctx, grad, needs):
    x, weight = ctx.saved_tensors
    if grad.shape == x.shape and _canonical(x, weight):
        return _prelu_grads(grad, x, weight, needs[0], needs[1])
    # a weight that broadcasts some other way (only a direct `_prelu_kernel` call makes one)
    return _PRELU_FULL((grad, x, weight), ((x.shape, x.dtype) if needs[0] else None,
                                           (weight.shape, weight.dtype) if needs[1] else None))[:2]


def _kernel_composite(ctx, grad, needs):
    x, weight = ctx.saved_tensors
    gi, gw = torch.ops.aten._prelu_kernel_backward(grad, x, weight)
    return gi.sum_to_size(x.shape) if needs[0] else None, gw.sum_to_size(weight.shape) if needs[1] else None


def _kernel_examples(device, dtype):
    x = randn((2, 3, 4), device, dtype).requires_grad_(True)
    w = randn((1, 3, 1), device, dtype).requires_grad_(True)
    return {"_prelu_kernel": ((x, w), {})}


_KERNEL_OVERRIDE = fused_autograd(_OP, "_prelu_kernel", accepts=_kernel_accepts, save=_kernel_save,
                                  fused=_kernel_fused, composite=_kernel_composite)


@register_op(_OP, aten={"_prelu_kernel": _KERNEL_OVERRIDE}, dispatch="autograd", accumulates=True,
             reference=_prelu_backward_reference, cases=_prelu_cases, aten_examples=_kernel_examples,
             samples=_prelu_samples, errors=_prelu_errors, **STOCK_IN_AUTO)
def prelu_backward(grad_output: torch.Tensor, self: torch.Tensor, weight: torch.Tensor,
                   output_mask: Sequence[bool] = (True, True)) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of torch.prelu(self, weight) in one pass: (grad_input, grad_weight), grad_weight in weight's
    shape (reduced in the same pass, deterministically); None where output_mask says so."""
    mask = check_output_mask(_OP, output_mask, 2)
    _checked.checked((_OP, *meta_key((grad_output, self, weight))), lambda: _check_backward(grad_output, self, weight))
    return _prelu_grads(grad_output, self, weight, *mask)


def _check_backward(grad_output, self, weight) -> bool:
    """prelu_backward's validation (True: passed)."""
    named = (("grad_output", grad_output), ("self", self), ("weight", weight))
    for name, t in named:
        check_tensor(_OP, name, t)
    for name, t in named:
        if t.dtype != self.dtype:  # PyTorch's rule: no type promotion
            raise Unsupported(_OP, name, f"dtype {self.dtype} (the dtype of self)", t.dtype)
        if t.device != self.device:
            raise Unsupported(_OP, name, f"a tensor on {self.device} (the device of self)", t.device)
    _check_prelu(_OP, self, weight)
    if grad_output.shape != self.shape:
        raise InvalidProblem(_OP, "grad_output", f"shape {tuple(self.shape)} (the shape of self)",
                             tuple(grad_output.shape))
    return True
