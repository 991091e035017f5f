"""Command line and shared settings of depthprune."""

from depthprune.errors import UserError
from depthprune.settings import default_registry_url, home_dir, variants_dir

__all__ = ["UserError", "default_registry_url", "home_dir", "variants_dir"]
