"""The docs site builds strictly, offline, and its reference names the public surface only.

``mkdocs build --strict`` (the README's instructions, and ``nox -s docs``) into a
temporary folder, bounded in time, failing on any warning it prints; then the built
HTML is read: every name of ``partitioner.__all__`` has its
entry in the API reference, once, the reference names no private module or sentinel,
code is coloured at build time (Pygments), and no page loads a script or font from the
internet.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

# The site's tools are in the test extra (pip install -e ".[test]"). Imported, not
# importorskip-ed: a skip would let an environment without them pass the docs check
# without building anything.
import material  # noqa: F401  (mkdocs-material, the theme)
import mkdocs  # noqa: F401
import mkdocstrings_handlers.python  # noqa: F401  (builds the API reference)
import pytest

import partitioner
import partitioner.testing
from partitioner.testing import strategies

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # starts processes

ROOT = Path(__file__).resolve().parents[2]
SWITCHING = [
    "from-pjit-2022",
    "from-jax-jit",
    "from-pmap",
    "from-host-callback",
    "from-colocated-python",
]
#: Names a user never writes: the private package, the old sentinels, private bases.
PRIVATE = re.compile(r"_src\b|_UNSET|_Unspecified|_Stage\b|jax_private")


def build(project: Path, out: Path) -> list[str]:
    """Build the site of ``project`` strictly into ``out``; the problems it reported.

    Why not ``-q``: it silences the warnings that ``--strict`` counts, so a build with a
    broken link exits 0 (``nox -s docs``, which shows them, fails). The build runs at
    mkdocs' normal verbosity and every WARNING or ERROR line it prints is a problem, as
    is a non-zero exit.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = done.stdout + done.stderr
    problems = re.findall(r"^(?:WARNING|ERROR)\b.*$", log, re.M)
    if done.returncode and not problems:
        problems = [f"mkdocs exited with {done.returncode}:\n{log[-4000:]}"]
    return problems


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    problems = build(ROOT, out)
    assert not problems, "mkdocs build --strict reported:\n" + "\n".join(problems)
    return out


def test_the_build_check_sees_a_broken_link(tmp_path: Path) -> None:
    """The check above can fail: a one-page site with a broken link is reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the code](../missing.py).\n")
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: t\nstrict: true\nvalidation:\n  links:\n    not_found: warn\n"
    )
    problems = build(tmp_path, tmp_path / "site")
    assert any("missing.py" in p for p in problems), problems


def _content(html: str) -> str:
    """The page's article (the navigation repeats headings from other pages)."""
    match = re.search(r'<article class="md-content__inner[^"]*">(.*)</article>', html, re.S)
    assert match, "no article in the page"
    return match.group(1)


def test_every_public_name_is_in_the_reference_once(site: Path) -> None:
    html = _content((site / "reference" / "index.html").read_text())
    ids = collections.Counter(re.findall(r'<h\d id="(partitioner\.[A-Za-z_.]+)"', html))
    missing = [n for n in partitioner.__all__ if ids[f"partitioner.{n}"] == 0]
    assert not missing, f"public names without a reference entry: {missing}"
    twice = [i for i, n in ids.items() if n > 1]
    assert not twice, f"entries shown twice: {twice}"
    # No section shares its title with an entry (the menu showed pjit, pmap twice).
    titles = [
        re.sub(r"<[^>]+>|¤", "", t).strip()
        for t in re.findall(r"<h[2-4][^>]*>(.*?)</h[2-4]>", html, re.S)
    ]
    assert len(titles) == len(set(titles)), collections.Counter(titles).most_common(3)


def test_the_reference_lists_the_testing_package(site: Path) -> None:
    """``partitioner.testing`` (imported on its own) has its section: every name of it
    and of its strategies module, and the plugin (its docstring names what it adds)."""
    html = _content((site / "reference" / "index.html").read_text())
    ids = set(re.findall(r'<h\d id="(partitioner\.testing[A-Za-z_.]*)"', html))
    expected = {
        "partitioner.testing",
        "partitioner.testing.strategies",
        "partitioner.testing.plugin",
    }
    expected |= {f"partitioner.testing.{n}" for n in partitioner.testing.__all__}
    expected |= {f"partitioner.testing.strategies.{n}" for n in strategies.__all__}
    assert not expected - ids, f"missing from the reference: {sorted(expected - ids)}"


def test_the_reference_names_no_private_name(site: Path) -> None:
    html = (site / "reference" / "index.html").read_text()
    found = sorted({m.group(0) for m in PRIVATE.finditer(html)})
    assert not found, f"private names in the built reference: {found}"
    # The omitted-spec default reads as the documented word, explained on the page.
    assert "UNSPECIFIED" in html and "left out" in html


def test_code_is_highlighted_at_build_time_and_nothing_loads_from_the_internet(
    site: Path,
) -> None:
    tutorial = (site / "tutorial" / "index.html").read_text()
    assert 'class="language-python highlight"' in tutorial
    assert '<span class="kn">import</span>' in tutorial  # Pygments' token classes
    for page in site.rglob("*.html"):
        text = page.read_text()
        remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', text)
        remote = [u for u in remote if not u.startswith("https://github.com")]
        assert not remote, f"{page.relative_to(site)} loads {remote}"


def test_the_switching_pages_are_in_the_menu(site: Path) -> None:
    home = (site / "index.html").read_text()
    assert "Switching to partitioner" in home
    for name in SWITCHING:
        assert f'href="switching/{name}/"' in home, name
        page = _content((site / "switching" / name / "index.html").read_text())
        assert "<table>" in page, f"{name}: no table of differences"
        assert 'href="../../api/' in page, f"{name}: does not link the contract"
        source = (ROOT / "docs" / "switching" / f"{name}.md").read_text()
        runnable = source.count("\n```python\n") + source.startswith("```python\n")
        assert runnable >= 2, f"{name}: needs a runnable before/after pair ({runnable} blocks)"
