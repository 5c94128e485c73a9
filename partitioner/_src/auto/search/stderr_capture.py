"""What the process writes to file descriptor 2 while blocks run, some lines kept apart
and the rest passed on to stderr: one redirection for the whole process, however many
threads capture at once.

NOTE [one stderr capture]: XLA's C++ warnings go straight to fd 2, so only redirecting
fd 2 catches them (``measure.py``, NOTE [trial compiles' warnings]), and fd 2 is the
process's, not a thread's. Two threads redirecting it each on their own would cross:
the second saves the first's temporary file as "the original" and, restoring it
after the first has closed it, leaves every later write to stderr going to a deleted
file. So there is one redirection, made by the first capture and undone by the last
(counted under a lock), into one file. A capture keeps apart the lines that begin
while it runs and match its ``keep`` (overlapping captures may each keep the same
line: fd 2 cannot say which thread wrote it). Every other line, whoever wrote it,
is held in the file and written to the real stderr in the order written: as soon as
no running capture can keep it (when the earliest running capture ends), and at the
latest when the last capture ends. No line but a kept one is lost; it is only late.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import IO


@dataclasses.dataclass(eq=False)
class _Redirection:
    """fd 2 redirected into ``file`` while ``starts`` is not empty."""

    saved: int  # a duplicate of fd 2 as it was: the real stderr
    file: IO[bytes]
    starts: list[int] = dataclasses.field(default_factory=list)  # running captures' offsets
    kept: set[int] = dataclasses.field(default_factory=set)  # offsets of lines kept apart
    passed: int = 0  # the file's bytes before this are written out (or kept apart)


_lock = threading.Lock()  # guards _now and its fields; held for no longer than a file read
_now: _Redirection | None = None


@contextlib.contextmanager
def capture(keep: Callable[[str], bool]) -> Iterator[list[str]]:
    """Lines written to fd 2 while the block runs, by any thread, for which ``keep`` is
    true: in the list yielded, filled when the block ends; the rest reach stderr in the
    order written (NOTE [one stderr capture])."""
    found: list[str] = []
    with _lock:
        redirection = _now or _redirect()
        start = _size(redirection)
        redirection.starts.append(start)
    try:
        yield found
    finally:
        with _lock:
            found += _keep(redirection, start, keep)
            redirection.starts.remove(start)
            if redirection.starts:
                _pass_on(redirection, min(redirection.starts), whole=True)
            else:
                _restore(redirection)


def write_out(text: str) -> None:
    """``text`` to the real stderr at once, whatever captures run: lines a capture kept
    and its caller decides are the program's own (the chosen layout's warnings) must not
    be kept again by a capture running in another thread."""
    if not text:
        return
    with _lock:
        if _now is None:
            sys.stderr.write(text)
            sys.stderr.flush()
            return
        data = text.encode()
        while data:
            data = data[os.write(_now.saved, data) :]


def _redirect() -> _Redirection:
    """fd 2 into a new temporary file (under the lock)."""
    global _now
    sys.stderr.flush()  # what was written before the redirection goes out before it
    saved = os.dup(2)
    file = tempfile.TemporaryFile()
    os.dup2(file.fileno(), 2)
    _now = _Redirection(saved, file)
    return _now


def _restore(redirection: _Redirection) -> None:
    """fd 2 back to the real stderr, everything held written out (under the lock)."""
    global _now
    sys.stderr.flush()  # a partial line buffered meanwhile lands in the file, in order
    _pass_on(redirection, _size(redirection), whole=True)
    os.dup2(redirection.saved, 2)
    # whatever slipped in between the last read and the restore, partial lines too
    _pass_on(redirection, _size(redirection), whole=False)
    os.close(redirection.saved)
    redirection.file.close()
    _now = None


def _keep(redirection: _Redirection, start: int, keep: Callable[[str], bool]) -> list[str]:
    """The lines begun at ``start`` or later that ``keep`` takes, marked kept."""
    fd = redirection.file.fileno()
    begun_before = start > 0 and os.pread(fd, 1, start - 1) != b"\n"
    found = []
    for index, (offset, line) in enumerate(_lines(redirection, start)):
        text = line.decode(errors="replace")
        if not (index == 0 and begun_before) and keep(text):
            redirection.kept.add(offset)
            found.append(text)
    return found


def _pass_on(redirection: _Redirection, until: int, *, whole: bool) -> None:
    """The lines begun before ``until`` and not kept, to the real stderr; ``whole``:
    only those already ended (a partial line may still be being written)."""
    out = []
    for offset, line in _lines(redirection, redirection.passed):
        if offset >= until or (whole and not line.endswith(b"\n")):
            break
        if offset not in redirection.kept:
            out.append(line)
        redirection.passed = offset + len(line)
    data = b"".join(out)
    while data:
        data = data[os.write(redirection.saved, data) :]


def _lines(redirection: _Redirection, start: int) -> Iterator[tuple[int, bytes]]:
    """The file's lines from byte ``start`` on, each with its offset (the last may lack
    its newline)."""
    fd = redirection.file.fileno()
    data = os.pread(fd, _size(redirection) - start, start)
    at = 0
    while at < len(data):
        end = data.find(b"\n", at) + 1 or len(data)
        yield start + at, data[at:end]
        at = end


def _size(redirection: _Redirection) -> int:
    """Bytes written to the file so far (every writer appends: none seeks)."""
    return os.fstat(redirection.file.fileno()).st_size
