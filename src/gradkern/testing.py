"""The test harness shared by the test suite and `python -m gradkern check`: one tolerance table, one compare,
the reference runner (stock PyTorch in float64 on CPU) and boundary-value / layout generators."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .launch.launcher import round_to_dtype
from .registry import get_op
from .routing.dispatch import use

__all__ = ["TOLERANCES", "to_reference", "run_reference", "assert_close", "assert_bitwise_equal", "check_case",
           "boundary_values", "layouts", "poison_like"]

#: (atol, rtol) for comparing a result of `dtype` with the float64 reference.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-12, 1e-10),
    torch.float32: (1e-5, 1.3e-5),
    torch.float16: (1e-3, 2e-3),
    torch.bfloat16: (8e-3, 1.6e-2),
}


def _map(x: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_map(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def to_reference(x: Any, dtype: torch.dtype | None = torch.float64) -> Any:
    """Detached CPU copies of every tensor in `x` (float tensors cast to `dtype`; None keeps the dtype)."""
    def conv(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().cpu()
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t.clone()
    return _map(x, conv)


def run_reference(fn: Callable, args: tuple, kwargs: dict | None = None,
                  dtype: torch.dtype | None = torch.float64) -> Any:
    """Stock PyTorch's `fn` on CPU copies of the arguments (cast to `dtype`), with gradkern's routing off."""
    with use(False):
        return fn(*to_reference(args, dtype), **to_reference(kwargs or {}, dtype))


def _bits(t: torch.Tensor) -> torch.Tensor:
    int_t = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
    return t.contiguous().view(int_t)


def _per_output(actual: Any, expected: Any, what: str, compare: Callable) -> bool:
    """Handle what is not one tensor: None (a gradient not computed) must be None in both; tuples and lists are
    compared output by output with `compare(a, e, what)`. False: both are tensors, for the caller to compare."""
    if actual is None or expected is None:
        assert actual is None and expected is None, f"{what}: {actual!r}, expected {expected!r}"
        return True
    if isinstance(actual, (tuple, list)):
        assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
            compare(a, e, f"{what}[{i}]")
        return True
    return False


def assert_bitwise_equal(actual: Any, expected: Any, what: str = "") -> None:
    """Same shape, dtype and bits (any NaN equals any NaN; +0 and -0 differ). A None result (a gradient not
    computed) must be None in both."""
    if _per_output(actual, expected, what, assert_bitwise_equal):
        return
    a, e = actual.detach(), expected.detach()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    assert a.dtype == e.dtype, f"{what}: dtype {a.dtype}, expected {e.dtype}"
    e = e.to(a.device)
    if not a.is_floating_point():
        assert torch.equal(a, e), f"{what}: values differ"
        return
    if torch.equal(_bits(a), _bits(e)):  # the common case, decided on the device without a host copy
        return
    same = (_bits(a) == _bits(e)) | (torch.isnan(a) & torch.isnan(e))
    if not bool(same.all()):
        idx = (~same).nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int((~same).sum())} of {a.numel()} elements differ in bits; first at "
                             f"{idx}: {a[tuple(idx)].item()!r} vs expected {e[tuple(idx)].item()!r}")


def assert_repeats_bitwise(op_names, dtype: torch.dtype, device, size: str, repeats: int = 3) -> None:
    """Each op's registry cases of `size`, run `repeats` times more through `gradkern.ops`, give the first run's
    bits."""
    from . import ops

    for name in op_names:
        fn = getattr(ops, name)
        for case in get_op(name).cases(device, dtype, size):
            first = fn(*case.args, **case.kwargs)
            for _ in range(repeats):
                assert_bitwise_equal(fn(*case.args, **case.kwargs), first, f"{name} {case.label}")


def assert_close(actual: Any, expected: Any, dtype: torch.dtype | None = None, what: str = "", *,
                 summed_from: int = 0) -> None:
    """Compare a result with the float64 reference (rounded to `dtype`, default the result's) within the
    tolerance of `dtype`. A None result (a gradient not computed) must be None in both. `summed_from`: for
    results that sum an input down, that input's number of elements; each result element then sums
    summed_from / its size terms, and for float32/float64 results (whose dtype is their accumulator's) the
    tolerance grows with the square root of that (rounding errors of a long sum add up as a random walk)."""
    if _per_output(actual, expected, what, lambda a, e, w: assert_close(a, e, dtype, w, summed_from=summed_from)):
        return
    terms = summed_from // actual.numel() if summed_from and actual.numel() else 1
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    dtype = dtype or actual.dtype
    # (16-bit results accumulate in fp32: their error is the final rounding alone, whatever the sum's length)
    grow = math.sqrt(max(terms, 1)) if dtype in (torch.float32, torch.float64) else 1.0
    atol, rtol = (t * grow for t in TOLERANCES[dtype])
    # the reference rounded to the result's dtype first, so that overflow to inf agrees
    expected = expected.detach().cpu().to(dtype).double()
    torch.testing.assert_close(actual.detach().cpu().double(), expected, atol=atol,
                               rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def check_case(op_name: str, args: tuple, kwargs: dict | None = None, *, what: str = "") -> Any:
    """Run gradkern op `op_name` and compare with stock PyTorch: bit-exact against stock at the same dtype for
    ops whose result is a selection or exact scaling, else against stock in float64 within the dtype's
    tolerance (widened for the long sums of reducing ops, see assert_close). Returns gradkern's result."""
    info = get_op(op_name)
    kwargs = kwargs or {}
    out = info.fn(*args, **kwargs)
    what = what or op_name
    if info.exact:
        assert_bitwise_equal(out, run_reference(info.reference_fn(), args, kwargs, dtype=None), what)
    else:  # each result within the tolerance of its own dtype
        # a reducing op's smaller results (e.g. prelu's grad_weight) sum many terms: the tolerance grows with them
        summed = max((t.numel() for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), default=0)
        assert_close(out, run_reference(info.reference_fn(), args, kwargs), None, what,
                     summed_from=summed if info.accumulates else 0)
    return out


def boundary_values(dtype: torch.dtype, *points: float) -> torch.Tensor:
    """A 1-D tensor of `dtype` holding 0, -0, ±1, NaN, ±inf, the largest and smallest finite values and, for
    each of `points` (e.g. lambda, 3), ± the point as given, rounded to `dtype`, and its two neighbours in
    `dtype`."""
    info = torch.finfo(dtype)
    vals = [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, info.max, -info.max, info.tiny, -info.tiny]
    for p in points:
        for q in (p, -p):
            r = round_to_dtype(q, dtype)
            vals += [q, r, _neighbour(r, dtype, +1), _neighbour(r, dtype, -1)]
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


def _neighbour(r: float, dtype: torch.dtype, step: int) -> float:
    """The representable value of `dtype` next to the finite `r`, upwards (step=+1) or downwards (-1)."""
    int_t = {8: torch.int64, 4: torch.int32, 2: torch.int16}[torch.empty((), dtype=dtype).element_size()]
    if r == 0:
        tiny = torch.tensor(1, dtype=int_t).view(dtype).item()
        return tiny if step > 0 else -tiny
    bits = torch.tensor(r, dtype=dtype).view(int_t).item()
    bits += step if r > 0 else -step
    return torch.tensor(bits, dtype=int_t).view(dtype).item()


def layouts(t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Views of the values of `t` in several memory layouts: contiguous, a strided slice of a larger buffer, and
    (for rank >= 2) a transposed copy seen through its transpose."""
    yield "contiguous", t.contiguous()
    big = torch.empty(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype, device=t.device) if t.dim() else None
    if big is not None:
        big[..., ::2] = t
        yield "strided", big[..., ::2]
    if t.dim() >= 2:
        yield "transposed", t.transpose(-1, -2).contiguous().transpose(-1, -2)


def count_calls(monkeypatch, owner: Any, name: str) -> list:
    """Replace `owner.name` (a module's function) by a wrapper that records each call, for the test's duration;
    returns the list the calls are appended to."""
    calls = []
    real = getattr(owner, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor like `t` filled with NaN (a value a correct kernel never leaves behind for finite inputs)."""
    return torch.full_like(t, math.nan)


class Launch:
    """One kernel launch, as a kernel module hands it to `launch.launcher.launch`: the jit function, the grid, the
    tensor arguments (`ptrs`), the other runtime arguments (`ints`) and the constexprs with num_warps (`consts`)."""

    __slots__ = ("kernel", "grid", "ptrs", "ints", "consts")

    def __init__(self, kernel, grid: tuple, ptrs: tuple, ints: tuple, consts: dict):
        self.kernel, self.grid, self.ptrs, self.ints, self.consts = kernel, grid, ptrs, ints, consts


def record_launches(monkeypatch, *modules: Any) -> list[Launch]:
    """Wrap each module's `launch` (the name it imported from `launch.launcher`) for the test's duration, so that
    every kernel launch from here on is appended to the returned list, in order; the launches still run. Call it
    once a test (twice would record each launch twice); `.clear()` the list between the calls it compares."""
    seen: list[Launch] = []
    for module in modules:
        def spy(kernel, grid, ptrs, ints, consts, *rest, _real=module.launch):
            seen.append(Launch(kernel, grid, ptrs, ints, consts))
            return _real(kernel, grid, ptrs, ints, consts, *rest)

        monkeypatch.setattr(module, "launch", spy)
    return seen


def layouts_nd(g: torch.Tensor, transpose: tuple[int, int] = (-1, -2), plane: int = 2
               ) -> Iterator[tuple[str, torch.Tensor]]:
    """(label, view) of the values of `g`, an (N, C, ...) tensor, in layouts a kernel must read in place: a slice of
    a buffer twice as wide along the last dim ("strided"), a copy transposed along the dims `transpose` seen
    through its transpose ("transposed"), channels_last for a 4-D `g` or channels_last_3d for a 5-D one, the first
    batch entry broadcast over the batch ("broadcast batch"), and the first element of the last `plane` dims
    broadcast over them ("broadcast plane"; none for `plane` 0)."""
    big = torch.zeros(*g.shape[:-1], 2 * g.shape[-1], dtype=g.dtype, device=g.device)
    big[..., ::2] = g
    yield "strided", big[..., ::2]
    yield "transposed", g.transpose(*transpose).contiguous().transpose(*transpose)
    fmt = {4: ("channels_last", torch.channels_last), 5: ("channels_last_3d", torch.channels_last_3d)}.get(g.dim())
    if fmt is not None:
        yield fmt[0], g.contiguous(memory_format=fmt[1])
    yield "broadcast batch", g[:1].expand(g.shape)
    if plane:
        yield "broadcast plane", g[(..., *[slice(0, 1)] * plane)].expand(g.shape)


def spy_on_ops(monkeypatch, op_names, record: Callable[[str, tuple], Any] = lambda op, args: op) -> list:
    """Wrap the implementation each op of `op_names` registers for its own ATen name (`REGISTRY[op].aten[op]`, what
    `enable()` routes that ATen op to) for the test's duration, so that every call reaching it from here on appends
    `record(op, args)` (default: the op's name) to the returned list; the calls still run."""
    calls = []
    for op in op_names:
        info = get_op(op)
        impl = info.aten[op]

        def spy(*args, _op=op, _impl=impl, **kwargs):
            calls.append(record(_op, args))
            return _impl(*args, **kwargs)

        monkeypatch.setitem(info.aten, op, spy)
    return calls
