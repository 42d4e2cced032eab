"""Predictions with error bars: the spread of each source (:mod:`.sources`) drawn through the
simulation (:mod:`.draws`) into P10 / P50 / P90 of the iteration and the sources that spread it."""

from .draws import Uncertainty, propagate
from .sources import Spread, spread

__all__ = ["Spread", "Uncertainty", "propagate", "spread"]
