"""enable()/disable()/use(): scoping, nesting and non-re-entrance."""

import dataclasses
import threading

import pytest
import torch
import torch.nn.functional as F

import gradkern
from conftest import DEVICE
from gradkern.routing import dispatch


def test_enable_disable_idempotent_and_use_nests():
    assert not gradkern.is_enabled()
    gradkern.enable(mode="always")
    gradkern.enable(mode="always")
    assert gradkern.is_enabled()
    gradkern.disable()
    gradkern.disable()
    assert not gradkern.is_enabled()
    with gradkern.use(mode="always"):
        assert gradkern.is_enabled()
        with gradkern.use(False):
            assert not gradkern.is_enabled()
            with gradkern.use(mode="always"):
                assert gradkern.is_enabled()
            assert not gradkern.is_enabled()
        assert gradkern.is_enabled()
    assert not gradkern.is_enabled()


def test_use_restores_state_on_exception():
    try:
        with gradkern.use(mode="always"):
            raise KeyError("boom")
    except KeyError:
        pass
    assert not gradkern.is_enabled()


def test_override_does_not_reenter(monkeypatch):
    """A gradkern-routed op called from inside an override reaches stock PyTorch, not gradkern again."""
    info = gradkern.registry.REGISTRY["hardsigmoid_backward"]
    seen = []
    inner_results = []

    def impl(g, x):
        seen.append(1)
        inner_results.append(torch.ops.aten.hardsigmoid_backward(g, x))  # nested: must go to stock
        return info.fn(g, x)

    monkeypatch.setitem(info.aten, "hardsigmoid_backward", impl)
    g = torch.randn(64, device=DEVICE)
    x = torch.randn(64, device=DEVICE) * 4
    with gradkern.use(mode="always"):
        out = torch.ops.aten.hardsigmoid_backward(g, x)
    assert len(seen) == 1
    assert torch.equal(out, inner_results[0])


def test_scopes_register_once_and_only_switch_a_flag(monkeypatch):
    """Bug: every use() block built and destroyed a torch.library.Library (415 us a block on an H100). Now the
    first enable() registers; blocks after it only switch routing, and disable() keeps the registrations."""
    gradkern.enable(mode="always")
    lib = dispatch._lib
    gradkern.disable()

    def no_new_library(*args, **kwargs):
        raise AssertionError("a scope created a torch.library.Library")

    monkeypatch.setattr(torch.library, "Library", no_new_library)
    for _ in range(3):
        with gradkern.use(mode="always"):
            assert gradkern.is_enabled()
            with gradkern.use(False):
                assert not gradkern.is_enabled()
    assert dispatch._lib is lib and not gradkern.is_enabled()


def _counting_impl(monkeypatch, hook=None) -> list:
    """hardsigmoid_backward's registered implementation replaced by one that records each call's thread (the
    kernels themselves one thread at a time: Triton's interpreter is not thread-safe)."""
    info = gradkern.registry.REGISTRY["hardsigmoid_backward"]
    seen = []
    one_at_a_time = threading.Lock()

    def impl(g, x):
        seen.append(threading.get_ident())
        if hook is not None:
            hook()
        with one_at_a_time:
            return info.fn(g, x)

    monkeypatch.setitem(info.aten, "hardsigmoid_backward", impl)
    return seen


def test_a_scope_routes_calls_of_every_thread(monkeypatch):
    """Routing is process-wide: a block in one thread routes the calls other threads make meanwhile (the autograd
    engine runs CUDA backwards on threads of its own), and nothing after it."""
    seen = _counting_impl(monkeypatch)
    g, x = torch.randn(64, device=DEVICE), 4 * torch.randn(64, device=DEVICE)

    def call():
        torch.ops.aten.hardsigmoid_backward(g, x)

    with gradkern.use(mode="always"):
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
    assert seen == [worker.ident]
    seen.clear()
    worker = threading.Thread(target=call)
    worker.start()
    worker.join()
    assert not seen


def test_a_scope_around_backward_routes_the_backward(monkeypatch):
    seen = _counting_impl(monkeypatch)
    x = torch.randn(64, device=DEVICE, requires_grad=True)
    loss = F.hardsigmoid(3 * x).sum()
    with gradkern.use(mode="always"):
        loss.backward()
    assert len(seen) == 1
    torch.testing.assert_close(x.grad, torch.where((3 * x.detach()).abs() < 3, 0.5, 0.0), rtol=0, atol=1e-6)


def test_threads_route_at_once_and_nested_scopes_keep_routing_on(monkeypatch):
    """Several threads, each with its own nested blocks inside an enable() of the main thread, route every call
    and get stock's bits; the re-entrance guard is per thread (a thread inside an override does not send another
    thread's calls to stock)."""
    inside = threading.Barrier(4, timeout=60)
    seen = _counting_impl(monkeypatch, hook=lambda: inside.wait())
    g, x = torch.randn(256, device=DEVICE), 4 * torch.randn(256, device=DEVICE)
    want = torch.ops.aten.hardsigmoid_backward(g, x)
    results, errors = [], []

    def work():
        try:
            with gradkern.use(mode="always"):
                with gradkern.use(mode="always"):
                    results.append(torch.ops.aten.hardsigmoid_backward(g, x))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    gradkern.enable(mode="always")
    workers = [threading.Thread(target=work) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors and gradkern.is_enabled()
    assert sorted(seen) == sorted(w.ident for w in workers)  # all four were inside an override at once
    for r in results:
        assert torch.equal(r, want)


def test_enable_keeps_autograd():
    x = torch.randn(32, device=DEVICE, dtype=torch.float64, requires_grad=True)
    with gradkern.use(mode="always"):
        (gx,) = torch.autograd.grad(F.hardsigmoid(x).sum(), x)
    (ref,) = torch.autograd.grad(F.hardsigmoid(x).sum(), x)
    assert torch.equal(gx, ref)


def test_routed_overloads_names_registry_ops():
    routed = dispatch.routed_overloads()
    assert routed["elu_backward"] == "elu_backward"
    assert set(routed.values()) <= set(gradkern.registry.REGISTRY)


def _nine_d():
    """A 9-D view no two dims of which merge (the kernels take at most 8 after merging)."""
    torch.manual_seed(0)
    return torch.randn((2,) * 9, device=DEVICE, dtype=torch.float64).permute(*reversed(range(9)))


_BEYOND_THE_KERNELS = {  # routed calls whose problem the kernels reject: under enable() stock must run them
    "hardshrink forward, 9-D": lambda: F.hardshrink(_nine_d(), 0.5),
    "celu backward, 9-D": lambda: torch.autograd.grad(F.celu(x := _nine_d().requires_grad_()), x,
                                                      torch.ones_like(x)),
    "prelu backward, 9-D": lambda: torch.autograd.grad(
        F.prelu(x := _nine_d().requires_grad_(), torch.rand(2, device=DEVICE, dtype=torch.float64)), x,
        torch.ones_like(x)),
    "where backward, 9-D condition": lambda: torch.autograd.grad(
        torch.where(_nine_d() > 0, x := torch.ones((2,) * 9, device=DEVICE, dtype=torch.float64,
                                                   requires_grad=True), 0.0), x, torch.ones_like(x)),
    "repeat backward, 9 repeats": lambda: torch.autograd.grad(
        (x := torch.randn(2, 3, device=DEVICE, dtype=torch.float64, requires_grad=True)).repeat(1, 1, 1, 1, 1, 1, 1,
                                                                                                2, 2), x,
        torch.ones((1,) * 7 + (4, 6), device=DEVICE, dtype=torch.float64)),
    "lerp backward, 9-D weight": lambda: torch.autograd.grad(
        torch.lerp(x := torch.ones((2,) * 9, device=DEVICE, dtype=torch.float64, requires_grad=True),
                   2 * x.detach(), _nine_d().abs()), x, torch.ones_like(x)),
}


@pytest.mark.parametrize("name", sorted(_BEYOND_THE_KERNELS))
def test_problems_the_kernels_reject_run_stock_under_enable(name):
    """Bug: under enable(), a 9-D problem (stock takes any rank) raised gradkern.Unsupported. What the kernels
    reject now goes to stock PyTorch, which computes it."""
    call = _BEYOND_THE_KERNELS[name]
    want = call()
    with gradkern.use(mode="always"):
        got = call()
    # (stock's path there may be ATen's Python decomposition, whose float64 rounding can differ in the last bit)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_invalid_problems_are_runtime_errors_as_stocks_are():
    """Bug: under enable(), gradkern's checks raised InvalidProblem, a ValueError, where stock raises a
    RuntimeError, so `except RuntimeError` handlers stopped catching them. InvalidProblem is a RuntimeError too."""

    def inplace_elu_negative_alpha():
        x = torch.randn(5, device=DEVICE, dtype=torch.float64, requires_grad=True)
        F.elu(x * 1, alpha=-1.0, inplace=True).sum().backward()

    def hardshrink_lambda_overflows_half():
        F.hardshrink(torch.randn(5, device=DEVICE, dtype=torch.float16), 1e6)

    for call in (inplace_elu_negative_alpha, hardshrink_lambda_overflows_half):
        with pytest.raises(RuntimeError) as stock:
            call()
        with gradkern.use(mode="always"), pytest.raises(RuntimeError) as ours:
            call()
        assert isinstance(ours.value, gradkern.InvalidProblem), (call.__name__, stock.value)


def test_auto_mode_leaves_stock_routed_ops_to_stock_and_always_routes_them(monkeypatch):
    """enable()'s default mode sends an op whose route is stock for every problem (the activation backwards:
    ATen's kernels are deterministic and as fast) to stock without even registering it; mode "always" routes it,
    and "auto" again sends it to stock."""
    assert gradkern.registry.REGISTRY["hardsigmoid_backward"].route is False
    dispatch.unregister()
    seen = _counting_impl(monkeypatch)
    g, x = torch.randn(64, device=DEVICE), 4 * torch.randn(64, device=DEVICE)
    with gradkern.use():
        assert dispatch.mode() == "auto" and "hardsigmoid_backward" not in dispatch._registered
        assert "reflection_pad1d_backward" in dispatch._registered
        torch.ops.aten.hardsigmoid_backward(g, x)
        with gradkern.use(mode="always"):
            assert dispatch.mode() == "always"
            torch.ops.aten.hardsigmoid_backward(g, x)
        assert dispatch.mode() == "auto"
        torch.ops.aten.hardsigmoid_backward(g, x)  # registered now, and still stock's in mode auto
    assert len(seen) == 1


def test_auto_mode_registers_where_and_lerp_only_over_the_native_router(monkeypatch):
    """Mode "auto" routes where and lerp where the C++ autograd node is built (it costs no more host time than
    stock's node) and leaves them to stock where routing stays in Python (the override costs more); prelu stays
    stock either way, a pad is routed either way, and the plan's route says the same."""
    from gradkern.plan import route_of
    from gradkern.routing import native

    registry = gradkern.registry.REGISTRY
    for built in (False, True):
        monkeypatch.setattr(native, "available", lambda built=built: built)
        for name in ("where_backward", "lerp_backward"):
            assert dispatch.auto_registers(registry[name]) is built, name
            assert route_of(registry[name], (), {}) == ("gradkern" if built else "stock"), name
        assert not dispatch.auto_registers(registry["prelu_backward"])
        assert dispatch.auto_registers(registry["reflection_pad1d_backward"])


def test_a_route_predicate_decides_per_problem(monkeypatch):
    """A route that is a predicate of the arguments is asked on every call in mode auto, and not in always."""
    info = gradkern.registry.REGISTRY["reflection_pad1d_backward"]
    asked = []

    def route(grad_output, self, padding):
        asked.append(tuple(self.shape))
        return self.shape[-1] > 8

    # (the router takes the route at registration)
    monkeypatch.setitem(gradkern.registry.REGISTRY, info.name, dataclasses.replace(info, route=route))
    dispatch.unregister()
    ran = []
    monkeypatch.setitem(info.aten, "reflection_pad1d_backward", lambda *a: (ran.append(1), info.fn(*a))[1])
    x_small, x_big = torch.zeros(2, 3, 8, device=DEVICE), torch.zeros(2, 3, 16, device=DEVICE)
    with gradkern.use():
        for x in (x_small, x_big):
            torch.ops.aten.reflection_pad1d_backward(torch.randn(2, 3, x.shape[-1] + 2, device=DEVICE), x, [1, 1])
        assert asked == [(2, 3, 8), (2, 3, 16)] and ran == [1]
        with gradkern.use(mode="always"):
            torch.ops.aten.reflection_pad1d_backward(torch.randn(2, 3, 10, device=DEVICE), x_small, [1, 1])
        assert len(asked) == 2 and ran == [1, 1]
    monkeypatch.undo()
    dispatch.unregister()  # (the next registration takes the op's own route again)


def test_an_unknown_mode_is_a_named_error():
    with pytest.raises(gradkern.InvalidProblem, match="mode"):
        gradkern.enable(mode="fastest")
    assert not gradkern.is_enabled()
