"""torch.lerp backward (Scalar and Tensor weight), fused: one pass reads grad (and weight, end, self where the
requested gradients need them) once and writes every requested gradient.

grad_self = g*(1 - w), grad_end = g*w, grad_weight = g*(end - self) (tensor weight), at the broadcast shape, each
summed back to its input's shape. A Python-number weight enters as the two float64 scalars (1 - w) and w, cast to
the math dtype as ATen casts a Scalar (so the scalar-weight gradients are bit-identical to stock's). With
`enable()`, `torch.lerp` reaches the `lerp.Scalar` / `lerp.Tensor` overrides on the autograd key."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real

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

_OP = "lerp_backward"


@triton.jit
def _lerp_backward_math(g, w, end, start, one_minus_ws, ws, SCALAR: tl.constexpr):
    if SCALAR:
        return g * one_minus_ws, g * ws, g
    else:
        return g * (1.0 - w), g * w, g * (end - start)


_LERP_BACKWARD = MultiPointwise(_OP, _lerp_backward_math, ("grad", "weight", "end", "self"),
                                ("grad_self", "grad_end", "grad_weight"))


def _lerp_grads(grad, start, end, weight, self_spec, end_spec, weight_spec):
    """The fused pass. `*_spec`: (shape, dtype) of an input whose gradient is wanted, else None; `start` / `end`
    are read only for grad_weight, a tensor `weight` only for grad_self / grad_end (None where not needed)."""
    if weight is not None and not isinstance(weight, torch.Tensor):  # a real number (callers checked)
        w = float(weight)
        return _LERP_BACKWARD((grad,), (self_spec, end_spec, None), scalars=(1.0 - w, w), flag=1)
    need_w = self_spec is not None or end_spec is not None
    ins = (grad, weight if need_w else None, end if weight_spec else None, start if weight_spec else None)
    return _LERP_BACKWARD(ins, (self_spec, end_spec, weight_spec))


def _spec(t) -> tuple:
    return (t.shape, t.dtype)


def _lerp_backward_reference(grad, self, end, weight, output_mask=(True, True, True)):
    """What stock autograd computes (derivatives.yaml), each gradient summed back to its input's shape."""
    if isinstance(weight, torch.Tensor):
        # .to: 0-d operands promote among themselves (an f16 grad times a 0-d f64 weight is f64); autograd casts back
        gs = (grad * (1 - weight)).sum_to_size(self.shape).to(self.dtype) if output_mask[0] else None
        ge = (grad * weight).sum_to_size(end.shape).to(end.dtype) if output_mask[1] else None
        gw = (grad * (end - self)).sum_to_size(weight.shape).to(weight.dtype) if output_mask[2] else None
        return gs, ge, gw
    w = float(weight)
    return ((grad * (1.0 - w)).sum_to_size(self.shape) if output_mask[0] else None,
            (grad * w).sum_to_size(end.shape) if output_mask[1] else None, None)


def _lerp_cases(device, dtype, size: str) -> list[Case]:
    rows, cols = matrix_shape(size)
    n = rows * cols
    el = torch.empty((), dtype=dtype).element_size()
    g = randn((rows, cols), device, dtype)
    full = stand_in((rows, cols), device, dtype)
    start, end = randn((rows, cols), device, dtype), randn((rows, cols), device, dtype)
    w = torch.rand((rows, cols), device=device).to(dtype)
    w_row = torch.rand((rows, 1), device=device).to(dtype)
    # the summed gradient gets positive terms, g*(end - self) > 0: thousands of terms that cancel to ~0 have no
    # relative accuracy in any fp32 summation (stock's included), and the check compares within a fixed tolerance
    g_pos, end_up = g.abs() + 0.1, (start.float() + torch.rand_like(start, dtype=torch.float32) + 0.1).to(dtype)
    return [
        Case(f"scalar weight {rows}x{cols}", (g, full, full, 0.3), {}, bytes=3 * n * el, elements=n),
        Case(f"tensor weight {rows}x{cols}", (g, start, end, w), {}, bytes=7 * n * el, elements=n),
        Case(f"weight ({rows}, 1) {rows}x{cols}", (g_pos, start, end_up, w_row), {}, bytes=(5 * n + 2 * rows) * el,
             elements=n),
    ]


_DYADIC_WEIGHTS = (0.25, -1.5, 0.0, 1.0, 0.625, 2.0)  # 1 - w exact too: sums of their products stay exact


def _lerp_samples(rng, device, dtype):
    """self, end and a weight of shapes that broadcast together: a tensor weight, a 0-d one of any dtype, or a
    Python number; every output_mask; values on the k/8 grid (and dyadic weights) where a gradient is summed or a 0-d
    weight of another dtype rounds its gradient at another dtype's tolerance."""
    d = Draw(rng, device, dtype)
    for edge in d.edges():
        shape = d.shape(edge)
        kind = rng.choice(("number", "tensor", "tensor", "0-d"))
        shapes = [d.operand(shape), d.operand(shape)] + {"tensor": [d.operand(shape)], "0-d": [()]}.get(kind, [])
        mask = tuple(rng.random() < 0.8 for _ in range(3))
        full = torch.broadcast_shapes(*shapes)
        grid = kind == "0-d" or any(m and s != full for m, s in zip(mask, shapes))
        if kind == "number":
            weight = rng.choice(_DYADIC_WEIGHTS + (() if grid else (1 / 3, 0.3)))
        else:
            weight = d.tensor(shapes[2], "grid", dtype=dtype if kind == "tensor" else rng.choice(FLOAT_DTYPES))
        g, start, end = (d.tensor(s, "grid" if grid else None, huge=False) for s in (full, *shapes[:2]))
        yield Case(describe(grad=g, self=start, end=end, weight=weight, output_mask=mask),
                   (g, start, end, weight, mask))


def _lerp_errors(device):
    t = rand_on(device)
    return [
        refuse("end of another dtype", Unsupported, "end", t(3, 4), t(3, 4), t(3, 4, dtype=torch.float64), 0.5),
        refuse("a 1-D weight of another dtype", Unsupported, "weight", t(3, 4), t(3, 4), t(3, 4),
               t(4, dtype=torch.float64)),
        refuse("weight a string", Unsupported, "weight", t(3, 4), t(3, 4), t(3, 4), "0.5"),
        refuse("grad of another shape", InvalidProblem, "grad", t(3, 5), t(3, 4), t(3, 4), 0.5),
        refuse("shapes that do not broadcast", InvalidProblem, "self/end/weight", t(3, 4), t(3, 4), t(3, 4),
               t(2, 4)),
        refuse("output_mask of two", InvalidProblem, "output_mask", t(3, 4), t(3, 4), t(3, 4), 0.5, (True, True)),
        refuse("an int self", Unsupported, "self", t(3, 4), t(3, 4, dtype=torch.int32), t(3, 4), 0.5),
    ]


def _same_dtype(self, end) -> bool:
    return self.dtype in FLOAT_DTYPES and end.dtype == self.dtype


def _scalar_accepts(self, end, weight) -> bool:
    # (a float, as the dispatcher passes a Scalar, without isinstance's walk of the Real ABC)
    return _same_dtype(self, end) and (type(weight) is float or isinstance(weight, Real))


def _tensor_accepts(self, end, weight) -> bool:
    return _same_dtype(self, end) and weight.dtype in FLOAT_DTYPES and (weight.dtype == self.dtype or
                                                                        weight.dim() == 0)


def _scalar_save(ctx, needs, self, end, weight) -> None:
    ctx.weight = float(weight)
    ctx.specs = (_spec(self) if needs[0] else None, _spec(end) if needs[1] else None, None)


def _tensor_save(ctx, needs, self, end, weight) -> None:
    keep_w = needs[0] or needs[1]
    ctx.save_for_backward(self if needs[2] else None, end if needs[2] else None, weight if keep_w else None)
    ctx.weight = None  # (saved as a tensor)
    ctx.specs = (_spec(self) if needs[0] else None, _spec(end) if needs[1] else None,
                 _spec(weight) if needs[2] else None)


def _saved(ctx) -> tuple:
    if ctx.weight is not None:  # a Python number
        return None, None, ctx.weight
    return ctx.saved_tensors


def _lerp_fused(ctx, grad, _needs):
    start, end, weight = _saved(ctx)
    return _lerp_grads(grad, start, end, weight, *ctx.specs)


def _lerp_composite(ctx, grad, _needs):
    start, end, weight = _saved(ctx)
    s, e, w = ctx.specs
    gs = (grad * (1 - weight)).sum_to_size(s[0]) if s else None
    ge = (grad * weight).sum_to_size(e[0]) if e else None
    gw = (grad * (end - start)).sum_to_size(w[0]).to(w[1]) if w else None
    return gs, ge, gw


def _lerp_examples(device, dtype):
    a = randn((8, 5), device, dtype).requires_grad_(True)
    b = randn((8, 5), device, dtype)
    w = torch.rand((8, 1), device=device).to(dtype).requires_grad_(True)
    return {"lerp.Scalar": ((a, b, 0.25), {}), "lerp.Tensor": ((a, b, w), {})}


_ATEN = {
    "lerp.Scalar": fused_autograd(_OP, "lerp.Scalar", accepts=_scalar_accepts, save=_scalar_save, fused=_lerp_fused,
                                  composite=_lerp_composite),
    "lerp.Tensor": fused_autograd(_OP, "lerp.Tensor", accepts=_tensor_accepts, save=_tensor_save, fused=_lerp_fused,
                                  composite=_lerp_composite),
}


@register_op(_OP, aten=_ATEN, dispatch="autograd", accumulates=True, reference=_lerp_backward_reference,
             cases=_lerp_cases, aten_examples=_lerp_examples, samples=_lerp_samples, errors=_lerp_errors,
             **NATIVE_IN_AUTO)
def lerp_backward(grad: torch.Tensor, self: torch.Tensor, end: torch.Tensor, weight: float | torch.Tensor,
                  output_mask: Sequence[bool] = (True, True, True)
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of torch.lerp(self, end, weight) in one pass: (grad_self, grad_end, grad_weight), each at its
    input's shape and dtype; None where output_mask says so, and grad_weight None for a Python-number weight
    (self and end are read only for grad_weight)."""
    mask = check_output_mask(_OP, output_mask, 3)
    specs = _checked.checked((mask, *meta_key((grad, self, end, weight))),
                    lambda: _lerp_specs(grad, self, end, weight, mask))
    return _lerp_grads(grad, self, end, weight, *specs)


_checked = PlanCache("kernels.lerp._checked")  # validated problems -> the gradients' (shape, dtype) specs


def _lerp_specs(grad, self, end, weight, mask) -> tuple:
    """lerp_backward's validation; the (shape, dtype) of each gradient asked for (None for the others)."""
    check_tensor(_OP, "grad", grad)
    check_tensor(_OP, "self", self)
    check_tensor(_OP, "end", end)
    if end.dtype != self.dtype:  # PyTorch's rule: no type promotion between self and end
        raise Unsupported(_OP, "end", f"dtype {self.dtype} (the dtype of self)", end.dtype)
    if isinstance(weight, torch.Tensor):
        check_tensor(_OP, "weight", weight)
        if weight.dtype != self.dtype and weight.dim() != 0:  # ... nor with a weight that is not 0-d
            raise Unsupported(_OP, "weight", f"dtype {self.dtype} (the dtype of self) or a 0-d tensor",
                              f"a {weight.dim()}-d tensor of dtype {weight.dtype}")
        shapes = (self.shape, end.shape, weight.shape)
    elif isinstance(weight, Real):
        shapes = (self.shape, end.shape)
    else:
        raise Unsupported(_OP, "weight", "a real number or a floating tensor", type(weight).__name__)
    shape = broadcast_shape(_OP, ("self", "end", "weight")[:len(shapes)], shapes)
    if shape != tuple(grad.shape):
        raise InvalidProblem(_OP, "grad", f"shape {shape} (self, end and weight broadcast)", tuple(grad.shape))
    tensor_w = isinstance(weight, torch.Tensor)
    return (_spec(self) if mask[0] else None, _spec(end) if mask[1] else None,
            _spec(weight) if mask[2] and tensor_w else None)
