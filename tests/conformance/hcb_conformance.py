"""What the ports of jax's ``host_callback_test.py`` share: the stream and the comparisons.

jax's tests compared ``id_print``'s text after rounding floats to two decimals and
stripping lines; :func:`assert_printed` does the same. The 2024 module printed
pytrees on one line, ``( a b )`` for tuples, and ``transforms`` as a list with
``('batch', {'batch_dims': ...})`` entries; ``id_print`` here keeps the seed's
layout (docs/api.md), so :func:`assert_printed_2024` compares the 2024
expectations token by token, brackets and line breaks aside, after writing our
``transforms`` the 2024 way.
"""

from __future__ import annotations

import ast
import re

from partitioner import host_callback as hcb


class Stream:
    """An ``output_stream``: one ``write`` per tap."""

    def __init__(self) -> None:
        self.taps: list[str] = []

    def write(self, text: str) -> None:
        self.taps.append(text)

    @property
    def output(self) -> str:
        return "".join(self.taps)

    def take(self) -> str:
        """Everything printed since the last take, after a barrier."""
        hcb.barrier_wait()
        out, self.taps = self.output, []
        return out

    def _taken(self, untransformed: bool) -> list[str]:
        hcb.barrier_wait()
        taps, self.taps = self.taps, []
        return [t for t in taps if not (untransformed and _AD.search(t))]

    def take_untransformed(self) -> str:
        """The taps not under a jvp or transpose (the 2024 module's default printed only those)."""
        return "".join(self._taken(untransformed=True))

    def take_by_device(self, *, untransformed: bool = False) -> str:
        """The taps grouped by their ``device:`` (stable within a device), as jax's test did."""
        taps = self._taken(untransformed)
        return "".join(sorted(taps, key=lambda t: re.search(r"device: (\S+)", t).group(1)))


_AD = re.compile(r"transforms: \(.*'(jvp|transpose)'")


def _round_floats(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        return f"{round(float(m.group(0)), 2):.2f}"

    return re.sub(r"-?\d+\.\d*(e[-+]?\d+)?", repl, text)


def lines(text: str) -> list[str]:
    """Rounded, stripped, non-empty lines (jax's ``assertMultiLineStrippedEqual``)."""
    return [ln.strip() for ln in _round_floats(text).splitlines() if ln.strip()]


def assert_printed(expected: str, got: str) -> None:
    assert lines(got) == lines(expected), f"printed:\n{got}"


def _as_2024_header(line: str) -> str:
    dims = re.search(r"batch_dims: (\(.*?\)) ?", line)
    line = line.replace(dims.group(0), "") if dims else line
    m = re.search(r"transforms: (\(.*?\))(?= \w+:|$)", line)
    if not m:
        return line
    entries = [
        f"('batch', {{'batch_dims': {dims.group(1) if dims else None}}})"
        if t == "batch"
        else repr(t)
        for t in ast.literal_eval(m.group(1))
    ]
    return line.replace(m.group(0), f"transforms: [{', '.join(entries)}]")


def tokens(text: str) -> list[str]:
    """Words and numbers, brackets and layout aside (floats rounded)."""
    text = "\n".join(_as_2024_header(ln.strip()) for ln in text.splitlines())
    return re.findall(r"[^\s\[\](){}]+", _round_floats(text))


def assert_printed_2024(expected: str, got: str) -> None:
    assert tokens(got) == tokens(expected), f"printed:\n{got}"
