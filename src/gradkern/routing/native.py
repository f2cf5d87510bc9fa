"""The native router: a C++ kernel (native.cpp) over the Python router of each backend-key overload, so that a
repeated call does not enter Python.

A descriptor's first call goes to the Python router as before (it warms the op's own caches). Its second call runs
the Python router under a recording: every ATen op the implementation calls (allocations, views, fills, copies, an
integer cumsum) and every Triton launch it makes, with each pointer argument traced to the tensor it points into.
Where all of it is of kinds the C++ side replays, the recording becomes the descriptor's program, and later calls of
the descriptor replay it: allocations through ATen, launches straight to the driver on the current stream, no
Python. A descriptor that `enable()`'s route sends to stock gets a program too: ATen's kernel, called from C++.
Anything else (an op the recording does not know, a data-dependent call, a launch that needs Triton's scratch
memory) keeps the descriptor on the Python router. The descriptor (native.cpp's `make_key`) is every argument's
dtype, device, sizes, strides, 16-byte alignment and storage sharing, every scalar's bits, the routing mode and the
deterministic switches; programs are dropped by `gradkern.clear_plans()`. Triton's launch hooks (a profiler's) do
not see replayed launches (the CUDA profilers do); GRADKERN_NATIVE=0 keeps every launch in Triton's.

The extension is compiled once per machine at the first `enable()` or `gradkern.ops` call on CUDA
(torch.utils.cpp_extension; tens of seconds, then cached). Where that fails, or with GRADKERN_NATIVE=0, routing
stays in Python; `status()` says which."""

from __future__ import annotations

import functools
import os
import struct
import threading
import time
import warnings
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _runtime
from ..config import PlanCache
from ..launch import alloc, launcher

__all__ = ["status", "available", "programs"]

_SOURCE = os.path.join(os.path.dirname(__file__), "native.cpp")
_ops = None  # torch.ops.gradkern_native once loaded
_status = "not loaded"
_load_lock = threading.Lock()


def status() -> str:
    """Whether the native router is in use, and if not, why."""
    return _status


def available() -> bool:
    """Load the extension (once; compiled at the first call on a machine) and say whether it is in use."""
    global _ops, _status
    if _ops is not None:
        return True
    if _status != "not loaded":
        return False
    with _load_lock:
        if _ops is None and _status == "not loaded":
            if os.environ.get("GRADKERN_NATIVE", "1") in ("0", ""):
                _status = "off (GRADKERN_NATIVE=0)"
            elif _runtime.INTERPRET or not torch.cuda.is_available():
                _status = "off (no CUDA device)"
            else:
                try:
                    _build()
                    _ops = torch.ops.gradkern_native
                    _status = "on"
                except Exception as e:  # (no compiler, no CUDA headers: routing stays in Python)
                    _status = f"off (the build failed: {type(e).__name__}: {str(e)[:300]})"
                    warnings.warn(f"gradkern: the native router is {_status}; routing stays in Python", stacklevel=3)
    return _ops is not None


def _include_dirs() -> list[str]:
    """Where cuda.h and cuda_runtime_api.h are: the CUDA toolkit's, else the pip packages' (nvidia/*/include)."""
    from torch.utils import cpp_extension

    dirs = []
    if cpp_extension.CUDA_HOME:
        dirs.append(os.path.join(cpp_extension.CUDA_HOME, "include"))
    try:
        import nvidia

        for base in nvidia.__path__:
            for sub in sorted(os.listdir(base)):
                dirs.append(os.path.join(base, sub, "include"))
    except ImportError:
        pass
    return [d for d in dirs if os.path.exists(os.path.join(d, "cuda_runtime_api.h"))][:1] + \
        [d for d in dirs if os.path.exists(os.path.join(d, "cuda.h"))][:1]


# a build lock older than this is a killed build's (a build takes about 15 s on a 16-core machine)
_STALE_LOCK_S = 600


def _clear_stale_lock(name: str) -> None:
    """Remove the build lock of extension `name` if it is older than _STALE_LOCK_S: a build killed midway leaves
    it, and torch.utils.cpp_extension would wait on it forever."""
    from torch.utils import cpp_extension

    try:
        lock = os.path.join(cpp_extension._get_build_directory(name, False), "lock")
        if os.path.exists(lock) and time.time() - os.path.getmtime(lock) > _STALE_LOCK_S:
            os.remove(lock)
    except (AttributeError, OSError):  # (a torch without that helper: its own behaviour)
        pass


def _build() -> None:
    import hashlib

    from torch.utils import cpp_extension

    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha1(f.read() + torch.__version__.encode()).hexdigest()[:12]
    name = f"gradkern_native_{digest}"
    _clear_stale_lock(name)
    cpp_extension.load(name=name, sources=[_SOURCE], extra_include_paths=_include_dirs(),
                       extra_ldflags=["-lc10_cuda", "-ltorch_cuda"], extra_cflags=["-O2"], is_python_module=False,
                       verbose=False)


# ----------------------------------------------------------------------------------------------- registration
def eligible(overload: str) -> bool:
    """Whether an ATen overload can have programs: functional (no argument written or aliased) and returning
    tensors only."""
    return _functional(aten_overload(overload)._schema)


def _functional(schema) -> bool:
    return all(a.alias_info is None for a in schema.arguments) and bool(schema.returns) and \
        all(str(r.type) == "Tensor" and r.alias_info is None for r in schema.returns)


def aten_overload(overload: str) -> torch._ops.OpOverload:
    """torch.ops.aten's OpOverload for "name" or "name.overload"."""
    packet, _, name = overload.partition(".")
    return getattr(getattr(torch.ops.aten, packet), name or "default")


def op_schema(overload: str):
    return aten_overload(overload)._schema


def capture_stock(overload: str) -> None:
    """Keep ATen's kernel of `overload` (before gradkern registers over it)."""
    _ops.capture_stock(_qualname(overload))


def attach_whole_write(overloads: tuple[str, ...]) -> None:
    """Wrap ATen's CUDA kernels of `overloads` (stock ops that write everything they allocate before reading it) so
    that their allocations skip deterministic mode's NaN fill while gradkern is enabled (native.cpp, "the NaN
    fill")."""
    _ops.attach_whole_write([_qualname(o) for o in overloads])


_recorders: torch.library.Library | None = None


def attach(overload: str, router: Callable) -> None:
    """Put the C++ router over the Python one now registered for `overload`; `router` is the Python router's
    recording twin (`dispatch._router(..., recording=True)`), registered as the op gradkern_rec::<overload> that
    the C++ router calls to record."""
    name = overload.replace(".", "__")
    _define(_recorder_lib(), name, str(op_schema(overload)), router)
    _ops.attach(_qualname(overload), f"gradkern_rec::{name}", False)


def _recorder_lib() -> torch.library.Library:
    global _recorders
    if _recorders is None:
        _recorders = torch.library.Library("gradkern_rec", "DEF")
    return _recorders


def _define(lib: torch.library.Library, name: str, schema: str, impl: Callable) -> None:
    """Define op `name` in `lib`'s namespace with `schema`'s arguments and returns, `impl` its kernel on the backend
    key."""
    lib.define(name + schema[schema.index("("):])
    lib.impl(name, impl, _runtime.BACKEND_KEY)


# ----------------------------------------------------------------------------------------------- gradkern.ops
# A gradkern op gets a twin, gradkern_eager::<name>, whose CUDA kernel is the C++ router over the op's function,
# gradkern's whatever the switch: gradkern.ops.<name> calls it below autograd (it refuses inputs that require grad
# itself), so that a repeated call is one dispatcher entry and a replay. The twin's schema is ATen's for an op whose
# function serves its ATen overload of the same name, else the op's own custom op's (torch.ops.gradkern.<name>:
# segment_max, sparsemax, repeat_backward); ops with neither (split by argument kind, or results that are not all
# tensors) keep the Python call.
#: gradkern.ops through the router (on by default; the test suite turns it off but where a test asks for it, since
#: tests that spy on a module's launches expect every call to reach Python)
OPS_FAST = True
_eager_defined: set[str] = set()  # ops defined in gradkern_eager (kept across unregister)
_eager_calls: dict[str, Callable | None] = {}  # op -> its call through the router (None: the op has none)


def eager_call(name: str) -> Callable | None:
    """`gradkern.ops.<name>`'s call through the native router (its arguments as the op's function takes them, out=
    aside), or None (the router not available, or the op without a twin). The first call loads the router, as
    `enable()` does: gradkern.ops users without `enable()` replay too."""
    if not OPS_FAST or (_ops is None and not available()):
        return None
    call = _eager_calls.get(name, False)
    if call is not False:
        return call
    with _load_lock:
        if name not in _eager_calls:
            _eager_calls[name] = _attach_eager(name)
    return _eager_calls[name]


def _attach_eager(name: str) -> Callable | None:
    from ..registry import REGISTRY

    info = REGISTRY.get(name)
    schema = None if info is None else _eager_schema(info)
    if schema is None:
        return None
    if name not in _eager_defined:
        _define(_kept_library("gradkern_eager"), name, str(schema), info.fn)
        _eager_defined.add(name)
    _define(_recorder_lib(), f"{name}__eager", str(schema), lambda *a, **k: recorded(name, info.fn, a, k, schema))
    _ops.attach(f"gradkern_eager::{name}", f"gradkern_rec::{name}__eager", True)
    return functools.partial(getattr(torch.ops.gradkern_eager, name).default._op_dk, torch._C.DispatchKey.CUDA)


def _eager_schema(info):
    """The schema (a torch FunctionSchema) of op `info`'s twin (see above), or None where it has none."""
    if info.name in info.aten and info.dispatch == "backend" and info.aten[info.name] is info.fn and \
            eligible(info.name):
        return op_schema(info.name)
    try:
        schema = getattr(torch.ops.gradkern, info.name).default._schema
    except AttributeError:  # (split by argument kind: gradkern::<name>__<kinds>, or no custom op)
        return None
    return schema if _functional(schema) else None


# ----------------------------------------------------------------------------------------------- autograd key
# An autograd-key override made by routing/autograd.py's fused_autograd (where.self, lerp, _prelu_kernel, repeat) gets
# a C++ router over its Python router (native.cpp's AgRouter). A descriptor's first plain call asks the planner,
# gradkern_ag::<overload>__plan (this module's `_plan`), which decides as the override would and, where the fused
# path applies, commits what the backward needs: the arguments the op's `save` keeps, and two twins of the op's
# backward for the inputs that require grad, gradkern_ag::<overload>__<mask>__fused (the op's fused backward, its CUDA
# kernel under the native router, so that it replays) and ...__composite (its ATen formula, differentiable). The
# twins take (grad, the saved tensors..., desc): `desc` names the descriptor's other attributes (the shapes and dtypes
# `save` put on its ctx), kept here. From then on a call of the descriptor runs stock's forward below autograd and a
# C++ node, without Python.
#: the C++ autograd path (on by default; the test suite turns it off but where a test asks for it)
AG_FAST = True
_ag_defined: set[str] = set()  # ops defined in gradkern_ag (kept across unregister)
_ag_attached: set[str] = set()  # fused twins with the C++ router over them (until detach_all)
_ag_descs: list[tuple] = []  # desc -> (ctx attributes, which saved tensors are not None)
_ag_desc_ids: dict = {}


def attach_autograd(overload: str, override: Callable) -> None:
    """Put the C++ autograd router over the Python router now registered for `overload` on the autograd key;
    `override` is fused_autograd's (its `parts`: accepts, save, fused, composite)."""
    name = overload.replace(".", "__") + "__plan"
    if name not in _ag_defined:
        schema = str(op_schema(overload))
        lib = _kept_library("gradkern_ag")
        lib.define(name + schema[schema.index("("):schema.rindex(" -> ")] + " -> ()")
        lib.impl(name, functools.partial(_plan, overload, override), "CompositeImplicitAutograd")
        _ag_defined.add(name)
    _ops.attach_autograd(_qualname(overload), f"gradkern_ag::{name}")


_kept_libs: dict[str, torch.library.Library] = {}


def _kept_library(ns: str) -> torch.library.Library:
    """The library of gradkern's twin ops in namespace `ns` (gradkern_eager, gradkern_ag), made once and kept for the
    process: an op defined there stays defined."""
    lib = _kept_libs.get(ns)
    if lib is None:
        lib = _kept_libs[ns] = torch.library.Library(ns, "DEF")
    return lib


class _Probe:
    """A stand-in ctx for the override's `save`: what it keeps."""

    def __init__(self, needs: tuple):
        self.needs_input_grad = needs
        self.saved = ()

    def save_for_backward(self, *tensors) -> None:
        self.saved = tensors


class _Ctx:
    """The ctx the op's fused / composite backward reads: its saved tensors and `save`'s other attributes."""

    def __init__(self, attrs: dict, saved: tuple, needs: tuple):
        self.__dict__.update(attrs)
        self.saved_tensors = saved
        self.needs_input_grad = needs


def _plan(overload: str, override: Callable, *args) -> None:
    """The planner: commits the descriptor's plan (native.cpp's ag_commit) - not fast where the override would
    decline the call or its `save` keeps a tensor that is not an argument."""
    from .autograd import plain_tensors

    accepts, save, fused, composite = override.parts
    if not AG_FAST or not plain_tensors(args) or not accepts(*args):
        return _ops.ag_commit(False, [], [], 0, "", "", "")
    needs = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    probe = _Probe(needs)
    save(probe, needs, *args)
    index = []
    for t in probe.saved:
        if t is not None:
            i = next((i for i, a in enumerate(args) if a is t), None)
            if i is None:
                return _ops.ag_commit(False, [], [], 0, "", "", "")
            index.append(i)
    attrs = {k: v for k, v in vars(probe).items() if k not in ("needs_input_grad", "saved")}
    pattern = tuple(t is not None for t in probe.saved)
    desc_key = (overload, needs, pattern, repr(attrs))
    desc = _ag_desc_ids.get(desc_key)
    if desc is None:
        desc = _ag_desc_ids[desc_key] = len(_ag_descs)
        _ag_descs.append((attrs, pattern))
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    outs = [tensors.index(i) for i, n in enumerate(needs) if n]
    twin = _ag_twins(overload, needs, len(index), fused, composite)
    _ops.ag_commit(True, index, outs, desc, f"gradkern_ag::{twin}__fused", f"gradkern_ag::{twin}__composite",
                   override.function.__name__ + "Backward")


def _ag_twins(overload: str, needs: tuple, n_saved: int, fused: Callable, composite: Callable) -> str:
    """The backward twins of `overload` for the inputs `needs` marks (defined and attached once); their name."""
    twin = overload.replace(".", "__") + "__" + "".join("1" if n else "0" for n in needs) + f"__{n_saved}"
    n_out = sum(needs)
    signature = ("(Tensor grad" + "".join(f", Tensor s{k}" for k in range(n_saved)) + ", int desc) -> " +
                 ("Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"))
    fused_twin = functools.partial(_backward_twin, fused, composite, needs, True)
    if twin not in _ag_defined:
        lib = _kept_library("gradkern_ag")
        lib.define(twin + "__fused" + signature)
        lib.define(twin + "__composite" + signature)
        lib.impl(twin + "__fused", fused_twin, _runtime.BACKEND_KEY)
        lib.impl(twin + "__composite", functools.partial(_backward_twin, fused, composite, needs, False),
                 "CompositeImplicitAutograd")
        _ag_defined.add(twin)
    if twin not in _ag_attached:
        schema = getattr(torch.ops.gradkern_ag, twin + "__fused").default._schema
        _define(_recorder_lib(), f"ag__{twin}", str(schema),
                lambda *a, **k: recorded(twin, fused_twin, a, k, schema))
        _ops.attach(f"gradkern_ag::{twin}__fused", f"gradkern_rec::ag__{twin}", True)
        _ag_attached.add(twin)
    return twin


def _backward_twin(fused: Callable, composite: Callable, needs: tuple, fast: bool, grad, *rest):
    """A backward twin's kernel: the op's fused backward (`fast`) or its ATen formula, on a ctx rebuilt from the
    saved tensors and the descriptor's attributes; the gradients of the inputs that require grad."""
    from ..errors import RankUnsupported

    *saved, desc = rest
    attrs, pattern = _ag_descs[desc]
    it = iter(saved)
    ctx = _Ctx(attrs, tuple(next(it) if p else None for p in pattern), needs)
    try:
        out = fused(ctx, grad, needs) if fast else composite(ctx, grad, needs)
    except RankUnsupported:  # more dims than the kernels index, found before any launch
        out = composite(ctx, grad, needs)
    out = tuple(g for g, n in zip(out, needs, strict=True) if n)
    return out[0] if len(out) == 1 else out


def detach_all() -> None:
    """Remove the C++ routers (the Python ones stay registered) and the recorder ops."""
    global _recorders
    if _ops is not None:
        _ops.detach_all()
    _eager_calls.clear()  # (the gradkern_eager ops stay defined, their kernel gradkern's Python, until re-attached)
    _ag_attached.clear()
    if _recorders is not None:
        _recorders._destroy()
        _recorders = None


def set_state(enabled: bool, always: bool) -> None:
    if _ops is not None:
        _ops.set_state(enabled, always)


def programs() -> int:
    """How many descriptors replay a recorded program (0 without the native router)."""
    return int(_ops.programs()) if _ops is not None else 0


def _qualname(overload: str) -> str:
    return "aten::" + overload


class _Programs(PlanCache):
    """Registers the C++ programs with clear_plans() (a config change drops them with every other plan)."""

    def clear(self) -> None:
        super().clear()
        if _ops is not None:
            _ops.clear()


_programs = _Programs("routing.native (C++ programs)")

# ----------------------------------------------------------------------------------------------- recording
PYTHON, STOCK, REPLAY = 0, 1, 2
EMPTY, VIEW, ZERO, FILL, COPY, LAUNCH, RETURN, CUMSUM = 1, 2, 3, 4, 5, 6, 7, 8
AS_EMPTY, NEVER, ZEROS, VALUE = 0, 1, 2, 3
SLOT_PTR, CONST_PTR, IMMEDIATE = 0, 1, 2


def commit_stock() -> None:
    """The recording descriptor goes to ATen's kernel (its route)."""
    _ops.commit(STOCK, [], [])


def recorded(overload: str, fn: Callable, args: tuple, kwargs: dict, schema=None):
    """`fn(*args, **kwargs)` (the op's implementation of `overload`, whose schema is ATen's unless given), recorded;
    commits the descriptor's program, or PYTHON where the run cannot be replayed (the reason kept in
    `refusals()`)."""
    rec = _Recording(op_schema(overload) if schema is None else schema, args, kwargs)
    if rec.device is not None and rec.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return fn(*args, **kwargs)  # (nothing committed: a later call records outside the capture)
    try:
        with rec, launcher.observe_launches(rec.launched), alloc.recording(rec):
            out = fn(*args, **kwargs)
    except Exception as e:  # (a declined or invalid problem: the Python router, which raises it again, keeps it)
        _refusals[overload] = f"the run raised {type(e).__name__}"
        _ops.commit(PYTHON, [], [])
        raise
    words = rec.finish(out) if out is not NotImplemented else None
    if words is None:
        _refusals[overload] = rec.refused or "the op declined the problem, or returned what the run did not make"
    _ops.commit(REPLAY if words is not None else PYTHON, words or [], rec.consts)
    return out


_refusals: dict[str, str] = {}


def refusals() -> dict[str, str]:
    """ATen overload -> why its last recording did not become a program."""
    return dict(_refusals)


def clear() -> None:
    """Drop every program (the next calls of each descriptor record again)."""
    _programs.clear()


class _Refused(Exception):
    """A step of the run that a program cannot replay."""


_FACTORIES = {  # ATen factory overloads -> (fill, the index of their fill value among the args or None)
    **{op: (AS_EMPTY, None) for op in ("empty.memory_format", "empty_strided.default", "empty_like.default",
                                       "new_empty.default", "new_empty_strided.default")},
    **{op: (ZEROS, None) for op in ("zeros.default", "zeros_like.default", "new_zeros.default")},
    **{op: (VALUE, None) for op in ("ones.default", "ones_like.default", "new_ones.default")},
    "full.default": (VALUE, 1), "full_like.default": (VALUE, 1), "new_full.default": (VALUE, 2),
}
_COPIES = ("clone.default", "_to_copy.default")
_INT_SIZES = {"i1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8}


class _Recording(TorchDispatchMode):
    """What a run did, as a program (see native.cpp's `Op`): every tensor it touches is a slot (the call's tensor
    arguments first), every step an instruction."""

    def __init__(self, schema, args: tuple, kwargs: dict):
        super().__init__()
        self.slots: list[torch.Tensor] = []
        self.index: dict[int, int] = {}  # id(tensor) -> slot
        self.words: list[int] = []
        self.consts: list[torch.Tensor] = []
        self.kernels: list = []  # the compiled kernels launched (kept with the program)
        self.refused: str | None = None
        self.quiet = 0  # >0 inside an allocation noted whole (alloc.empty's)
        for i, a in enumerate(schema.arguments):  # (a slot for each tensor argument, as native.cpp counts them,
            v = args[i] if i < len(args) else kwargs.get(a.name)  # even one passed twice)
            if isinstance(v, torch.Tensor):
                self._add(v)
        self.device = next((t.device for t in self.slots), None)

    # -- slots
    def _add(self, t: torch.Tensor) -> int:
        self.index.setdefault(id(t), len(self.slots))
        self.slots.append(t)
        return len(self.slots) - 1

    def _slot_of(self, t: torch.Tensor, new: bool = False) -> int:
        """`t`'s slot; with `new`, a new one where `t` has none (a tensor an op made)."""
        i = self.index.get(id(t))
        if i is not None and self.slots[i] is t:
            return i
        if not new:
            raise _Refused(f"a tensor the run did not make ({tuple(t.shape)})")
        return self._add(t)

    def _pointer(self, value) -> tuple[int, int, int]:
        """A launch's pointer argument as (kind, a, b): a slot or a kept tensor and a byte offset."""
        if value is None:
            return IMMEDIATE, 0, 8
        if isinstance(value, torch.Tensor):
            i = self.index.get(id(value))
            if i is not None and self.slots[i] is value:
                return SLOT_PTR, i, 0
            address = value.data_ptr()
        else:
            address, value = int(value), None
        for i, t in enumerate(self.slots):  # (an address inside a slot's storage, a view's for instance)
            base = t.untyped_storage().data_ptr()
            if base <= address < base + max(1, t.untyped_storage().nbytes()):
                return SLOT_PTR, i, address - t.data_ptr()
        if value is None:
            raise _Refused("a pointer into memory the run did not make")
        self.consts.append(value)  # a tensor made before the run (a table a plan keeps): kept with the program
        return CONST_PTR, len(self.consts) - 1, 0

    def _emit(self, *words: int) -> None:
        self.words.extend(int(w) for w in words)

    # -- ATen ops
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refused is None and not self.quiet:
            try:
                self._note(func, args, kwargs, out)
            except Exception as e:  # noqa: BLE001 - anything not understood keeps the descriptor in Python
                self.refused = f"{type(e).__name__}: {e}"
        return out

    def _note(self, func, args, kwargs, out) -> None:
        flat = [a for a in (*args, *kwargs.values(), *(out if isinstance(out, (tuple, list)) else (out,)))
                if isinstance(a, torch.Tensor)]
        if all(t.device.type == "meta" for t in flat):
            return  # (layout arithmetic on meta tensors)
        name = f"{func._schema.name.split('::')[-1]}.{func._overloadname}"
        if any(t.device != self.device for t in flat):
            raise _Refused(f"{name} on another device")
        if name == "zero_.default":
            self._emit(ZERO, self._slot_of(args[0]))
        elif name == "fill_.Scalar":
            self._emit(FILL, self._slot_of(args[0]), launcher.scalar_bits(args[1]))
        elif name == "copy_.default":
            self._emit(COPY, self._slot_of(args[0]), self._slot_of(args[1]))
        elif name in _FACTORIES:
            fill, at = _FACTORIES[name]
            value = 1.0 if fill == VALUE and at is None else args[at] if fill == VALUE else None
            self._new(out, fill, value)
        elif name in _COPIES:
            self._new(out, NEVER, None)
            self._emit(COPY, self._slot_of(out), self._slot_of(args[0]))
        elif name == "cumsum.default" and len(args) == 2 and kwargs.get("dtype") is None and \
                not args[0].is_floating_point():  # (segment_reduce's lengths to their ends)
            self._emit(CUMSUM, self._slot_of(args[0]), int(args[1]))
            self._slot_of(out, new=True)
        elif any(r.alias_info is not None for r in func._schema.returns) and not func._schema.is_mutable:
            base = self._slot_of(args[0])
            for o in out if isinstance(out, (tuple, list)) else (out,):
                b = self.slots[base]
                if o.dtype != b.dtype or o.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
                    raise _Refused(f"{name}: a view of another dtype or storage")
                self._emit(VIEW, base, o.dim(), *o.shape, *o.stride(), o.storage_offset() - b.storage_offset())
                self._slot_of(o, new=True)
        else:
            raise _Refused(f"{name} is not replayed")

    def _new(self, t: torch.Tensor, fill: int, value) -> None:
        if not isinstance(t, torch.Tensor) or t.dtype not in _SCALAR_TYPES:
            raise _Refused("a factory of no tensor, or of a dtype not keyed")
        self._emit(EMPTY, fill, _SCALAR_TYPES[t.dtype], t.dim(), *t.shape, *t.stride(),
                   *([launcher.scalar_bits(value)] if fill == VALUE else []))
        self._slot_of(t, new=True)

    def allocated(self, t: torch.Tensor) -> None:
        """alloc.empty's tensor, made without the fill deterministic mode gives torch.empty."""
        if self.refused is None:
            self._new(t, NEVER, None)

    # -- Triton launches
    def launched(self, jit, args: tuple, kwargs: dict, grid, compiled) -> None:
        if self.refused is not None:
            return
        try:
            self._launch(jit, args, kwargs, grid, compiled)
        except Exception as e:  # noqa: BLE001 - anything not understood keeps the descriptor in Python
            self.refused = f"{type(e).__name__}: {e}"

    def _launch(self, jit, args, kwargs, grid, ck) -> None:
        meta = getattr(ck, "metadata", None)
        function = getattr(ck, "function", None)
        if meta is None or not function:
            raise _Refused("a launch of no compiled kernel")
        if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0) or \
                getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False):
            raise _Refused("a launch with scratch memory, clusters or a cooperative grid")
        names = list(jit.arg_names)
        bound = dict(zip(names, args))
        bound.update({k: v for k, v in kwargs.items() if k in names})
        for p in getattr(jit, "params", ()):
            if p.name not in bound and getattr(p, "has_default", False):
                bound[p.name] = p.default
        if callable(grid):
            grid = grid(bound)
        grid = (*grid, 1, 1)[:3]
        signature = ck.src.signature
        params: list[tuple[int, int, int]] = []
        for i, name in enumerate(names):
            ty = signature.get(name, signature.get(i)) if isinstance(signature, dict) else None
            if ty is None:
                raise _Refused(f"no signature for {name}")
            self._param(ty, bound[name], params)
        self.kernels.append(ck)
        self._emit(LAUNCH, function, *grid, 32 * meta.num_warps, meta.shared, bool(getattr(meta, "launch_pdl", False)),
                   len(params), *[w for p in params for w in p])

    def _param(self, ty, value, params: list) -> None:
        """Append the kernel parameters of an argument of Triton type `ty` (a tuple type takes one per element,
        as Triton flattens it)."""
        if isinstance(ty, tuple):
            for t, v in zip(ty, value, strict=True):
                self._param(t, v, params)
        elif ty == "constexpr":
            return
        elif ty.startswith("*"):
            params.append(self._pointer(value))
        elif ty in _INT_SIZES:
            params.append((IMMEDIATE, int(value), _INT_SIZES[ty]))
        elif ty == "fp64":
            params.append((IMMEDIATE, launcher.scalar_bits(value), 8))
        elif ty == "fp32":
            params.append((IMMEDIATE, struct.unpack("<I", struct.pack("<f", float(value)))[0], 4))
        else:
            raise _Refused(f"a parameter of type {ty}")

    # -- the end
    def finish(self, out) -> list[int] | None:
        if self.refused is not None:
            return None
        outs = out if isinstance(out, (tuple, list)) else (out,)
        try:
            slots = [self._slot_of(o) for o in outs]
        except (_Refused, TypeError):
            return None
        _kept.update((id(ck), ck) for ck in self.kernels)  # (loaded while a program may launch them)
        return [*self.words, RETURN, len(slots), *slots]


_kept: dict[int, object] = {}  # the compiled kernels programs launch, by identity

_SCALAR_TYPES = {  # torch dtype -> c10::ScalarType's value
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15,
}
