"""The documents state what the code does.

docs/api.md names every public name of ``partitioner``; docs/architecture.md lists the
``MSG_*`` message constants there are, and each lives beside the check that raises it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import partitioner

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "partitioner"


def test_api_doc_names_every_export() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    missing = [n for n in partitioner.__all__ if f"`{n}`" not in text]
    assert not missing, f"docs/api.md does not mention {missing} (partitioner.__all__)"


def _msg_constants() -> dict[str, Path]:
    found = {}
    plugin = sorted((ROOT / "_partitioner_pytest").rglob("*.py"))  # the pytest plugin's package
    for path in [*sorted(PACKAGE.rglob("*.py")), *plugin]:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.startswith("MSG_"):
                        found[t.id] = path
    return found


def test_architecture_doc_lists_the_message_constants() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"`(MSG_[A-Z_]+)`", text)) - {"MSG_"}
    assert listed == set(_msg_constants()), (
        "docs/architecture.md's list of MSG_* constants differs from the code: "
        f"only in the doc {sorted(listed - set(_msg_constants()))}, "
        f"only in the code {sorted(set(_msg_constants()) - listed)}"
    )


def test_each_message_constant_is_raised_beside_its_definition() -> None:
    """A template lives in the module whose check uses it, so the two read together."""
    unused = []
    for name, path in _msg_constants().items():
        tree = ast.parse(path.read_text())
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name]
        if not any(isinstance(u.ctx, ast.Load) for u in uses):
            unused.append(f"{name} ({path.relative_to(ROOT)})")
    assert not unused, f"message constants no check in their module uses: {unused}"


#: A path to one of this suite's files (``tests/<folder>/test_<name>.py``, a conftest).
#: jax's own test files, which the ports cite, are named ``<name>_test.py`` instead.
_OUR_TEST_PATH = re.compile(r"\btests/(?:\w+/)*(?:test_\w+|conftest)\.py\b")


def test_every_test_file_the_documents_name_exists() -> None:
    """Moving a test file must move the documents' pointers to it: README.md, the docs
    and the tests' own docstrings name test files by path."""
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    documents += [*sorted((ROOT / "docs").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    stale = sorted(
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in documents
        for path in set(_OUR_TEST_PATH.findall(doc.read_text()))
        if not (ROOT / path).is_file()
    )
    assert not stale, f"documents name test files that do not exist: {stale}"
