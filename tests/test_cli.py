"""`python -m gradkern list | check | bench`: arguments (bug hunt: bad values ran or crashed late) and the
registry's lookups."""

import dataclasses

import pytest
import torch

import gradkern
from gradkern.registry import REGISTRY
from gradkern.tools import cli


def test_list_runs(capfd):
    assert cli.main(["list"]) == 0
    assert "hardsigmoid_backward" in capfd.readouterr().out


@pytest.mark.parametrize("argv", [
    ["bench", "--size", "huge"],  # was a KeyError traceback after the overhead pass
    ["bench", "--ops", ""],  # was every op
    ["check", "--dtypes", ""],  # was "0 passed, 0 failed", exit 0
    ["check", "--ops", "no_such_op"],
    ["check", "--dtypes", "f8"],
    # bug (audit): an output path in a missing folder failed only after every case ran (a traceback, exit 1)
    ["bench", "--ops", "hardshrink", "--dtypes", "f32", "--json", "/nonexistent-gradkern-dir/bench.json"],
    ["bench", "--ops", "hardshrink", "--dtypes", "f32", "--plot", "/nonexistent-gradkern-dir/bench.png"],
])
def test_bad_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_guarantee_of_an_unhashable_name_is_a_named_error():
    with pytest.raises(gradkern.InvalidProblem, match="op_name"):  # was a raw TypeError (unhashable type)
        gradkern.guarantee(["hardsigmoid_backward"], torch.float32)


def test_check_passes_and_fails_with_the_exit_status(capfd, monkeypatch):
    """`check` compares each op with stock: exit 0 and 'N passed, 0 failed' as it is; a wrong result is a FAIL
    row and exit 1 (nothing tested the command itself)."""
    argv = ["check", "--ops", "hardshrink", "--dtypes", "f32"]
    assert cli.main(argv) == 0
    assert "1 passed, 0 failed" in capfd.readouterr().out
    info = REGISTRY["hardshrink"]
    monkeypatch.setitem(REGISTRY, "hardshrink", dataclasses.replace(info, fn=lambda x, lambd: info.fn(x, lambd) + 1))
    assert cli.main(argv) == 1
    out = capfd.readouterr().out
    assert "FAIL" in out and "0 passed, 1 failed" in out


def test_host_table_times_each_autograd_overload_itself(monkeypatch):
    """Bug: the host table called the overload packet (torch.ops.aten.lerp), whose resolution tries lerp.Scalar
    first and formats the tensor arguments into the error it discards: about 2 ms a call, stock and gradkern alike,
    in the lerp.Tensor row."""
    from gradkern.tools import bench

    seen = []
    real = bench._forward_backward
    monkeypatch.setattr(bench, "_forward_backward", lambda op, a, k: (seen.append(op), real(op, a, k))[1])
    monkeypatch.setattr(bench, "host_overhead_us", lambda fn, calls: 1.0)
    rows = bench._overheads(["lerp_backward"], torch.device(gradkern._runtime.DEVICE_TYPE), False)
    assert [r["path"].split()[0] for r in rows if "fwd+bwd" in r["path"]] == ["lerp.Scalar", "lerp.Tensor"]
    assert [str(op) for op in seen] == ["aten.lerp.Scalar", "aten.lerp.Tensor"]


def test_host_row_keeps_each_sides_fastest_of_many_short_runs(monkeypatch):
    """Bug: each side of a host row was its faster of two long runs, so one slow spell of the host moved a row past
    its target (a row read 1.40x in one table, 1.05x in the next). A row takes `rounds` runs a side, alternating,
    and keeps each side's fastest, wherever it falls."""
    from gradkern.tools import bench

    def stock():
        pass

    def ours():
        pass
    times = {stock: iter([9.0, 8.0, 8.5, 5.0, 9.0]), ours: iter([12.0, 11.0, 6.0, 13.0, 12.0])}
    monkeypatch.setattr(bench, "host_overhead_us", lambda fn, calls: next(times[fn]))
    row = bench._host_row("op", "gradkern.ops", "case", ours, stock, 200, 5, routed=False)
    assert (row["aten_us"], row["gradkern_us"], row["ratio"]) == (5.0, 6.0, 1.2)
    assert row["target_met"]
