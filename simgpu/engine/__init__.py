"""The SimPy engine and what it returns."""

from .core import Engine, EngineOptions
from .result import SimResult

__all__ = ["Engine", "EngineOptions", "SimResult"]
