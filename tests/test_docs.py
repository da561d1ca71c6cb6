"""The documentation site builds with `mkdocs build --strict` (as `make docs` builds it), so a
broken link, a missing anchor or a page left out of the nav fails `make test`; and the README
stays a landing page that links into it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]  # not --quiet: it hides the warnings that --strict counts


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "--config-file", str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_the_site_builds_strictly(tmp_path):
    result = build(REPO, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    pages = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("*.html")}
    assert {"index.html", "tutorial.html", "cloudevents.html", "api.html", "configuration.html",
            "methods.html", "methods/angular.html"} <= pages
    assert "Quickstart" not in (tmp_path / "site" / "tutorial.html").read_text()  # the README's, not the site's
    # The HTTP API page is rendered from the service's own OpenAPI document: every route is on it.
    from calibd.config import Settings
    from calibd.main import create_app

    api = (tmp_path / "site" / "http-api.html").read_text()
    for path, operations in create_app(Settings(database_url="sqlite://")).openapi()["paths"].items():
        for method in operations:
            assert f"{method.upper()} {path}" in api, (method, path)


@pytest.mark.parametrize("breakage", ["link", "anchor", "orphan"])
def test_a_broken_link_anchor_or_orphan_page_fails_the_build(tmp_path, breakage):
    root = tmp_path / "copy"
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(REPO / "docs_hooks", root / "docs_hooks")
    shutil.copytree(REPO / "docs", root / "docs")
    index = root / "docs" / "index.md"
    if breakage == "link":
        index.write_text(index.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    elif breakage == "anchor":
        index.write_text(index.read_text() + "\nSee [a section](tutorial.md#no-such-section).\n")
    else:
        (root / "docs" / "stray.md").write_text("# Not in the nav\n")
    assert build(root, tmp_path / "site").returncode != 0


def test_the_readme_is_a_landing_page_whose_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert readme.count("\n") < 150
    targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme) if not t.startswith("http")]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, missing
