"""How kernels are launched: scalars passed at full precision, launch constants, programmatic dependent launch, and
the direct relaunch of a compiled kernel (after the first launch of a specialisation, no Triton JIT lookup)."""

from __future__ import annotations

import contextlib
import functools
import math
import struct
import threading
from collections.abc import Callable, Iterator, Sequence

import torch
import triton

from .. import _runtime
from .._runtime import I32_MAX, thread_value
from ..config import PlanCache
from ..errors import Unsupported
from .tl_helpers import HAS_GDC


def scalar_bits(value: float) -> int:
    """A float as the int64 bit pattern of its float64 value: how kernels receive scalars at full precision
    (Triton would pass a Python float as fp32). (Zeros bypass the cache: 0.0 and -0.0 are one key there.)"""
    value = float(value)
    return _bits(value) if value != 0.0 else (0 if math.copysign(1.0, value) > 0 else -(2**63))


@functools.lru_cache(maxsize=4096)
def _bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value))[0]


def bits_spec(bits) -> tuple:
    """What Triton specialises scalar arguments `bits` on, part of the key under which a compiled kernel is
    relaunched directly: their type (int32 or int64). The kernels exempt them from value specialisation (see
    SCALAR_PARAMS), so a scalar's bits are never compiled in."""
    return tuple(-(2**31) <= b <= I32_MAX for b in bits)


# the kernels' scalar parameters, exempt from Triton's value specialisation (do_not_specialize): it would compile
# bits equal to 1 (the float 5e-324) in as a constant, which the scalar helper cannot bitcast, and key others on
# their divisibility by 16
SCALAR_PARAMS = ("s0", "s1", "s2")


def round_to_dtype(value: float, dtype: torch.dtype) -> float:
    """`value` rounded to `dtype` (round to nearest even, overflow to ±inf), as ATen's Scalar.to<scalar_t>()."""
    value = float(value)
    if value == 0.0:  # (±0 is exact in every dtype; the cache below takes 0.0 and -0.0 for one key)
        return value
    return _rounded(value, dtype)


@functools.lru_cache(maxsize=4096)
def _rounded(value: float, dtype: torch.dtype) -> float:
    if dtype == torch.float64 or math.isnan(value) or math.isinf(value):
        return value
    if dtype == torch.float32:
        fmt = "<f"
    elif dtype == torch.float16:
        fmt = "<e"
    elif dtype == torch.bfloat16:
        f32 = _rounded(value, torch.float32)
        if math.isinf(f32):
            return f32
        bits = struct.unpack("<I", struct.pack("<f", f32))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    else:
        raise Unsupported("gradkern", "dtype", "a floating dtype", dtype)
    try:
        return struct.unpack(fmt, struct.pack(fmt, value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


# ----------------------------------------------------------------------------------------------- fast launch
_fast_cache = PlanCache("launch.launcher._fast_cache")
_get_device = getattr(torch._C, "_cuda_getDevice", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_FAST_OK = not _runtime.INTERPRET
_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


#: how many threads are observing their launches (observe_launches): while any is, every launch goes through
#: Triton's JIT entry point, where the observer sees it
RECORDING = 0


def hooks_idle() -> bool:
    """True when no Triton launch hook is installed (a profiler's) and no plan is recording, so the launcher may
    be called directly with no launch metadata. Triton 3.6 keeps hooks in (possibly empty) HookChains; older
    versions use None."""
    if _KNOBS is None or RECORDING:
        return False
    for hook in (_KNOBS.launch_enter_hook, _KNOBS.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def relaunchable(ck) -> bool:
    """Whether `ck`, what `kernel[grid](...)` returned, is a compiled kernel we know how to call directly."""
    return _FAST_OK and all(hasattr(ck, a) for a in ("run", "function", "packed_metadata"))


def direct_launcher(ck) -> Callable:
    """A callable `(grid0, stream, *args)` that launches compiled kernel `ck` directly, as Triton's JIT does after
    its own cache lookup: `args` are every kernel parameter in order, constexprs included; pointers may be given
    as ints (data_ptr values), which spares the launcher a driver query per pointer. Only valid for the
    specialisation `ck` was compiled for, on the current device, with `hooks_idle()`."""
    run, function, meta = ck.run, ck.function, ck.packed_metadata
    raw = getattr(run, "launch", None)
    if raw is not None and getattr(run, "global_scratch_size", 1) == 0 \
            and getattr(run, "profile_scratch_size", 1) == 0 and hasattr(run, "launch_pdl"):
        # Triton 3.6's CudaLauncher.__call__ only adds the (here absent) scratch buffers before calling this
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl
        return lambda grid0, stream, *args: raw(grid0, 1, 1, stream, function, coop, pdl, None, None, meta, None,
                                                None, None, *args)
    return lambda grid0, stream, *args: run(grid0, 1, 1, stream, function, meta, None, None, None, *args)


# kernels with a PDL constexpr launch as programmatic dependents where the GPU can (pdl_ok)
PDL = True


def pdl_ok(device: int) -> bool:
    """Whether kernels on CUDA device `device` launch as programmatic dependents of the kernel before them in the
    stream: PDL on (read on every call), compiled Triton with gdc_wait, compute capability 9+. Such a kernel (its
    PDL constexpr set) may start while that kernel finishes; its first instruction, gdc_wait, waits until that
    kernel is done and its writes are visible, so only the launch latency overlaps."""
    return PDL and _pdl_capable(device)


@functools.cache
def _pdl_capable(device: int) -> bool:
    return _FAST_OK and HAS_GDC and device >= 0 and torch.cuda.get_device_capability(device)[0] >= 9


def tile_warps(elements: int, most: int, per_thread: int = 1) -> int:
    """Warps for a program tile of `elements`: as many as give each thread at least `per_thread` of them, at most
    `most`, at least one (a small tile on the full count leaves threads idle and holds programs off an SM)."""
    return max(1, min(most, elements // (32 * per_thread)))


def column_block(size: int, cap: int, least: int) -> int:
    """The column block along an axis of `size`: the power of two, at most `cap` and at least `least` (or
    size's next power of two), whose blocks waste the fewest lanes past the axis' end; the widest among equals
    (W = 96: 32, 200: 32, 56: 64). A lane past the row costs a whole element's work; a narrower block costs a
    thread nothing (it holds one row's 4 columns either way), but its warp's accesses span more rows."""
    top = min(_runtime.next_pow2(size), cap)
    blocks = [top >> k for k in range(top.bit_length()) if top >> k >= min(least, top)]
    return min(blocks, key=lambda b: (_runtime.cdiv(size, b) * b, -b))


def launch_consts(constexprs: dict, num_warps: int, *, pdl: bool | None = None, **options) -> dict:
    """The `consts` that `launch` takes: the kernel's constexprs (in its parameter order; with `pdl` not None, its
    PDL constexpr last), their values for the direct relaunch, num_warps and other compile `options`, and
    launch_pdl where PDL is on."""
    consts = dict(constexprs) if pdl is None else {**constexprs, "PDL": pdl}
    consts = {**consts, "__values__": tuple(consts.values()), "num_warps": num_warps, **options}
    if pdl:
        consts["launch_pdl"] = True
    return consts


def launch(kernel, grid: tuple[int, ...], ptrs: Sequence[torch.Tensor], ints: Sequence, consts: dict, device: int,
           spec_key: tuple | None = None) -> None:
    """Launch `kernel[grid](*ptrs, *ints, **consts)` on CUDA device `device` (-1: CPU under the interpreter):
    `ptrs` are the tensors of the kernel's leading pointer parameters, `ints` its parameters after them.

    With a `spec_key`, the compiled kernel is called directly after the first launch of that specialisation,
    with the pointers as ints (which spares the launcher a driver query each: docs/tuning/pointwise.md). The key
    must capture the device and everything Triton specialises `ints` and the pointers' dtypes on (integer widths,
    values of 1, divisibility); launch adds the pointers' 16-byte alignment. `consts` as `launch_consts` makes
    them."""
    if spec_key is not None and _FAST_OK:
        addrs = [p.data_ptr() for p in ptrs]
        spec_key = (spec_key, *[not a & 15 for a in addrs])
        call = _fast_cache.get(spec_key)
        if call is not None and torch._C._cuda_getDevice() == device and hooks_idle():
            call(grid[0], torch._C._cuda_getCurrentRawStream(device), *addrs, *ints, *consts["__values__"])
            return
    kw = {k: v for k, v in consts.items() if k != "__values__"}
    if device >= 0 and torch.cuda.current_device() != device:
        with torch.cuda.device(device):
            kernel[grid](*ptrs, *ints, **kw)
        return
    ck = kernel[grid](*ptrs, *ints, **kw)
    if spec_key is not None and relaunchable(ck):
        _fast_cache.remember(spec_key, direct_launcher(ck))  # built once per specialisation, not per call


# ----------------------------------------------------------------------------------------------- observing launches
_observer = threading.local()  # .fn: this thread's observer (observe_launches)
_observe_lock = threading.Lock()
_patched: dict[type, Callable] = {}  # a Triton JIT class -> its own `run`, while any thread observes


def _jit_classes() -> list[type]:
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # (a Triton without the interpreter)
        pass
    return classes


def _observed(original: Callable) -> Callable:
    def run(self, *args, grid, warmup, **kwargs):
        compiled = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        fn = getattr(_observer, "fn", None)
        if fn is not None and not warmup:
            fn(self, args, kwargs, grid, compiled)
        return compiled
    return run


@contextlib.contextmanager
def observe_launches(fn: Callable) -> Iterator[None]:
    """Within the block, `fn(jit_function, args, kwargs, grid, compiled)` is called after each Triton launch this
    thread makes (`compiled`: what the launch returned, a CompiledKernel when compiled). The direct relaunch paths
    stand aside meanwhile, for every thread (hooks_idle is false), so no launch escapes; other threads' launches
    are not observed. Blocks nest and may overlap across threads."""
    global RECORDING
    with _observe_lock:
        if not _patched:
            for cls in _jit_classes():
                _patched[cls] = cls.run
                cls.run = _observed(cls.run)
        RECORDING += 1
    try:
        with thread_value(_observer, "fn", fn):
            yield
    finally:
        with _observe_lock:
            RECORDING -= 1
            if not RECORDING:
                for cls, run in _patched.items():
                    cls.run = run
                _patched.clear()
