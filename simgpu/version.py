"""The simulator's version: in every run's summary and in the keys of a study's rows."""

__version__ = "0.1.0"
