"""The package's version (``pyproject.toml`` names the same), importable from every floor."""
__version__ = "0.1.0"
