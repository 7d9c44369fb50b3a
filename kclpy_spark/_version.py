"""The one place the version is written (pyproject.toml reads it; semver)."""

__version__ = "0.1.0"
