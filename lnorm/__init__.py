r"""lnorm: layer normalization, forward and backward by hand, in NumPy.

The public API is two functions and the cache between them::

    y, cache = lnorm.forward(x, gamma, beta, eps=1e-5)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)

Both run the fused loops of :mod:`lnorm.fused` (Numba, one pass per row) by
default, and the NumPy formulas on blocks of rows with ``block_rows=``;
:mod:`lnorm.core` has the formulas themselves (``forward_formula``,
``backward_formula``), and :mod:`lnorm.cache` the cache and its constructor
``make_cache``.

The other modules are imported by name: ``lnorm.validate`` (the input checks
every public function shares), ``lnorm.inputs`` (seeded inputs),
``lnorm.variance``, ``lnorm.gradcheck``, ``lnorm.symbolic``, ``lnorm.cost``,
``lnorm.bench`` and ``lnorm.gpu``. Importing ``lnorm`` does not import SymPy
or CuPy. ``CHANGELOG.md`` lists what changed
since the first edition.

Examples
--------
>>> import numpy as np
>>> import lnorm
>>> x = np.array([[1.0, 2.0, 3.0]])
>>> y, cache = lnorm.forward(x, np.ones(3), np.zeros(3))
>>> dx, dgamma, dbeta = lnorm.backward(np.ones_like(y), cache)
>>> np.round(y, 3), dbeta
(array([[-1.225,  0.   ,  1.225]]), array([1., 1., 1.]))
"""

from .cache import LayerNormCache
from .core import backward, forward

__all__ = ["LayerNormCache", "forward", "backward"]
__version__ = "0.1.0"
