"""The simulator's version: in every run's summary and in the keys of a study's rows.

Read from the installed package's metadata, so it is the version pip installed; :data:`VERSION`
(what the checkout declares, and what packaging reads) where the package is not installed.
"""

VERSION = "0.1.0"


def _installed() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("simgpu")
    except (PackageNotFoundError, ValueError):
        return VERSION


__version__ = _installed()
