"""Shared test inputs and settings.

* :func:`make_inputs`: the one generator of seeded ``x, gamma, beta, dy``
  (a thin layer over :func:`lnorm.inputs.make_inputs`, with the test defaults
  of ``tests/reference.py``: ``x ~ N(offset, scale)``, ``gamma ~ N(1, 0.5)``,
  ``beta ~ N(0, 0.5)``, ``dy ~ N(0, 1)``);
* :func:`layouts`: the same values C-ordered, Fortran-ordered and strided;
* the ``rng`` fixture: a seeded NumPy generator;
* the Hypothesis profiles (``tests/test_properties.py``): ``lnorm`` (the
  default: 100 examples a test, a quarter of them for the two invariants
  that fail on almost any example; no deadline, no example database written
  into the tree), ``ci`` (the same, derandomized: the same examples on every run)
  and ``thorough`` (1000 examples). Pick one with ``pytest
  --hypothesis-profile=thorough``.

Import the helpers with ``from conftest import make_inputs, layouts``.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference
from hypothesis import HealthCheck, settings

import lnorm
from lnorm.inputs import make_inputs as draw_inputs

#: The test defaults for the parameters' spread (as tests/reference.py).
PARAM_SCALE = 0.5

_COMMON = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("lnorm", max_examples=100, **_COMMON)
settings.register_profile("ci", max_examples=100, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=1000, **_COMMON)
settings.load_profile("lnorm")


def make_inputs(
    shape, dtype=np.float64, seed: int = 0, offset: float = 0.0, scale: float = 1.0
):
    """Seeded ``x, gamma, beta, dy``: ``x``, ``dy`` of ``shape``, parameters ``(D,)``.

    ``x ~ N(offset, scale)`` (so ``offset / scale`` is the row offset in
    units of the spread), ``gamma ~ N(1, 0.5)``, ``beta ~ N(0, 0.5)``,
    ``dy ~ N(0, 1)``, drawn in float64 and converted to ``dtype`` last:
    :func:`lnorm.inputs.make_inputs` with the tests' parameter spread.

    Examples
    --------
    >>> x, gamma, beta, dy = make_inputs((2, 3), np.float32, seed=1, offset=1e4)
    >>> x.shape, gamma.shape, x.dtype
    ((2, 3), (3,), dtype('float32'))
    """
    return draw_inputs(
        tuple(shape), dtype, seed, loc=offset, scale=scale, param_scale=PARAM_SCALE
    )


def layouts(a: np.ndarray) -> dict[str, np.ndarray]:
    """The values of ``a`` C-ordered, Fortran-ordered and strided (every other element).

    Examples
    --------
    >>> {k: v.flags.c_contiguous for k, v in layouts(np.ones((2, 3))).items()}
    {'C': True, 'F': False, 'strided': False}
    """
    a = np.ascontiguousarray(a)
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    wide[..., ::2] = a
    return {"C": a, "F": np.asfortranarray(a), "strided": wide[..., ::2]}


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with a fixed seed: the same draws in every test that asks."""
    return np.random.default_rng(20240607)


# Shared by the tests of lnorm.finitediff and lnorm.gradcheck.
@pytest.fixture
def ab():
    rng = np.random.default_rng(10)
    return [rng.normal(size=(3, 4)), rng.normal(0.0, 0.5, size=(3, 4))]


@pytest.fixture
def layernorm_case():
    """(2, 3, 8) with gamma far from 1 and nonzero beta, and its gradients."""
    x, gamma, beta, dy = reference.make_inputs((2, 3, 8), seed=11)
    grads = lnorm.backward(dy, lnorm.forward(x, gamma, beta)[1])
    return [x, gamma, beta], dy, list(grads)


@pytest.fixture(scope="session")
def load_dev():
    """Import a script of dev/ by its name (the folder is no package)."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        path = Path(__file__).parents[1] / "dev" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
