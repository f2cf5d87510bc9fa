"""The native router (routing/native.py): a descriptor's third call replays its recorded program, and what it
returns is the Python router's result bit for bit, strides included; descriptors that route to stock get ATen's
result; replays run on the autograd engine's threads and under CUDA graph capture."""

import os
import struct
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch.utils import cpp_extension

import gradkern
from conftest import DEVICE, gpu_only
from gradkern.plan import _copy
from gradkern.registry import REGISTRY
from gradkern.routing import dispatch, native
from gradkern.testing import assert_bitwise_equal


def _problems(dtype):
    """(overload, args, kwargs) for every overload the native router serves, from the registry's examples."""
    out = []
    for overload, name in sorted(dispatch.routed_overloads().items()):
        info = REGISTRY[name]
        if info.dispatch != "backend" or not native.eligible(overload) or dtype not in info.dtypes:
            continue
        if info.aten[overload] is info.fn:
            for case in info.cases(DEVICE, dtype, "tiny"):
                out.append((overload, case.args, dict(case.kwargs)))
        elif info.aten_examples is not None:
            examples = info.aten_examples(DEVICE, dtype)
            if overload in examples:
                out.append((overload, *examples[overload]))
    return out


def _fresh(a, seed: int, shift: int = 0):
    """A copy of an argument with the same layout, `shift` 16-byte steps further into its storage (the same
    descriptor: alignment is keyed, the storage offset is not), and new floating values (integer tensors keep
    theirs: they are indices, lengths or targets)."""
    if not isinstance(a, torch.Tensor):
        return a
    c = _copy(a)
    step = shift * max(1, 16 // c.element_size())
    if step and c.numel():
        room = torch.empty(c.untyped_storage().nbytes() // c.element_size() + step, dtype=c.dtype, device=c.device)
        room[step:].copy_(c.as_strided((room.numel() - step,), (1,), 0))
        c = room.as_strided(c.shape, c.stride(), step + c.storage_offset())
    if c.is_floating_point() and c.numel():
        g = torch.Generator(device=c.device).manual_seed(seed)
        span = c.as_strided((c.untyped_storage().nbytes() // c.element_size() - c.storage_offset(),), (1,))
        span.copy_(torch.randn(span.shape, generator=g, device=c.device, dtype=torch.float32) * 3)
    return c


def _aten(overload):
    return native.aten_overload(overload)


def _record(fn, *args):
    """A `_Recording` of `fn(*args)` (elu_backward's schema numbers the tensor arguments) and fn's result."""
    rec = native._Recording(torch.ops.aten.elu_backward.default._schema, args, {})
    with rec:
        out = fn(*args)
    return rec, out


_DTYPES = {v: k for k, v in native._SCALAR_TYPES.items()}


def _replay(words: list[int], inputs: list[torch.Tensor]):
    """native.cpp's replay of a program without launches, in Python: what the test checks the encoding against."""
    slots, i, n = list(inputs), 0, native
    while True:
        op = words[i]
        if op == n.EMPTY:
            fill, dtype, nd = words[i + 1:i + 4]
            sizes, strides = words[i + 4:i + 4 + nd], words[i + 4 + nd:i + 4 + 2 * nd]
            t = torch.empty_strided(sizes, strides, dtype=_DTYPES[dtype], device=inputs[0].device)
            if fill == n.ZEROS:
                t.zero_()
            if fill == n.VALUE:
                t.fill_(struct.unpack("<d", struct.pack("<q", words[i + 4 + 2 * nd]))[0])
            slots.append(t)
            i += 4 + 2 * nd + (fill == n.VALUE)
        elif op == n.VIEW:
            base, nd = words[i + 1:i + 3]
            b = slots[base]
            slots.append(b.as_strided(words[i + 3:i + 3 + nd], words[i + 3 + nd:i + 3 + 2 * nd],
                                      b.storage_offset() + words[i + 3 + 2 * nd]))
            i += 4 + 2 * nd
        elif op == n.COPY:
            slots[words[i + 1]].copy_(slots[words[i + 2]])
            i += 3
        elif op == n.FILL:
            slots[words[i + 1]].fill_(struct.unpack("<d", struct.pack("<q", words[i + 2]))[0])
            i += 3
        elif op == n.ZERO:
            slots[words[i + 1]].zero_()
            i += 2
        elif op == n.CUMSUM:
            slots.append(slots[words[i + 1]].cumsum(words[i + 2]))
            i += 3
        else:
            assert op == n.RETURN and i + 2 + words[i + 1] == len(words)
            return [slots[k] for k in words[i + 2:]]


def test_recording_encodes_allocations_views_copies_and_fills():
    """What a program holds, on any device: factories by the layout they made, views relative to their base's
    storage offset (an input's offset differs between calls of one descriptor), copies and fills by slot. Replayed
    on new inputs at another storage offset, the program gives what the function gives."""

    def run(g, a, b, c, d, x):
        out = torch.full((4, 6), 2.0, device=DEVICE)
        out[1:3, 2:].copy_(g[:, :4])
        out[0].fill_(0.5)
        out[3].zero_()
        return out, torch.zeros_like(x).t()

    def inputs(offset):
        g = torch.randn(offset + 2, 8, device=DEVICE)[offset:]
        return g, 1.0, 1.0, 1.0, False, torch.randn(2, 8, device=DEVICE)

    args = inputs(1)
    rec, out = _record(run, *args)
    words = rec.finish(out)
    assert rec.refused is None and words is not None
    args = inputs(3)
    for got, want in zip(_replay(words, [args[0], args[5]]), run(*args), strict=True):
        assert got.stride() == want.stride()
        assert_bitwise_equal(got, want, "replayed")


def test_recording_replays_an_integer_cumsum():
    """Bug: the segment_reduce backward's lengths summed to their ends (`lengths.cumsum(-1)`) were not a step a
    program replays, so the op stayed in Python. An integer cumsum is recorded by slot and dim and, replayed on new
    lengths, sums those; a floating one (its sums rounded in an order the recording does not fix) is not."""

    def run(lens, a, b, c, d, x):
        return lens.reshape(2, 3).cumsum(-1)

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 9, (6,), generator=g, dtype=torch.int32).to(DEVICE), 1.0, 1.0, 1.0, False, None

    rec, out = _record(run, *inputs(0))
    words = rec.finish(out)
    assert rec.refused is None and words is not None
    args = inputs(1)
    got, want = _replay(words, [args[0]])[0], run(*args)
    assert got.dtype == want.dtype == torch.int64
    assert torch.equal(got, want)
    rec, out = _record(lambda x, *rest: x.cumsum(0), torch.randn(6, device=DEVICE), 1.0, 1.0, 1.0, False, None)
    assert rec.finish(out) is None and "cumsum" in rec.refused


class _Meta:
    num_warps, shared, launch_pdl, num_ctas = 4, 128, True, 1


class _Src:
    signature = {"x": "*fp32", "t": ("*fp32", "i32"), "n": "i32", "s": "fp32", "big": "i64", "B": "constexpr"}


class _Compiled:
    """What a recording reads of a CompiledKernel."""
    metadata, src, function = _Meta(), _Src(), 0x1234


class _Jit:
    arg_names, params = ["x", "t", "n", "s", "big", "B"], ()


def test_recording_encodes_a_launchs_parameters():
    """A launch as native.cpp replays it: the grid padded to 3-D, threads, shared memory and the PDL flag; pointers
    as (slot, byte offset), found by identity or inside a slot's storage (a view made outside the dispatcher's
    sight); a tuple argument flattened as Triton passes it; constexprs left out; ints and fp32 by their bits."""
    g, x = torch.randn(5, device=DEVICE), torch.randn(8, device=DEVICE)
    rec, _ = _record(lambda *a: None, g, 1.0, 1.0, 1.0, False, x)
    rec.launched(_Jit(), (g, (x[1:], 7), -3, 0.1), {"big": 2**40, "B": 64, "num_warps": 4}, (5,), _Compiled())
    assert rec.refused is None
    n = native
    fp32 = struct.unpack("<q", struct.pack("<f", 0.1).ljust(8, b"\0"))[0]
    assert rec.words == [n.LAUNCH, 0x1234, 5, 1, 1, 128, 128, 1, 6,
                         n.SLOT_PTR, 0, 0, n.SLOT_PTR, 1, 4, n.IMMEDIATE, 7, 4, n.IMMEDIATE, -3, 4,
                         n.IMMEDIATE, fp32, 4, n.IMMEDIATE, 2**40, 8]
    rec.launched(_Jit(), (torch.randn(3, device=DEVICE), (x, 1), 0, 0.0), {"big": 0, "B": 1}, (1,), _Compiled())
    assert rec.words[-3 * 6 - 9:-3 * 6 - 9 + 1] == [n.LAUNCH]
    assert rec.consts and rec.words[-3 * 6 + 0] == n.CONST_PTR  # (a tensor made before the run: kept)


def test_recording_refuses_host_reads_and_foreign_tensors():
    g, x = torch.randn(5, device=DEVICE), torch.randn(5, device=DEVICE)
    rec, out = _record(lambda g, a, b, c, d, x: g * (1 if g.sum().item() > 0 else 2), g, 1.0, 1.0, 1.0, False, x)
    assert rec.finish(out) is None and "not replayed" in rec.refused
    outside = torch.randn(5, device=DEVICE)
    rec, out = _record(lambda g, a, b, c, d, x: outside.view(5, 1), g, 1.0, 1.0, 1.0, False, x)
    assert rec.finish(out) is None and "did not make" in rec.refused


def test_a_tensor_passed_twice_numbers_two_slots():
    """native.cpp gives every tensor argument a slot, one tensor passed twice included; so does the recording."""
    g = torch.randn(5, device=DEVICE)
    rec, out = _record(lambda g, a, b, c, d, x: x.t(), g, 1.0, 1.0, 1.0, False, g)
    assert rec.finish(out)[:2] == [native.VIEW, 0] and len(rec.slots) == 3  # (g, g, and the view of the first)


@gpu_only
def test_the_native_router_is_built_on_the_gpu():
    assert native.available(), native.status()


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_replays_equal_the_python_router(dtype):
    """Three calls per descriptor (Python router, recording, replay), each on new data at another storage offset:
    every result equals the op's implementation called directly, with the same strides. Most overloads must get a
    program. (Bug, found in review: the replay took a view's storage offset as absolute, where the recording gives
    it relative to its base's.)"""
    problems = _problems(dtype)
    assert problems
    with_program = set()
    for k, (overload, args, kwargs) in enumerate(problems):
        impl = REGISTRY[dispatch.routed_overloads()[overload]].aten[overload]
        with gradkern.use(mode="always"):
            for call in range(3):  # (each call's tensors at another storage offset: views replay relative to it)
                a = [_fresh(x, 1000 * k + call, call) for x in args]
                kw = {n: _fresh(v, 1000 * k + call, call) for n, v in kwargs.items()}
                before = native.programs()
                got = _aten(overload)(*a, **kw)
                if native.programs() > before:
                    with_program.add(overload)
                expected = impl(*a, **kw)
                what = f"{overload} call {call}"
                assert_bitwise_equal(got, expected, what)
                for g, e in zip(got if isinstance(got, tuple) else (got,),
                                expected if isinstance(expected, tuple) else (expected,), strict=True):
                    assert g.stride() == e.stride(), what
    missing = sorted({o for o, _, _ in problems} - with_program)
    # (ops whose implementation reads data on the host cannot have programs; none of those is served here)
    assert len(missing) <= len({o for o, _, _ in problems}) // 4, (missing, native.refusals())


@gpu_only
def test_descriptors_routed_to_stock_get_atens_result():
    """In mode "auto", a descriptor the op's route sends to stock replays ATen's kernel (from C++)."""
    g = torch.randn(64, device=DEVICE)
    x = torch.randn(64, device=DEVICE) * 4
    expected = torch.ops.aten.hardsigmoid_backward(g, x)  # stock
    with gradkern.use():
        for _ in range(4):
            assert_bitwise_equal(torch.ops.aten.hardsigmoid_backward(g, x), expected, "routed to stock")


@gpu_only
def test_replays_on_the_autograd_threads_and_other_threads():
    """A program recorded on the main thread replays in a backward (the autograd engine's CUDA thread) and in
    other threads at once, each with its own results."""
    x = torch.randn(4, 3, 17, 19, device=DEVICE, requires_grad=True)
    pad = torch.nn.ReflectionPad2d((2, 3, 1, 4))
    reference = torch.autograd.grad(pad(x).square().sum(), x)[0]
    with gradkern.use(mode="always"):
        for _ in range(4):
            got = torch.autograd.grad(pad(x).square().sum(), x)[0]
            assert_bitwise_equal(got, reference, "backward on the autograd thread")
        errors = []

        def work(seed):
            try:
                g = torch.Generator(device=DEVICE).manual_seed(seed)
                xs = torch.randn(4, 3, 17, 19, device=DEVICE, generator=g)
                gs = torch.randn(4, 3, 22, 24, device=DEVICE, generator=g)
                for _ in range(20):
                    got = torch.ops.aten.reflection_pad2d_backward(gs, xs, [2, 3, 1, 4])
                want = REGISTRY["reflection_pad2d_backward"].fn(gs, xs, [2, 3, 1, 4])
                torch.cuda.synchronize()
                assert torch.equal(got, want)
            except Exception as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert native.programs() > 0


@gpu_only
def test_replays_under_cuda_graph_capture():
    g = torch.randn(8, 64, device=DEVICE)
    x = torch.randn(8, 64, device=DEVICE)
    with gradkern.use(mode="always"):
        for _ in range(3):
            torch.ops.aten.elu_backward(g, 1.0, 1.0, 1.0, False, x)
        assert native.programs() > 0
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            out = torch.ops.aten.elu_backward(g, 1.0, 1.0, 1.0, False, x)
        g.copy_(torch.randn_like(g))
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out, REGISTRY["elu_backward"].fn(g, 1.0, 1.0, 1.0, False, x), "graph replay")


@gpu_only
def test_deterministic_mode_is_part_of_the_descriptor():
    """A program recorded outside deterministic mode is not replayed inside it (allocations differ there)."""
    g = torch.randn(2, 3, 9, 9, device=DEVICE)
    x = torch.randn(2, 3, 6, 6, device=DEVICE)
    with gradkern.use(mode="always"):
        for _ in range(3):
            torch.ops.aten.replication_pad2d_backward(g, x, [1, 2, 0, 3])
        n = native.programs()
        torch.use_deterministic_algorithms(True)
        try:
            for _ in range(3):
                got = torch.ops.aten.replication_pad2d_backward(g, x, [1, 2, 0, 3])
        finally:
            torch.use_deterministic_algorithms(False)
        assert native.programs() == n + 1
    assert_bitwise_equal(got, REGISTRY["replication_pad2d_backward"].fn(g, x, [1, 2, 0, 3]), "deterministic mode")


@gpu_only
def test_a_tensor_passed_twice_is_two_slots():
    """A descriptor whose tensor arguments share storage (here: one tensor passed twice) is its own descriptor, and
    its program numbers both arguments, as the C++ side does."""
    x = torch.randn(33, 7, device=DEVICE)
    y = torch.randn(33, 7, device=DEVICE)
    impl = REGISTRY["elu_backward"].fn
    with gradkern.use(mode="always"):
        for _ in range(3):
            shared = torch.ops.aten.elu_backward(x, 1.0, 1.0, 1.0, False, x)
            apart = torch.ops.aten.elu_backward(y, 1.0, 1.0, 1.0, False, x)
            assert_bitwise_equal(shared, impl(x, 1.0, 1.0, 1.0, False, x), "one tensor twice")
            assert_bitwise_equal(apart, impl(y, 1.0, 1.0, 1.0, False, x), "two tensors")
    assert native.programs() == 2


class _Commits:
    """native's C++ ops where the test needs only what `recorded` commits."""

    def __init__(self):
        self.commits = []

    def commit(self, kind, words, consts):
        self.commits.append((kind, list(words)))

    def clear(self):  # (the suite drops programs after each test)
        pass


def test_a_run_that_raises_commits_the_python_router(monkeypatch):
    """A descriptor whose run raises (a declined or invalid problem) is kept on the Python router, so that its later
    calls do not record again each time; a run that completes commits its program."""
    ops = _Commits()
    monkeypatch.setattr(native, "_ops", ops)
    g, x = torch.randn(5, device=DEVICE), torch.randn(5, device=DEVICE)

    def fails(*args):
        raise gradkern.RankUnsupported("elu_backward", "self", "at most 8 dims", 9)

    with pytest.raises(gradkern.RankUnsupported):
        native.recorded("elu_backward", fails, (g, 1.0, 1.0, 1.0, False, x), {})
    assert ops.commits == [(native.PYTHON, [])]
    native.recorded("elu_backward", lambda *a: torch.empty_like(a[0]), (g, 1.0, 1.0, 1.0, False, x), {})
    assert ops.commits[-1][0] == native.REPLAY


def test_a_killed_builds_lock_is_removed(tmp_path, monkeypatch):
    """torch.utils.cpp_extension waits forever on the lock a killed build leaves; an old one is removed, a fresh one
    (a build in progress in another process) is not."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = os.path.join(cpp_extension._get_build_directory("gradkern_native_test", False), "lock")
    open(lock, "w").close()
    native._clear_stale_lock("gradkern_native_test")
    assert os.path.exists(lock)
    old = time.time() - 2 * native._STALE_LOCK_S
    os.utime(lock, (old, old))
    native._clear_stale_lock("gradkern_native_test")
    assert not os.path.exists(lock)


@gpu_only
def test_gradkern_ops_functions_replay_through_the_native_router(monkeypatch):
    """Once the native router is loaded, gradkern.ops.<name> of a backend op taking ATen's arguments goes through
    it (gradkern's kernel whatever the switch: no stock route): from its third call a replay, equal bit for bit to
    the function's own result; out= calls keep the Python path."""
    assert native.available(), native.status()
    monkeypatch.setattr(native, "OPS_FAST", True)
    g = torch.randn(33, 65, device=DEVICE)
    x = torch.randn(33, 65, device=DEVICE)
    want = REGISTRY["elu_backward"].fn(g, 1.0, 1.0, 1.0, False, x)
    before = native.programs()
    for _ in range(3):
        got = gradkern.ops.elu_backward(g, 1.0, 1.0, 1.0, False, x)
    assert native.programs() == before + 1
    assert_bitwise_equal(got, want, "gradkern.ops through the native router")
    out = torch.empty_like(g)
    assert gradkern.ops.elu_backward(g, 1.0, 1.0, 1.0, False, x, grad_input=out) is out
    assert_bitwise_equal(out, want, "out=")
    x.requires_grad_(True)
    with pytest.raises(gradkern.Unsupported, match="require grad"):
        gradkern.ops.elu_backward(g, 1.0, 1.0, 1.0, False, x)


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gradkern_ops_replays_equal_the_functions(dtype, monkeypatch):
    """Every gradkern.ops function the native router serves, three calls per example on new data at another storage
    offset: each equal to the function called directly, strides included."""
    assert native.available(), native.status()
    monkeypatch.setattr(native, "OPS_FAST", True)
    served = 0
    for overload, args, kwargs in _problems(dtype):
        info = REGISTRY[dispatch.routed_overloads()[overload]]
        if overload != info.name or info.aten[overload] is not info.fn or kwargs:
            continue
        served += 1
        for call in range(3):
            a = [_fresh(x, 7 * call, call) for x in args]
            got, expected = getattr(gradkern.ops, info.name)(*a), info.fn(*a)
            assert_bitwise_equal(got, expected, f"gradkern.ops.{info.name} call {call}")
            for g, e in zip(got if isinstance(got, tuple) else (got,),
                            expected if isinstance(expected, tuple) else (expected,), strict=True):
                assert g.stride() == e.stride(), info.name
    assert served and native.programs() > 0


_FIRST_CALL = """
import sys, torch, gradkern
from gradkern.routing import native
before = native.status()
g, x = (torch.randn(8, 9, device=sys.argv[1]) for _ in range(2))
gradkern.ops.elu_backward(g, 1.0, 1.0, 1.0, False, x)
print(before, "->", native.status())
"""


@gpu_only
def test_gradkern_ops_load_the_native_router_at_their_first_call():
    """Bug: gradkern.ops went through the native router only once something had loaded it (`enable()`), so a
    program calling gradkern.ops alone (and the sweep benchmark) paid the Python path's host time on every call.
    A fresh process's first gradkern.ops call loads it."""
    done = subprocess.run([sys.executable, "-c", _FIRST_CALL, DEVICE], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GRADKERN_NATIVE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("not loaded -> on"), done.stdout


@gpu_only
def test_gradkern_ops_keyword_calls_replay(monkeypatch):
    """Bug: a gradkern.ops call with keyword arguments (`_segment_reduce_backward(..., lengths=l, axis=0)`, as
    users and the sweep call it) always took the Python path. Keywords the op's function takes positionally go to
    its twin by name: from the third call a replay (which sums each call's own lengths: ATen's cumsum replayed),
    equal bit for bit to the function's result; unknown keywords still raise Python's TypeError."""
    assert native.available(), native.status()
    monkeypatch.setattr(native, "OPS_FAST", True)
    info = REGISTRY["_segment_reduce_backward"]
    before = native.programs()
    for call, lens in enumerate(([3, 0, 1, 5, 2], [1, 4, 0, 2, 4], [0, 0, 11, 0, 0], [2, 2, 2, 2, 3])):
        lengths = torch.tensor(lens, device=DEVICE)
        data = torch.randn(11, 6, device=DEVICE)
        output = torch.segment_reduce(data, "max", lengths=lengths, axis=0, unsafe=True)
        grad = torch.randn_like(output)
        want = info.fn(grad, output, data, "max", lengths, None, 0)
        got = gradkern.ops._segment_reduce_backward(grad, output, data, "max", lengths=lengths, axis=0)
        assert_bitwise_equal(got, want, f"gradkern.ops with keywords through the native router, call {call}")
    assert native.programs() == before + 1
    with pytest.raises(TypeError):
        gradkern.ops._segment_reduce_backward(grad, output, data, "max", lengths=lengths, dim=0)


def test_twin_schemas_of_gradkern_ops():
    """gradkern.ops' twins: ATen's schema where the op's function serves its ATen overload, the op's own custom op's
    for ops without one, none for ops split by argument kind or returning lists."""
    schema = lambda name: str(native._eager_schema(REGISTRY[name]))  # noqa: E731
    assert schema("elu_backward").startswith("aten::elu_backward(")
    assert schema("segment_max_forward").startswith("gradkern::segment_max_forward(Tensor data, Tensor offsets")
    assert schema("repeat_backward").startswith("gradkern::repeat_backward(")
    # (an ATen name served at the autograd key by another function: its custom op's, not none)
    assert schema("_segment_reduce_backward").startswith("gradkern::_segment_reduce_backward(Tensor grad")
    assert native._eager_schema(REGISTRY["lerp_backward"]) is None
    assert native._eager_schema(REGISTRY["where_backward"]) is None


_GRADKERN_ONLY = ("repeat_backward", "segment_max_forward", "segment_max_backward", "sparsemax_forward",
                  "sparsemax_backward")


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", _GRADKERN_ONLY)
def test_gradkern_only_ops_replay_equal_the_functions(name, dtype, monkeypatch):
    """The ops without an ATen overload of their own, through their custom op's schema: three calls per tiny case
    on new data at another storage offset, each equal to the function called directly, strides included."""
    assert native.available(), native.status()
    monkeypatch.setattr(native, "OPS_FAST", True)
    info, before = REGISTRY[name], native.programs()
    for case in info.cases(DEVICE, dtype, "tiny"):
        assert not case.kwargs
        for call in range(3):
            a = [_fresh(x, 7 * call, call) for x in case.args]
            got, expected = getattr(gradkern.ops, name)(*a), info.fn(*a)
            assert_bitwise_equal(got, expected, f"gradkern.ops.{name} {case.label} call {call}")
            for g, e in zip(got if isinstance(got, tuple) else (got,),
                            expected if isinstance(expected, tuple) else (expected,), strict=True):
                assert g.stride() == e.stride(), name
    assert native.programs() > before


# ----------------------------------------------------------------------------------------------- autograd key
_AUTOGRAD_OVERLOADS = [("where_backward", "where.self"), ("lerp_backward", "lerp.Scalar"),
                       ("lerp_backward", "lerp.Tensor"), ("prelu_backward", "_prelu_kernel"),
                       ("repeat_backward", "repeat")]


class _AgOps:
    """Stands in for the C++ side of the autograd path: the plans committed, the routers attached."""

    def __init__(self):
        self.plans, self.attached = [], []

    def ag_commit(self, *plan):
        self.plans.append(plan)

    def attach(self, *a):
        self.attached.append(a)

    def attach_autograd(self, *a):
        self.attached.append(a)

    def clear(self):  # (the suite drops programs after each test)
        pass

    def set_state(self, *a):
        pass

    def detach_all(self):
        pass


class _NoLibrary:
    def define(self, *a):
        pass

    def impl(self, *a):
        pass


@pytest.fixture
def ag_ops(monkeypatch):
    """The autograd path's Python half against a stand-in C++ side (no router is attached for real)."""
    fake = _AgOps()
    monkeypatch.setattr(native, "_ops", fake)
    monkeypatch.setattr(native, "AG_FAST", True)
    monkeypatch.setattr(native, "_ag_attached", set())
    monkeypatch.setattr(native, "_recorder_lib", _NoLibrary)
    return fake


def _grad_of(result: torch.Tensor) -> torch.Tensor:
    return torch.randn_like(result).to(result.dtype)


@pytest.mark.parametrize("name, overload", _AUTOGRAD_OVERLOADS)
def test_autograd_plan_and_backward_twins_give_stocks_gradients(name, overload, ag_ops):
    """What the C++ node does with a committed plan - the backward twin called on (grad, the saved arguments...,
    desc), each result the gradient of the tensor argument `outs` names - gives stock autograd's gradients, from
    the fused twin (the op's kernel) and the composite twin (its ATen formula) alike."""
    info = REGISTRY[name]
    args, _ = info.aten_examples(DEVICE, torch.float32)[overload]
    native._plan(overload, info.aten[overload], *args)
    fast, save, outs, desc, fused, composite, node_name = ag_ops.plans[-1]
    assert fast and node_name.startswith("Gradkern") and node_name.endswith("Backward")
    assert all(qualname.endswith("__fused") for qualname, *_ in ag_ops.attached)
    op = native.aten_overload(overload)
    out = op(*args)
    grad = _grad_of(out)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    wanted = [t for t in tensors if t.requires_grad]
    want = torch.autograd.grad(out, wanted, grad)
    for twin in (fused, composite):
        twin_op = getattr(torch.ops.gradkern_ag, twin.split("::")[1]).default
        got = twin_op(grad, *[args[i].detach() for i in save], desc)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(outs) == len(wanted)
        for k, g in zip(outs, got, strict=True):
            w = want[next(j for j, t in enumerate(wanted) if t is tensors[k])]
            assert g.shape == w.shape and g.dtype == w.dtype, twin
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=twin)


def test_autograd_plan_declines_what_the_override_declines(ag_ops, monkeypatch):
    """Not fast: an integer where (the override's `accepts`), AG_FAST off, and a `save` keeping a tensor that is
    not an argument (the twins could not be handed it)."""
    info = REGISTRY["where_backward"]
    cond = torch.rand(4, 3, device=DEVICE) > 0.5
    x = torch.randn(4, 3, device=DEVICE).requires_grad_(True)
    native._plan("where.self", info.aten["where.self"], cond, x.long(), x.long())
    assert ag_ops.plans[-1][0] is False
    monkeypatch.setattr(native, "AG_FAST", False)
    native._plan("where.self", info.aten["where.self"], cond, x, x)
    assert ag_ops.plans[-1][0] is False
    monkeypatch.setattr(native, "AG_FAST", True)
    accepts, save, fused, composite = info.aten["where.self"].parts

    def derived_save(ctx, needs, condition, self, other):
        ctx.save_for_backward(condition.clone())

    override = type("O", (), {"parts": (accepts, derived_save, fused, composite), "function": type("F", (), {})})
    native._plan("where.self", override, cond, x, x)
    assert ag_ops.plans[-1][0] is False


def test_autograd_planner_op_has_the_overloads_arguments(ag_ops):
    """attach_autograd defines the planner with the overload's arguments (returning nothing) and puts the C++
    router over the autograd key with it; calling the planner runs `_plan`."""
    info = REGISTRY["where_backward"]
    native.attach_autograd("where.self", info.aten["where.self"])
    assert ag_ops.attached[-1] == ("aten::where.self", "gradkern_ag::where__self__plan")
    planner = torch.ops.gradkern_ag.where__self__plan.default
    assert str(planner._schema) == \
        "gradkern_ag::where__self__plan(Tensor condition, Tensor self, Tensor other) -> ()"
    cond = torch.rand(4, 3, device=DEVICE) > 0.5
    x = torch.randn(4, 3, device=DEVICE).requires_grad_(True)
    planner(cond, x, x.detach())
    assert ag_ops.plans[-1][0] is True and ag_ops.plans[-1][1] == [0]  # (where saves the condition)


# the autograd-key overloads mode "auto" routes over the C++ node (one per op)
_AUTO_ROUTED = (("where_backward", "where.self"), ("lerp_backward", "lerp.Tensor"))


@gpu_only
def test_auto_mode_routes_where_and_lerp_through_the_cpp_node(monkeypatch):
    """enable()'s default mode registers where and lerp (not prelu) where the native router is built, and a plain
    call gets the C++ node, with the Python override's gradients."""
    assert native.available(), native.status()
    monkeypatch.setattr(native, "AG_FAST", True)
    dispatch.unregister()
    native.clear()
    with gradkern.use():
        assert "where.self" in dispatch._registered and "lerp.Tensor" in dispatch._registered
        assert "_prelu_kernel" not in dispatch._registered
        for name, overload in _AUTO_ROUTED:
            info = REGISTRY[name]
            args, _ = info.aten_examples(DEVICE, torch.float32)[overload]
            wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            op = native.aten_overload(overload)
            out = op(*args)
            assert out.grad_fn.name() == info.aten[overload].function.__name__ + "Backward"
            grad = _grad_of(out)
            got = torch.autograd.grad(out, wanted, grad)
            with gradkern.use(False):
                want = torch.autograd.grad(op(*args), wanted, grad)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w)


@gpu_only
def test_no_grad_calls_of_autograd_key_routes_stay_in_cpp(monkeypatch):
    """A where/lerp call that wants no graph (no_grad, or no input requiring grad) runs stock below autograd from
    the C++ router, without entering the Python override (which would cost host time on the most common calls)."""
    assert native.available(), native.status()
    monkeypatch.setattr(native, "AG_FAST", True)
    with gradkern.use():
        pass  # (registered before the spy goes in: registration attaches the C++ router over the override it sees)
    calls = []
    for name, overload in _AUTO_ROUTED:
        info = REGISTRY[name]
        override = info.aten[overload]
        monkeypatch.setitem(info.aten, overload, lambda *a, _o=override, **k: calls.append(1) or _o(*a, **k))
    with gradkern.use():
        for name, overload in _AUTO_ROUTED:
            args, _ = REGISTRY[name].aten_examples(DEVICE, torch.float32)[overload]
            op = native.aten_overload(overload)
            plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
            with gradkern.use(False):
                want = op(*plain)
            with torch.no_grad():
                got = op(*args)
            assert got.grad_fn is None
            assert_bitwise_equal(got, want, overload)
            assert_bitwise_equal(op(*plain), want, overload)
        assert not calls
        monkeypatch.setattr(native, "AG_FAST", False)
        native.clear()
        op(*args)  # (the spy sees a call that wants a graph, with the C++ node off)
        assert calls


@gpu_only
@pytest.mark.parametrize("name, overload", _AUTOGRAD_OVERLOADS)
def test_autograd_key_routes_through_the_cpp_node(name, overload, monkeypatch):
    """With the C++ autograd path on, mode "always": the result's grad_fn is the C++ node (not the Python
    Function's), its gradients equal the Python override's bit for bit (the same fused kernel) on every call, and
    create_graph gives stock's double backward."""
    assert native.available(), native.status()
    info = REGISTRY[name]
    args, _ = info.aten_examples(DEVICE, torch.float32)[overload]
    op = native.aten_overload(overload)
    wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    python_node = torch.autograd.function.BackwardCFunction

    def second_order(out, grad):
        first = torch.autograd.grad(out, wanted, grad, create_graph=True)
        total = sum(g.sum() for g in first)
        return total.requires_grad and torch.autograd.grad(total, wanted, allow_unused=True)

    with gradkern.use(mode="always"):
        out = op(*args)
        grad = _grad_of(out)
        assert isinstance(out.grad_fn, python_node)  # (AG_FAST off: the Python override)
        want = torch.autograd.grad(out, wanted, grad)
        monkeypatch.setattr(native, "AG_FAST", True)
        native.clear()
        for _ in range(3):
            out = op(*args)
            assert not isinstance(out.grad_fn, python_node)
            assert out.grad_fn.name() == info.aten[overload].function.__name__ + "Backward"
            got = torch.autograd.grad(out, wanted, grad)
            for g, w in zip(got, want, strict=True):
                assert_bitwise_equal(g, w, f"{overload} C++ node")
        ours = second_order(op(*args), grad)
    stock = second_order(op(*args), grad)
    assert bool(ours) == bool(stock)
    for g, w in zip(ours or (), stock or (), strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w)


def _step_fills(net, x):
    """A forward and backward of `net` on `x` in deterministic mode: its gradients, and per op of
    dispatch.WHOLE_WRITE the NaN fills of new memory that ran inside it."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        net.zero_grad(set_to_none=True)
        with torch.profiler.profile() as prof:
            net(x).square().sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)
    fills = {}
    for e in prof.events():
        if e.name != "aten::fill_":
            continue
        q = e.cpu_parent
        while q is not None and q.name.removeprefix("aten::") not in dispatch.WHOLE_WRITE:
            q = q.cpu_parent
        if q is not None:
            fills[q.name] = fills.get(q.name, 0) + 1
    return [p.grad.clone() for p in net.parameters()], fills


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_whole_write_ops_skip_the_nan_fill_in_deterministic_mode(dtype):
    """Bug: in deterministic mode every allocation of batch norm (cuDNN's for f32, ATen's for bf16) and its
    backward, the convolution backward and prelu's forward ran a NaN fill kernel, though each op writes all it
    allocates (the segmentation models' deterministic steps: most of their extra launches). While gradkern is
    enabled they allocate without it, with stock's gradients bit for bit; torch.empty is still filled, and disable()
    brings the fills back."""
    assert native.available(), native.status()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.PReLU(8),
                              torch.nn.Conv2d(8, 4, 3)).to(DEVICE, dtype)
    x = torch.randn(2, 3, 16, 16, device=DEVICE, dtype=dtype, requires_grad=True)
    dispatch.unregister()
    want, stock_fills = _step_fills(net, x)
    assert {"aten::convolution_backward", "aten::_prelu_kernel"} <= set(stock_fills), stock_fills
    assert {"cudnn_batch_norm", "native_batch_norm"} & {n.removeprefix("aten::") for n in stock_fills}, stock_fills
    with gradkern.use():
        got, fills = _step_fills(net, x)
        torch.use_deterministic_algorithms(True)
        try:
            assert torch.empty(4, device=DEVICE).isnan().all()
        finally:
            torch.use_deterministic_algorithms(False)
    assert fills == {}, fills
    for g, w in zip(got, want, strict=True):
        assert_bitwise_equal(g, w, "gradient")
    with gradkern.use(False):
        assert _step_fills(net, x)[1] == stock_fills
