"""The README and docs/: the README stays a page a newcomer reads (its detail in docs/), and every relative link in
either points at a file of this checkout."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_resolves():
    seen = 0
    for page in [ROOT / "README.md", *DOCS]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            seen += 1
            path = (page.parent / target.split("#", 1)[0]).resolve()
            assert path.exists(), (page.name, target)
    assert seen >= len(DOCS)  # the README links every page of docs/


def test_the_readme_links_each_page_of_docs_and_stays_short():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert DOCS and all(f"](docs/{p.name})" in readme for p in DOCS), [p.name for p in DOCS]
    # the whole of the cost model, the runtime, the accuracy checks and the speed history was one 2,515-line page
    # until 2026-12-07; the README keeps the commands, the summary tables and where the rest is
    assert len(readme.splitlines()) < 400
