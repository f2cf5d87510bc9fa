"""repeat backward: dx[c] = sum of grad over every tile, as one deterministic strided reduction.

The gradient of `x.repeat(r0, ..., r{m-1})` (x of shape s, padded with leading 1s to rank m) has shape
(r0*s0, ..., r{m-1}*s{m-1}); seen in place as (r0, s0, r1, s1, ...) - element (k*s_i + c) along dim i sits at
offset k*(s_i*stride_i) + c*stride_i - it is summed over the r dims by the shared reduction
(`gradkern.reduction`): coalesced across outputs, fp32 accumulation (fp64 for f64), one fixed order.

Autograd: `repeat`'s derivative is a C++ function (`repeat_backward` in FunctionsManual.cpp, a reshape plus
sum), not an ATen op, so there is nothing to override below autograd. `enable()` registers aten::repeat on the
autograd key instead, as it does where, lerp and prelu (routing/autograd.py's fused_autograd): a
`torch.autograd.Function` whose forward is stock `repeat` (ATen's own autograd kernel) and whose backward is this
kernel; with create_graph=True its backward is autograd's own formula (so double backward is stock's).
Forward-mode AD, functorch transforms and non-plain tensors are left to stock."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from .._cases import Draw, describe, refuse
from .._runtime import FLOAT_DTYPES, values_key
from ..config import PlanCache
from ..engines.reduction import plan_view, run_plan
from ..errors import InvalidProblem, RankUnsupported, Unsupported
from ..launch.checks import check_tensor
from ..registry import Case, register_op
from ..routing.autograd import STOCK_IN_AUTO, fused_autograd

_OP = "repeat_backward"
MAX_REPEAT_RANK = 8
_views = PlanCache("kernels.repeat._views")


def _ints(name: str, values, what: str) -> tuple[int, ...]:
    if isinstance(values, torch.Size):
        return tuple(values)
    try:  # what ATen's int lists take: ints and int-like values (operator.index), not floats, bools or strings
        if isinstance(values, (str, bytes)) or any(isinstance(v, bool) for v in values):
            raise TypeError
        out = tuple(operator.index(v) for v in values)
    except (TypeError, ValueError):
        raise InvalidProblem(_OP, name, f"a sequence of {what}", values) from None
    if any(v < 0 for v in out):
        raise InvalidProblem(_OP, name, f"a sequence of {what}", out)
    return out


def _plan(grad: torch.Tensor, repeats, input_shape):
    """(the reduction plan reading grad in place as (r0, s0, r1, s1, ...), input_shape, whether there is nothing to
    sum: no leading dims and every repeat 1), after validation."""
    check_tensor(_OP, "grad", grad)
    reps = _ints("repeats", repeats, "non-negative ints")
    shape = _ints("input_shape", input_shape, "non-negative sizes")
    if len(reps) < len(shape):
        raise InvalidProblem(_OP, "repeats", f"at least {len(shape)} repeats (the input's rank), as Tensor.repeat "
                             "requires", f"{len(reps)} ({list(reps)})")
    if len(reps) > MAX_REPEAT_RANK:
        raise RankUnsupported(_OP, "repeats", f"at most {MAX_REPEAT_RANK} repeats (rank <= {MAX_REPEAT_RANK})",
                              len(reps))
    padded = (1,) * (len(reps) - len(shape)) + shape
    expected = tuple(r * s for r, s in zip(reps, padded, strict=True))
    if tuple(grad.shape) != expected:
        raise InvalidProblem(_OP, "grad", f"shape {expected} (repeats {list(reps)} times input_shape "
                             f"{list(shape)})", tuple(grad.shape))
    vshape: list[int] = []
    vstride: list[int] = []
    for r, s, g in zip(reps, padded, grad.stride(), strict=True):
        vshape += [r, s]
        vstride += [s * g, g]
    dims = tuple(range(0, 2 * len(reps), 2))
    identity = len(reps) == len(shape) and all(r == 1 for r in reps)
    return plan_view(tuple(vshape), tuple(vstride), grad.dtype, dims, op=_OP), shape, identity


def repeat_backward(grad: torch.Tensor, repeats: Sequence[int], input_shape: Sequence[int]) -> torch.Tensor:
    """Gradient of `x.repeat(*repeats)` for x of `input_shape`: grad summed over every tile (fp32 accumulation,
    fp64 for f64; a fixed summation order). Repeats may add leading dims and contain 1s and 0s (0: zeros)."""
    try:  # (with the negative bit, which validation refuses)
        rkey, skey = values_key(repeats), values_key(input_shape)
        key = None if rkey is None or skey is None else (grad.shape, grad.stride(), grad.dtype, grad.device,
                                                         grad.is_neg(), rkey, skey)
        plan = _views.get(key) if key is not None else None
    except (AttributeError, TypeError):
        key, plan = None, None
    if plan is None:
        plan = _views.remember(key, _plan(grad, repeats, input_shape))
    if plan[2]:  # nothing to sum: autograd's formula returns grad itself (a sum would turn -0.0 into +0.0)
        return grad.clone(memory_format=torch.contiguous_format)
    return run_plan(plan[0], grad, plan[1])


def _stock_repeat_backward(grad: torch.Tensor, repeats, input_shape) -> torch.Tensor:
    """autograd's own formula (torch/csrc/autograd/FunctionsManual.cpp `repeat_backward`), step for step."""
    repeats, input_shape = list(repeats), list(input_shape)
    if 0 in repeats:
        return torch.zeros(input_shape, dtype=grad.dtype, device=grad.device)
    n_lead = grad.dim() - len(input_shape)
    for _ in range(n_lead):
        grad = grad.sum(0)
    size: list[int] = []
    sum_dims: list[int] = []
    for d, s in enumerate(input_shape):
        if repeats[d + n_lead] != 1:
            size.append(repeats[d + n_lead])
            sum_dims.append(len(size) - 1)
        size.append(s)
    if sum_dims:
        grad = grad.reshape(size).sum(sum_dims)
    return grad


# ----------------------------------------------------------------------------------------------- autograd
# aten::repeat at the autograd key (routing/autograd.py's fused_autograd): stock's forward, gradkern's backward
def _repeat_accepts(self, repeats) -> bool:
    return True  # (a dtype the kernel does not take gets autograd's own formula in the backward)


def _repeat_save(ctx, _needs, self, repeats) -> None:
    ctx.repeats, ctx.input_shape = tuple(repeats), tuple(self.shape)
    ctx.kernel = self.dtype in FLOAT_DTYPES


def _repeat_fused(ctx, grad, needs):
    if len(ctx.repeats) == len(ctx.input_shape) and all(r == 1 for r in ctx.repeats):
        return grad, None  # nothing to sum: autograd's formula hands grad on as it is (no copy)
    if not ctx.kernel:
        return _repeat_composite(ctx, grad, needs)
    return repeat_backward(grad, ctx.repeats, ctx.input_shape), None


def _repeat_composite(ctx, grad, _needs):
    """autograd's own formula, so that higher-order gradients are stock PyTorch's."""
    return _stock_repeat_backward(grad, ctx.repeats, ctx.input_shape), None


_REPEAT_OVERRIDE = fused_autograd(_OP, "repeat", accepts=_repeat_accepts, save=_repeat_save, fused=_repeat_fused,
                                  composite=_repeat_composite)


# ----------------------------------------------------------------------------------------------- cases
_SHAPES = {
    "tiny": [((16, 16), (4, 4))],
    "small": [((24, 20), (4, 4)), ((32, 8), (2, 8)), ((16, 8), (64, 1)), ((4, 4), (16, 16)),
              ((3, 5), (2, 1, 3)), ((2, 3, 4), (1, 2, 3)), ((7,), (3, 1, 2))],
    "check": [((256, 256), (4, 4)), ((1024, 64), (2, 8)), ((1024, 64), (64, 1)), ((16, 16), (64, 64)),
              ((8, 16, 32), (2, 3, 1, 2))],
    "large": [((1024, 1024), (4, 4)), ((4096, 256), (2, 8)), ((4096, 256), (64, 1)), ((64, 64), (256, 256))],
}


def _cases(device, dtype, size: str) -> list[Case]:
    el = torch.empty((), dtype=dtype).element_size()
    out = []
    for shape, reps in _SHAPES[size]:
        padded = (1,) * (len(reps) - len(shape)) + shape
        gshape = tuple(r * s for r, s in zip(reps, padded, strict=True))
        grad = torch.randn(gshape, device=device, dtype=torch.float32).to(dtype)
        n_in = math.prod(shape)
        label = f"{'x'.join(map(str, shape))} rep {tuple(reps)}"
        out.append(Case(label, (grad, list(reps), list(shape)), {}, bytes=(grad.numel() + n_in) * el,
                        elements=n_in))
    return out


def _samples(rng, device, dtype):
    """Inputs of rank 0 to 3 (sizes 0 to 4), repeats of 0 to 3 and up to two leading ones (which add dims), grad in
    every layout; values on the k/8 grid where tiles are summed."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        shape = d.shape(edge, ranks=(0, 3), hi=4)
        reps = [rng.choice((1, 1, 2, 3, 0) if edge == "empty" else (1, 1, 2, 3)) for _ in range(rng.randint(0, 2))]
        reps += [rng.choice((0, 1, 2, 3)) if edge == "empty" else rng.choice((1, 1, 2, 3)) for _ in shape]
        g_shape = tuple(r * n for r, n in zip(reps, (1,) * (len(reps) - len(shape)) + shape, strict=True))
        sums = math.prod(reps) > 1
        g = d.tensor(g_shape, "grid" if sums else None, huge=not sums)
        yield Case(describe(grad=g, repeats=reps, input_shape=shape), (g, reps, list(shape)))


def _errors(device):
    g = torch.randn(4, 6, device=device)
    return [
        refuse("fewer repeats than dims", InvalidProblem, "repeats", g, [2], [2, 6]),
        refuse("a negative repeat", InvalidProblem, "repeats", g, [2, -1], [2, 6]),
        refuse("a repeat of 1.5", InvalidProblem, "repeats", g, [2, 1.5], [2, 6]),
        refuse("grad of another shape", InvalidProblem, "grad", g, [2, 2], [2, 6]),
        refuse("input_shape of floats", InvalidProblem, "input_shape", g, [2, 1], [2.0, 6.0]),
        refuse("more repeats than dims the kernels index", RankUnsupported, "repeats", g.view((1,) * 7 + (4, 6)),
               [1] * 9, [4, 6]),
        refuse("int grad", Unsupported, "grad", g.int(), [2, 1], [2, 6]),
    ]


def _aten_examples(device, dtype) -> dict:
    x = torch.randn(3, 4, device=device, dtype=dtype, requires_grad=True)
    return {"repeat": ((x, [2, 1, 3]), {})}


def _fake(grad: torch.Tensor, repeats, input_shape) -> torch.Tensor:
    return grad.new_empty(tuple(input_shape))


register_op(_OP, aten={"repeat": _REPEAT_OVERRIDE}, dispatch="autograd", accumulates=True,
            reference=_stock_repeat_backward, cases=_cases, aten_examples=_aten_examples, fake=_fake,
            samples=_samples, errors=_errors, **STOCK_IN_AUTO)(repeat_backward)
