"""Tests for lnorm.validate: each check accepts what it should, converts what it
should, and names the argument and the fix when it refuses."""

import numpy as np
import pytest

import lnorm
from lnorm import validate


def test_as_float_array_accepts_floats_and_refuses_the_rest():
    for dt in validate.SUPPORTED_DTYPES:
        a = np.ones(3, dt)
        assert validate.as_float_array(a, "x") is a  # no copy
    with pytest.raises(
        TypeError, match=r"x must have a floating dtype.*x\.astype\(np\.float32\)"
    ):
        validate.as_float_array(np.ones(3, np.int32), "x")
    with pytest.raises(TypeError, match="complex128"):
        validate.as_float_array(np.ones(3, complex), "dy")


def test_as_rows_refuses_0d_and_empty_rows():
    assert validate.as_rows(np.zeros((0, 2)), "x").shape == (0, 2)
    with pytest.raises(ValueError, match="x must have at least one dimension"):
        validate.as_rows(np.float64(1.0), "x")
    with pytest.raises(ValueError, match="D >= 1; got D = 0"):
        validate.as_rows(np.zeros((3, 0)), "x")


def test_check_param_names_the_expected_shape():
    with pytest.raises(
        ValueError, match=r"gamma must have shape \(D,\) = \(4,\).*got shape \(3,\)"
    ):
        validate.check_param(np.ones(3), "gamma", 4)


@pytest.mark.parametrize(
    "bad, exc",
    [
        (0.0, ValueError),
        (-1e-5, ValueError),
        (np.inf, ValueError),
        (np.nan, ValueError),
        ("1e-5", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_check_eps_refuses_what_is_not_finite_and_positive(bad, exc):
    with pytest.raises(exc, match="eps"):
        validate.check_eps(bad)


def test_check_positive_and_int_convert():
    assert validate.check_positive(np.float32(0.5), "h", "1e-6") == 0.5
    assert type(validate.check_positive(2, "h", "1e-6")) is float
    assert validate.check_int(np.int16(7), "D", 1) == 7
    with pytest.raises(ValueError, match="D must be >= 1; got 0. hint"):
        validate.check_int(0, "D", 1, "hint")
    with pytest.raises(TypeError, match="D must be an integer; got float"):
        validate.check_int(2.0, "D", 1)


def test_as_dtype():
    assert (
        validate.as_dtype(np.float16, "dtype", validate.SUPPORTED_DTYPES, "x")
        == np.float16
    )
    with pytest.raises(TypeError, match="dtype must be a float; got int32"):
        validate.as_dtype("int32", "dtype", validate.SUPPORTED_DTYPES, "a float")
    with pytest.raises(TypeError, match="got 'nonsense'"):
        validate.as_dtype("nonsense", "dtype", validate.SUPPORTED_DTYPES, "a float")


def test_cache_and_dy_checks():
    _, cache = lnorm.forward(np.ones((2, 3)), np.ones(3), np.zeros(3))
    assert validate.check_cache(cache) is cache
    with pytest.raises(
        TypeError, match="LayerNormCache returned by lnorm.forward; got tuple"
    ):
        validate.check_cache((1, 2))
    with pytest.raises(
        ValueError, match=r"dy must have the shape of x, \(2, 3\).*got \(3, 2\)"
    ):
        validate.check_dy(np.ones((3, 2)), cache)


def test_no_module_imports_a_private_name_of_another():
    # Shared checks have public names here; no module reaches into another
    # module for a name that starts with an underscore.
    import re
    from pathlib import Path

    package = Path(lnorm.__file__).parent
    for path in package.rglob("*.py"):
        for m in re.finditer(
            r"^from \.[\w.]* import (\([^)]*\)|[^\n]*)", path.read_text(), re.M
        ):
            names = re.findall(r"\b(\w+)\b(?:\s+as\s+\w+)?", m.group(1))
            private = [n for n in names if n.startswith("_") and n != "__future__"]
            assert not private, f"{path.name} imports private {private}"
