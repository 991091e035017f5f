"""depthprune's version, where every package may read it without importing the shell (``depthprune``).

Pruned checkpoints, merged heals and load-test reports record the version that wrote them; they import
:data:`__version__` from here. ``depthprune.__version__`` is the same value.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("depthprune")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
