"""Modules imported on first use: pyarrow (~0.1 s with numpy) is needed by the readers of a few
formats only, but every ingest imports every reader to detect formats (issue 17)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule(ModuleType):
    """Stands for the module ``name``; the first attribute read imports it."""

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attr)
