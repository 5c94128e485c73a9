"""Trial compiles redirect file descriptor 2, the whole process's (NOTE [trial compiles'
warnings], NOTE [one stderr capture]): what other threads write meanwhile is held and
written out in order, never lost, and two threads' captures overlapping leave stderr
where it was.

Every wait here is bounded: a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import sys
import threading

from partitioner._src.auto.search.measure import INVOLUNTARY, _involuntary_rematerializations

PROMPT = 30.0


def _warning(name: str) -> str:
    return f"W0000 spmd_partitioner.cc:1] {INVOLUNTARY} ({name})\n"


def _stderr_file() -> tuple[int, int]:
    status = os.fstat(2)
    return status.st_dev, status.st_ino


def _in_order(text: str, *parts: str) -> bool:
    at = 0
    for part in parts:
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


def test_other_threads_output_during_a_capture_is_held_and_written_out_in_order(capfd) -> None:
    capfd.readouterr()
    before = _stderr_file()

    def other_thread() -> None:
        os.write(2, b"one (fd 2)\n")
        sys.stderr.write("two (sys.stderr)\n")
        sys.stderr.flush()
        os.write(2, b"three (fd 2)\n")

    with _involuntary_rematerializations() as found:
        os.write(2, _warning("trial").encode())
        writer = threading.Thread(target=other_thread)
        writer.start()
        writer.join(PROMPT)
        assert not writer.is_alive()
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert found == [_warning("trial")]
    assert _in_order(err, "one (fd 2)\n", "three (fd 2)\n", "after\n")
    assert "two (sys.stderr)\n" in err
    assert INVOLUNTARY not in err
    assert _stderr_file() == before


class _Capturing(threading.Thread):
    """A trial compile's capture in a thread: writes a line and a warning inside it,
    then holds it open until told to end."""

    def __init__(self, name: str) -> None:
        super().__init__(daemon=True)
        self.name_ = name
        self.inside, self.end, self.found = threading.Event(), threading.Event(), None

    def run(self) -> None:
        with _involuntary_rematerializations() as found:
            os.write(2, f"{self.name_} inside\n".encode())
            os.write(2, _warning(self.name_).encode())
            self.inside.set()
            self.end.wait(PROMPT)
        self.found = found

    def ended(self) -> bool:
        self.end.set()
        self.join(PROMPT)
        return not self.is_alive()


def test_overlapping_captures_in_two_threads_lose_nothing_and_restore_stderr(capfd) -> None:
    """Each thread redirected fd 2 on its own: the second saved the first's temporary
    file as the original and, its capture ending last, left stderr pointing at that
    file, closed and deleted, so everything written afterwards was lost."""
    capfd.readouterr()
    before = _stderr_file()
    one, two = _Capturing("one"), _Capturing("two")
    one.start()
    assert one.inside.wait(PROMPT)
    two.start()
    assert two.inside.wait(PROMPT)
    assert one.ended()  # the first to begin ends first: the captures cross
    # one's line began before two's capture: no running capture can keep it, out it goes
    early = capfd.readouterr().err
    assert "one inside\n" in early and "two inside" not in early
    os.write(2, b"between\n")
    assert two.ended()
    os.write(2, b"after\n")
    err = early + capfd.readouterr().err
    assert _stderr_file() == before, "stderr was left redirected"
    assert _in_order(err, "one inside\n", "two inside\n", "between\n", "after\n"), err
    assert INVOLUNTARY not in err
    # a warning written while both run is kept by both: fd 2 cannot say whose it is
    assert one.found == [_warning("one"), _warning("two")]
    assert two.found == [_warning("two")]


def test_a_chosen_programs_warnings_written_out_are_never_kept_by_another_capture(
    capfd,
) -> None:
    """A search writes its chosen layout's warnings out (``write_out``) while another
    thread's trial compile captures fd 2: they reach stderr, not that capture."""
    from partitioner._src.auto.search.stderr_capture import write_out

    capfd.readouterr()
    with _involuntary_rematerializations() as found:
        writer = threading.Thread(target=write_out, args=(_warning("chosen"),))
        writer.start()
        writer.join(PROMPT)
        assert not writer.is_alive()
    assert found == []
    assert _warning("chosen") in capfd.readouterr().err
