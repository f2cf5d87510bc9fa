#!/usr/bin/env python
"""Randomized differential fuzz of gradkern against stock PyTorch (a standalone script: not part of the tests).

    TRITON_INTERPRET=1 python scripts/fuzz.py --seed 1 --minutes 10          # CPU, through Triton's interpreter
    python scripts/fuzz.py --seed 1 --minutes 10 --log fuzz-1.jsonl           # (on a GPU: compiled kernels)
    python scripts/fuzz.py --replay 1:123                                      # rerun one case, verbosely

Each case is drawn from (seed, case index) alone, so any case replays exactly with --replay SEED:IDX. Three entry
points:

* direct: `gradkern.ops.<op>(...)` against the ATen op (or autograd's formula run by stock PyTorch), with random
  shapes (rank 0-5 where the op allows, sizes 0-7), layouts (permuted, sliced with steps, offset, expanded with
  stride 0, channels_last), dtypes (f32/f16/bf16/f64, sometimes mixed where ATen promotes), values (±0, ±inf, NaN,
  subnormals - not bf16 ones under the interpreter -, values at and next to the op's thresholds) and scalar
  parameters; out= / grad_input= into poisoned outputs of random (non-contiguous) layouts, sometimes in place;
* autograd: the forward ops under `gradkern.use()` / `gradkern.enable()` against stock autograd with the same
  inputs, grad_output of a random layout, a random subset of inputs requiring grad;
* error: ill-posed or refused problems; where stock raises, gradkern must raise a named gradkern error (or the same
  torch error type) and leave out= and the inputs untouched.

Comparison, per the guarantees (README "Precision guarantee", gradkern.testing.TOLERANCES): selection and
exact-scaling results bit for bit against stock at the same dtype; summing results within the dtype's tolerance
of stock PyTorch in float64 (the tolerance grows with sqrt(terms) for f32/f64, as gradkern.testing does); a summing
result that misses the tolerance while stock at the same dtype misses it too is reported as "ill-conditioned"
(not counted as a failure). Documented deliberate differences are applied to stock's result before comparing
and counted: NaN x in the shrink / elu backwards takes ATen's CUDA convention (g, g*scale) where ATen's vectorised
CPU kernels give 0 / NaN; a pad backward of an empty grad_output is zeros, where stock's CPU reflection_pad1d/3d
backwards return uninitialised memory.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import random
import sys
import time
import traceback
import warnings

import torch

if not os.environ.get("TRITON_INTERPRET") and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import torch.nn.functional as F  # noqa: E402

import gradkern  # noqa: E402
from gradkern import ops  # noqa: E402
from gradkern.errors import GradkernError  # noqa: E402
from gradkern.testing import TOLERANCES  # noqa: E402

DEV = gradkern.device()
INTERP = DEV.type == "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
warnings.filterwarnings("ignore")


class Skip(Exception):
    """The drawn case is not meaningful (e.g. both sides refuse it in the autograd entry): not counted."""


class Mismatch(Exception):
    def __init__(self, category: str, msg: str):
        super().__init__(f"{category}: {msg}")
        self.category, self.msg = category, msg


# ----------------------------------------------------------------------------------------------- values
def _math(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _neighbours(v: float, dtype) -> list[float]:
    """v rounded to dtype and its two neighbours in dtype."""
    t = torch.tensor(v, dtype=torch.float64).to(dtype)
    if not torch.isfinite(t):
        return [t.item()]
    it = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
    b = t.view(it).item()
    out = [t.item()]
    for step in (1, -1):
        nb = b + step
        lim = torch.iinfo(it)
        if lim.min <= nb <= lim.max:
            u = torch.tensor(nb, dtype=it).view(dtype)
            if torch.isfinite(u):
                out.append(u.item())
    return out


def specials(dtype, thresholds=()) -> list[float]:
    fi = torch.finfo(dtype)
    vals = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -2.0, fi.max, -fi.max, fi.tiny, -fi.tiny]
    if dtype != torch.bfloat16 or not INTERP:  # the interpreter loads bf16 subnormals as 0
        sub = fi.tiny * fi.eps
        vals += [sub, -sub, fi.tiny / 4, -fi.tiny / 2]
    for p in thresholds:
        for q in (p, -p):
            vals += _neighbours(q, dtype)
    return vals


def rand_values(ctx, shape, dtype, thresholds=(), finite=False, kind=None, huge=True) -> torch.Tensor:
    """Random CPU values of `dtype` (made in float64 and rounded). huge=False: no values near the dtype's max
    (inputs of sums: max + -max cancels to whatever the order leaves, no tolerance can hold there)."""
    n = math.prod(shape)
    r = ctx.r
    kind = kind or r.choice(["normal", "normal", "grid", "special", "special", "threshold"])
    scale = r.choice([1.0, 1.0, 3.0, 0.25, 10.0, 1000.0] if huge else [1.0, 1.0, 3.0, 0.25, 10.0])
    t = torch.randn(n, generator=ctx.g, dtype=torch.float64) * scale
    if kind == "grid":
        t = torch.randint(-12, 13, (n,), generator=ctx.g).double() / 4
    elif kind in ("special", "threshold") and n:
        pool = specials(dtype, thresholds) if kind == "special" else []
        for p in thresholds:
            for q in (p, -p):
                pool += _neighbours(q, dtype) * 3
        if kind == "threshold":
            pool += [0.0, -0.0, math.nan]
        if finite:
            pool = [v for v in pool if math.isfinite(v) and abs(v) < 1e4]
        if not huge:
            pool = [v for v in pool if not (math.isfinite(v) and abs(v) > 1e4)]
        if pool:
            frac = r.choice([0.1, 0.3, 0.6, 1.0])
            pick = torch.rand(n, generator=ctx.g) < frac
            idx = torch.randint(0, len(pool), (n,), generator=ctx.g)
            t = torch.where(pick, torch.tensor(pool, dtype=torch.float64)[idx], t)
    t = t.to(dtype)
    if dtype == torch.bfloat16 and INTERP:  # no bf16 subnormals under the interpreter
        t = torch.where(t.abs() < torch.finfo(dtype).tiny, torch.zeros_like(t) * torch.sign(t), t)
    return t.view(shape)


# ----------------------------------------------------------------------------------------------- layouts
LAYOUTS = ("contiguous", "permuted", "sliced", "offset", "expanded", "channels_last", "perm_sliced")


def build(ctx, vals: torch.Tensor, layout: str) -> torch.Tensor:
    """A tensor on DEV equal to `vals` (already expanded where layout == "expanded") in `layout`."""
    shape = tuple(vals.shape)
    dt = vals.dtype
    if layout in ("permuted", "perm_sliced") and vals.dim() >= 2:
        p = list(range(vals.dim()))
        ctx.r.shuffle(p)
        inv = [p.index(i) for i in range(len(p))]
        inner = build(ctx, vals.permute(p).contiguous(), "sliced" if layout == "perm_sliced" else "contiguous")
        return inner.permute(inv)
    if layout == "sliced" and vals.dim() >= 1:
        steps = [ctx.r.choice([1, 2, 3]) for _ in shape]
        starts = [ctx.r.choice([0, 0, 1]) for _ in shape]
        big = torch.full([s * st + a + 1 for s, st, a in zip(shape, steps, starts)], math.nan, dtype=dt, device=DEV)
        view = big[tuple(slice(a, a + s * st, st) for s, st, a in zip(shape, steps, starts))]
        view.copy_(vals)
        return view
    if layout == "offset":
        flat = torch.full((math.prod(shape) + 3,), math.nan, dtype=dt, device=DEV)
        off = ctx.r.choice([1, 2, 3])
        t = flat[off:off + math.prod(shape)].view(shape)
        t.copy_(vals)
        return t
    if layout == "channels_last" and vals.dim() in (4, 5):
        fmt = torch.channels_last if vals.dim() == 4 else torch.channels_last_3d
        return vals.to(DEV).contiguous(memory_format=fmt)
    return vals.to(DEV).contiguous()


HUGE = [True]  # per case: False for the inputs of summing ops


def make(ctx, shape, dtype, *, thresholds=(), finite=False, layouts=LAYOUTS, kind=None, name="t"):
    """A random input of `shape` and `dtype` on DEV in a random layout; records it in ctx.desc."""
    layout = ctx.r.choice(layouts)
    base_shape = list(shape)
    if layout == "expanded":
        dims = [i for i, s in enumerate(shape) if s > 1]
        if dims:
            for i in ctx.r.sample(dims, ctx.r.randint(1, len(dims))):
                base_shape[i] = 1
        inner = ctx.r.choice(["contiguous", "sliced", "offset"])
    vals = rand_values(ctx, base_shape, dtype, thresholds, finite, kind, huge=HUGE[0])
    if layout == "expanded":
        t = build(ctx, vals, inner).expand(shape)
    else:
        t = build(ctx, vals, layout)
    ctx.note(name, t)
    return t


def make_out(ctx, shape, dtype, name="out", allow_bad=False):
    """A NaN-poisoned output tensor of a random non-expanded layout."""
    layout = ctx.r.choice(["contiguous", "permuted", "sliced", "offset", "channels_last", "perm_sliced"])
    t = build(ctx, torch.full(shape, math.nan, dtype=dtype), layout)
    ctx.note(name, t)
    return t


# ----------------------------------------------------------------------------------------------- shapes
def rand_shape(ctx, lo=0, hi=5, max_numel=2000, size_hi=7) -> tuple[int, ...]:
    r = ctx.r
    rank = r.randint(lo, hi)
    for _ in range(20):
        shape = []
        for _ in range(rank):
            c = r.random()
            shape.append(1 if c < 0.2 else 0 if c < 0.04 + 0.2 else r.randint(1, size_hi))
        if math.prod(shape) <= max_numel:
            return tuple(shape)
    return tuple([1] * rank)


def broadcast_variant(ctx, shape) -> tuple[int, ...]:
    """A shape that broadcasts to `shape`: leading dims dropped, some dims set to 1."""
    r = ctx.r
    if r.random() < 0.5:
        return tuple(shape)
    drop = r.randint(0, len(shape))
    out = list(shape[drop:])
    for i in range(len(out)):
        if r.random() < 0.3:
            out[i] = 1
    return tuple(out)


# ----------------------------------------------------------------------------------------------- comparison
def _bits(t):
    it = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
    return t.contiguous().view(it)


def bit_diff(a: torch.Tensor, e: torch.Tensor, what: str) -> str | None:
    """None if same shape, dtype and bits (NaN == NaN whatever the payload); else a message."""
    if tuple(a.shape) != tuple(e.shape):
        return f"{what}: shape {tuple(a.shape)} vs stock {tuple(e.shape)}"
    if a.dtype != e.dtype:
        return f"{what}: dtype {a.dtype} vs stock {e.dtype}"
    a, e = a.detach().cpu(), e.detach().cpu()
    if not a.is_floating_point():
        return None if torch.equal(a, e) else f"{what}: values differ"
    same = (_bits(a) == _bits(e)) | (torch.isnan(a) & torch.isnan(e))
    if bool(same.all()):
        return None
    idx = tuple((~same).nonzero()[0].tolist())
    return (f"{what}: {int((~same).sum())}/{a.numel()} elements differ in bits; first at {list(idx)}: "
            f"gradkern {a[idx].item()!r} vs stock {e[idx].item()!r}")


def close_diff(a: torch.Tensor, ref64: torch.Tensor, what: str, summed_from: int = 0) -> str | None:
    """None if `a` is within its dtype's tolerance of the float64 reference (rounded to a's dtype first)."""
    if tuple(a.shape) != tuple(ref64.shape):
        return f"{what}: shape {tuple(a.shape)} vs stock {tuple(ref64.shape)}"
    dtype = a.dtype
    terms = summed_from // a.numel() if summed_from and a.numel() else 1
    grow = math.sqrt(max(terms, 1)) if dtype in (torch.float32, torch.float64) else 1.0
    atol, rtol = (t * grow for t in TOLERANCES[dtype])
    exp = ref64.detach().cpu().to(dtype).double()
    act = a.detach().cpu().double()
    ok = torch.isclose(act, exp, rtol=rtol, atol=atol, equal_nan=True)
    if bool(ok.all()):
        return None
    idx = tuple((~ok).nonzero()[0].tolist())
    return (f"{what}: {int((~ok).sum())}/{a.numel()} elements outside tolerance (atol {atol:g}, rtol {rtol:g}); "
            f"first at {list(idx)}: gradkern {act[idx].item()!r} vs stock(f64) {exp[idx].item()!r}")


def compare(ctx, gk, same, ref64, what, exact: bool, summed_from=0, stock_dtype=None):
    """gradkern's `gk` vs stock at the same dtype (`same`) and in float64 (`ref64`)."""
    if gk is None or same is None:
        if (gk is None) != (same is None):
            raise Mismatch("grad-presence", f"{what}: gradkern {'None' if gk is None else 'a tensor'}, stock "
                           f"{'None' if same is None else 'a tensor'}")
        return
    if same is not None and gk.dtype != same.dtype:
        raise Mismatch("dtype", f"{what}: gradkern {gk.dtype} vs stock {same.dtype}")
    d = bit_diff(gk, same, what)
    if d is None:
        return
    if interp_bf16_subnormal(gk, same):
        ctx.counts["interp-bf16-subnormal"] += 1
        return
    if exact:
        raise Mismatch("bits", d)
    c = close_diff(gk, ref64, what, summed_from)
    if c is None:
        ctx.counts["bits-differ-within-tol"] += 1
        return
    if close_diff(same, ref64, what, summed_from) is not None:
        ctx.counts["ill-conditioned"] += 1
        ctx.soft.append(f"ill-conditioned {c}")
        return
    raise Mismatch("tolerance", c)


def interp_bf16_subnormal(a, e) -> bool:
    """Under the interpreter, bf16 subnormal results are unreliable (it flushes them): every differing element
    is a bf16 subnormal on one side and a zero or subnormal on the other."""
    if not INTERP or a.dtype != torch.bfloat16 or a.shape != e.shape:
        return False
    a, e = a.detach().cpu().float(), e.detach().cpu().float()
    diff = ~((a == e) | (torch.isnan(a) & torch.isnan(e)))
    diff |= (a == 0) & (e == 0) & (torch.signbit(a) != torch.signbit(e))
    tiny = torch.finfo(torch.bfloat16).tiny
    sub = lambda t: t.abs() < tiny  # noqa: E731  (zero or subnormal)
    return bool(diff.any()) and bool((sub(a) & sub(e))[diff].all())


def sum_to(t: torch.Tensor, shape) -> torch.Tensor:
    """autograd's sum_to: `t` itself where it has the shape already (Tensor.sum_to_size sums a 0-d tensor anyway,
    turning -0.0 into 0.0)."""
    return t if tuple(t.shape) == tuple(shape) else t.sum_to_size(shape)


def clone_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` with the same sizes, strides and storage offset (overlapping layouts included)."""
    c = torch.empty(0, dtype=t.dtype, device=t.device)
    c.set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())
    return c


def snapshot(ts):
    return [(t, t.detach().clone()) for t in ts if isinstance(t, torch.Tensor)]


def check_untouched(snap, what="input"):
    for t, before in snap:
        if bit_diff(t, before, what) is not None:
            raise Mismatch("wrote-input", f"gradkern changed an {what} ({tuple(t.shape)}, strides {t.stride()})")


# ----------------------------------------------------------------------------------------------- context
class Ctx:
    def __init__(self, seed: int, idx: int):
        self.seed, self.idx = seed, idx
        self.r = random.Random(f"{seed}:{idx}")
        self.g = torch.Generator().manual_seed(self.r.getrandbits(62))
        self.desc: list[str] = []
        self.counts: collections.Counter = collections.Counter()
        self.soft: list[str] = []

    def note(self, name, t=None, **kw):
        if isinstance(t, torch.Tensor):
            self.desc.append(f"{name}: {str(t.dtype)[6:]} {tuple(t.shape)} strides {t.stride()} "
                             f"off {t.storage_offset()}")
        elif t is not None:
            self.desc.append(f"{name}={t!r}")
        for k, v in kw.items():
            self.desc.append(f"{k}={v!r}")


def stock():
    return gradkern.use(False)


def run_both(stock_fn, gk_fn):
    """(stock result or exception, gradkern result or exception)."""
    try:
        with stock():
            s = stock_fn()
        s_err = None
    except Exception as e:  # noqa: BLE001
        s, s_err = None, e
    try:
        g = gk_fn()
        g_err = None
    except Exception as e:  # noqa: BLE001
        g, g_err = None, e
    return s, s_err, g, g_err


def judge_errors(ctx, s_err, g_err, *, deliberate: str | None = None):
    """Error behaviour: both raise (gradkern a named error or stock's type) -> True (done); neither -> False."""
    if s_err is None and g_err is None:
        return False
    if s_err is not None and g_err is not None:
        if isinstance(g_err, GradkernError) or type(g_err) is type(s_err):
            ctx.counts["both-raise"] += 1
            return True
        raise Mismatch("unnamed-error", f"stock {type(s_err).__name__}: {str(s_err)[:150]} | gradkern "
                       f"{type(g_err).__name__}: {str(g_err)[:300]}")
    if s_err is not None:
        raise Mismatch("no-error", f"stock raises {type(s_err).__name__}: {str(s_err)[:200]}; gradkern returns")
    if deliberate:
        ctx.counts[f"deliberate:{deliberate}"] += 1
        return True
    if isinstance(g_err, GradkernError):
        raise Mismatch("gradkern-refuses", f"stock succeeds; gradkern {type(g_err).__name__}: {str(g_err)[:300]}")
    raise Mismatch("gradkern-crash", f"stock succeeds; gradkern {type(g_err).__name__}: {str(g_err)[:300]}\n"
                   + "".join(traceback.format_exception(g_err)[-6:]))


# ----------------------------------------------------------------------------------------------- direct: pointwise
POINTWISE = ("hardsigmoid_backward", "softshrink_backward", "hardshrink_backward", "elu_backward", "hardshrink")


def rand_lambd(ctx, dtype, nonneg):
    r = ctx.r
    v = r.choice([0.5, 0.5, 0.0, 1.0, 3.0, 0.1, 1 / 3, 2.5, 1e-30, 1e-6, 0.3])
    if not nonneg and r.random() < 0.2:
        v = -v
    if r.random() < 0.1:
        v = torch.tensor(v, dtype=r.choice(DTYPES))  # a 0-d tensor lambd
    return v


def rand_elu_params(ctx):
    r = ctx.r
    kind = r.choice(["elu", "celu", "selu", "random"])
    if kind == "elu":
        a = r.choice([1.0, 0.5, 2.0, 0.0, 1e-3])
        return a, 1.0, 1.0
    if kind == "celu":
        a = r.choice([1.0, 0.5, 2.0, 3.0, 1e-3, 1.7])
        return a, 1.0, 1.0 / a
    if kind == "selu":
        return 1.6732632423543772, 1.0507009873554805, 1.0
    pick = lambda: r.choice([0.0, 1.0, -1.0, 0.3, 2.0, 1e-3, 100.0, -0.5, 1e-30])  # noqa: E731
    return pick(), pick(), pick()


def pointwise_direct(ctx, op):
    r = ctx.r
    shape = rand_shape(ctx)
    d0 = r.choice(DTYPES)
    mixed = r.random() < 0.2
    d1 = r.choice(DTYPES) if mixed else d0
    gshape = broadcast_variant(ctx, shape)
    xshape = broadcast_variant(ctx, shape) if gshape == tuple(shape) else tuple(shape)
    if r.random() < 0.5:  # swap which operand carries the full shape
        gshape, xshape = xshape, gshape
    if op == "hardshrink":
        xshape = shape
    params = ()
    thresholds = ()
    if op == "hardsigmoid_backward":
        thresholds = (3.0,)
    elif op in ("softshrink_backward", "hardshrink_backward", "hardshrink"):
        lam = rand_lambd(ctx, d0, op == "softshrink_backward")
        params = (lam,)
        lv = float(lam)
        thresholds = (abs(lv),) if math.isfinite(lv) else ()
    else:
        alpha, scale, iscale = rand_elu_params(ctx)
        is_result = r.random() < 0.3
        if is_result and alpha < 0:
            alpha = -alpha
        params = (alpha, scale, iscale, is_result)
    ctx.note("op", op)
    ctx.note("params", params)
    x = make(ctx, xshape, d1 if op != "hardshrink" else d0, thresholds=thresholds, name="x")
    g = make(ctx, gshape, d0, name="g") if op != "hardshrink" else None
    if g is not None and r.random() < 0.1:  # 0-d grad of another dtype
        g = make(ctx, (), r.choice(DTYPES), name="g0d")
    bshape = tuple(torch.broadcast_shapes(*(t.shape for t in (g, x) if t is not None)))
    rdt = torch.result_type(g, x) if g is not None else x.dtype
    kw = {}
    out = None
    outkw = "out" if op == "hardshrink" else "grad_input"
    c = r.random()
    if c < 0.3:
        out = make_out(ctx, bshape, rdt)
        kw[outkw] = out
    elif c < 0.4 and g is not None and tuple(g.shape) == bshape and g.dtype == rdt \
            and torch._debug_has_internal_overlap(g) == 0:
        g = g.clone() if r.random() < 0.5 else g
        out = g  # in place into grad
        kw[outkw] = out
        ctx.note("in-place into g")
    elif c < 0.45 and op == "hardshrink" and torch._debug_has_internal_overlap(x) == 0:
        x = x.clone()
        out = x
        kw[outkw] = out
        ctx.note("in-place into x")

    sparams = tuple(float(p) if isinstance(p, torch.Tensor) else p for p in params)  # ATen's schema: a number
    if op == "hardshrink":
        args = (x, *params)
        sargs = (x, *sparams)
        aten = torch.ops.aten.hardshrink
    elif op == "elu_backward":
        args = sargs = (g, *params, x)
        aten = torch.ops.aten.elu_backward
    else:
        args = (g, x, *params)
        sargs = (g, x, *sparams)
        aten = getattr(torch.ops.aten, op)
    # stock first, on copies (the in-place call overwrites g / x)
    copies = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in sargs)
    snap = snapshot([a for a in args if a is not out])
    s, s_err, gk, g_err = run_both(lambda: aten(*copies), lambda: getattr(ops, op)(*args, **kw))
    if judge_errors(ctx, s_err, g_err):
        if g_err is not None and out is not None and out not in args:
            if not torch.isnan(out.float()).all() and out.numel():
                raise Mismatch("wrote-out-on-error", "gradkern wrote out= before raising")
        return
    check_untouched(snap)
    if out is not None and gk is not out:
        raise Mismatch("out-identity", "gradkern did not return the out= tensor")
    exp = expected_pointwise(ctx, op, s, copies)
    if op == "elu_backward":
        with stock():
            ref = aten(*_f64(copies))
        ref = nan_adjust_elu(ref.double(), _f64(copies), torch.float64)
        compare(ctx, gk, exp, ref, op, exact=False)
    else:
        compare(ctx, gk, exp, None, op, exact=True)


def _f64(args):
    return tuple(a.detach().double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def nan_adjust_elu(out, args, dtype):
    g, alpha, scale, iscale, is_result, x = args
    xb = x.expand(out.shape)
    gs = (g.to(_math(dtype)) * _round(float(scale), _math(dtype))).to(dtype).expand(out.shape)
    return torch.where(torch.isnan(xb), gs, out)


def _round(v, dt):
    return torch.tensor(v, dtype=torch.float64).to(dt).item()


def expected_pointwise(ctx, op, s, args):
    """Stock's result with the documented CUDA NaN convention applied (counted where it changes something)."""
    if op in ("softshrink_backward", "hardshrink_backward"):
        g, x = args[0], args[1]
        adj = torch.where(torch.isnan(x.expand(s.shape)), g.to(s.dtype).expand(s.shape), s)
    elif op == "elu_backward":
        adj = nan_adjust_elu(s, args, s.dtype)
    else:
        return s
    if bit_diff(adj, s, "") is not None:
        ctx.counts["deliberate:nan-x-cuda-convention"] += 1
    return adj


# ----------------------------------------------------------------------------------------------- direct: prelu
def prelu_kernel_direct(ctx):
    r = ctx.r
    shape = rand_shape(ctx)
    dt = r.choice(DTYPES)
    shapes = [tuple(shape), broadcast_variant(ctx, shape), broadcast_variant(ctx, shape)]
    r.shuffle(shapes)
    g = make(ctx, shapes[0], dt, name="g")
    x = make(ctx, shapes[1], dt, name="x")
    w = make(ctx, shapes[2], dt, name="w")
    snap = snapshot([g, x, w])
    s, s_err, gk, g_err = run_both(lambda: torch.ops.aten._prelu_kernel_backward(g, x, w),
                                   lambda: ops._prelu_kernel_backward(g, x, w))
    if judge_errors(ctx, s_err, g_err):
        return
    check_untouched(snap)
    for i in range(2):
        compare(ctx, gk[i], s[i], None, f"_prelu_kernel_backward[{i}]", exact=True)


def prelu_weight(ctx, x, dt, name="w"):
    r = ctx.r
    C = x.shape[1] if x.dim() > 1 else 1
    n = r.choice([1, C, C]) if x.dim() else 1
    wshape = r.choice([(n,), (n,)] + ([()] if n == 1 else []))
    return make(ctx, wshape, dt, name=name)


def prelu_x(ctx, dt, lo=0):
    r = ctx.r
    shape = rand_shape(ctx, lo=lo)
    if len(shape) >= 2 and r.random() < 0.5:  # more channels, sometimes C == W
        shape = list(shape)
        shape[1] = r.randint(2, 9)
        if r.random() < 0.3:
            shape[-1] = shape[1]
        shape = tuple(shape)
        if math.prod(shape) > 3000:
            shape = tuple(min(s, 3) for s in shape)
    return make(ctx, shape, dt, name="x")


def prelu_direct(ctx):
    r = ctx.r
    dt = r.choice(DTYPES)
    x = prelu_x(ctx, dt)
    w = prelu_weight(ctx, x, dt)
    g = make(ctx, tuple(x.shape), dt, name="g",
             layouts=("contiguous", "contiguous", "channels_last", "permuted", "sliced"))
    mask = (r.random() < 0.8, r.random() < 0.8)
    ctx.note("output_mask", mask)
    snap = snapshot([g, x, w])

    def stock_fn():
        wb = w.reshape([w.numel() if i == 1 else 1 for i in range(x.dim())]) if x.dim() != w.dim() or w.dim() > 1 \
            else w
        if w.numel() == 1:
            wb = w.reshape([1] * x.dim()) if x.dim() else w.reshape(())
        gi, gw = torch.ops.aten._prelu_kernel_backward(g, x, wb)
        return gi, sum_to(gw, wb.shape).reshape(w.shape)

    s, s_err, gk, g_err = run_both(stock_fn, lambda: ops.prelu_backward(g, x, w, mask))
    if judge_errors(ctx, s_err, g_err):
        return
    check_untouched(snap)
    with stock():
        s64 = (lambda g, x, w: stock_fn_64(g, x, w))(g.double(), x.double(), w.double())
    compare(ctx, gk[0], s[0] if mask[0] else None, s64[0], "grad_input", exact=True)
    compare(ctx, gk[1], s[1] if mask[1] else None, s64[1], "grad_weight", exact=False, summed_from=x.numel())


def stock_fn_64(g, x, w):
    wb = w.reshape([w.numel() if i == 1 else 1 for i in range(x.dim())]) if x.dim() else w.reshape(())
    gi, gw = torch.ops.aten._prelu_kernel_backward(g, x, wb)
    return gi, sum_to(gw, wb.shape).reshape(w.shape)


# ----------------------------------------------------------------------------------------------- direct: where / lerp
def where_direct(ctx):
    r = ctx.r
    shape = rand_shape(ctx)
    dt = r.choice(DTYPES)
    cshape, sshape, oshape = (broadcast_variant(ctx, shape) for _ in range(3))
    full = tuple(torch.broadcast_shapes(cshape, sshape, oshape))
    cond = build(ctx, torch.rand(cshape, generator=ctx.g) < r.choice([0.1, 0.5, 0.9]), r.choice(LAYOUTS[:4]))
    ctx.note("cond", cond)
    sdt, odt = (r.choice(DTYPES) if r.random() < 0.3 else dt for _ in range(2))
    self_ = make(ctx, sshape, sdt, name="self") if r.random() < 0.85 else 0.5
    other = make(ctx, oshape, odt, name="other") if r.random() < 0.85 else -1.0
    full = tuple(torch.broadcast_shapes(cshape, *(t.shape for t in (self_, other) if isinstance(t, torch.Tensor))))
    g = make(ctx, full, dt, name="g")
    mask = (isinstance(self_, torch.Tensor) and r.random() < 0.85, isinstance(other, torch.Tensor) and r.random() < .85)
    ctx.note("output_mask", mask)
    snap = snapshot([g, cond])

    def stock_fn(g=g):
        out = []
        for t, m, sel in ((self_, mask[0], True), (other, mask[1], False)):
            if not m:
                out.append(None)
                continue
            z = torch.zeros((), dtype=g.dtype)
            v = torch.where(cond, g, z) if sel else torch.where(cond, z, g)
            out.append(sum_to(v, t.shape).to(t.dtype))
        return out

    s, s_err, gk, g_err = run_both(stock_fn, lambda: ops.where_backward(g, cond, self_, other, mask))
    if judge_errors(ctx, s_err, g_err):
        return
    check_untouched(snap)
    with stock():
        s64 = stock_fn(g.double())
    for i, (t, nm) in enumerate(((self_, "grad_self"), (other, "grad_other"))):
        unsummed = isinstance(t, torch.Tensor) and tuple(t.shape) == full
        compare(ctx, gk[i], s[i], s64[i].to(torch.float64) if s64[i] is not None else None, nm, exact=unsummed,
                summed_from=g.numel())


def lerp_direct(ctx):
    r = ctx.r
    shape = rand_shape(ctx)
    dt = r.choice(DTYPES)
    sshape, eshape, wshape = (broadcast_variant(ctx, shape) for _ in range(3))
    scalar_w = r.random() < 0.4
    wdt = dt if r.random() < 0.8 else r.choice(DTYPES)
    if wdt != dt:
        wshape = ()
    full = tuple(torch.broadcast_shapes(sshape, eshape, *(() if scalar_w else (wshape,))))
    g = make(ctx, full, dt, name="g")
    a = make(ctx, sshape, dt, name="self")
    b = make(ctx, eshape, dt, name="end")
    if scalar_w:
        w = r.choice([0.25, 0.5, 0.3, 1.0, 0.0, -1.5, 2.0, 1 / 3, 1e-8])
        ctx.note("weight", w)
    else:
        w = make(ctx, wshape, wdt, name="weight")
    mask = tuple(r.random() < 0.8 for _ in range(3))
    ctx.note("output_mask", mask)
    snap = snapshot([g, a, b, w])

    def stock_fn(g=g, a=a, b=b, w=w):
        gs = sum_to(g * (1 - w), a.shape).to(a.dtype) if mask[0] else None
        ge = sum_to(g * w, b.shape).to(b.dtype) if mask[1] else None
        gw = sum_to(g * (b - a), w.shape).to(w.dtype) if mask[2] and isinstance(w, torch.Tensor) else None
        return gs, ge, gw

    s, s_err, gk, g_err = run_both(stock_fn, lambda: ops.lerp_backward(g, a, b, w, mask))
    if judge_errors(ctx, s_err, g_err):
        return
    check_untouched(snap)
    with stock():
        s64 = stock_fn(g.double(), a.double(), b.double(), w.double() if isinstance(w, torch.Tensor) else w)
    for i, (t, nm) in enumerate(((a, "grad_self"), (b, "grad_end"), (w, "grad_weight"))):
        # scalar weight, unsummed: a single exact-scaling rounding, stated bit-identical to stock in lerp.py
        exact = scalar_w and i < 2 and tuple(t.shape) == full
        compare(ctx, gk[i], s[i], s64[i], nm, exact=exact, summed_from=g.numel())


# ----------------------------------------------------------------------------------------------- direct: pad
PADS = [f"{k}_pad{d}d_backward" for k in ("replication", "reflection") for d in (1, 2, 3)]


def pad_problem(ctx, dims, reflect, max_numel=1500):
    r = ctx.r
    batched = r.random() < 0.6
    lead = [r.randint(1, 3)] * batched + [r.choice([1, 1, 2, 3])]
    sizes = [r.choice([1, 2, 3, 4, 5, 7]) for _ in range(dims)]
    if dims == 1 and r.random() < 0.5:
        sizes[0] = r.randint(1, 12)
    pads = []
    for k in range(dims):
        n = sizes[-1 - k]
        for _ in range(2):
            if reflect:
                p = r.choice([0, 1, 2, n - 1, -1, 3]) if r.random() < 0.9 else n
            else:
                p = r.choice([0, 1, 2, 3, 5, -1, -2])
            pads.append(p)
    shape = tuple(lead + sizes)
    if math.prod(shape) > max_numel:
        shape = tuple(lead[:1] + sizes)
    return shape, pads


def pad_direct(ctx, op):
    r = ctx.r
    dims = int(op[-11])
    reflect = op.startswith("reflection")
    shape, pads = pad_problem(ctx, dims, reflect)
    dt = r.choice(DTYPES)
    ctx.note("op", op)
    ctx.note("padding", pads)
    gshape = list(shape)
    for k in range(dims):
        gshape[-1 - k] += pads[2 * k] + pads[2 * k + 1]
    if min(gshape) < 0:
        gshape = [max(s, 0) for s in gshape]
    g = make(ctx, tuple(gshape), dt, name="g", layouts=LAYOUTS)
    selfv = make(ctx, shape, dt, name="self", kind="normal")
    kw = {}
    out = None
    if r.random() < 0.35:
        out = make_out(ctx, shape, dt, name="grad_input")
        kw["grad_input"] = out
    aten = getattr(torch.ops.aten, op)
    snap = snapshot([g, selfv])
    s, s_err, gk, g_err = run_both(lambda: stock_pad_backward(op, g, selfv, pads),
                                   lambda: getattr(ops, op)(g, selfv, pads, **kw))
    if judge_errors(ctx, s_err, g_err):
        if g_err is not None and out is not None and out.numel() and not torch.isnan(out.float()).all():
            raise Mismatch("wrote-out-on-error", "gradkern wrote grad_input before raising")
        return
    check_untouched(snap)
    if out is not None and gk is not out:
        raise Mismatch("out-identity", "gradkern did not return grad_input")
    with stock():
        s64 = aten(g.double(), selfv.double(), pads)
    if g.numel() == 0 and not (bool((s == 0).all()) and bool((s64 == 0).all())):
        # stock's CPU reflection_pad{1,3}d_backward returns uninitialised memory for an empty grad_output (its
        # results vary from call to call); an empty sum is 0, which gradkern returns
        ctx.counts["deliberate:stock-empty-grad-uninitialised"] += 1
        s, s64 = torch.zeros_like(s), torch.zeros_like(s64)
    compare(ctx, gk, s, s64, op, exact=False, summed_from=g.numel())


def stock_pad_backward(op, g, selfv, pads, **kw):
    """Stock's pad backward, after stock's forward has validated the problem: ATen's CPU backward kernels do not
    check the padding themselves (reflection pads >= the input size write out of bounds: heap corruption), so
    stock 'raises' where its forward raises."""
    if op.startswith("reflection") and any(p >= selfv.shape[-1 - k // 2] for k, p in enumerate(pads)
                                           if k // 2 < selfv.dim()):
        fwd = getattr(torch.ops.aten, op[: -len("_backward")])
        fwd(selfv, pads)
    if "grad_input" in kw and kw["grad_input"] is None:
        raise RuntimeError("(stock not run: an expanded grad_input)")
    aten = getattr(torch.ops.aten, op)
    if kw:
        return aten.grad_input(g, selfv, pads, **kw)
    return aten(g, selfv, pads)


# ----------------------------------------------------------------------------------------------- direct: repeat
def repeat_problem(ctx):
    r = ctx.r
    for _ in range(20):
        shape = rand_shape(ctx, 0, 4, size_hi=5)
        reps = [r.choice([1, 1, 2, 3, 0]) if r.random() < 0.95 else 0 for _ in shape]
        reps = [r.choice([1, 2, 3]) for _ in range(r.randint(0, 2))] + reps
        out = math.prod(s * p for s, p in zip(shape, reps[len(reps) - len(shape):])) * math.prod(
            reps[:len(reps) - len(shape)])
        if out <= 3000:
            return shape, reps
    return (2,), [2]


def repeat_direct(ctx):
    r = ctx.r
    shape, reps = repeat_problem(ctx)
    dt = r.choice(DTYPES)
    ctx.note("input_shape", shape)
    ctx.note("repeats", reps)
    padded = (1,) * (len(reps) - len(shape)) + tuple(shape)
    gshape = tuple(a * b for a, b in zip(reps, padded))
    g = make(ctx, gshape, dt, name="g")
    snap = snapshot([g])

    def stock_fn(g=g):
        x = torch.zeros(shape, dtype=g.dtype, requires_grad=True)
        with torch.enable_grad():
            (gx,) = torch.autograd.grad(x.repeat(reps), x, g)
        return gx

    s, s_err, gk, g_err = run_both(stock_fn, lambda: ops.repeat_backward(g, reps, list(shape)))
    if judge_errors(ctx, s_err, g_err):
        return
    check_untouched(snap)
    with stock():
        s64 = stock_fn(g.double())
    one_term = all(p <= 1 for p in reps)
    compare(ctx, gk, s, s64, "repeat_backward", exact=one_term, summed_from=g.numel())


# ----------------------------------------------------------------------------------------------- direct: segment reduce
def segred_problem(ctx, dt):
    r = ctx.r
    lead = [r.randint(1, 3) for _ in range(r.choice([0, 0, 0, 1, 1, 2]))]
    axis = len(lead)
    S = r.randint(0, 5)
    lengths = torch.randint(0, 4, (*lead, S), generator=ctx.g)
    if S and r.random() < 0.3:
        lengths[..., r.randrange(S)] = 0
    n = int(lengths.sum(-1).max()) if lengths.numel() else 0
    # every row of lengths must sum to the same N: pad the last segment
    if S:
        tot = lengths.sum(-1, keepdim=True)
        lengths[..., -1:] += n - tot
    trail = [r.choice([1, 2, 3]) for _ in range(r.choice([0, 1, 1, 2]))]
    shape = (*lead, n, *trail)
    kind = r.choice(["grid", "grid", "special", "normal"])
    data = make(ctx, shape, dt, name="data", kind=kind, layouts=("contiguous", "permuted", "sliced", "offset"))
    return data, lengths, axis


def segred_direct(ctx):
    r = ctx.r
    dt = r.choice(DTYPES)
    data, lengths, axis = segred_problem(ctx, dt)
    use_offsets = r.random() < 0.4
    initial = r.choice([None, None, None, 0.0, -1.0, 100.0])
    ctx.note("lengths", lengths.tolist())
    ctx.note("axis", axis, initial=initial, offsets=use_offsets)
    seg = {"lengths": lengths}
    if use_offsets:
        offs = torch.cat([torch.zeros((*lengths.shape[:-1], 1), dtype=lengths.dtype), lengths.cumsum(-1)], -1)
        seg = {"offsets": offs}
    if r.random() < 0.3:
        seg = {k: v.to(torch.int32) for k, v in seg.items()}
    with stock():
        try:
            output = torch.segment_reduce(data, "max", axis=axis, unsafe=True, initial=initial, **seg)
        except Exception:  # noqa: BLE001
            raise Skip from None
    if r.random() < 0.2:
        output = make(ctx, tuple(output.shape), dt, name="output(random)", kind="grid")
    g = make(ctx, tuple(output.shape), dt, name="grad")
    snap = snapshot([g, output, data])
    aten = torch.ops.aten._segment_reduce_backward
    s, s_err, gk, g_err = run_both(
        lambda: aten(g, output, data, "max", axis=axis, initial=initial, **seg),
        lambda: ops._segment_reduce_backward(g, output, data, "max", axis=axis, initial=initial, **seg))
    if data.numel() == 0 and s_err is not None and g_err is None:
        ctx.counts["deliberate:empty-data-stock-crashes"] += 1
        return
    if judge_errors(ctx, s_err, g_err):
        return
    check_untouched(snap)
    compare(ctx, gk, s, None, "_segment_reduce_backward", exact=True)


# ----------------------------------------------------------------------------------------------- direct: gradkern-only
def segmax_direct(ctx):
    from gradkern.registry import REGISTRY
    r = ctx.r
    dt = r.choice(DTYPES)
    data, lengths, axis = segred_problem(ctx, dt)
    if axis:  # segment_max takes one offsets vector for every outer index
        lengths = lengths.reshape(-1, lengths.shape[-1])[0] if lengths.numel() else lengths.new_zeros(0)
        n = int(lengths.sum())
        data = make(ctx, (*data.shape[:axis], n, *data.shape[axis + 1:]), dt, name="data",
                    kind=r.choice(["grid", "special"]))
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(-1)]).to(r.choice([torch.int32,
                                                                                            torch.int64]))
    ctx.note("offsets", offs.tolist(), axis=axis)
    ref_f = REGISTRY["segment_max_forward"].reference_fn()
    s, s_err, gk, g_err = run_both(lambda: ref_f(data, offs, axis), lambda: ops.segment_max_forward(data, offs, axis))
    if judge_errors(ctx, s_err, g_err):
        return
    compare(ctx, gk[0], s[0], None, "values", exact=True)
    compare(ctx, gk[1], s[1], None, "indices", exact=True)
    g = make(ctx, tuple(gk[0].shape), dt, name="grad")
    ref_b = REGISTRY["segment_max_backward"].reference_fn()
    n = data.shape[axis]
    s2, s_err, gk2, g_err = run_both(lambda: ref_b(g, s[1], offs, n, axis),
                                     lambda: ops.segment_max_backward(g, gk[1], offs, n, axis))
    if judge_errors(ctx, s_err, g_err):
        return
    compare(ctx, gk2, s2, None, "segment_max_backward", exact=True)


def sparsemax_direct(ctx):
    from gradkern.registry import REGISTRY
    r = ctx.r
    dt = r.choice(DTYPES)
    shape = rand_shape(ctx, 1, 4, max_numel=1200, size_hi=9)
    dim = r.randrange(-len(shape), len(shape))
    x = make(ctx, shape, dt, name="x", kind=r.choice(["normal", "normal", "grid", "special"]))
    ctx.note("dim", dim)
    ref_f = REGISTRY["sparsemax_forward"].reference_fn()
    with stock():
        s64 = ref_f(x.double(), dim)
    s, s_err, gk, g_err = run_both(lambda: ref_f(x, dim), lambda: ops.sparsemax_forward(x, dim))
    if judge_errors(ctx, s_err, g_err):
        return
    compare(ctx, gk, s, s64, "sparsemax_forward", exact=False, summed_from=x.numel())
    g = make(ctx, shape, dt, name="g")
    y = gk
    ref_b = REGISTRY["sparsemax_backward"].reference_fn()
    s, s_err, gk, g_err = run_both(lambda: ref_b(g, y, dim), lambda: ops.sparsemax_backward(g, y, dim))
    if judge_errors(ctx, s_err, g_err):
        return
    with stock():
        s64 = ref_b(g.double(), y.double(), dim)
    compare(ctx, gk, s, s64, "sparsemax_backward", exact=False, summed_from=x.numel())


# ----------------------------------------------------------------------------------------------- autograd entry
def leaf(t, rg):
    return t.detach().requires_grad_(rg) if t.is_floating_point() else t


@contextlib.contextmanager
def routing(entry: str, routed: bool):
    """gradkern's routing around one autograd call: `gradkern.use()` or enable() ... disable() (`entry`), where
    `routed`; none for the stock call."""
    if not routed:
        yield
    elif entry == "use":
        with gradkern.use(mode="always"):
            yield
    else:
        gradkern.enable(mode="always")
        try:
            yield
        finally:
            gradkern.disable()


def run_autograd_both(ctx, name, tensors, stock_fn, gk_fn):
    """Run an autograd case's stock and routed calls ((forward, gradients) each): None where their errors decide
    the case (judged), else (stock, gradkern) after checking that neither wrote to `tensors` and that the forwards
    agree bit for bit."""
    snap = snapshot(tensors)
    s, s_err, gk, g_err = run_both(stock_fn, gk_fn)
    if judge_errors(ctx, s_err, g_err):
        return None
    check_untouched(snap)
    d = bit_diff(gk[0], s[0], f"{name} forward")
    if d is not None:
        raise Mismatch("forward-bits", d)
    return s, gk


def run_autograd(ctx, name, fwd, inputs, needs, exact, summed_from=0, g_layouts=LAYOUTS, thresholds=(),
                 adjust=None):
    """fwd(*inputs) under stock / gradkern; gradients of the inputs flagged in `needs`. `exact(i)`: whether
    input i's gradient must be bit-exact."""
    r = ctx.r
    ctx.note("requires_grad", needs)
    entry = r.choice(["use", "enable"])
    ctx.note("entry", entry)

    def one(tensors, g=None, routed=False):
        leaves = [leaf(t, n) if isinstance(t, torch.Tensor) else t for t, n in zip(tensors, needs)]
        with routing(entry, routed), torch.enable_grad():
            out = fwd(*leaves)
            if g is None:
                return out, None
            want = [lf for lf, n in zip(leaves, needs) if n]
            grads = torch.autograd.grad(out, want, g, allow_unused=True) if want else ()
        it = iter(grads)
        return out, [next(it) if n else None for n in needs]

    try:
        with stock():
            out0, _ = one(inputs)
    except Exception as e:  # noqa: BLE001
        s_err = e
        try:
            one(inputs, routed=True)
            g_err = None
        except Exception as e2:  # noqa: BLE001
            g_err = e2
        judge_errors(ctx, s_err, g_err)
        return
    if not out0.is_floating_point():
        raise Skip
    g = make(ctx, tuple(out0.shape), out0.dtype, name="grad_output", layouts=g_layouts, thresholds=thresholds)
    both = run_autograd_both(ctx, name, [t for t in inputs if isinstance(t, torch.Tensor)] + [g],
                             lambda: one(inputs, g), lambda: one(inputs, g, routed=True))
    if both is None:
        return
    s, gk = both
    with stock():
        f64 = [t.detach().double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
        _, s64 = one(f64, g.double())
    if adjust is not None:  # a documented convention where stock's CPU kernel differs
        adj = adjust(inputs, g, s[1])
        if any(a is not None and bit_diff(a, b, "") is not None for a, b in zip(adj, s[1])):
            ctx.counts["deliberate:nan-x-cuda-convention"] += 1
        s = (s[0], adj)
        s64 = adjust(f64, g.double(), s64)
    for i, (a, b, c) in enumerate(zip(gk[1], s[1], s64)):
        if a is not None and b is not None and a.dtype != b.dtype:
            raise Mismatch("dtype", f"{name} grad {i}: gradkern {a.dtype} vs stock {b.dtype}")
        compare(ctx, a, b, c, f"{name} grad[{i}]", exact=exact(i), summed_from=summed_from)


def needs_subset(ctx, k, floating):
    r = ctx.r
    while True:
        needs = [f and r.random() < 0.7 for f in floating]
        if any(needs) or not any(floating):
            return needs
        if r.random() < 0.1:
            return needs


def ag_where(ctx):
    r = ctx.r
    shape = rand_shape(ctx)
    dt = r.choice(DTYPES)
    cshape, sshape, oshape = (broadcast_variant(ctx, shape) for _ in range(3))
    cond = build(ctx, torch.rand(cshape, generator=ctx.g) < r.choice([0.1, 0.5, 0.9]), r.choice(LAYOUTS[:4]))
    ctx.note("cond", cond)
    a = make(ctx, sshape, dt, name="self") if r.random() < 0.85 else r.choice([0.5, 2, -1.0])
    bdt = r.choice(DTYPES) if r.random() < 0.25 else dt
    b = make(ctx, oshape, bdt, name="other") if r.random() < 0.85 else r.choice([0.5, 3, -1.0])
    full = tuple(torch.broadcast_shapes(cshape, sshape if isinstance(a, torch.Tensor) else (),
                                        oshape if isinstance(b, torch.Tensor) else ()))
    needs = needs_subset(ctx, 3, [False, isinstance(a, torch.Tensor), isinstance(b, torch.Tensor)])
    form = r.choice(["torch.where", "Tensor.where"])
    ctx.note("form", form)
    fwd = (lambda c, x, y: torch.where(c, x, y)) if form == "torch.where" or not isinstance(a, torch.Tensor) \
        else (lambda c, x, y: x.where(c, y))
    run_autograd(ctx, "where", fwd, [cond, a, b], needs,
                 exact=lambda i: i == 0 or (isinstance((a, b)[i - 1], torch.Tensor)
                                            and tuple((a, b)[i - 1].shape) == full), summed_from=math.prod(full))


def ag_lerp(ctx):
    r = ctx.r
    shape = rand_shape(ctx)
    dt = r.choice(DTYPES)
    sshape, eshape, wshape = (broadcast_variant(ctx, shape) for _ in range(3))
    a = make(ctx, sshape, dt, name="self")
    b = make(ctx, eshape, dt if r.random() < 0.9 else r.choice(DTYPES), name="end")
    if r.random() < 0.4:
        w = r.choice([0.25, 0.5, 0.3, 1.0, 0.0, -1.5, 2.0, 1 / 3])
        ctx.note("weight", w)
    else:
        wdt = dt if r.random() < 0.85 else r.choice(DTYPES)
        w = make(ctx, wshape if r.random() < 0.85 else (), wdt, name="weight")
    shapes = [a.shape, b.shape] + ([w.shape] if isinstance(w, torch.Tensor) else [])
    try:
        full = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        full = ()
    needs = needs_subset(ctx, 3, [True, True, isinstance(w, torch.Tensor)])
    scalar = not isinstance(w, torch.Tensor)
    run_autograd(ctx, "lerp", lambda x, y, z: torch.lerp(x, y, z), [a, b, w], needs,
                 exact=lambda i: scalar and i < 2 and tuple((a, b)[i].shape) == full, summed_from=math.prod(full))


def ag_prelu(ctx):
    r = ctx.r
    dt = r.choice(DTYPES)
    x = prelu_x(ctx, dt)
    w = prelu_weight(ctx, x, dt if r.random() < 0.95 else r.choice(DTYPES))
    needs = needs_subset(ctx, 2, [True, True])
    form = r.choice(["F.prelu", "F.prelu", "_prelu_kernel"])
    ctx.note("form", form)
    if form == "_prelu_kernel":  # the ATen op with a weight broadcasting some other way
        wshape = broadcast_variant(ctx, tuple(x.shape))
        w = make(ctx, wshape, dt, name="w(kernel)")
        fwd = torch.ops.aten._prelu_kernel
    else:
        fwd = F.prelu
    run_autograd(ctx, "prelu", fwd, [x, w], needs, exact=lambda i: i == 0, summed_from=x.numel())


def ag_pad(ctx):
    r = ctx.r
    dims = r.randint(1, 3)
    mode = r.choice(["replicate", "reflect"])
    shape, pads = pad_problem(ctx, dims, mode == "reflect")
    dt = r.choice(DTYPES)
    x = make(ctx, shape, dt, name="x", layouts=LAYOUTS)
    ctx.note("mode", mode, pads=pads)
    form = r.choice(["F.pad", "F.pad", "module"])
    if form == "module":
        cls = {("replicate", 1): torch.nn.ReplicationPad1d, ("replicate", 2): torch.nn.ReplicationPad2d,
               ("replicate", 3): torch.nn.ReplicationPad3d, ("reflect", 1): torch.nn.ReflectionPad1d,
               ("reflect", 2): torch.nn.ReflectionPad2d, ("reflect", 3): torch.nn.ReflectionPad3d}[(mode, dims)]
        m = cls(tuple(pads))
        fwd = lambda t: m(t)  # noqa: E731
    else:
        fwd = lambda t: F.pad(t, pads, mode=mode)  # noqa: E731
    out_n = math.prod(max(s, 0) for s in shape) * 4
    run_autograd(ctx, f"pad {mode} {dims}d", fwd, [x], [True], exact=lambda i: False, summed_from=out_n)


def ag_repeat(ctx):
    r = ctx.r
    shape, reps = repeat_problem(ctx)
    dt = r.choice(DTYPES)
    x = make(ctx, shape, dt, name="x")
    ctx.note("repeats", reps)
    one_term = all(p <= 1 for p in reps)
    gn = math.prod(a * b for a, b in zip(reps, (1,) * (len(reps) - len(shape)) + tuple(shape)))
    run_autograd(ctx, "repeat", lambda t: t.repeat(*reps) if reps else t.repeat(reps), [x], [True],
                 exact=lambda i: one_term, summed_from=gn)


def ag_elu(ctx):
    r = ctx.r
    dt = r.choice(DTYPES)
    shape = rand_shape(ctx)
    x = make(ctx, shape, dt, name="x", thresholds=(0.0,))
    fn = r.choice(["celu", "elu", "selu", "celu_", "elu_", "selu_"])
    alpha = r.choice([1.0, 0.5, 2.0, 1.7, 1e-3, 0.0, -0.5])
    ctx.note("fn", fn, alpha=alpha)
    inplace = fn.endswith("_")
    base = fn.rstrip("_")

    def fwd(t):
        if inplace:
            t = t * 1  # a non-leaf copy, then in place (is_result=True)
        if base == "celu":
            return F.celu(t, alpha, inplace=inplace)
        if base == "elu":
            return F.elu(t, alpha, inplace=inplace)
        return F.selu(t, inplace=inplace)

    scale = 1.0507009873554805 if base == "selu" else 1.0

    def adjust(inputs, g, grads):
        gx = grads[0]
        if gx is None:
            return grads
        m = _math(gx.dtype)
        return [torch.where(torch.isnan(inputs[0]), (g.to(m) * _round(scale, m)).to(gx.dtype), gx)]

    run_autograd(ctx, fn, fwd, [x], [True], exact=lambda i: False, adjust=adjust)


def ag_shrinks(ctx):
    r = ctx.r
    dt = r.choice(DTYPES)
    shape = rand_shape(ctx)
    fn = r.choice(["softshrink", "hardshrink", "hardsigmoid"])
    if fn == "hardsigmoid":
        th, fwd = (3.0,), F.hardsigmoid
    else:
        lam = r.choice([0.5, 0.0, 1.0, 0.1, 1 / 3, 2.5, -0.5 if fn == "hardshrink" else 0.5])
        ctx.note("lambd", lam)
        th = (abs(lam),)
        fwd = (lambda t: F.softshrink(t, lam)) if fn == "softshrink" else (lambda t: F.hardshrink(t, lam))
    x = make(ctx, shape, dt, name="x", thresholds=th)
    ctx.note("fn", fn)
    if fn == "hardsigmoid" and r.random() < 0.3:
        run_autograd(ctx, fn, lambda t: F.hardsigmoid(t * 1, inplace=True), [x], [True], exact=lambda i: True)
        return
    run_autograd_nan(ctx, fn, fwd, x)


def run_autograd_nan(ctx, fn, fwd, x):
    """Shrinks: stock CPU's NaN-x gradient is 0, the documented (CUDA) one g; compare with that applied."""
    r = ctx.r
    ctx.note("requires_grad", [True])
    g = make(ctx, tuple(x.shape), x.dtype, name="grad_output")
    entry = r.choice(["use", "enable"])

    def one(routed):
        lf = x.detach().requires_grad_(True)
        with routing(entry, routed), torch.enable_grad():
            out = fwd(lf)
            (gx,) = torch.autograd.grad(out, lf, g)
        return out, gx

    both = run_autograd_both(ctx, fn, [x, g], lambda: one(False), lambda: one(True))
    if both is None:
        return
    s, gk = both
    exp = s[1]
    if fn != "hardsigmoid":
        adj = torch.where(torch.isnan(x), g, exp)
        if bit_diff(adj, exp, "") is not None:
            ctx.counts["deliberate:nan-x-cuda-convention"] += 1
        exp = adj
    compare(ctx, gk[1], exp, None, f"{fn} grad", exact=True)


def ag_segred(ctx):
    r = ctx.r
    dt = r.choice(DTYPES)
    data, lengths, axis = segred_problem(ctx, dt)
    initial = r.choice([None, None, None, 0.0, -1.0, 100.0])
    use_offsets = r.random() < 0.3
    seg = {"lengths": lengths}
    if use_offsets:
        seg = {"offsets": torch.cat([torch.zeros((*lengths.shape[:-1], 1), dtype=lengths.dtype),
                                     lengths.cumsum(-1)], -1)}
    ctx.note("seg", {k: v.tolist() for k, v in seg.items()}, axis=axis, initial=initial)
    unsafe = r.random() < 0.5
    if data.numel() == 0:
        raise Skip  # stock's backward crashes on empty data (docs/bad-inputs.md)
    run_autograd(ctx, "segment_reduce max",
                 lambda d: torch.segment_reduce(d, "max", axis=axis, unsafe=unsafe, initial=initial, **seg),
                 [data], [True], exact=lambda i: True,
                 g_layouts=("contiguous", "permuted", "sliced", "offset", "expanded"))


# ----------------------------------------------------------------------------------------------- error entry
def err_case(ctx, name, stock_fn, gk_fn, outs=(), inputs=(), deliberate=None):
    snap_out = snapshot(outs)
    snap_in = snapshot(inputs)
    s, s_err, gk, g_err = run_both(stock_fn, gk_fn)
    if g_err is not None:
        for t, before in snap_out:
            if bit_diff(t, before, "") is not None:
                raise Mismatch("wrote-out-on-error", f"{name}: gradkern raised {type(g_err).__name__} but wrote "
                               "the out= tensor")
    check_untouched(snap_in)
    if s_err is None and g_err is None:
        ctx.counts["both-succeed"] += 1
        return
    judge_errors(ctx, s_err, g_err, deliberate=deliberate if s_err is None else None)


def error_pointwise(ctx):
    r = ctx.r
    op = r.choice(["hardsigmoid_backward", "softshrink_backward", "hardshrink_backward", "elu_backward",
                   "hardshrink"])
    ctx.note("op", op)
    dt = r.choice(DTYPES)
    shape = rand_shape(ctx, 1, 4)
    x = make(ctx, shape, dt, name="x")
    g = make(ctx, shape, dt, name="g")
    bad = r.choice(["g-shape", "int-dtype", "out-expanded", "out-dtype", "out-overlap", "out-shape",
                    "lambd", "elu-params", "out-alias-x"])
    ctx.note("bad", bad)
    params = {"softshrink_backward": (0.5,), "hardshrink_backward": (0.5,), "hardshrink": (0.5,),
              "hardsigmoid_backward": (), "elu_backward": (1.0, 1.0, 1.0, False)}[op]
    out = None
    deliberate = None
    if bad == "g-shape" and shape:
        gs = list(shape)
        gs[r.randrange(len(gs))] += r.choice([1, 2])
        g = make(ctx, tuple(gs), dt, name="g(bad)")
    elif bad == "int-dtype":
        deliberate = "int-dtype-unsupported(docs/bad-inputs.md)"
        if r.random() < 0.5:
            x = x.to(torch.int32)
        else:
            g = g.to(torch.int64)
    elif bad == "out-expanded" and shape:
        out = torch.full((1,) * (len(shape) - 1) + (shape[-1],), math.nan, dtype=dt, device=DEV).expand(shape)
        if math.prod(shape) <= shape[-1]:
            out = torch.full((1,), math.nan, dtype=dt, device=DEV).expand(shape)
    elif bad == "out-dtype":
        deliberate = "out-of-another-dtype-refused(README)"
        out = torch.full(shape, math.nan, dtype=r.choice([d for d in DTYPES if d != dt]), device=DEV)
    elif bad == "out-overlap" and math.prod(shape) > 1:
        buf = torch.full((2 * math.prod(shape),), math.nan, dtype=dt, device=DEV)
        gbuf = buf[: math.prod(shape)].view(shape)
        gbuf.copy_(g)
        g = gbuf
        out = buf[1: 1 + math.prod(shape)].view(shape)  # partly overlaps g
    elif bad == "out-shape":
        out = torch.full((*shape[:-1], shape[-1] + 1) if r.random() < 0.6 else (0,), math.nan, dtype=dt,
                         device=DEV)
        deliberate = "out-shape-stock-resizes"
    elif bad == "out-alias-x" and op != "hardshrink":
        out = x  # in place into self: allowed by ATen for elementwise ops
    elif bad == "lambd" and op in ("softshrink_backward", "hardshrink_backward", "hardshrink"):
        params = (r.choice([-0.5, math.nan, math.inf, 1e6 if dt == torch.float16 else 1e39, -math.inf]),)
        if op == "softshrink_backward" and not params[0] >= 0:
            deliberate = "softshrink_backward-checks-lambd>=0(semantics.md)"
    elif bad == "elu-params" and op == "elu_backward":
        params = (r.choice([-1.0, 1.0, 1e39, math.nan]), r.choice([1.0, 1e39, math.nan]), r.choice([1.0, 1e39]),
                  r.random() < 0.6)
    ctx.note("params", params)
    aten = getattr(torch.ops.aten, op)
    if op == "hardshrink":
        sargs, outkw, aten_out = (x, *params), "out", torch.ops.aten.hardshrink.out
    elif op == "elu_backward":
        sargs, outkw, aten_out = (g, *params, x), "grad_input", torch.ops.aten.elu_backward.grad_input
    else:
        sargs, outkw, aten_out = (g, x, *params), "grad_input", getattr(torch.ops.aten, op).grad_input
    copies = tuple(clone_layout(a.detach()) if isinstance(a, torch.Tensor) else a for a in sargs)
    if out is not None:
        ctx.note("out", out)
        # stock into a copy of out with the same layout (or out itself when it aliases an input)
        if out is x or out is g:
            so = copies[[id(a) for a in sargs].index(id(out))]
        else:
            so = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device) \
                if torch._debug_has_internal_overlap(out) == 0 else out.clone().expand(out.shape)
            if bad == "out-expanded":
                so = torch.full((1,), math.nan, dtype=dt, device=DEV).expand(out.shape)
            if bad == "out-overlap":  # the same overlap with stock's own copies
                buf2 = torch.full((2 * math.prod(shape),), math.nan, dtype=dt, device=DEV)
                gb2 = buf2[: math.prod(shape)].view(shape)
                gb2.copy_(g)
                copies = tuple(gb2 if a is g else c for a, c in zip(sargs, copies))
                so = buf2[1: 1 + math.prod(shape)].view(shape)
        stock_fn = lambda: aten_out(*copies, **{outkw: so})  # noqa: E731
        gk_fn = lambda: getattr(ops, op)(*sargs, **{outkw: out})  # noqa: E731
        outs = () if out is x or out is g else (out,)
    else:
        stock_fn = lambda: aten(*copies)  # noqa: E731
        gk_fn = lambda: getattr(ops, op)(*sargs)  # noqa: E731
        outs = ()
    ins = [a for a in sargs if isinstance(a, torch.Tensor) and a is not out]
    err_case(ctx, op, stock_fn, gk_fn, outs=outs, inputs=ins, deliberate=deliberate)


def error_structured(ctx):
    r = ctx.r
    which = r.choice(["pad", "pad", "prelu_kernel", "segred", "repeat", "pad_out", "prelu_fused"])
    ctx.note("which", which)
    dt = r.choice(DTYPES)
    if which in ("pad", "pad_out"):
        op = r.choice(PADS)
        dims = int(op[-11])
        reflect = op.startswith("reflection")
        shape, pads = pad_problem(ctx, dims, reflect)
        bad = r.choice(["rank", "pad-len", "g-shape", "big-pad", "dtype", "none"])
        deliberate = None
        if bad == "rank":
            shape = (2,) * r.choice([dims, dims + 3]) if r.random() < 0.7 else ()
        elif bad == "pad-len":
            pads = pads + [1, 1] if r.random() < 0.5 else pads[:-1]
            if reflect and dims < 3 and len(pads) > 2 * dims:  # (issue #4 asks for a named error)
                deliberate = "pad-len-checked(README: stock's reflection_pad1d/2d backwards ignore extra entries)"
        elif bad == "dtype":
            deliberate = "pad-dtype-mismatch(stock's backward does not check it)"
        elif bad == "big-pad":
            k = r.randrange(len(pads))
            pads[k] = shape[-1 - k // 2] + r.choice([0, 1, 3]) if reflect else -(shape[-1 - k // 2] + 1)
        gshape = list(shape)
        for k in range(min(dims, len(shape))):
            if 2 * k + 1 < len(pads):
                gshape[-1 - k] += pads[2 * k] + pads[2 * k + 1]
        if bad == "g-shape" and gshape:
            k = r.randrange(len(gshape))
            gshape[k] += 1
            if k < len(gshape) - dims:  # ATen's pad backwards check only the padded dims
                deliberate = "pad-stock-does-not-check-batch/channel-of-grad"
        gshape = [max(s, 0) for s in gshape]
        ctx.note("op", op, pads=pads, bad=bad)
        g = make(ctx, tuple(gshape), dt, name="g")
        sv = make(ctx, shape, dt if bad != "dtype" else r.choice([d for d in DTYPES if d != dt]), name="self")
        aten = getattr(torch.ops.aten, op)
        if which == "pad_out":
            outbad = r.choice(["shape", "dtype", "expanded", "overlap-g", "ok"])
            ctx.note("out", outbad)
            if outbad == "shape":
                out = torch.full((max(math.prod(shape), 1) + 1,), math.nan, dtype=dt, device=DEV)
            elif outbad == "dtype":
                out = torch.full(shape, math.nan, dtype=r.choice([d for d in DTYPES if d != dt]), device=DEV)
            elif outbad == "expanded" and shape and shape[-1] > 1:
                out = torch.full((1,), math.nan, dtype=dt, device=DEV).expand(shape)
            elif outbad == "overlap-g" and math.prod(gshape) >= math.prod(shape) > 0 and g.is_contiguous():
                out = g.view(-1)[: math.prod(shape)].view(shape)
            else:
                out = make_out(ctx, shape, dt)
            so = clone_layout(out)
            if torch._debug_has_internal_overlap(out) == 1:
                # ATen's CPU pad backwards write grad_input as if it were contiguous: an expanded one is written out
                # of bounds (heap corruption, seen here). Stock is not run; gradkern must refuse it.
                so = None
                deliberate = "pad-expanded-grad_input(stock writes out of bounds)"
            gc = g.detach().clone()
            if outbad == "overlap-g" and so.shape == shape and out._base is g or out.data_ptr() == g.data_ptr():
                so = gc.view(-1)[: math.prod(shape)].view(shape) if gc.is_contiguous() else so
            # ATen's .grad_input overload resizes a wrong-shaped grad_input; gradkern.ops' grad_input= does not
            deliberate = {"shape": "pad-out-shape-no-resize", "overlap-g": "pad-out-overlapping-grad_output-refused"
                          "(README)"}.get(outbad, deliberate)
            err_case(ctx, op, lambda: stock_pad_backward(op, gc, sv, pads, grad_input=so),
                     lambda: getattr(ops, op)(g, sv, pads, grad_input=out),
                     outs=(out,) if out.data_ptr() != g.data_ptr() else (), inputs=(sv,) if outbad == "overlap-g"
                     else (g, sv), deliberate=deliberate)
            return
        err_case(ctx, op, lambda: stock_pad_backward(op, g, sv, pads), lambda: getattr(ops, op)(g, sv, pads),
                 inputs=(g, sv), deliberate=deliberate)
    elif which == "prelu_kernel":
        shape = rand_shape(ctx, 1, 4)
        x = make(ctx, shape, dt, name="x")
        w = make(ctx, broadcast_variant(ctx, shape), dt if r.random() < 0.5 else r.choice(DTYPES), name="w")
        gshape = list(shape)
        if r.random() < 0.5 and gshape:
            gshape[-1] += 1
        g = make(ctx, tuple(gshape), dt, name="g")
        err_case(ctx, "_prelu_kernel_backward", lambda: torch.ops.aten._prelu_kernel_backward(g, x, w),
                 lambda: ops._prelu_kernel_backward(g, x, w), inputs=(g, x, w))
    elif which == "prelu_fused":
        # F.prelu with a wrong weight: stock raises in the forward, so must the routed call
        shape = rand_shape(ctx, 0, 4)
        x = make(ctx, shape, dt, name="x")
        wn = r.choice([2, 3, 5]) if r.random() < 0.8 else 1
        w = make(ctx, r.choice([(wn,), (1, wn), (wn, 1)]), dt, name="w")
        ag = lambda: F.prelu(x.detach().requires_grad_(), w.detach().requires_grad_()).sum().backward()  # noqa
        s, s_err, gk, g_err = run_both(ag, lambda: _routed(ag))
        if not judge_errors(ctx, s_err, g_err):
            ctx.counts["both-succeed"] += 1
    elif which == "segred":
        data, lengths, axis = segred_problem(ctx, dt)
        if data.numel() == 0:
            raise Skip
        with stock():
            output = torch.segment_reduce(data, "max", lengths=lengths, axis=axis, unsafe=True)
        g = make(ctx, tuple(output.shape), dt, name="grad")
        bad = r.choice(["lengths-sum", "axis", "g-dtype", "reduce", "both", "g-shape"])
        ctx.note("bad", bad, lengths=lengths.tolist(), axis=axis)
        kw = {"lengths": lengths, "axis": axis}
        red = "max"
        if bad == "lengths-sum" and lengths.numel():
            lengths = lengths.clone()
            lengths.view(-1)[0] += 1
            kw["lengths"] = lengths
        elif bad == "axis":
            kw["axis"] = r.choice([axis + 1, -1, 5])
        elif bad == "g-dtype":
            g = g.to(r.choice([d for d in DTYPES if d != dt]))
        elif bad == "reduce":
            red = r.choice(["sum", "mean", "min"])
        elif bad == "both":
            kw["offsets"] = torch.cat([torch.zeros((*lengths.shape[:-1], 1), dtype=lengths.dtype),
                                       lengths.cumsum(-1)], -1)
        elif bad == "g-shape":
            g = make(ctx, (*output.shape[:-1], output.shape[-1] + 1) if output.dim() else (2,), dt, name="g(bad)")
        aten = torch.ops.aten._segment_reduce_backward
        stock_fn = lambda: aten(g, output, data, red, **kw)  # noqa: E731
        if bad == "lengths-sum" and lengths.numel():
            # stock's CPU backward does not check lengths against data and writes past its result (heap
            # corruption: seed 11261 case 9753 aborted the process); gradkern clamps each segment to the data
            ctx.counts["stock-not-run:segred-lengths-sum-memory-unsafe"] += 1
            stock_fn = lambda: None  # noqa: E731
        err_case(ctx, "_segment_reduce_backward", stock_fn,
                 lambda: ops._segment_reduce_backward(g, output, data, red, **kw), inputs=(g, output, data),
                 deliberate={"g-shape": "segred-stock-does-not-check-grad",
                             "both": "segred-refuses-lengths-and-offsets",
                             "reduce": "segred-ops-only-max(README)"}.get(bad))
    else:  # repeat
        shape = rand_shape(ctx, 1, 4, size_hi=4)
        reps = [r.choice([1, 2]) for _ in range(max(len(shape) - r.choice([1, 0]), 0))]
        if r.random() < 0.3 and reps:
            reps[0] = -1
        ctx.note("shape", shape, reps=reps)
        x = make(ctx, shape, dt, name="x")
        ag = lambda: x.detach().requires_grad_().repeat(reps).sum().backward()  # noqa: E731
        s, s_err, gk, g_err = run_both(ag, lambda: _routed(ag))
        if not judge_errors(ctx, s_err, g_err):
            ctx.counts["both-succeed"] += 1


def _routed(fn):
    with gradkern.use(mode="always"):
        return fn()


# ----------------------------------------------------------------------------------------------- driver
DIRECT = {
    **{op: (lambda o: lambda ctx: pointwise_direct(ctx, o))(op) for op in POINTWISE},
    "_prelu_kernel_backward": prelu_kernel_direct,
    "prelu_backward": prelu_direct,
    "where_backward": where_direct,
    "lerp_backward": lerp_direct,
    **{op: (lambda o: lambda ctx: pad_direct(ctx, o))(op) for op in PADS},
    "repeat_backward": repeat_direct,
    "_segment_reduce_backward": segred_direct,
    "segment_max": segmax_direct,
    "sparsemax": sparsemax_direct,
}
AUTOGRAD = {"where": ag_where, "lerp": ag_lerp, "prelu": ag_prelu, "pad": ag_pad, "repeat": ag_repeat,
            "elu/celu/selu": ag_elu, "shrink/hardsigmoid": ag_shrinks, "segment_reduce": ag_segred}
ERRORS = {"pointwise": error_pointwise, "structured": error_structured}
SUMMING = {"prelu_backward", "where_backward", "lerp_backward", *PADS, "repeat_backward", "sparsemax"}
ENTRIES = {"direct": DIRECT, "autograd": AUTOGRAD, "error": ERRORS}
WEIGHTS = {"direct": 0.45, "autograd": 0.4, "error": 0.15}


def pick(seed, idx, entries, only):
    r = random.Random(f"pick:{seed}:{idx}")
    names = [e for e in ENTRIES if e in entries]
    entry = r.choices(names, [WEIGHTS[e] for e in names])[0]
    table = {k: v for k, v in ENTRIES[entry].items() if not only or any(o in k for o in only)}
    if not table:
        return entry, None, None
    name = r.choice(sorted(table))
    return entry, name, table[name]


def run_case(seed, idx, entries, only):
    entry, name, fn = pick(seed, idx, entries, only)
    if fn is None:
        return entry, name, "skip", None, None
    ctx = Ctx(seed, idx)
    HUGE[0] = not (name in SUMMING or entry == "autograd" and name in ("where", "lerp", "prelu", "pad", "repeat"))
    try:
        torch.manual_seed(idx)
        fn(ctx)
        status, err = "ok", None
    except Skip:
        status, err = "skip", None
    except Mismatch as m:
        status, err = "fail", m
    except Exception as e:  # noqa: BLE001  (a fault of this script, or an unexpected crash)
        status = "fail"
        err = Mismatch("harness", f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e)[-5:]))
    finally:
        if gradkern.is_enabled():
            gradkern.disable()
    return entry, name, status, err, ctx


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=5.0, help="time budget")
    ap.add_argument("--max-cases", type=int, default=10**9)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--entries", default="direct,autograd,error")
    ap.add_argument("--only", default="", help="comma-separated substrings of op names to run")
    ap.add_argument("--log", default=None, help="append failures (JSON lines) here")
    ap.add_argument("--replay", default=None, help="SEED:IDX: rerun one case and print it")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--child", action="store_true", help="(internal) run in this process, no supervisor")
    ap.add_argument("--progress", default=None, help="(internal) file the child writes each case index to")
    ap.add_argument("--summarize", nargs="*", default=None, help="aggregate the summaries of these --log files")
    a = ap.parse_args(argv)
    if a.summarize is not None:
        return summarize(a.summarize)
    entries = a.entries.split(",")
    only = [s for s in a.only.split(",") if s]
    if a.replay:
        seed, idx = map(int, a.replay.split(":"))
        entry, name, status, err, ctx = run_case(seed, idx, entries, only)
        print(f"case {seed}:{idx} {entry}/{name}: {status}")
        if ctx:
            print("  " + "\n  ".join(ctx.desc))
            print("  counts:", dict(ctx.counts), *ctx.soft, sep="\n  ")
        if err:
            print(err)
        return 1 if status == "fail" else 0
    if not a.child:
        return supervise(a, argv if argv is not None else sys.argv[1:])
    t_end = time.monotonic() + 60 * a.minutes
    stats: dict = collections.defaultdict(collections.Counter)
    notes = collections.Counter()
    fails = []
    idx = a.start
    while time.monotonic() < t_end and idx - a.start < a.max_cases:
        if a.progress:
            with open(a.progress, "w") as f:
                f.write(str(idx))
        entry, name, status, err, ctx = run_case(a.seed, idx, entries, only)
        stats[(entry, name)][status] += 1
        if ctx:
            notes.update(ctx.counts)
        if status == "fail":
            rec = {"case": f"{a.seed}:{idx}", "entry": entry, "op": name, "category": err.category,
                   "msg": err.msg[:1500], "desc": ctx.desc}
            fails.append(rec)
            print(f"FAIL {rec['case']} {entry}/{name} [{err.category}] {err.msg.splitlines()[0][:300]}",
                  flush=True)
            if a.verbose:
                print("  " + "\n  ".join(ctx.desc), flush=True)
            if a.log:
                with open(a.log, "a") as f:
                    f.write(json.dumps(rec) + "\n")
        idx += 1
    print(f"\nseed {a.seed}: cases {a.start}..{idx - 1} ({idx - a.start}) in {a.minutes:g} min budget")
    print(f"{'entry':9} {'op':30} {'ok':>5} {'fail':>5} {'skip':>5}")
    for (entry, name), c in sorted(stats.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        print(f"{entry:9} {str(name):30} {c['ok']:5} {c['fail']:5} {c['skip']:5}")
    print("notes:", dict(notes))
    cats = collections.Counter((f["entry"], f["op"], f["category"]) for f in fails)
    for k, v in sorted(cats.items()):
        print("failures:", k, v)
    if a.log:
        with open(a.log, "a") as f:
            f.write(json.dumps({"summary": True, "seed": a.seed, "cases": idx - a.start,
                                "stats": {f"{e}/{n}": dict(c) for (e, n), c in stats.items()},
                                "notes": dict(notes)}) + "\n")
    return 1 if fails else 0


def _strip(argv, *names):
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok in names:
            skip = True
            continue
        if any(tok.startswith(n + "=") for n in names):
            continue
        out.append(tok)
    return out


def supervise(a, argv) -> int:
    """Run the cases in child processes, so that a case that kills the process (a crash in a kernel or in
    stock PyTorch) is logged as a failure and the run goes on with the next case."""
    import subprocess
    import tempfile
    base = _strip(argv, "--start", "--minutes", "--progress", "--max-cases")
    t_end = time.monotonic() + 60 * a.minutes
    start, rc_all = a.start, 0
    prog = tempfile.NamedTemporaryFile(prefix="gradkern-fuzz-", suffix=".idx", delete=False).name
    while time.monotonic() < t_end and start - a.start < a.max_cases:
        left = (t_end - time.monotonic()) / 60
        cmd = [sys.executable, os.path.abspath(__file__), *base, "--child", "--start", str(start), "--minutes",
               f"{left:.4f}", "--progress", prog, "--max-cases", str(a.max_cases - (start - a.start))]
        with open(prog, "w") as f:
            f.write(str(start))
        rc = subprocess.call(cmd)
        if rc in (0, 1):
            rc_all |= rc
            break
        with open(prog) as f:
            idx = int(f.read().strip() or start)
        entry, name, _ = pick(a.seed, idx, a.entries.split(","), [s for s in a.only.split(",") if s])
        rec = {"case": f"{a.seed}:{idx}", "entry": entry, "op": name, "category": "process-crash",
               "msg": f"the process died (exit status {rc}) during this case", "desc": []}
        print(f"FAIL {rec['case']} {entry}/{name} [process-crash] exit status {rc}", flush=True)
        if a.log:
            with open(a.log, "a") as f:
                f.write(json.dumps(rec) + "\n")
        rc_all = 1
        start = idx + 1
    os.unlink(prog)
    return rc_all


def summarize(paths) -> int:
    stats: dict = collections.defaultdict(collections.Counter)
    notes: collections.Counter = collections.Counter()
    fails = collections.Counter()
    cases = 0
    for p in paths:
        with open(p) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("summary"):
                    cases += rec["cases"]
                    for k, v in rec["stats"].items():
                        stats[k].update(v)
                    notes.update(rec["notes"])
                else:
                    fails[(rec["entry"], rec["op"], rec["category"])] += 1
    print(f"{cases} cases")
    print(f"{'entry/op':42} {'ok':>6} {'fail':>5} {'skip':>5}")
    for k, c in sorted(stats.items()):
        print(f"{k:42} {c['ok']:6} {c['fail']:5} {c['skip']:5}")
    print("notes:", dict(notes))
    for k, v in sorted(fails.items(), key=str):
        print("failures:", k, v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
