"""`python -m gradkern list | check | bench`: arguments (bug hunt: bad values ran or crashed late) and the
registry's lookups."""

import pytest
import torch

import gradkern
from gradkern import cli


def test_list_runs(capfd):
    assert cli.main(["list"]) == 0
    assert "hardsigmoid_backward" in capfd.readouterr().out


@pytest.mark.parametrize("argv", [
    ["bench", "--size", "huge"],  # was a KeyError traceback after the overhead pass
    ["bench", "--ops", ""],  # was every op
    ["check", "--dtypes", ""],  # was "0 passed, 0 failed", exit 0
    ["check", "--ops", "no_such_op"],
    ["check", "--dtypes", "f8"],
])
def test_bad_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_guarantee_of_an_unhashable_name_is_a_named_error():
    with pytest.raises(gradkern.InvalidProblem, match="op_name"):  # was a raw TypeError (unhashable type)
        gradkern.guarantee(["hardsigmoid_backward"], torch.float32)
