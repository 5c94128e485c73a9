"""Modules loaded on first use: what a ``pjit`` user never touches is not imported.

Why: ``import partitioner`` should cost what ``pjit``/``jit``/``PartitionSpec``
need; the other systems (host callbacks, multi-process jobs, ``colocated_python``,
``pmap``, ``AUTO``, reports) load when a program first reaches for them, as jax's
own lazy loader (``jax._src.lazy_loader``) does for its submodules. Besides the
import time, every object a module creates at import is one more object the
garbage collector's generational counters see, which brings jax's first full
collection forward into the user's first call.

An import inside a function would hide the edge from ``tests/test_architecture.py``
(layers, cycles), so a deferred import is *declared* at module level, by its
module's full name, with one of the two helpers below, and the test reads those
declarations as imports of the named module:

- :func:`attach` gives a package a module ``__getattr__`` / ``__dir__`` for public
  names that live in modules loaded on first access (``partitioner.pmap``).
- :func:`module` gives a module a stand-in for another module, imported at the
  stand-in's first attribute read (the planner's AUTO stage, the stages' reports);
  :func:`loaded` says whether anyone imported it yet.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any


def attach(
    package: str, names: Mapping[str, str], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``package``'s deferred public names.

    Args:
        package: the package's ``__name__``.
        names: each public name -> the full name of the module defining it.
        submodules: public submodules of ``package``, loaded when first read.

    Returns:
        ``(__getattr__, __dir__)``. A name is imported once: its value is then
        stored in the package, so later reads never reach ``__getattr__``.
        ``__dir__`` lists the package's globals and every deferred name.
    """
    subs = frozenset(submodules)

    def __getattr__(name: str) -> Any:
        if name in subs:
            value: Any = importlib.import_module(f"{package}.{name}")
        elif name in names:
            value = getattr(importlib.import_module(names[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names, *subs})

    return __getattr__, __dir__


class _Deferred:
    """A module imported at the first attribute read (see :func:`module`)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, loaded on first use>"


def module(name: str) -> Any:
    """A stand-in for the module ``name`` (its full name), imported when first used.

    Declare it at module level, with the real import under ``if TYPE_CHECKING:`` so
    type checkers see the module itself.
    """
    return _Deferred(name)


def loaded(deferred: Any) -> ModuleType | None:
    """The module behind a :func:`module` stand-in if anyone imported it yet, else None."""
    return sys.modules.get(deferred._name)  # noqa: SLF001  (this module's own class)
