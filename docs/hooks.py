"""MkDocs hook: the API reference names public paths only.

mkdocstrings gives each name in a signature or a type column a hover title with the
path where the object is defined; for partitioner that is a module of the private
package ``partitioner._src``, which users never import. The hook drops such titles
(the name shown stays, and links still go to the public entry), so the built site
names only what ``partitioner`` exports. ``tests/docs/test_docs_site.py`` checks the result.

Docstrings name other objects with Sphinx roles (``:class:`Report```), which Markdown
leaves as text before the code span; the hook drops the role and keeps the name.
"""

from __future__ import annotations

import re
from typing import Any

_PRIVATE_TITLE = re.compile(r'\stitle="[^"]*\._src\.[^"]*"')
_SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|obj|exc):(?=<code>)")


def on_post_page(output: str, **_: Any) -> str:
    # After autorefs has turned its placeholders into links (it runs on_post_page
    # earlier, at a higher priority).
    return _SPHINX_ROLE.sub("", _PRIVATE_TITLE.sub("", output))
