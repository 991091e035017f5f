"""Command line and shared settings of depthprune."""

from importlib.metadata import PackageNotFoundError, version

from depthprune.errors import UserError
from depthprune.settings import default_registry_url, home_dir, variants_dir

try:
    __version__ = version("depthprune")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__", "UserError", "default_registry_url", "home_dir", "variants_dir"]
