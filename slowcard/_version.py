"""The package version, in a module of its own so that any module can read it without importing
the package front (``slowcard/__init__``)."""

__version__ = "0.1.0"
