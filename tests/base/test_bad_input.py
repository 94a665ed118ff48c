"""The package's base checks on bad input: the positive-integer check names the argument and
the value, and an error raised inside a Pyro trace reaches the user as their own."""

import pytest
import torch


@pytest.mark.parametrize(
    "value, error",
    [(None, TypeError), (float("inf"), ValueError), (float("nan"), ValueError),
     (0, ValueError), (-1, ValueError), (2.5, ValueError), ("3", TypeError),
     (True, TypeError)],
    ids=repr,
)
def test_check_positive_int_names_the_parameter_and_the_value(value, error):
    from pyro_dgp.validation import check_positive_int

    with pytest.raises(error, match=r"^num_inducing must be a positive integer, got ") as exc:
        check_positive_int(value, "num_inducing")
    assert repr(value) in str(exc.value)


def test_check_positive_int_accepts_whole_numbers():
    from pyro_dgp.validation import check_positive_int

    assert check_positive_int(3, "n") == 3
    assert check_positive_int(3.0, "n") == 3
    assert check_positive_int(torch.tensor(4), "n") == 4
    with pytest.raises(ValueError, match="n must be at most 3, got 4"):
        check_positive_int(4, "n", upper=3)


def test_unwrap_leaves_other_errors_alone():
    from pyro_dgp.errors import unwrap_trace_error

    inner = ValueError("bad")
    outer = ValueError("bad\nsomething else")
    outer.__cause__ = inner
    assert unwrap_trace_error(outer) is outer
    assert unwrap_trace_error(inner) is inner
