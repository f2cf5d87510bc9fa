"""Pointwise activation backwards (and hardshrink's forward), all on the shared elementwise launcher.

Each op is its math as a scalar Triton function, a `Pointwise` and the ATen-signature wrapper. Formulas and
boundary conventions follow ATen's CUDA kernels (see shared/docs/semantics.md)."""

from __future__ import annotations

import functools
import math
from numbers import Real

import torch
import triton
import triton.language as tl

from .._cases import Draw, describe, pointwise_cases, rand_on, randn, refuse
from .._runtime import FLOAT_DTYPES
from ..engines.elementwise import Pointwise
from ..errors import InvalidProblem, Unsupported
from ..launch.checks import result_dtype
from ..launch.launcher import round_to_dtype
from ..registry import Case, register_op

# enable()'s route for every op here (see registry.OpInfo.route): ATen's kernels for them are deterministic and run
# at the copy ceiling; gradkern's are level with them at best (0.61x at 16-bit sizes not a multiple of 16, H100), so
# routing would only add host time
_STOCK_ROUTE = {"route": False, "route_doc": "stock (deterministic, and as fast: ATen's kernel runs at the copy "
                "ceiling); gradkern only in mode \"always\""}

# ATen multiplies by the float literal 1.0f/6.0f in every dtype (fp64 included), not by 1/6.
_ONE_SIXTH_F32 = 0.1666666716337204


def _real(op: str, name: str, value) -> float:
    """A scalar argument as a float: a real number or a one-element real tensor (read now), else a named error."""
    if type(value) is float:  # the common case, first: the checks below cost about a microsecond a call
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and not value.is_complex():
            return float(value)
        given = f"a tensor of {value.numel()} elements and dtype {value.dtype}"
    elif isinstance(value, Real):
        return float(value)
    else:
        given = type(value).__name__
    raise Unsupported(op, name, "a real number", given)


# ------------------------------------------------------------------------------------------------- elu
@triton.jit
def _elu_backward_math(g, x, _c, negcoef, poscoef, negiptcoef, IS_RESULT: tl.constexpr):
    if IS_RESULT:
        neg = g * negiptcoef * (x + negcoef)
    else:
        neg = g * negiptcoef * negcoef * tl.exp(x * negiptcoef)
    return tl.where(x <= 0, neg, g * poscoef)


def _elu_backward_reference(g, alpha, scale, input_scale, is_result, x):
    # NaN x takes the else branch (g*scale) in ATen's CUDA kernel; its vectorised CPU kernel gives NaN there
    out = torch.ops.aten.elu_backward(g, alpha, scale, input_scale, is_result, x)
    return torch.where(torch.isnan(x), g * float(scale), out)


_ELU_BACKWARD = Pointwise("elu_backward", _elu_backward_math, ("grad_output", "self_or_result"), "grad_input")


def _elu_cases(device, dtype, n):
    g, x = randn(n, device, dtype), randn(n, device, dtype, scale=3.0)
    return [("elu", (g, 1.0, 1.0, 1.0, False, x)),
            ("celu a=2", (g, 2.0, 1.0, 0.5, False, x)),
            ("selu result", (g, 1.6732632423543772, 1.0507009873554805, 1.0, True, x))]


_LAMBDAS = (0.5, 0.5, 0.0, 1.0, 3.0, 0.1, 1 / 3, 2.5, 1e-30, 1e-6)
_SELU = (1.6732632423543772, 1.0507009873554805, 1.0)


def _elu_params(rng) -> tuple:
    """(alpha, scale, input_scale, is_result): elu's, celu's, selu's or arbitrary ones."""
    kind = rng.choice(("elu", "celu", "selu", "any"))
    if kind == "any":
        alpha, scale, input_scale = (rng.choice((0.0, 1.0, -1.0, 0.3, 2.0, 1e-3, 100.0, -0.5, 1e-30)) for _ in "abc")
    else:
        a = rng.choice((1.0, 0.5, 2.0, 1e-3, 1.7))
        alpha, scale, input_scale = {"elu": (a, 1.0, 1.0), "celu": (a, 1.0, 1.0 / a), "selu": _SELU}[kind]
    is_result = rng.random() < 0.3
    return (abs(alpha) if is_result else alpha), scale, input_scale, is_result  # (is_result: alpha >= 0)


def _samples(op: str):
    """samples(rng, device, dtype) of one of this module's ops: grad_output and self of shapes that broadcast
    together (either one the full shape; a 0-d grad_output of another dtype; self of another dtype), values at
    the op's thresholds and special values, the op's scalars."""

    def samples(rng, device, dtype):
        d = Draw(rng, device, dtype)
        for edge in d.edges():
            shape = d.shape(edge)
            g_shape = d.operand(shape)
            x_shape = d.operand(shape) if g_shape == shape else shape
            if rng.random() < 0.5:
                g_shape, x_shape = x_shape, g_shape
            if op == "hardsigmoid_backward":
                params, points = (), (3.0,)
            elif op == "elu_backward":
                params, points = _elu_params(rng), (0.0,)
            else:
                lambd = rng.choice(_LAMBDAS) * (-1 if op != "softshrink_backward" and rng.random() < 0.2 else 1)
                params, points = (lambd,), (abs(lambd),)
            x_dtype = rng.choice(FLOAT_DTYPES) if rng.random() < 0.2 and op != "hardshrink" else dtype
            x = d.tensor(shape if op == "hardshrink" else x_shape, points=points, dtype=x_dtype)
            if op == "hardshrink":
                yield Case(describe(self=x, lambd=params[0]), (x, *params))
                continue
            # (elu's g scaled by alpha * scale may pass the float32 math range where float64's holds it: no huge g)
            huge = op != "elu_backward"
            g = d.tensor(g_shape, huge=huge) if rng.random() < 0.9 else \
                d.tensor((), huge=huge, dtype=rng.choice(FLOAT_DTYPES))
            args = (g, *params, x) if op == "elu_backward" else (g, x, *params)
            yield Case(describe(grad_output=g, self=x, params=params), args)

    return samples


def _errors(op: str):
    """errors(device) of one of this module's ops: shapes that do not broadcast, integer and list operands,
    grad_input=/out= buffers that are expanded, of another dtype or shape, or overlap an operand, and the scalars'
    bad values."""
    names = {"elu_backward": ("grad_output", "self_or_result"), "hardshrink_backward": ("grad_out", "self"),
             "hardshrink": ("self",)}.get(op, ("grad_output", "self"))
    out_kw = "out" if op == "hardshrink" else "grad_input"
    params = {"elu_backward": (1.0, 1.0, 1.0, False), "hardsigmoid_backward": ()}.get(op, (0.5,))

    def errors(device):
        t = rand_on(device)

        def call(label, error, arg, *tensors, scalars=params, **kw):
            """The op on `tensors` (grad_output, self) and `scalars`, in its argument order."""
            args = (tensors[0], *scalars, tensors[1]) if op == "elu_backward" else (*tensors, *scalars)
            return refuse(label, error, arg, *args, **kw)

        unary = op == "hardshrink"
        ins = (t(3, 4),) if unary else (t(3, 4), t(3, 4))
        poison = {out_kw: torch.full((3, 4), math.nan, device=device)}  # (bad operands: out= stays untouched)
        out = []
        if not unary:
            out += [call("shapes that do not broadcast", InvalidProblem, "/".join(names), t(3, 4), t(3, 5),
                         **poison),
                    call("int64 grad", Unsupported, names[0], t(3, 4, dtype=torch.int64), t(3, 4), **poison)]
        out += [call("int32 self", Unsupported, names[-1], *ins[:-1], t(3, 4, dtype=torch.int32), **poison),
                call("a list, not a tensor", Unsupported, names[-1], *ins[:-1], [1.0, 2.0], **poison),
                call("out expanded", InvalidProblem, out_kw, *ins, **{out_kw: t(1, 4).expand(3, 4)}),
                call("out of another dtype", Unsupported, out_kw, *ins, **{out_kw: t(3, 4, dtype=torch.float64)}),
                call("out of another shape", InvalidProblem, out_kw, *ins, **{out_kw: t(3, 5)})]
        buf = t(2 * 12)
        overlap = (buf[:12].view(3, 4),) + ins[1:]  # the first operand and out= share part of their memory
        out.append(call("out partly overlapping an operand", InvalidProblem, out_kw, *overlap,
                        **{out_kw: buf[1:13].view(3, 4)}))
        if op == "elu_backward":
            out += [call("is_result with alpha < 0", InvalidProblem, "alpha", *ins, scalars=(-1.0, 1.0, 1.0, True)),
                    call("scale past float32", InvalidProblem, "scale", *ins, scalars=(1.0, 1e39, 1.0, False)),
                    call("alpha a string", Unsupported, "alpha", *ins, scalars=("1", 1.0, 1.0, False))]
        elif op != "hardsigmoid_backward":
            if op == "softshrink_backward":
                out += [call("lambd < 0", InvalidProblem, "lambd", *ins, scalars=(-0.5,)),
                        call("lambd NaN", InvalidProblem, "lambd", *ins, scalars=(math.nan,))]
            out += [call("lambd past float16", InvalidProblem, "lambd", *[x.half() for x in ins], scalars=(1e6,)),
                    call("lambd a tensor of 2", Unsupported, "lambd", *ins, scalars=(t(2),))]
        return out

    return errors


@register_op("elu_backward", aten=("elu_backward",), reference=_elu_backward_reference,
             cases=pointwise_cases(_elu_cases, 2), samples=_samples("elu_backward"),
             errors=_errors("elu_backward"), **_STOCK_ROUTE)
def elu_backward(grad_output: torch.Tensor, alpha: float, scale: float, input_scale: float, is_result: bool,
                 self_or_result: torch.Tensor, *, grad_input: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of elu/celu/selu: x <= 0 -> g*input_scale*alpha*scale*exp(x*input_scale) (or, with is_result,
    g*input_scale*(r + alpha*scale)), else g*scale."""
    args = (_real("elu_backward", "alpha", alpha), _real("elu_backward", "scale", scale),
            _real("elu_backward", "input_scale", input_scale), bool(is_result),
            getattr(self_or_result, "dtype", torch.float64) == torch.float64)
    # (a zero is not cached: 0.0 and -0.0 are one key there, and the products' signs differ)
    scalars = _elu_scalars(*args) if 0.0 not in args[:3] else _elu_scalars.__wrapped__(*args)
    return _ELU_BACKWARD(grad_output, self_or_result, scalars=scalars, flag=int(bool(is_result)), out=grad_input)


@functools.lru_cache(maxsize=1024)
def _elu_scalars(alpha: float, scale: float, input_scale: float, is_result: bool, f64: bool) -> tuple:
    """elu_backward's checks of its scalars and the kernel's (negcoef, poscoef, negiptcoef); cached, as they run
    on every call."""
    if is_result and not alpha >= 0:  # (NaN too, as ATen: its test is "alpha < 0" negated the other way round)
        raise InvalidProblem("elu_backward", "alpha", "alpha >= 0 when is_result=True (in-place elu)", alpha)
    if not f64:  # ATen reads them as float: it refuses what overflows it
        for name, v in (("alpha", alpha), ("scale", scale), ("input_scale", input_scale)):
            if math.isfinite(v) and math.isinf(round_to_dtype(v, torch.float32)):
                raise InvalidProblem("elu_backward", name, "a value representable in float32 (the math type)", v)
    return (alpha * scale, scale, input_scale)


# ------------------------------------------------------------------------------------------------- shrink
@triton.jit
def _shrink_backward_math(g, x, _c, lambd, _s1, _s2, _f: tl.constexpr):
    return tl.where((x >= -lambd) & (x <= lambd), 0.0, g)


@triton.jit
def _hardshrink_math(x, _b, _c, lambd, _s1, _s2, _f: tl.constexpr):
    return tl.where((x >= -lambd) & (x <= lambd), 0.0, x)


_SOFTSHRINK_BACKWARD = Pointwise("softshrink_backward", _shrink_backward_math, ("grad_output", "self"), "grad_input")
_HARDSHRINK_BACKWARD = Pointwise("hardshrink_backward", _shrink_backward_math, ("grad_out", "self"), "grad_input")
_HARDSHRINK = Pointwise("hardshrink", _hardshrink_math, ("self",), "out")


def _lambd(op: str, lambd, dtype: torch.dtype, nonneg: bool) -> float:
    """lambd cast to the inputs' dtype, as ATen does (which also rejects a value the dtype cannot hold)."""
    # (a 0-d tensor's value, read now: not cached by identity)
    return _lambd_value(op, _real(op, "lambd", lambd), dtype, nonneg)


@functools.lru_cache(maxsize=1024)
def _lambd_value(op: str, value: float, dtype: torch.dtype, nonneg: bool) -> float:
    """Cached: it runs on every call, and host time per call is part of the op's cost."""
    if nonneg and not value >= 0:
        raise InvalidProblem(op, "lambd", "lambd >= 0", value)
    if dtype not in FLOAT_DTYPES:  # the launcher rejects the tensor itself, by name
        return value
    rounded = round_to_dtype(value, dtype)
    if math.isinf(rounded) and not math.isinf(value):
        raise InvalidProblem(op, "lambd", f"a value representable in {dtype}", value)
    return rounded


def _common_dtype(a, b) -> torch.dtype:
    try:
        return a.dtype if a.dtype is b.dtype else result_dtype((a, b))
    except AttributeError:  # not tensors: the launcher's validation names the argument
        return torch.float64


def _nan_x_passes_grad(aten_op):
    # ATen's CUDA kernels send NaN x to g (the band test is false); its vectorised CPU kernels send it to 0
    def reference(g, x, lambd):
        return torch.where(torch.isnan(x), g, aten_op(g, x, lambd))
    return reference


def _shrink_backward_fake(g, x, lambd):
    """The shrink backwards' shape and dtype for torch.compile: ATen's own have no meta for symbolic shapes."""
    return torch.empty(torch.broadcast_shapes(g.shape, x.shape), dtype=torch.result_type(g, x), device=g.device)


def _shrink_cases(device, dtype, n):
    return [("lambd=0.5", (randn(n, device, dtype), randn(n, device, dtype), 0.5))]


@register_op("softshrink_backward", aten=("softshrink_backward",), exact=True,
             reference=_nan_x_passes_grad(torch.ops.aten.softshrink_backward), fake=_shrink_backward_fake,
             cases=pointwise_cases(_shrink_cases, 2), samples=_samples("softshrink_backward"),
             errors=_errors("softshrink_backward"), **_STOCK_ROUTE)
def softshrink_backward(grad_output: torch.Tensor, self: torch.Tensor, lambd: float, *,
                        grad_input: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of softshrink: 0 where -lambd <= x <= lambd (closed band, lambd cast to the dtype), else g."""
    lam = _lambd("softshrink_backward", lambd, _common_dtype(grad_output, self), nonneg=True)
    return _SOFTSHRINK_BACKWARD(grad_output, self, scalars=(lam,), out=grad_input)


@register_op("hardshrink_backward", aten=("hardshrink_backward",), exact=True,
             reference=_nan_x_passes_grad(torch.ops.aten.hardshrink_backward), fake=_shrink_backward_fake,
             cases=pointwise_cases(_shrink_cases, 2), samples=_samples("hardshrink_backward"),
             errors=_errors("hardshrink_backward"), **_STOCK_ROUTE)
def hardshrink_backward(grad_out: torch.Tensor, self: torch.Tensor, lambd: float, *,
                        grad_input: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of hardshrink: 0 where -lambd <= x <= lambd (closed band, lambd cast to the dtype), else g."""
    lam = _lambd("hardshrink_backward", lambd, _common_dtype(grad_out, self), nonneg=False)
    return _HARDSHRINK_BACKWARD(grad_out, self, scalars=(lam,), out=grad_input)


def _hardshrink_cases(device, dtype, n):
    return [("lambd=0.5", (randn(n, device, dtype), 0.5))]


@register_op("hardshrink", aten=("hardshrink",), exact=True, cases=pointwise_cases(_hardshrink_cases, 1),
             samples=_samples("hardshrink"), errors=_errors("hardshrink"),
             **_STOCK_ROUTE)
def hardshrink(self: torch.Tensor, lambd: float = 0.5, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Hardshrink forward: x where x > lambd or x < -lambd, else 0 (lambd cast to the dtype)."""
    lam = _lambd("hardshrink", lambd, getattr(self, "dtype", torch.float64), nonneg=False)
    return _HARDSHRINK(self, scalars=(lam,), out=out)


# ------------------------------------------------------------------------------------------------- hardsigmoid
@triton.jit
def _hardsigmoid_backward_math(g, x, _c, one_sixth, _s1, _s2, _f: tl.constexpr):
    return tl.where((x > -3.0) & (x < 3.0), g * one_sixth, 0.0)


_HARDSIGMOID_BACKWARD = Pointwise("hardsigmoid_backward", _hardsigmoid_backward_math, ("grad_output", "self"),
                                  "grad_input")


def _hardsigmoid_cases(device, dtype, n):
    return [("", (randn(n, device, dtype), randn(n, device, dtype, scale=3.0)))]


@register_op("hardsigmoid_backward", aten=("hardsigmoid_backward",), exact=True,
             cases=pointwise_cases(_hardsigmoid_cases, 2), samples=_samples("hardsigmoid_backward"),
             errors=_errors("hardsigmoid_backward"), **_STOCK_ROUTE)
def hardsigmoid_backward(grad_output: torch.Tensor, self: torch.Tensor, *,
                         grad_input: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of hardsigmoid: g * (1/6 as fp32) where -3 < x < 3 (open interval), else 0."""
    return _HARDSIGMOID_BACKWARD(grad_output, self, scalars=(_ONE_SIXTH_F32,), out=grad_input)
