"""Every op on its own random samples and error cases (`register_op(samples=..., errors=...)`): each sample against
the registry reference (`check_case`: bit-exact for selections, else the dtype's tolerance against float64, and
then the shapes and dtypes the op's fake implementation gives torch.compile), each
error case raising its named error with a message naming the argument, having written nothing. A stream of samples
is seeded by (op, dtype), so a failure replays; GRADKERN_SAMPLES sets how many a (op, dtype) runs (a few under
the interpreter, more on a GPU)."""

import itertools
import math
import os
import random

import pytest
import torch

from conftest import DEVICE, DTYPES, dtype_id
from gradkern import _runtime
from gradkern.registry import REGISTRY
from gradkern.testing import assert_bitwise_equal, assert_same_kind, check_case, check_error, tensors_of

OPS = sorted(REGISTRY)
SAMPLES = int(os.environ.get("GRADKERN_SAMPLES", "3" if _runtime.INTERPRET else "16"))
# samples of each op the coverage test looks through (drawn only: no kernel runs)
COVERAGE = 64


def stream(name: str, dtype: torch.dtype, seed: str = ""):
    return REGISTRY[name].samples(random.Random(f"{name}:{dtype}:{seed}"), DEVICE, dtype)


def meta(x):
    """`x` with each tensor replaced by one of its shape, strides and dtype on the meta device (a uint8 one, where's
    deprecated condition, as bool: meta's where takes bool only)."""
    if isinstance(x, torch.Tensor):
        dtype = torch.bool if x.dtype == torch.uint8 else x.dtype
        return torch.empty_strided(x.shape, x.stride(), dtype=dtype, device="meta")
    if isinstance(x, (tuple, list)):
        return type(x)(map(meta, x))
    return {k: meta(v) for k, v in x.items()} if isinstance(x, dict) else x


def test_every_op_declares_samples_and_errors():
    assert [n for n in OPS if REGISTRY[n].samples is None or REGISTRY[n].errors is None] == []


@pytest.mark.filterwarnings("ignore:where received a uint8 condition")  # the reference's deprecation warning
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", OPS)
def test_samples_match_reference(name, dtype):
    if dtype not in REGISTRY[name].dtypes:
        pytest.skip("dtype not supported by this op")
    info = REGISTRY[name]
    for case in itertools.islice(stream(name, dtype), SAMPLES):
        what = f"{name} {case.label}"
        out = check_case(name, case.args, dict(case.kwargs), what=what)
        if not info.exact:  # (compared in float64 there) the shapes and dtypes torch.compile is told
            shape_fn = info.fake or info.reference_fn()
            assert_same_kind(out, shape_fn(*meta(case.args), **meta(dict(case.kwargs))), what)


@pytest.mark.parametrize("name", OPS)
def test_errors_are_named_and_write_nothing(name):
    cases = list(REGISTRY[name].errors(DEVICE))
    assert cases, f"{name} declares no error cases"
    for case in cases:
        check_error(name, case)


def _kinds(t: torch.Tensor) -> set[str]:
    """The boundaries and layouts a sample tensor shows."""
    out = set()
    if t.numel() == 0:
        out.add("empty")
    if 1 in t.shape or t.dim() == 0:
        out.add("size 1")
    if any(n % 2 and n > 1 for n in t.shape):
        out.add("odd size")
    if any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)):
        out.add("expanded")
    elif t.numel() > 1 and not t.is_contiguous():
        out.add("strided")
    if _wide(t) and not t.is_contiguous() and t.is_contiguous(
            memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d):
        out.add("channels_last")
    return out


def _wide(t: torch.Tensor) -> bool:
    """A 4-D or 5-D tensor whose channels_last layout differs from its contiguous one."""
    return t.dim() in (4, 5) and t.shape[1] > 1 and math.prod(t.shape[2:]) > 1


@pytest.mark.parametrize("name", OPS)
def test_samples_cover_boundaries_and_layouts(name):
    """Among an op's first samples: an empty tensor, size-1 and odd sizes, strided and expanded tensors, and
    channels_last ones where the op takes 4-D or 5-D tensors."""
    seen, wide = set(), False
    for case in itertools.islice(stream(name, torch.float32, "coverage"), COVERAGE):
        for t in tensors_of((case.args, dict(case.kwargs))):
            if t.is_floating_point():
                seen |= _kinds(t)
                wide |= _wide(t)
    want = {"empty", "size 1", "odd size", "strided", "expanded"} | ({"channels_last"} if wide else set())
    assert want <= seen, f"{name}: no sample shows {sorted(want - seen)}"


@pytest.mark.parametrize("name", OPS)
def test_samples_replay_from_their_seed(name):
    first, again = (list(itertools.islice(stream(name, torch.float32, "replay"), 3)) for _ in range(2))
    for a, b in zip(first, again):
        assert a.label == b.label
        for x, y in zip(tensors_of(a.args), tensors_of(b.args)):
            assert_bitwise_equal(x, y, f"{name} {a.label}")
            assert x.stride() == y.stride()
