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

    def take_untransformed(self) -> str:
        """The taps not under a jvp or transpose (the 2024 module's default printed only those)."""
        hcb.barrier_wait()
        kept = [t for t in self.taps if not re.search(r"transforms: \(.*'(jvp|transpose)'", t)]
        self.taps = []
        return "".join(kept)


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
    m = re.match(r"(batch_dims: (?P<dims>\(.*?\)) )?transforms: (?P<t>\(.*?\))(?P<rest>.*)", line)
    if not m:
        return line
    dims = m.group("dims")
    entries = [
        f"('batch', {{'batch_dims': {dims}}})" if t == "batch" else repr(t)
        for t in ast.literal_eval(m.group("t"))
    ]
    return f"transforms: [{', '.join(entries)}]{m.group('rest')}"


def tokens(text: str) -> list[str]:
    """Words and numbers, brackets and layout aside (floats rounded)."""
    text = "\n".join(_as_2024_header(ln.strip()) for ln in text.splitlines())
    return re.findall(r"[^\s\[\](){}]+", _round_floats(text))


def assert_printed_2024(expected: str, got: str) -> None:
    assert tokens(got) == tokens(expected), f"printed:\n{got}"
