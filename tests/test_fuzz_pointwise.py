"""Property-based tests (hypothesis) for the elementwise launcher through the pointwise ops, drawing from their own
random samples (`register_op(samples=...)`: shapes that broadcast, strides (slices, permutations, stride-0
broadcasts, storage offsets, channels_last), dtypes (mixed too), values at the ops' thresholds and special ones, the
ops' scalars), compared with stock PyTorch; and out= / grad_input= in a drawn layout, in place into an operand
too. Bounded for CI; GRADKERN_FUZZ_EXAMPLES raises the count (GPU profile)."""

import math
import os
import random

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEVICE, DTYPES
from gradkern._cases import DENSE_LAYOUTS
from gradkern.registry import REGISTRY
from gradkern.testing import arrangeable, assert_bitwise_equal, check_case, place

EXAMPLES = int(os.environ.get("GRADKERN_FUZZ_EXAMPLES", "30"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
OUT = {"softshrink_backward": "grad_input", "hardshrink_backward": "grad_input", "hardsigmoid_backward": "grad_input",
       "elu_backward": "grad_input", "hardshrink": "out"}


@SETTINGS
@given(data=st.data(), op=st.sampled_from(sorted(OUT)), seed=st.integers(0, 2**63 - 1),
       dtype=st.sampled_from(DTYPES))
def test_pointwise_ops_fuzz(data, op, seed, dtype):
    case = next(iter(REGISTRY[op].samples(random.Random(seed), DEVICE, dtype)))
    what = f"{op} seed {seed} {case.label}"
    out = check_case(op, case.args, dict(case.kwargs), what=what)
    # the result written into a given tensor, whatever its layout, or in place into an operand of its shape and
    # dtype (which ATen allows for elementwise ops), with the same bits
    same = [i for i, a in enumerate(case.args) if isinstance(a, torch.Tensor) and a.shape == out.shape
            and a.dtype == out.dtype and not torch._debug_has_internal_overlap(a)]
    where = data.draw(st.sampled_from(["given", *same]), label="out")
    args = list(case.args)
    if where == "given":
        layout = data.draw(st.sampled_from([k for k in DENSE_LAYOUTS if arrangeable(out.shape, k)] or ["contig"]))
        given_out = place(torch.full(out.shape, math.nan, dtype=out.dtype, device=DEVICE), layout,
                          random.Random(seed))
    else:
        given_out = args[where] = args[where].clone()
    res = REGISTRY[op].fn(*args, **{OUT[op]: given_out})
    assert res is given_out
    assert_bitwise_equal(given_out, out, f"{what} {OUT[op]}= {where}")
