"""gradkern.plan: one plan per descriptor, with its route, guarantee, kernels, bytes, check and run."""

import pytest
import torch

import gradkern
from conftest import DEVICE
from gradkern import ops
from gradkern.testing import assert_bitwise_equal, poison_like


def _pad_problem(w=8):
    return torch.randn(2, 3, w + 4, device=DEVICE), torch.zeros(2, 3, w, device=DEVICE), [2, 2]


def test_a_plan_per_descriptor_and_its_run_is_the_op():
    g, x, p = _pad_problem()
    plan = gradkern.plan("reflection_pad1d_backward", g, x, p)
    assert gradkern.plan("reflection_pad1d_backward", torch.randn_like(g), x, list(p)) is plan  # new data
    assert gradkern.plan("reflection_pad1d_backward", *_pad_problem(9)) is not plan
    assert gradkern.plan("reflection_pad1d_backward", g, x, (2, 2)) is not plan  # (a tuple is another type)
    g2 = torch.randn_like(g)
    assert_bitwise_equal(plan(g2, x, p), ops.reflection_pad1d_backward(g2, x, p), "plan run")
    assert plan.route == "gradkern" and plan.guarantee == gradkern.guarantee(plan.op, torch.float32)
    (launch,) = plan.kernels
    assert launch.kernel == "_pad_backward_kernel" and launch.config["REFLECT"] is True and launch.grid[0] >= 1
    assert plan.bytes == (g.numel() + 2 * x.numel()) * 4  # grad_output and self read, grad_input written


def test_another_descriptor_and_a_rejected_problem_are_named_errors_that_write_nothing():
    g, x, p = _pad_problem()
    plan = gradkern.plan("reflection_pad1d_backward", g, x, p)
    plan.can_implement(g, x, p)
    with pytest.raises(gradkern.InvalidProblem, match="descriptor"):
        plan(g, x, [1, 3])
    with pytest.raises(gradkern.InvalidProblem, match="descriptor"):
        plan.can_implement(g.double(), x.double(), p)
    out = poison_like(x)
    before = out.clone()
    with pytest.raises(gradkern.InvalidProblem, match="padding"):
        gradkern.plan("reflection_pad1d_backward", g, x, [2, 9], grad_input=out)
    assert torch.equal(out.isnan(), before.isnan()) and torch.equal(out.nan_to_num(), before.nan_to_num())
    out_plan = gradkern.plan("reflection_pad1d_backward", g, x, p, grad_input=out)
    out_plan.can_implement(g, x, p, grad_input=out)  # checks run on copies: out is not written
    assert torch.equal(out.nan_to_num(), before.nan_to_num())
    with pytest.raises(gradkern.InvalidProblem, match="op_name"):
        gradkern.plan("no_such_op", g)


def test_routes_follow_the_ops_rules():
    n = torch.randn(64, device=DEVICE)
    elu = gradkern.plan("elu_backward", n, 1.0, 1.0, 1.0, False, n)
    assert elu.route == "stock" and "copy ceiling" in elu.route_rule and elu.kernels  # (the kernel still exists)
    assert gradkern.plan("sparsemax_forward", torch.randn(4, 8, device=DEVICE), -1).route == "gradkern"


def test_an_expanded_argument_counts_its_distinct_elements():
    g = torch.randn(4, 8, device=DEVICE)
    x = torch.zeros((), device=DEVICE).expand(4, 8)
    plan = gradkern.plan("hardsigmoid_backward", g, x)
    assert plan.bytes == (32 + 1 + 32) * 4
