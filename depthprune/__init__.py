"""depthprune: the shell (:mod:`~depthprune.cli`), the demo's assets (:mod:`~depthprune.demo`), the testing
kit (:mod:`~depthprune.testing`) and the ground every package stands on (:mod:`~depthprune.core`)."""

from importlib.metadata import PackageNotFoundError, version

from depthprune.core.errors import UserError
from depthprune.core.settings import default_registry_url, home_dir, variants_dir

try:
    __version__ = version("depthprune")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__", "UserError", "default_registry_url", "home_dir", "variants_dir"]
