"""torch.where backward, fused: one pass reads grad and the condition once and writes grad_self and grad_other.

grad_self = where(cond, g, 0), grad_other = where(cond, 0, g) at the broadcast shape, each summed back to its
input's shape (deterministically) and cast to its dtype; the condition gets no gradient. With `enable()`,
`torch.where` / `Tensor.where` (tensor or Python-scalar operands) reach the `where.self` override on the autograd
key (see routing.autograd), whose backward is this kernel."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .._cases import Draw, describe, matrix_shape, rand_on, randn, refuse, stand_in
from .._runtime import FLOAT_DTYPES, meta_key
from ..config import PlanCache
from ..engines.multi_pointwise import MultiPointwise, check_output_mask
from ..errors import InvalidProblem, Unsupported
from ..launch.checks import broadcast_shape, check_tensor
from ..registry import Case, register_op
from ..routing.autograd import NATIVE_IN_AUTO, fused_autograd

_OP = "where_backward"
_COND_DTYPES = (torch.bool, torch.uint8)  # uint8: deprecated by PyTorch, still accepted there (with a warning)


@triton.jit
def _where_backward_math(g, cond, _c, _d, _s0, _s1, _flag: tl.constexpr):
    keep = cond != 0
    return tl.where(keep, g, 0.0), tl.where(keep, 0.0, g), g


_WHERE_BACKWARD = MultiPointwise(_OP, _where_backward_math, ("grad", "condition"), ("grad_self", "grad_other"),
                                 exact=True)


def _where_grads(grad: torch.Tensor, condition: torch.Tensor, self_spec, other_spec):
    """The fused pass; `*_spec` is (shape, dtype) of an input whose gradient is wanted, else None."""
    return _WHERE_BACKWARD((grad, condition), (self_spec, other_spec))


def _shape(t) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def _where_backward_reference(grad, condition, self, other, output_mask=(True, True)):
    """What stock autograd computes: where(cond, g, 0) / where(cond, 0, g), summed back to each input's shape."""
    gs = torch.where(condition, grad, 0).sum_to_size(self.shape).to(self.dtype) if output_mask[0] else None
    go = torch.where(condition, 0, grad).sum_to_size(other.shape).to(other.dtype) if output_mask[1] else None
    return gs, go


def _where_cases(device, dtype, size: str) -> list[Case]:
    rows, cols = matrix_shape(size)
    n = rows * cols
    el = torch.empty((), dtype=dtype).element_size()
    g = randn((rows, cols), device, dtype)
    cond = torch.rand((rows, cols), device=device) > 0.5
    full = stand_in((rows, cols), device, dtype)
    # the summed case gets a positive grad: a sum of thousands of terms that cancel to ~0 has no relative
    # accuracy for any fp32 summation (stock's included), and the check compares within a fixed tolerance
    return [
        Case(f"same shape {rows}x{cols}", (g, cond, full, full), {}, bytes=n * (3 * el + 1), elements=n),
        Case(f"other ({rows}, 1) {rows}x{cols}", (g.abs() + 0.1, cond, full, stand_in((rows, 1), device, dtype)),
             {}, bytes=n * (2 * el + 1) + rows * el, elements=n),
        Case(f"other ({cols},) {rows}x{cols}", (g.abs() + 0.1, cond, full, stand_in((cols,), device, dtype)),
             {}, bytes=n * (2 * el + 1) + cols * el, elements=n),
    ]


def _where_samples(rng, device, dtype):
    """Operands of shapes that broadcast together (one of them sometimes a Python number, which has no gradient),
    self and other of different dtypes, a bool or uint8 condition, every output_mask; grad in the promoted dtype,
    mostly on the k/8 grid where a gradient is summed (so that every summation order is exact)."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        shape = d.shape(edge)
        number = rng.choice((None, None, None, "self", "other"))
        operands = [rng.uniform(-2, 2) if number == name else
                    d.tensor(d.operand(shape), "normal",
                             dtype=rng.choice(FLOAT_DTYPES) if rng.random() < 0.3 else dtype)
                    for name in ("self", "other")]
        mask = tuple(rng.random() < 0.8 and isinstance(t, torch.Tensor) for t in operands)
        c_shape = d.operand(shape)
        cond = d.mask(c_shape) if rng.random() < 0.8 else d.place(d.ints(0, 4, c_shape, torch.uint8))
        full = torch.broadcast_shapes(c_shape, *(t.shape for t in operands if isinstance(t, torch.Tensor)))
        sums = any(m and t.shape != full for m, t in zip(mask, operands))
        g_dtype = torch.result_type(*operands) if all(isinstance(t, torch.Tensor) for t in operands) else dtype
        g = d.tensor(full, "grid" if sums and rng.random() < 0.7 else None, huge=not sums, dtype=g_dtype)
        yield Case(describe(grad=g, condition=cond, self=operands[0], other=operands[1], output_mask=mask),
                   (g, cond, *operands, mask))


def _where_errors(device):
    t = rand_on(device)
    cond = torch.rand((3, 4), device=device) > 0.5
    return [
        refuse("grad of another shape", InvalidProblem, "grad", t(3, 5), cond, t(3, 4), t(3, 4)),
        refuse("a float condition", Unsupported, "condition", t(3, 4), t(3, 4), t(3, 4), t(3, 4)),
        refuse("shapes that do not broadcast", InvalidProblem, "condition/self/other", t(3, 4), cond, t(3, 4),
               t(2, 4)),
        refuse("output_mask of three", InvalidProblem, "output_mask", t(3, 4), cond, t(3, 4), t(3, 4),
               (True, True, True)),
        refuse("an int self whose gradient is asked for", Unsupported, "self", t(3, 4), cond,
               t(3, 4, dtype=torch.int32), t(3, 4)),
        refuse("grad a list", Unsupported, "grad", [[1.0] * 4] * 3, cond, t(3, 4), t(3, 4)),
    ]


def _where_accepts(condition, self, other) -> bool:
    return condition.dtype in _COND_DTYPES and self.dtype in FLOAT_DTYPES and other.dtype in FLOAT_DTYPES


def _where_save(ctx, needs, condition, self, other) -> None:
    ctx.save_for_backward(condition)
    ctx.specs = ((self.shape, self.dtype) if needs[1] else None, (other.shape, other.dtype) if needs[2] else None)


def _where_fused(ctx, grad, _needs):
    (condition,) = ctx.saved_tensors
    return (None, *_where_grads(grad, condition, *ctx.specs))


def _where_composite(ctx, grad, _needs):
    (condition,) = ctx.saved_tensors
    s, o = ctx.specs
    gs = torch.where(condition, grad, 0).sum_to_size(s[0]).to(s[1]) if s else None
    go = torch.where(condition, 0, grad).sum_to_size(o[0]).to(o[1]) if o else None
    return None, gs, go


def _where_examples(device, dtype):
    x = randn((8, 5), device, dtype).requires_grad_(True)
    y = randn((8, 1), device, dtype).requires_grad_(True)
    return {"where.self": ((torch.rand((8, 5), device=device) > 0.5, x, y), {})}


_WHERE_OVERRIDE = fused_autograd(_OP, "where.self", accepts=_where_accepts, save=_where_save, fused=_where_fused,
                                 composite=_where_composite)


@register_op(_OP, aten={"where.self": _WHERE_OVERRIDE}, dispatch="autograd", accumulates=True,
             reference=_where_backward_reference, cases=_where_cases, aten_examples=_where_examples,
             samples=_where_samples, errors=_where_errors, **NATIVE_IN_AUTO)
def where_backward(grad: torch.Tensor, condition: torch.Tensor, self, other,
                   output_mask: Sequence[bool] = (True, True)) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of torch.where(condition, self, other) in one pass: (grad_self, grad_other), each at its input's
    shape and dtype (None where output_mask says so; only the inputs' shapes and dtypes are read)."""
    mask = check_output_mask(_OP, output_mask, 2)
    specs = _checked.checked((mask, *meta_key((grad, condition, self, other))),
                    lambda: _where_specs(grad, condition, self, other, mask))
    return _where_grads(grad, condition, *specs)


_checked = PlanCache("kernels.where._checked")  # validated problems -> the gradients' (shape, dtype) specs


def _where_specs(grad, condition, self, other, mask) -> tuple:
    """where_backward's validation; the (shape, dtype) of each gradient asked for (None for the others)."""
    check_tensor(_OP, "grad", grad)
    check_tensor(_OP, "condition", condition, _COND_DTYPES)
    for name, t, wanted in (("self", self, mask[0]), ("other", other, mask[1])):
        if wanted:  # a gradient needs a floating tensor (a Python scalar operand has none)
            check_tensor(_OP, name, t)
    shape = broadcast_shape(_OP, ("condition", "self", "other"), (condition.shape, _shape(self), _shape(other)))
    if shape != tuple(grad.shape):
        raise InvalidProblem(_OP, "grad", f"shape {shape} (condition, self and other broadcast)", tuple(grad.shape))
    return (self.shape, self.dtype) if mask[0] else None, (other.shape, other.dtype) if mask[1] else None
