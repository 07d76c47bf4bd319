"""The README and docs/: the README stays a page a newcomer reads (its detail in docs/), and every relative link in
either, its #anchor included, points at a file of this checkout and a heading in it."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The #anchors of a page's headings as GitHub makes them: lower case, punctuation but hyphens and underscores
    dropped, spaces as hyphens, a repeated one numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.+)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_resolves():
    seen = 0
    for page in [ROOT / "README.md", *DOCS]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            seen += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), (page.name, target)
            assert not anchor or anchor in anchors(dest), (page.name, target)
    assert seen >= 4 * len(DOCS)  # the README links every page of docs/; each page's contents its sections


def test_the_readme_links_each_page_of_docs_and_stays_short():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert DOCS and all(f"](docs/{p.name})" in readme for p in DOCS), [p.name for p in DOCS]
    # the whole of the cost model, the runtime, the accuracy checks and the speed history was one 2,515-line page
    # until 2026-12-07; the README keeps the commands, the summary tables and where the rest is
    assert len(readme.splitlines()) < 400


def test_a_heading_renamed_under_its_link_fails_the_check(tmp_path):
    """The anchor check reads headings as GitHub slugs them (the contents lists depend on it)."""
    page = tmp_path / "p.md"
    page.write_text("# A page\n\n## FP8 (2026-12-04, `nemo_h100_fp8`)\n\n## The loss's passes\n\n## Time\n\n## Time\n")
    assert anchors(page) == {"a-page", "fp8-2026-12-04-nemo_h100_fp8", "the-losss-passes", "time", "time-1"}
