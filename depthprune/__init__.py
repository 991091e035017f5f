"""depthprune: the shell, the command line (:mod:`~depthprune.cli`) and the testing kit
(:mod:`~depthprune.testing`), which use every package; the ground they all stand on is the top-level
:mod:`ground` package (helpers, memory planning, the demo's assets). The names below are re-exported from
there for users' scripts."""

from ground.core.errors import UserError
from ground.core.settings import default_registry_url, home_dir, variants_dir
from ground.core.version import __version__

__all__ = ["__version__", "UserError", "default_registry_url", "home_dir", "variants_dir"]
