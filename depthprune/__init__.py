"""depthprune: the shell (:mod:`~depthprune.cli`), the demo's assets (:mod:`~depthprune.demo`), the testing
kit (:mod:`~depthprune.testing`) and the ground every package stands on (:mod:`~depthprune.core`)."""

from depthprune.core.errors import UserError
from depthprune.core.settings import default_registry_url, home_dir, variants_dir
from depthprune.core.version import __version__

__all__ = ["__version__", "UserError", "default_registry_url", "home_dir", "variants_dir"]
