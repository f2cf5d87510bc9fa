"""Subnormal values. The bit-exact ops must keep a subnormal gradient, and a subnormal product of normal numbers,
exactly as stock PyTorch does (which flushes nothing to zero): compiled kernels must not flush them. Triton's
interpreter converts bfloat16 subnormals wrongly (triton 3.9: a subnormal bfloat16 loads as 0), so bfloat16 runs
compiled only; the other dtypes run everywhere."""

import pytest
import torch

from conftest import DEVICE, DTYPES, SIZE, dtype_id
from gradkern import _runtime
from gradkern.registry import REGISTRY
from gradkern.testing import check_case

EXACT = sorted(name for name, info in REGISTRY.items() if info.exact)
# the first argument (the gradient; segment_max_forward's data) times this: about a quarter of the values subnormal
_SCALE = {torch.float16: 2.0**-16, torch.bfloat16: 2.0**-128, torch.float32: 2.0**-128, torch.float64: 2.0**-1024}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", EXACT)
def test_subnormals_are_kept_as_stock_keeps_them(name, dtype):
    info = REGISTRY[name]
    if dtype not in info.dtypes:
        pytest.skip("dtype not supported by this op")
    if dtype == torch.bfloat16 and _runtime.INTERPRET:
        pytest.skip("the interpreter loads bfloat16 subnormals as 0 (triton 3.9)")
    tiny = torch.finfo(dtype).tiny
    for case in info.cases(DEVICE, dtype, SIZE):
        first = case.args[0]
        scaled = (first.double() * _SCALE[dtype]).to(dtype)
        sub = (scaled != 0) & (scaled.abs() < tiny)
        assert sub.float().mean() > 0.1, f"{name} {case.label}: too few subnormals to test"
        check_case(name, (scaled, *case.args[1:]), dict(case.kwargs), what=f"{name} {case.label} subnormal")
