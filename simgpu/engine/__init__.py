"""The SimPy engine; what it returns is :class:`simgpu.result.SimResult`."""

from .core import Engine, EngineOptions

__all__ = ["Engine", "EngineOptions"]
