"""``colocated_python_class``: a stateful object that lives where its methods' arguments do.

The handle (an instance of the wrapper class) only records the constructor's
arguments. The object itself is built lazily by the first method call, on the
worker running that call (NOTE [colocated lanes]): beside the devices of that
call's arguments, in each process its own. Every public method is a colocated
function (``obj.method.specialize(...)`` works) that runs the object's method.

NOTE [colocated object lifetime]: the remote object lives while anything can
still use it: the handle, a method taken from it, a call queued or running.
Dropping the handle queues its release after the calls the dropping thread made
(in its lane), so ``__del__`` runs on a worker, asynchronously, once the last
call that uses the object has run; an object never called is never built.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any

from .api import ColocatedFunction, Specialization
from .runtime import submit

#: Members of the class the handle does not turn into colocated methods.
_NOT_METHODS = ("__init__", "__del__", "__reduce__", "__reduce_ex__")


class _Remote:
    """The object behind a handle, built on first use."""

    def __init__(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._cls, self._args, self._kwargs = cls, args, kwargs
        self._lock = threading.Lock()
        self._obj: Any = None
        self._built = False

    def get(self) -> Any:
        with self._lock:
            if not self._built:
                self._obj = self._cls(*self._args, **self._kwargs)
                self._built = True
            return self._obj


def _call_method(remote: _Remote, name: str, *args: Any, **kwargs: Any) -> Any:
    return getattr(remote.get(), name)(*args, **kwargs)


def _release(box: list[_Remote]) -> None:
    """Queue dropping the handle's reference (NOTE [colocated object lifetime])."""
    submit(box.clear)


def colocated_python_class(cls: type) -> type:
    """A class whose instances are handles to objects built where their calls run.

    ``Obj = colocated_python_class(cls)``; ``obj = Obj(*args)`` records ``args``;
    the first method call ``obj.method(*arrays)`` builds ``cls(*args)`` beside
    the arrays' devices and runs the method there, as ``colocated_python`` runs a
    function; later calls use the same object, each thread's calls in call order.
    Dropping ``obj`` releases the object (NOTE [colocated object lifetime]).

    Raises:
        TypeError: ``cls`` is not a class.
    """
    if not isinstance(cls, type):
        raise TypeError(f"colocated_python_class: cls must be a class, got {cls!r}")
    methods = [
        (name, member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if name not in _NOT_METHODS
    ]

    @functools.wraps(cls.__init__)  # type: ignore[misc]
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        remote = _Remote(cls, args, kwargs)
        for name, member in methods:
            run = functools.partial(_call_method, remote, name)
            setattr(self, name, ColocatedFunction(run, Specialization(), member))
        weakref.finalize(self, _release, [remote]).atexit = False  # nothing runs after exit

    namespace = {
        "__init__": __init__,
        "__doc__": cls.__doc__,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__repr__": lambda self: f"<colocated_python_class {cls.__qualname__} handle>",
    }
    return type(cls.__name__, (), namespace)
