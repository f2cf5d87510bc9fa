"""Example-problem builders shared by op files: the fixed cases (for `check`, `bench` and the generic tests) and the
random samples and error cases (for the generic tests, the hypothesis tests and scripts/fuzz.py)."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator, Sequence

import torch

from . import _runtime
from .registry import Case, ErrorCase
from .testing import arrangeable, boundary_values, place

#: Size classes every op's `cases(device, dtype, size)` understands: "tiny" is the host-overhead size (about 4K
#: elements), "small" what the interpreter runs (CI, tests on CPU), "check" the GPU test/check size, "large" the
#: benchmark's (>= 256 MB moved in f32).
SIZES = ("tiny", "small", "check", "large")
POINTWISE_N = {"tiny": 4096, "small": 1 << 12, "check": 1 << 20, "large": 1 << 26}


def matrix_shape(size: str) -> tuple[int, int]:
    """(rows, cols) of a near-square 2-D problem of POINTWISE_N[size] elements (for row/column broadcasts)."""
    n = POINTWISE_N[size]
    rows = 1 << ((n.bit_length() - 1) // 2)
    return rows, n // rows


def randn(shape, device, dtype, *, scale: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random normal values (never zeros) made in float32 and cast, so every dtype sees the same problem."""
    t = torch.randn(shape, device=device, dtype=torch.float32, generator=generator) * scale
    return t.to(dtype)


def stand_in(shape, device, dtype) -> torch.Tensor:
    """A tensor of `shape` and `dtype` that owns one element (a broadcast view): for arguments whose shape and
    dtype are all a kernel reads (e.g. where's self/other), so that large cases do not allocate them. Zero, not
    uninitialised: a NaN there would make bitwise input checks fail spuriously."""
    return torch.zeros((), dtype=dtype, device=device).expand(shape)


def pointwise_cases(make_args, n_inputs: int, n_outputs: int = 1):
    """A `cases(device, dtype, size)` for an elementwise op: `make_args(device, dtype, n)` returns a list of
    (label, args) pairs over 1-D tensors of n elements."""

    def cases(device, dtype, size: str) -> list[Case]:
        n = POINTWISE_N[size]
        el = torch.empty((), dtype=dtype).element_size()
        return [Case(f"{label} n={n}", args, {}, bytes=(n_inputs + n_outputs) * n * el, elements=n)
                for label, args in make_args(device, dtype, n)]

    return cases


# ----------------------------------------------------------------------------------------------- samples
#: the boundary each sample of a stream stresses, in turn from a random start: any four samples in a row hold an empty
#: problem, one with size-1 dims and one with odd sizes
EDGES = ("empty", "ones", "odd", "any")
#: the layouts (testing.ARRANGEMENTS) a sample's tensors are drawn in, where their rank allows (contiguous twice)
SAMPLE_LAYOUTS = ("contig", "contig", "t", "perm_rand", "slice_rand", "off1", "exp_rand", "cl", "pitch")
DENSE_LAYOUTS = tuple(k for k in SAMPLE_LAYOUTS if k != "exp_rand")  # every element its own memory
_ODD = (3, 5, 7, 9, 11, 13)


class Draw:
    """What an op's `samples(rng, device, dtype)` draws with: every choice from `rng` (a random.Random), tensor
    values from a torch generator seeded by it, so that a stream of samples replays from its seed alone."""

    def __init__(self, rng: random.Random, device, dtype: torch.dtype):
        self.rng, self.device, self.dtype = rng, device, dtype
        self.gen = torch.Generator().manual_seed(rng.getrandbits(63))
        self._edge = rng.randrange(len(EDGES))

    def edges(self) -> Iterator[str]:
        """The boundary (EDGES) of each sample, endlessly: a samples function's loop."""
        while True:
            yield EDGES[self._edge % len(EDGES)]
            self._edge += 1

    def sizes(self, n: int, edge: str, hi: int = 7, lo: int = 1) -> list[int]:
        """n sizes in [lo, hi] for `edge`: one of them 0 ("empty"), some of them 1 ("ones"), odd ones >= 3 ("odd"),
        or any ("any")."""
        r = self.rng
        if edge == "odd":
            return [r.choice([k for k in _ODD if k <= max(hi, 3)]) for _ in range(n)]
        out = [r.randint(lo, hi) for _ in range(n)]
        if edge == "ones" and n:
            for i in r.sample(range(n), r.randint(1, n)):
                out[i] = 1
        if edge == "empty" and n:
            out[r.randrange(n)] = 0
        return out

    def shape(self, edge: str, ranks: tuple[int, int] = (0, 4), hi: int = 7, max_numel: int = 2000
              ) -> tuple[int, ...]:
        """A shape of a rank in `ranks` for `edge` (see `sizes`; "empty" has rank >= 1; "odd" and "any" favour the
        higher ranks), at most `max_numel` elements."""
        r = self.rng
        rank = r.randint(*ranks) if edge in ("empty", "ones") else max(r.randint(*ranks), r.randint(*ranks))
        sizes = self.sizes(max(rank, 1) if edge == "empty" else rank, edge, hi)
        while math.prod(sizes) > max_numel:
            i = max(range(len(sizes)), key=sizes.__getitem__)
            sizes[i] = max(1, sizes[i] // 2) | (1 if edge == "odd" else 0)
        return tuple(sizes)

    def operand(self, shape: Sequence[int]) -> tuple[int, ...]:
        """A shape that broadcasts to `shape`: as it is, or some leading dims dropped and some others made 1."""
        r = self.rng
        if r.random() < 0.4:
            return tuple(shape)
        rest = list(shape[r.randint(0, len(shape)):])
        return tuple(1 if r.random() < 0.4 else n for n in rest)

    def values(self, shape: Sequence[int], kind: str | None = None, *, kinds=("normal", "grid", "special"),
               points: Sequence[float] = (), huge: bool = True, finite: bool = False,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        """Values of `shape` on the CPU: "normal" (randn times a drawn scale), "grid" (k/8 for |k| <= 32: exact in
        every dtype, and so are sums of thousands of them) or "special" (some of testing.boundary_values with
        `points`, and subnormals, among normal ones). `huge=False`: no finite values past 1e4 (for inputs an op sums,
        where max + -max is whatever the order leaves, or scales up past the math dtype's range); `finite`: no NaN
        or infinities (for ops whose stock CPU kernel multiplies them by zero weights that CUDA's skips)."""
        dtype = dtype or self.dtype
        kind = kind or self.rng.choice(kinds)
        n = math.prod(shape)
        if kind == "grid":
            t = torch.randint(-32, 33, (n,), generator=self.gen).double() / 8
        else:
            t = torch.randn(n, generator=self.gen, dtype=torch.float64) * self.rng.choice((0.5, 1.0, 3.0, 10.0))
        if kind == "special" and n:
            pool = boundary_values(dtype, *points).double()
            fi = torch.finfo(dtype)
            pool = torch.cat([pool, torch.tensor([fi.tiny * fi.eps, -fi.tiny / 4], dtype=torch.float64)])
            if not huge:
                pool = pool[~(pool.abs() > 1e4) | pool.isinf()]
            if finite:
                pool = pool[pool.isfinite()]
            if dtype == torch.bfloat16 and _runtime.INTERPRET:  # the interpreter loads bf16 subnormals as 0
                pool = pool[~(pool.abs() < 2.0**-100) | (pool == 0)]
            pick = torch.rand(n, generator=self.gen, dtype=torch.float64) < self.rng.choice((0.1, 0.3, 0.7))
            t = torch.where(pick, pool[torch.randint(0, len(pool), (n,), generator=self.gen)], t)
        return t.to(dtype).view(tuple(shape))

    def place(self, values: torch.Tensor, layouts: Sequence[str] = SAMPLE_LAYOUTS) -> torch.Tensor:
        """`values` on the device in a layout drawn from `layouts` (those their rank allows; else contiguous; a third
        of 4-D and 5-D tensors channels_last, where `layouts` has it)."""
        usable = [k for k in layouts if arrangeable(values.shape, k)] or ["contig"]
        kind = "cl" if "cl" in usable and self.rng.random() < 0.3 else self.rng.choice(usable)
        return place(values.to(self.device), kind, self.rng)

    def tensor(self, shape: Sequence[int], kind: str | None = None, *, layouts: Sequence[str] = SAMPLE_LAYOUTS,
               **values) -> torch.Tensor:
        """`values(shape, kind, **values)` placed in a drawn layout."""
        return self.place(self.values(shape, kind, **values), layouts)

    def mask(self, shape: Sequence[int], p: float | None = None) -> torch.Tensor:
        """A bool tensor, each element true with probability `p` (drawn where None), in a drawn layout."""
        p = self.rng.choice((0.1, 0.5, 0.9)) if p is None else p
        return self.place(torch.rand(tuple(shape), generator=self.gen) < p)

    def ints(self, lo: int, hi: int, shape: Sequence[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """Integers in [lo, hi) on the CPU."""
        return torch.randint(lo, hi, tuple(shape), generator=self.gen, dtype=dtype)


def rand_on(device):
    """t(*shape, dtype=float32): a random normal tensor on `device` (for error cases)."""
    return lambda *shape, dtype=torch.float32: torch.randn(shape, device=device).to(dtype)


def describe(**named) -> str:
    """A sample's label: each tensor as name(shape):strides:dtype, anything else as name=value."""
    def one(k, v):
        if isinstance(v, torch.Tensor):
            return f"{k}{tuple(v.shape)}:{v.stride()}:{_runtime.DTYPE_NAMES.get(v.dtype, v.dtype)}"
        return f"{k}={v!r}"
    return " ".join(one(k, v) for k, v in named.items())


def refuse(label: str, error: type[Exception], arg: str, *args, **kwargs) -> ErrorCase:
    """An ErrorCase: the op on (*args, **kwargs) raises `error`, whose message names argument `arg`."""
    return ErrorCase(label, args, kwargs, error, rf"argument '{re.escape(arg)}'")


