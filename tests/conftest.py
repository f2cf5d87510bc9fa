"""Test set-up: without a CUDA GPU every kernel runs on CPU through Triton's interpreter (set before triton is
imported), with small shapes; on a GPU the same tests run compiled, with larger shapes."""

import contextlib
import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

import gradkern  # noqa: E402
from gradkern import (
    _runtime,  # noqa: E402
    config,
)
from gradkern.routing import native  # noqa: E402

DEVICE = _runtime.DEVICE_TYPE
#: the size class of registry cases the tests run: small under the interpreter, larger on a GPU;
#: GRADKERN_TEST_SIZE overrides it (scripts/gpu.sh runs compute-sanitizer at "tiny")
SIZE = os.environ.get("GRADKERN_TEST_SIZE") or ("small" if _runtime.INTERPRET else "check")
DTYPES = list(_runtime.FLOAT_DTYPES)

gpu_only = pytest.mark.skipif(_runtime.INTERPRET, reason="needs a CUDA GPU (compiled Triton)")


@pytest.fixture(autouse=True)
def _stock_routing_after_each_test(monkeypatch):
    # gradkern.ops calls and the autograd-key overrides reach Python (tests spy on launches and Functions);
    # test_native turns the native router's paths back on
    monkeypatch.setattr(native, "OPS_FAST", False)
    monkeypatch.setattr(native, "AG_FAST", False)
    yield
    gradkern.disable()
    native.clear()  # (a test may swap an op's implementation: no program recorded before may replay it)


def dtype_id(d: torch.dtype) -> str:
    return _runtime.DTYPE_NAMES[d]


def import_script(name: str):
    """The module scripts/<name>.py (the scripts are not a package)."""
    import importlib
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@contextlib.contextmanager
def small_pad_tiles(unroll: int = 1, loop_unroll_3d: int = 0):
    """Pad plans with 8-element tiles at most 4 columns wide, so that planes span many tiles and the border strips
    cross tile edges (what large planes get), and replicate pads wider than `unroll` in loops (after `loop_unroll_3d`
    sources a side unrolled)."""
    from gradkern.kernels import pad

    with config.override(pad.CONFIG, tile=(8, 8, 8), max_bw=4, unroll=unroll, loop_unroll_3d=loop_unroll_3d):
        yield


@contextlib.contextmanager
def small_prelu_splits(tile_bytes: int, rows_tpp: int):
    """prelu's fused plans with tiles of `tile_bytes` per operand, `rows_tpp` tiles a row-kernel program, and
    column-kernel splits down to a row, so that small inputs get several partials per channel (the fixed-order
    second pass)."""
    from gradkern.kernels import prelu

    with config.override(prelu.CONFIG, tile_bytes=tile_bytes, rows_tpp=rows_tpp, cols_tile=16,
                         cols_target_programs=4, cols_min_rows=1):
        yield
