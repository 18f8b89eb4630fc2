"""The documents a user reads stay inside the repository: every relative
link in README.md, python/README.md and docs/*.md names a file of this
repository (and an anchor that exists), nothing points outside it (the
design used to be a link to ../shared/DESIGN.md, which users do not
have), and the LICENSE that Cargo.toml and the wheel declare is there."""

from __future__ import annotations

import glob
import os
import re

from conftest import REPO_ROOT

DOCS = [os.path.join(REPO_ROOT, "README.md"), os.path.join(REPO_ROOT, "python", "README.md")] + sorted(
    glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: str) -> set:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to '-'."""
    out = set()
    for line in open(path, encoding="utf-8"):
        m = re.match(r"#+\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", ""))
            out.add(text.replace(" ", "-"))
    return out


def test_relative_links_resolve_inside_the_repository():
    checked = 0
    for doc in DOCS:
        text = open(doc, encoding="utf-8").read()
        assert "../shared" not in text, f"{doc} refers to ../shared, which is not part of the repository"
        for target in LINK.findall(text):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            assert full.startswith(REPO_ROOT + os.sep), f"{doc}: link {target} leaves the repository"
            assert os.path.exists(full), f"{doc}: link {target} names no file"
            if anchor and full.endswith(".md"):
                assert anchor in _anchors(full), f"{doc}: link {target}: no heading #{anchor} in {full}"
            checked += 1
    assert checked >= 8


def test_design_and_license_are_in_the_repository():
    design = open(os.path.join(REPO_ROOT, "docs", "design.md"), encoding="utf-8").read()
    for topic in ("## Semantics", "**Budget.**", "**Prepare**", "## Backends", "## The log"):
        assert topic in design
    license_text = open(os.path.join(REPO_ROOT, "LICENSE"), encoding="utf-8").read()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text
    cargo = open(os.path.join(REPO_ROOT, "Cargo.toml"), encoding="utf-8").read()
    assert 'license = "Apache-2.0"' in cargo
