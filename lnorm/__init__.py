"""lnorm: layer normalization, forward and backward by hand, in NumPy.

The public API is two functions and the cache between them::

    y, cache = lnorm.forward(x, gamma, beta, eps=1e-5)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)

The other modules (``lnorm.variance``, ``lnorm.gradcheck``, ``lnorm.symbolic``,
``lnorm.cost``, ``lnorm.bench``, ``lnorm.gpu``, and ``lnorm.prose``, the book's
glue and number-formatting helper) are imported by name; importing
``lnorm`` does not import SymPy or CuPy.
"""

from .core import LayerNormCache, backward, forward

__all__ = ["LayerNormCache", "forward", "backward"]
__version__ = "0.1.0"
