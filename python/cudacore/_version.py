"""The version of this cudacore (the one of pyproject.toml)."""

__version__ = "0.1.0"
