"""The multi-output pointwise engine (gradkern.engines.multi_pointwise) under the fused backwards: the summing pass
(results summed over trailing or leading dims as partials), its int64 index variant, empty problems whose results
are summed back, and the direct relaunch keyed by the scalars' specialisation."""


import pytest
import torch

import gradkern
from _fused_helpers import compare, cond, grads, rand
from conftest import DEVICE, dtype_id
from gradkern import config, ops
from gradkern.engines import multi_pointwise
from gradkern.kernels import lerp as lerp_mod
from gradkern.kernels import prelu as prelu_mod
from gradkern.kernels import where as where_mod
from gradkern.registry import REGISTRY
from gradkern.testing import arrange, assert_bitwise_equal, assert_close, run_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_summing_pass_sums_trailing_or_leading_dims(dtype):
    """Gradients summed over B's trailing dims (a per-row operand) or its leading dims (a per-column one) take the
    summing pass: partial sums per program, summed in a fixed order, nothing written at B for them. Several column
    blocks (M > 2048), row blocks with a ragged end, rows split over programs, dims merged, a 0-d operand
    (everything summed), a strided input; against stock in float64. Column sums split over 3 programs at most here,
    so that each walks several row steps."""
    cases = (((3, 5000), (3, 1), None), ((300, 5), (300, 1), None), ((2, 3, 4, 5), (2, 3, 1, 1), None),
             ((6, 7), (), None), ((5, 9), (5, 1), "strided"),
             # over the leading dims (a column sum): rows split over programs, several column blocks, merged dims
             ((3000, 7), (7,), None), ((70, 2500), (1, 2500), None), ((3, 4, 5, 6), (5, 6), None),
             ((40, 9), (9,), "strided"))
    with config.override(multi_pointwise.CONFIG, cols_programs=3):
        for shape, oshape, view in cases:
            # positive grads: sums of thousands of terms that cancel to ~0 have no relative accuracy (stock's
            # neither)
            g, c, s = rand(shape, dtype).abs() + 0.1, cond(shape), -rand(shape, dtype).abs() - 0.1
            if view == "strided":
                g = rand((shape[0], 2 * shape[1]), dtype)[:, ::2].abs() + 0.1
            o = rand(oshape, dtype).abs() + 0.1  # (lerp's grad_weight sums g * (end - self) > 0)
            plan, ours = _only_plan(where_mod._WHERE_BACKWARD, lambda: ops.where_backward(g, c, s, o))
            assert plan.summing, f"{shape} {oshape}: not the summing pass"
            compare(ours, run_reference(REGISTRY["where_backward"].reference, (g, c, s, o)), dtype, f"where {shape}")
            w = rand(oshape, dtype)
            plan, ours = _only_plan(lerp_mod._LERP_BACKWARD, lambda: ops.lerp_backward(g, s, o, w))
            assert plan.summing, f"lerp {shape} {oshape}: not the summing pass"
            compare(ours, run_reference(REGISTRY["lerp_backward"].reference, (g, s, o, w)), dtype, f"lerp {shape}")


def _only_plan(engine, call):
    """(the plan `engine` makes for the problem of `call`, call's result): planned from scratch."""
    config.clear_plans()
    out = call()
    (plan,) = engine._plans.values()
    return plan, out


def test_summing_pass_int64_offsets():
    """The summing pass's int64 index variant (used where offsets can pass 2^31) gives the same results: forced by
    lowering the threshold, since a 2^31-element problem does not fit a CPU test."""
    with config.override(multi_pointwise.CONFIG, i32_max=64):
        for shape, oshape in (((30, 70), (30, 1)), ((30, 70), (70,))):
            g, c, s = rand(shape, torch.float32).abs() + 0.1, cond(shape), rand(shape, torch.float32)
            o = rand(oshape, torch.float32)
            plan, ours = _only_plan(where_mod._WHERE_BACKWARD, lambda: ops.where_backward(g, c, s, o))
            assert plan.summing and plan.i64
            compare(ours, run_reference(REGISTRY["where_backward"].reference, (g, c, s, o)), torch.float32,
                    f"where i64 {oshape}")


def test_flat_and_strided_passes_int64_offsets():
    """The flat and the strided pass in int64 index math (forced by lowering the threshold) give the same bits as
    in int32: where (selections) and lerp with a tensor weight (three results)."""
    g0, w0 = rand((30, 70), torch.float32), torch.rand((30, 70), device=DEVICE)
    views = {"flat": lambda t: t, "strided": lambda t: t[:, ::2]}
    for name, view in views.items():
        g, w = view(g0), view(w0)
        calls = {"where": (where_mod._WHERE_BACKWARD, lambda: ops.where_backward(g, g > 0, g, g)),
                 "lerp": (lerp_mod._LERP_BACKWARD, lambda: ops.lerp_backward(g, g, -g, w))}
        for op, (engine, call) in calls.items():
            plan, want = _only_plan(engine, call)
            assert plan.flat == (name == "flat") and not plan.summing and not plan.i64, f"{op} {name}"
            with config.override(multi_pointwise.CONFIG, i32_max=64):
                plan, got = _only_plan(engine, call)
                assert plan.i64, f"{op} {name}"
            assert_bitwise_equal(got, want, f"{op} {name} int64")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_an_input_across_the_results_layout_takes_tiles(dtype):
    """Inputs of one shape in two layouts (the first contiguous, another transposed or channels_last): the strided
    pass walks 2-D tiles (elementwise.tile_dims), ragged edges and a dim walked a program each included, in int32
    and int64 index math; the same bits as over contiguous copies, and stock's strides. lerp with a tensor weight
    (three results), where (two, a bool condition across) and _prelu_kernel_backward (a broadcast weight)."""
    for shape, kind in (((37, 45), "t"), ((2, 3, 72, 20), "t"), ((2, 9, 5, 13), "cl")):
        g, a = rand(shape, dtype), arrange(shape, kind, lambda st: rand(st, dtype))
        w, c = arrange(shape, kind, lambda st: torch.rand(st, device=DEVICE)), arrange(shape, kind, cond)
        pw = rand((1, shape[1]) + (1,) * (len(shape) - 2), dtype)
        calls = {"lerp": (lerp_mod._LERP_BACKWARD, lambda x, y, z: ops.lerp_backward(x, y, -y, z.to(dtype)), (a, w)),
                 "where": (where_mod._WHERE_BACKWARD, lambda x, y, z: ops.where_backward(x, y, x, x), (c, c)),
                 "prelu": (prelu_mod._PRELU_FULL, lambda x, y, z: ops._prelu_kernel_backward(x, y, pw), (a, a))}
        for op, (engine, call, (y, z)) in calls.items():
            want = call(g, y.contiguous(), z.contiguous())
            for lim in (multi_pointwise.CONFIG.current.i32_max, 64):
                with config.override(multi_pointwise.CONFIG, i32_max=lim):
                    plan, got = _only_plan(engine, lambda: call(g, y, z))
                what = f"{op} {shape} {kind} i32_max {lim}"
                assert plan.consts["TD"] >= 0 and plan.i64 == (lim == 64), what
                for o, ow in zip(got, want, strict=True):
                    if o is not None:
                        assert o.stride() == g.stride(), what
                        assert_bitwise_equal(o, ow, what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
def test_results_summed_whole_take_partials_a_program(dtype):
    """A gradient summed whole (a 0-d operand's: where's other, lerp's weight) by the strided pass: each program
    sums its elements in the math dtype and the shared reduction adds the partials; no result at B is written.
    Runs of the results' order (a broadcast condition) and 2-D tiles (a transposed self); against the results at B
    summed afterwards (`totals` off), and the same bits on a second call."""
    shape = (2, 3, 37, 45)
    g, c = rand(shape, dtype), cond((1, 1) + shape[2:])
    s_t = rand(shape[:2] + shape[:1:-1], dtype).transpose(-1, -2)
    w = rand((), dtype)
    calls = {"where": (where_mod._WHERE_BACKWARD, lambda s: ops.where_backward(g, c, s, w)),
             "lerp": (lerp_mod._LERP_BACKWARD, lambda s: ops.lerp_backward(g, s, -s, w))}
    # (lerp with self contiguous takes the summing pass: every operand then merges to one row)
    for op, s in (("where", rand(shape, dtype)), ("where", s_t), ("lerp", s_t)):
        engine, call = calls[op]
        plan, got = _only_plan(engine, lambda: call(s))
        what = f"{op} {s.stride()}"
        j = len(got) - 1  # where's grad_other, lerp's grad_weight
        assert plan.consts["TOTALS"] == 1 << j and (j, plan.grid, (1,), plan.allocs[-1][3]) in plan.allocs, what
        assert got[j].shape == () and got[j].dtype == dtype, what
        assert_bitwise_equal(call(s)[j], got[j], f"{what} repeat")
        with config.override(multi_pointwise.CONFIG, totals=False):
            plan_b, before = _only_plan(engine, lambda: call(s))
        assert not plan_b.consts["TOTALS"]
        for o, ob in zip(got[:j], before[:j], strict=True):
            assert_bitwise_equal(o, ob, what)
        assert_close(got[j], before[j].double(), None, what)


def test_fused_relaunch_keys_follow_scalar_specialisation():
    """Fused kernels are relaunched directly, keyed by what Triton specialises their integer arguments on. lerp's
    Python-number weight w enters as the float64 bits of 1 - w and w: for w = 5e-324 the second is 1, which
    Triton compiles in as a constant; for w = 0.0 it is 0. A kernel compiled for one must not serve the other
    (grad_end = g * 5e-324 is not 0 in f64). The flat path (contiguous grad) and the strided one (a non-dense
    view), at two offsets each."""
    buf = rand((64 * 131,), torch.float64)
    for w in (5e-324, 0.0, 5e-324, 0.1, 0.0, 5e-324):
        for start in (0, 1):
            for grad in (buf[start:start + 64 * 128].view(64, 128), buf.view(64, 131)[:, start:start + 128:2]):
                x = torch.zeros_like(grad)
                gs, ge, gw = ops.lerp_backward(grad, x, x, w)
                assert gw is None
                what = f"w={w} offset {start} strides {grad.stride()}"
                assert_bitwise_equal(gs, grad * (1.0 - w), f"grad_self {what}")
                assert_bitwise_equal(ge, grad * w, f"grad_end {what}")


@pytest.mark.parametrize("shapes", [((2, 0), (0,)), ((0, 3), (0, 1)), ((0, 3), (3,)), ((3, 2, 0, 7), (0, 7))],
                         ids=["kept-empty", "rows-empty", "rows-empty-row", "prelu-like"])
def test_empty_broadcast_shapes(shapes):
    """Empty problems whose summed-back operand has another shape (the summing pass's view of an empty B): where,
    lerp (scalar and tensor weight) and _prelu_kernel give stock's empty or zero gradients (a ZeroDivisionError
    when planning the summing pass's tiles before)."""
    big, small = shapes
    c = torch.ones(big, dtype=torch.bool, device=DEVICE)
    cases = [(lambda a, b: torch.where(c, a, b), (rand(big, torch.float32), rand(small, torch.float32))),
             (lambda a, b: torch.lerp(b, a, 0.5), (rand(big, torch.float32), rand(small, torch.float32))),
             (lambda a, b, w: torch.lerp(b, a, w), (rand(big, torch.float32), rand(small, torch.float32),
                                                     rand(small, torch.float32)))]
    if len(big) == 4:
        cases.append((torch.ops.aten._prelu_kernel, (rand(big, torch.float32), rand(small, torch.float32))))
    for fn, inputs in cases:
        outs = []
        for enabled in (False, True):
            with gradkern.use(enabled, mode="always"):
                outs.append(grads(fn, inputs, [True] * len(inputs))[2])
        for o, st in zip(outs[1], outs[0], strict=True):
            assert o.shape == st.shape and o.dtype == st.dtype
            assert_bitwise_equal(o, st)
    g = rand(big, torch.float32)
    assert [t.shape for t in ops.where_backward(g, c, g, rand(small, torch.float32))] == [big, small]


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_strided_pass_results_follow_the_leading_input_layout(layout):
    """A problem the flat pass cannot take (a broadcast operand) whose full-shape inputs share a dense layout other
    than contiguous (channels_last; (N, C) transposed): the results come in that layout, as ATen's do, so that the
    strided pass walks it in memory order (contiguous results read against such inputs ran at 0.3x ATen on a
    GPU); values as stock's, bit for bit."""
    if layout == "channels_last":
        x = rand((2, 5, 3, 4), torch.float32).contiguous(memory_format=torch.channels_last)
        w = rand((1, 5, 1, 1), torch.float32)
    else:
        x, w = rand((5, 7), torch.float32).t(), rand((1, 5), torch.float32)  # (7, 5) with strides (1, 7)
    g = torch.randn_like(x)
    ours = ops._prelu_kernel_backward(g, x, w)
    stock = torch.ops.aten._prelu_kernel_backward(g, x, w)
    for o, st in zip(ours, stock, strict=True):
        assert o.stride() == x.stride() == st.stride(), f"{layout}: {o.stride()} (stock {st.stride()})"
        assert_bitwise_equal(o, st)
