#!/usr/bin/env python
"""Randomized differential fuzz of gradkern against stock PyTorch (a standalone script: not part of the tests), a
driver over the ops' own random samples and error cases (`register_op(samples=..., errors=...)`).

    TRITON_INTERPRET=1 python scripts/fuzz.py --seed 1 --minutes 10          # CPU, through Triton's interpreter
    python scripts/fuzz.py --seed 1 --minutes 10 --log fuzz-1.jsonl           # (on a GPU: compiled kernels)
    python scripts/fuzz.py --replay 1:123                                      # rerun one case, verbosely
    python scripts/fuzz.py --summarize fuzz-*.jsonl                            # aggregate the logs' summaries

Each case is drawn from (seed, case index) alone, so any case replays exactly with --replay SEED:IDX: an entry point,
an op of the registry (--only: substrings of op names), a dtype, and the first sample of the op's stream seeded by
the case. The samples hold the problems (random shapes with empty, size-1 and odd sizes, layouts, mixed dtypes where
the op takes them, special values and the op's thresholds, its scalar parameters: see each op's `samples`). Three
entry points:

* direct: `gradkern.ops.<op>` on the sample against the registry reference (`OpInfo.reference_fn()`: the ATen op,
  or its CUDA convention where ATen's CPU kernel departs from it, e.g. NaN x in the shrink and elu backwards),
  inputs untouched; where the op takes out= / grad_input=, also into a NaN-poisoned buffer of a random layout or in
  place into an operand of the result's shape (a named refusal of in-place is counted, not failed);
* autograd: the forward ATen op of the sample's problem (torch.where, lerp, prelu, the pads, repeat, elu/celu/selu,
  the shrinks, hardsigmoid, segment_reduce, the pools, upsampling, nll_loss) under `gradkern.use()` or
  `gradkern.enable()` (mode "always") against stock autograd with the same inputs: forwards bit for bit, gradients
  compared as below for a random subset of inputs requiring grad and a fresh grad_output of a random layout;
* error: one of the op's error cases: its named error with a message naming the argument, nothing written.

Comparison, per the guarantees (README "Precision guarantee", gradkern.testing): bit for bit against stock at the
same dtype where they agree (dtypes must); selection and exact-scaling ops (`exact`) must; the others within the
dtype's tolerance of stock in float64 (the tolerance grows with sqrt(terms) for summing ops, as gradkern.testing
does); a summing result that misses the tolerance while stock at the same dtype misses it too is reported as
"ill-conditioned" (not a failure). In the autograd entry, gradients that differ only where the differentiated input
is NaN are counted as the documented CUDA convention (stock's vectorised CPU kernels give 0 or NaN there).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import json
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
from gradkern._cases import DENSE_LAYOUTS, Draw  # noqa: E402
from gradkern.errors import GradkernError  # noqa: E402
from gradkern.registry import REGISTRY  # noqa: E402
from gradkern.testing import (  # noqa: E402
    arrangeable,
    assert_same_kind,
    bits_differ,
    check_error,
    place,
    run_reference,
    snapshot,
    tensors_of,
    tolerance_miss,
)

DEV = gradkern.device()
INTERP = DEV.type == "cpu"
aten = torch.ops.aten
warnings.filterwarnings("ignore")


class Skip(Exception):
    """The drawn case is not meaningful (e.g. a forward without elements in the autograd entry): not counted."""


class Mismatch(Exception):
    def __init__(self, category: str, msg: str):
        super().__init__(f"{category}: {msg}")
        self.category, self.msg = category, msg


class Ctx:
    """One case: its random streams, the description --replay prints, and its counters."""

    def __init__(self, seed: int, idx: int):
        self.rng = random.Random(f"{seed}:{idx}")
        self.desc: list[str] = []
        self.counts: collections.Counter = collections.Counter()
        self.soft: list[str] = []

    def sample(self, name: str):
        dtype = self.rng.choice(REGISTRY[name].dtypes)
        case = next(iter(REGISTRY[name].samples(self.rng, DEV, dtype)))
        self.desc.append(f"{name} {case.label}")
        return case


# ----------------------------------------------------------------------------------------------- comparison
def interp_bf16_subnormal(a, e) -> bool:
    """Under the interpreter, bf16 subnormal results are unreliable (it flushes them): every differing element is a
    bf16 subnormal on one side and a zero or subnormal on the other."""
    pairs = list(zip(tensors_of(a), tensors_of(e)))
    if not INTERP or not pairs:
        return False
    tiny = torch.finfo(torch.bfloat16).tiny
    for x, y in pairs:
        x, y = x.detach().cpu().float(), y.detach().cpu().float()
        if x.shape != y.shape:
            return False
        diff = ~((x == y) | (x.isnan() & y.isnan())) | ((x == 0) & (y == 0) & (x.signbit() != y.signbit()))
        if diff.any() and not (x.abs() < tiny)[diff].all() & (y.abs() < tiny)[diff].all():
            return False
    return any(x.dtype == torch.bfloat16 for x, _ in pairs)


NO_STOCK = object()  # stock's result where its CPU kernel lacks the dtype


def judge(ctx, gk, same, ref64, what: str, exact: bool, summed_from: int = 0, nan_inputs=None) -> None:
    """gradkern's `gk` against stock at the same dtype (`same`; NO_STOCK where stock lacks the dtype) and in
    float64. `nan_inputs`: per output, the input it is the gradient of, for the NaN-input convention (autograd)."""
    if same is not NO_STOCK:
        try:
            assert_same_kind(gk, same, what)  # (None where None too)
        except AssertionError as e:
            raise Mismatch("dtype-shape-or-presence", str(e)) from None
        if bits_differ(gk, same, what) is None:
            return
        if interp_bf16_subnormal(gk, same):
            ctx.counts["interp-bf16-subnormal"] += 1
            return
        if nan_inputs is not None and nan_convention(gk, same, nan_inputs):
            ctx.counts["deliberate:nan-x-cuda-convention"] += 1
            return
    if exact:
        raise Mismatch("bits", bits_differ(gk, same, what) if same is not NO_STOCK else f"{what}: no stock result")
    miss = tolerance_miss(gk, ref64, what, summed_from=summed_from)
    if miss is None:
        ctx.counts["bits-differ-within-tol"] += 1
    elif same is not NO_STOCK and tolerance_miss(same, ref64, what, summed_from=summed_from) is not None:
        ctx.counts["ill-conditioned"] += 1
        ctx.soft.append(f"ill-conditioned {miss}")
    else:
        raise Mismatch("tolerance", miss)


def nan_convention(gk, same, inputs) -> bool:
    """Every difference lies where the input the gradient belongs to is NaN."""
    for a, b, x in zip(tensors_of(gk), tensors_of(same), inputs):
        a, b = a.detach().cpu().double(), b.detach().cpu().double()
        diff = ~((a == b) | (a.isnan() & b.isnan()))
        if diff.any() and not (isinstance(x, torch.Tensor) and x.shape == a.shape
                               and x.detach().cpu().isnan()[diff].all()):
            return False
    return True


def summed(info, args, kwargs) -> int:
    """The terms a summing op's result elements share out (the tolerance's growth), as gradkern.testing counts."""
    return max((t.numel() for t in tensors_of((args, kwargs))), default=0) if info.accumulates else 0


def untouched(before, x, what="input") -> None:
    for i, (b, t) in enumerate(zip(before, tensors_of(x))):
        if t.device.type != "meta" and bits_differ(t, b) is not None:
            raise Mismatch("wrote-input", f"gradkern changed {what} {i} ({tuple(t.shape)}, strides {t.stride()})")


def call(fn, *args, **kwargs):
    """gradkern's call; an exception is a mismatch (the samples are valid problems)."""
    try:
        return fn(*args, **kwargs)
    except GradkernError as e:
        raise Mismatch("gradkern-refuses", f"{type(e).__name__}: {str(e)[:300]}") from None
    except Exception as e:  # noqa: BLE001
        raise Mismatch("gradkern-crash", f"{type(e).__name__}: {str(e)[:300]}\n"
                       + "".join(traceback.format_exception(e)[-6:])) from None


# ----------------------------------------------------------------------------------------------- direct
def direct(ctx, name):
    info = REGISTRY[name]
    case = ctx.sample(name)
    args, kwargs = case.args, dict(case.kwargs)
    before = snapshot((args, kwargs))
    gk = call(info.fn, *args, **kwargs)
    untouched(before, (args, kwargs))
    try:
        same = run_reference(info.reference_fn(), args, kwargs, dtype=None)
    except NotImplementedError:  # (stock's CPU kernel lacks the dtype)
        same = NO_STOCK
    ref64 = None if info.exact else run_reference(info.reference_fn(), args, kwargs)
    judge(ctx, gk, same, ref64, name, info.exact, summed(info, args, kwargs))
    into_buffer(ctx, info, args, kwargs, gk)


def into_buffer(ctx, info, args, kwargs, gk) -> None:
    """For ops with out= / grad_input=: the result into a NaN-poisoned buffer of a random layout, or in place into
    an operand of its shape and dtype; the same bits, and the buffer returned."""
    kw = next((p for p in ("out", "grad_input") if p in inspect.signature(info.fn).parameters), None)
    if kw is None or not isinstance(gk, torch.Tensor) or ctx.rng.random() < 0.5:
        return
    args = list(args)
    same = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.shape == gk.shape
            and a.dtype == gk.dtype and torch._debug_has_internal_overlap(a) == 0]
    if same and ctx.rng.random() < 0.3:
        i = ctx.rng.choice(same)
        buf = args[i] = args[i].clone()
        where = f"in place into argument {i}"
    else:
        where = ctx.rng.choice([k for k in DENSE_LAYOUTS if arrangeable(gk.shape, k)] or ["contig"])
        buf = place(torch.full(gk.shape, float("nan"), dtype=gk.dtype, device=DEV), where, ctx.rng)
    ctx.desc.append(f"{kw}= {where}")
    try:
        res = info.fn(*args, **kwargs, **{kw: buf})
    except GradkernError as e:
        if where.startswith("in place"):
            ctx.counts["refused-in-place"] += 1
            return
        raise Mismatch("out-refused", f"{kw}= {where}: {type(e).__name__}: {str(e)[:300]}") from None
    if res is not buf:
        raise Mismatch("out-identity", f"gradkern did not return the {kw}= tensor")
    d = bits_differ(buf, gk, f"{kw}= {where}")
    if d is not None:
        raise Mismatch("out-bits", d)


# ----------------------------------------------------------------------------------------------- autograd
def _values(ctx, shape, dtype):
    """Fresh random values (grad_output, or a forward input where the sample's is a stand-in) in a random layout."""
    return Draw(ctx.rng, DEV, dtype).tensor(shape, kinds=("normal", "grid"))


def _like(ctx, x):
    """Random values in `x`'s layout where it is dense (stock's pooling forwards take few layouts), else
    contiguous."""
    return torch.empty_like(x).copy_(Draw(ctx.rng, DEV, x.dtype).values(x.shape, kinds=("normal", "grid")))


def _elu(ctx, g, alpha, scale, input_scale, is_result, x):
    if is_result:  # in place on a non-leaf copy: autograd differentiates through the result
        return (lambda t: aten.elu_(t * 1, alpha, scale, input_scale)), [x]
    return (lambda t: aten.elu(t, alpha, scale, input_scale)), [x]


def _pad(mode: str):
    def forward(ctx, g, x, padding):
        return (lambda t: F.pad(t, padding, mode=mode)), [_like(ctx, x)]
    return forward


def _pool(forward, first: bool = False):
    """An op whose backward takes (grad_output, self, *params[, indices]): forward(self, *params)."""
    def make(ctx, g, x, *params):
        params = params[:-1] if first else params  # (max pooling's indices come from the forward)
        return (lambda t: forward(t, *params)[0] if first else forward(t, *params)), [_like(ctx, x)]
    return make


def _upsample(forward):
    def make(ctx, g, output_size, input_size, align_corners, *scales):
        return (lambda t: forward(t, output_size, align_corners, *scales)), [_values(ctx, input_size, g.dtype)]
    return make


def _segment_reduce(ctx, g, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    if data.numel() == 0:
        raise Skip  # stock's backward crashes on empty data
    seg = {"lengths": lengths} if lengths is not None else {"offsets": offsets}
    # (standard strides: stock's CPU forward and backward read the stride of a size-1 segment axis, and the
    # stock side's gradients would follow its misread maxima; the reference's _standard_strides, for the forward)
    return ((lambda d: torch.segment_reduce(d, "max", axis=axis, unsafe=True, initial=initial, **seg)),
            [data.clone(memory_format=torch.contiguous_format)])


#: op -> (ctx, *sample args, **sample kwargs) -> (the forward, its inputs[, which may require grad])
FORWARDS = {
    "elu_backward": _elu,
    "softshrink_backward": lambda ctx, g, x, lambd: ((lambda t: F.softshrink(t, lambd)), [x]),
    "hardshrink_backward": lambda ctx, g, x, lambd: ((lambda t: F.hardshrink(t, lambd)), [x]),
    "hardshrink": lambda ctx, x, lambd: ((lambda t: F.hardshrink(t, lambd)), [x]),
    "hardsigmoid_backward": lambda ctx, g, x: (F.hardsigmoid, [x]),
    "where_backward": lambda ctx, g, cond, a, b, mask: (torch.where, [cond, a, b]),
    "lerp_backward": lambda ctx, g, a, b, w, mask: (torch.lerp, [a, b, w]),
    "prelu_backward": lambda ctx, g, x, w, mask: (F.prelu, [x, w]),
    "_prelu_kernel_backward": lambda ctx, g, x, w: (aten._prelu_kernel, [x, w]),
    "repeat_backward": lambda ctx, g, reps, shape: ((lambda t: t.repeat(reps)), [_values(ctx, shape, g.dtype)]),
    "_segment_reduce_backward": _segment_reduce,
    **{f"{kind}_pad{d}d_backward": _pad(mode) for kind, mode in (("replication", "replicate"),
                                                                  ("reflection", "reflect")) for d in (1, 2, 3)},
    "_adaptive_avg_pool2d_backward": lambda ctx, g, x: _pool(aten._adaptive_avg_pool2d)(ctx, g, x, g.shape[-2:]),
    "_adaptive_avg_pool3d_backward": lambda ctx, g, x: _pool(aten._adaptive_avg_pool3d)(ctx, g, x, g.shape[-3:]),
    "adaptive_max_pool2d_backward": lambda ctx, g, x, i: _pool(aten.adaptive_max_pool2d, True)(ctx, g, x,
                                                                                                g.shape[-2:], i),
    "adaptive_max_pool3d_backward": lambda ctx, g, x, i: _pool(aten.adaptive_max_pool3d, True)(ctx, g, x,
                                                                                                g.shape[-3:], i),
    "avg_pool3d_backward": _pool(aten.avg_pool3d),
    "max_pool3d_with_indices_backward": _pool(aten.max_pool3d_with_indices, True),
    "upsample_linear1d_backward": _upsample(aten.upsample_linear1d),
    "upsample_bilinear2d_backward": _upsample(aten.upsample_bilinear2d),
    "upsample_trilinear3d_backward": _upsample(aten.upsample_trilinear3d),
    "upsample_bicubic2d_backward": _upsample(aten.upsample_bicubic2d),
    "_upsample_bilinear2d_aa_backward": _upsample(aten._upsample_bilinear2d_aa),
    "nll_loss2d_forward": lambda ctx, x, t, w, reduction, ignore: (
        (lambda a, b, c: aten.nll_loss2d_forward(a, b, c, reduction, ignore)[0]), [x, t, w], [True, False, False]),
}


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


def autograd(ctx, name):
    info = REGISTRY[name]
    case = ctx.sample(name)
    fwd, inputs, *diff = FORWARDS[name](ctx, *case.args, **case.kwargs)
    diff = diff[0] if diff else [isinstance(t, torch.Tensor) and t.is_floating_point() for t in inputs]
    needs = [d and ctx.rng.random() < 0.7 for d in diff]
    if not any(needs) and any(diff):
        needs[ctx.rng.choice([i for i, d in enumerate(diff) if d])] = True
    entry = ctx.rng.choice(["use", "enable"])
    ctx.desc.append(f"requires_grad {needs}, entry {entry}")

    def run(tensors, g=None, routed=False):
        leaves = [t.detach().requires_grad_(n) if n else t for t, n in zip(tensors, needs)]
        with routing(entry, routed), torch.enable_grad():
            out = fwd(*leaves)
            if g is None:
                return out, None
            grads = iter(torch.autograd.grad(out, [t for t, n in zip(leaves, needs) if n], g, allow_unused=True))
        return out, [next(grads) if n else None for n in needs]

    try:
        with gradkern.use(False):
            out0, _ = run(inputs)
    except Exception as e:  # noqa: BLE001  (stock refuses: so must gradkern's route)
        try:
            run(inputs, routed=True)
        except Exception as e2:  # noqa: BLE001
            ctx.counts["both-raise"] += 1
            if not (isinstance(e2, GradkernError) or type(e2) is type(e)):
                raise Mismatch("unnamed-error", f"stock {type(e).__name__}; gradkern {type(e2).__name__}: "
                               f"{str(e2)[:300]}") from None
            return
        raise Mismatch("no-error", f"stock raises {type(e).__name__}: {str(e)[:200]}; gradkern returns") from None
    if out0.numel() == 0:
        raise Skip  # (nothing to differentiate; stock's reflection_pad2d backward crashes on it)
    g = _values(ctx, out0.shape, out0.dtype)
    try:
        with gradkern.use(False):
            s = run(inputs, g)
    except NotImplementedError:  # stock's CPU backward lacks the dtype
        raise Skip from None
    except RuntimeError:  # stock's CPU backwards take some layouts only (contiguous grad_output, or self): both
        # sides get contiguous copies
        ctx.counts["stock-needs-contiguous"] += 1
        inputs = [t.clone(memory_format=torch.contiguous_format) if isinstance(t, torch.Tensor) else t
                  for t in inputs]
        g = g.clone(memory_format=torch.contiguous_format)
        with gradkern.use(False):
            s = run(inputs, g)
    before = snapshot((inputs, g))
    gk = call(run, inputs, g, routed=True)
    untouched(before, (inputs, g))
    with gradkern.use(False):
        s64 = run([t.detach().double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in inputs], g.double())
    # the forward is stock's (bit for bit) unless the op is the forward itself (hardshrink, nll_loss2d_forward)
    own = not name.endswith("_backward")
    judge(ctx, gk[0], s[0], s64[0], f"{name} forward", info.exact or not own, summed(info, inputs, {}))
    for i, (a, b, c) in enumerate(zip(gk[1], s[1], s64[1])):  # (a gradient summed to a broadcast input is a sum)
        exact = info.exact and getattr(inputs[i], "shape", None) == out0.shape
        judge(ctx, a, b, c, f"{name} grad[{i}]", exact, g.numel() if info.accumulates or not exact else 0,
              nan_inputs=[inputs[i]])


# ----------------------------------------------------------------------------------------------- errors
def error(ctx, name):
    cases = list(REGISTRY[name].errors(DEV))
    case = ctx.rng.choice(cases)
    ctx.desc.append(f"{name} error case: {case.label}")
    try:
        check_error(name, case)
    except AssertionError as e:
        raise Mismatch("error-case", str(e)[:500]) from None
    except Exception as e:  # noqa: BLE001  (another error than the named one)
        raise Mismatch("unnamed-error", f"{case.label}: {type(e).__name__}: {str(e)[:300]}") from None


# ----------------------------------------------------------------------------------------------- driver
ENTRIES = {"direct": (direct, lambda i: i.samples is not None),
           "autograd": (autograd, lambda i: i.samples is not None and i.name in FORWARDS),
           "error": (error, lambda i: i.errors is not None)}
WEIGHTS = {"direct": 0.45, "autograd": 0.4, "error": 0.15}


def pick(seed, idx, entries, only):
    r = random.Random(f"pick:{seed}:{idx}")
    names = [e for e in ENTRIES if e in entries]
    entry = r.choices(names, [WEIGHTS[e] for e in names])[0]
    ops = sorted(n for n, info in REGISTRY.items()
                 if ENTRIES[entry][1](info) and (not only or any(o in n for o in only)))
    return entry, (r.choice(ops) if ops else None)


def run_case(seed, idx, entries, only):
    entry, name = pick(seed, idx, entries, only)
    if name is None:
        return entry, name, "skip", None, None
    ctx = Ctx(seed, idx)
    try:
        torch.manual_seed(idx)
        ENTRIES[entry][0](ctx, name)
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
    print(f"{'entry':9} {'op':34} {'ok':>5} {'fail':>5} {'skip':>5}")
    for (entry, name), c in sorted(stats.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        print(f"{entry:9} {str(name):34} {c['ok']:5} {c['fail']:5} {c['skip']:5}")
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
        entry, name = pick(a.seed, idx, a.entries.split(","), [s for s in a.only.split(",") if s])
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
    print(f"{'entry/op':46} {'ok':>6} {'fail':>5} {'skip':>5}")
    for k, c in sorted(stats.items()):
        print(f"{k:46} {c['ok']:6} {c['fail']:5} {c['skip']:5}")
    print("notes:", dict(notes))
    for k, v in sorted(fails.items(), key=str):
        print("failures:", k, v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
