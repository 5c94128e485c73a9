"""See what partitioning did: where values live.

``residuals(fun, *args)`` reports the values ``jax.vjp`` keeps from each pjit
inside ``fun`` (residuals), with the layout XLA chose for each.
"""

from ._src.residuals import Residual, residuals

__all__ = ["Residual", "residuals"]
