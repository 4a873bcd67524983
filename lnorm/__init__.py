r"""lnorm: layer normalization, forward and backward by hand, in NumPy.

The public API is two functions (:mod:`lnorm.core`) and the cache between
them (:mod:`lnorm.cache`); the other modules are imported by name. Importing
``lnorm`` imports neither SymPy nor CuPy.

Examples
--------
>>> import numpy as np
>>> import lnorm
>>> x = np.array([[1.0, 2.0, 3.0]])
>>> y, cache = lnorm.forward(x, np.ones(3), np.zeros(3), eps=1e-5)
>>> dx, dgamma, dbeta = lnorm.backward(np.ones_like(y), cache)
>>> np.round(y, 3), dbeta
(array([[-1.225,  0.   ,  1.225]]), array([1., 1., 1.]))
"""

from .cache import LayerNormCache
from .core import backward, forward

__all__ = ["LayerNormCache", "forward", "backward"]
__version__ = "0.1.0"
