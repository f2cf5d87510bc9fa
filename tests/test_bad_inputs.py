"""The bad-input table (docs/bad-inputs.md), proved: for every op, each tensor argument of its first example is
replaced by a bad or edge variant; gradkern must either raise a named error (a GradkernError) having written
nothing, or give what stock PyTorch gives. The doc is generated from this
run (`GRADKERN_WRITE_DOCS=1 pytest tests/test_bad_inputs.py`) and the test fails when it is out of date."""

import math
import os
import pathlib

import pytest
import torch

import gradkern
from conftest import DEVICE
from gradkern.registry import REGISTRY
from gradkern.testing import assert_unchanged, check_case, check_error, snapshot

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "bad-inputs.md"

VARIANTS = {
    "int32": lambda t: t.to(torch.int32),
    "complex64": lambda t: t.to(torch.complex64),
    "list, not a tensor": lambda t: t.tolist(),
    "wrong shape (last dim - 1)": lambda t: t[..., :-1] if t.dim() and t.shape[-1] > 1 else t.unsqueeze(0)[:, :0],
    "extra leading dim": lambda t: t.unsqueeze(0).expand(2, *t.shape),
    "0-d": lambda t: t.reshape(-1)[0].clone() if t.numel() else torch.zeros((), dtype=t.dtype, device=t.device),
    "empty": lambda t: t[:0] if t.dim() else t.reshape(1)[:0],
    "NaN/inf values": lambda t: _specials(t),
    "float64 among float32": lambda t: t.to(torch.float64) if t.is_floating_point() else None,
    "bfloat16 among float32": lambda t: t.to(torch.bfloat16) if t.is_floating_point() else None,
    "on another device (meta)": lambda t: t.to("meta"),
}


def _specials(t):
    if not t.is_floating_point() or t.numel() == 0:
        return t
    s = t.clone().reshape(-1)
    vals = torch.tensor([math.nan, math.inf, -math.inf], dtype=t.dtype, device=t.device)
    s[: min(3, s.numel())] = vals[: min(3, s.numel())]
    return s.reshape(t.shape)


def _tensor_positions(args):
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]


# (op, variant) pairs whose reference would read out of bounds (stock CPU segment_reduce crashes the process), so
# gradkern's outcome is recorded without comparing: segment offsets that do not match data's length can only be
# seen with a device sync, which the raw segment ops (like aten::_segment_reduce_backward) leave to the caller
# as a documented precondition; their kernels clamp offsets instead, and gradkern.segment_max checks by default.
_SHAPE_VARIANTS = ("wrong shape (last dim - 1)", "extra leading dim", "0-d", "empty")
STOCK_CRASHES = {(op, v) for op in ("segment_max_forward", "segment_max_backward", "_segment_reduce_backward")
                 for v in _SHAPE_VARIANTS}
# a self narrower than the forward's input cannot be told from a valid one (adaptive output sizes are free), so
# gradkern ignores the indices past it; stock's CPU kernel writes out of bounds at them
STOCK_CRASHES |= {(op, "wrong shape (last dim - 1)")
                  for op in ("adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward")}
# variants whose tensors hold no data for the float64 reference to read: gradkern must reject them
NO_DATA = {"on another device (meta)"}


def _outcome(name, args, kwargs, compare=True):
    """gradkern's outcome: "ok" (and then equal to stock, which check_case runs) or a named error's class name,
    with the inputs proved unchanged. Stock is not run on arguments gradkern rejects: some of them make stock's
    CPU kernels read out of bounds (an empty grad_output for reflection_pad2d_backward crashes the process)."""
    before = snapshot(args)
    try:
        if compare:
            check_case(name, args, kwargs, what=f"{name} bad-input")
        else:
            REGISTRY[name].fn(*args, **kwargs)
            return "result (stock crashes; not compared)"
        return "ok"
    except gradkern.GradkernError as e:
        assert_unchanged(before, args, f"{name}: a rejected call changed its inputs")
        return type(e).__name__


def build_table() -> tuple[list[list[str]], list[str]]:
    rows, problems = [], []
    for name in sorted(REGISTRY):
        info = REGISTRY[name]
        torch.manual_seed(0)
        case = info.cases(DEVICE, torch.float32, "tiny")[0]
        params = list(info.fn.__code__.co_varnames[: info.fn.__code__.co_argcount])
        for pos in _tensor_positions(case.args):
            for vname, make in VARIANTS.items():
                args = list(case.args)
                args[pos] = make(args[pos])
                if args[pos] is None:  # the variant does not apply to this argument (a dtype change of a mask)
                    continue
                try:
                    compare = (name, vname) not in STOCK_CRASHES and vname not in NO_DATA
                    ours = _outcome(name, tuple(args), dict(case.kwargs), compare)
                    if vname in NO_DATA and ours.startswith("result"):
                        raise AssertionError("returned a result from tensors without data")
                except Exception as e:  # noqa: BLE001 - anything but a named error, or a mismatch, is a problem
                    problems.append(f"{name} {params[pos]} {vname}: {type(e).__name__}: {str(e).splitlines()[0]}")
                    continue
                rows.append([name, params[pos] if pos < len(params) else str(pos), vname,
                             "result equals stock" if ours == "ok" else ours])
    return rows, problems


def render(rows) -> str:
    lines = [
        "# Bad inputs: what each op does with them",
        "",
        "Generated by `GRADKERN_WRITE_DOCS=1 python -m pytest tests/test_bad_inputs.py` (on CPU through Triton's",
        "interpreter); the test fails when this file is out of date. For every op, each tensor argument of its",
        "first example problem is replaced by the variant named. \"result equals stock\" means gradkern returned",
        "what stock PyTorch returns (bit-exact or within tolerance, as for every test); an error name means",
        "gradkern raised that named error (`InvalidProblem` is also a `ValueError` and a `RuntimeError`;",
        "`Unsupported` a `TypeError` and `NotImplementedError`) before launching anything, and the test proved that",
        "the inputs are unchanged",
        "(`test_out_buffer_untouched_when_rejected` and each op's own tests prove it for out= buffers). Any other",
        "exception, or a result that differs from stock's, fails the test.",
        "",
        "| op | argument | variant | gradkern |",
        "|---|---|---|---|",
    ]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(DEVICE != "cpu", reason="the doc is generated under the interpreter")
def test_bad_input_table_holds_and_doc_is_current():
    rows, problems = build_table()
    assert not problems, "\n".join(problems)
    text = render(rows)
    if os.environ.get("GRADKERN_WRITE_DOCS"):
        DOC.parent.mkdir(exist_ok=True)
        DOC.write_text(text)
    assert DOC.exists() and DOC.read_text() == text, \
        "docs/bad-inputs.md is out of date: GRADKERN_WRITE_DOCS=1 python -m pytest tests/test_bad_inputs.py"


@pytest.mark.parametrize("name", [n for n in sorted(REGISTRY) if any(
    {"out", "grad_input"} & set(case.kwargs) for case in REGISTRY[n].errors(DEVICE))])
def test_out_buffer_untouched_when_rejected(name):
    """Every error case of the op (`register_op(errors=...)`) that hands an out= / grad_input= buffer: the named
    error, and the buffer (like every input) unchanged."""
    for case in REGISTRY[name].errors(DEVICE):
        if {"out", "grad_input"} & set(case.kwargs):
            check_error(name, case)
