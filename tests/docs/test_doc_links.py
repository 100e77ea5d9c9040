"""Every relative link and #anchor in README.md and docs/*.md leads somewhere, as on GitHub."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.docs.markdown_check import Link, anchors, broken, doc_pages, github_slug, links

PAGES = doc_pages()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    found = links(page)
    problems = [why for link in found if (why := broken(link))]
    assert not problems, "\n".join(problems)


def test_the_readme_links_every_docs_page():
    linked = {(REPO / link.target.partition("#")[0]).resolve()
              for link in links(REPO / "README.md") if link.target.startswith("docs/")}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("heading, slug", [
    ("Scaling efficiency: `hpctrain bench scaling`", "scaling-efficiency-hpctrain-bench-scaling"),
    ("The GPU check: `tools/gpu_check`", "the-gpu-check-toolsgpu_check"),
    ("`hpctrain runs` — what is there", "hpctrain-runs--what-is-there"),
    ("Why hpctrain's own, not nvidia-resiliency-ext (0.4.1, tried on CPU)",
     "why-hpctrains-own-not-nvidia-resiliency-ext-041-tried-on-cpu"),
    ("`hpctrain resume RUN [--profile P] [--nodes N] [--force]`",
     "hpctrain-resume-run---profile-p---nodes-n---force"),
    ("How often to save: `checkpoint.interval_minutes`", "how-often-to-save-checkpointinterval_minutes"),
    ("A [linked](x.md) *heading* × 2", "a-linked-heading--2"),
])
def test_anchors_follow_githubs_rule(heading, slug):
    assert github_slug(heading) == slug


def test_a_missing_page_a_missing_anchor_and_a_repeated_heading_are_told_apart(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Benchmark\n\n## Benchmark\n\n```\n## not a heading\n```\n"
                    "[ok](#benchmark-1) [bad](#benchmark-2) [gone](other.md) "
                    "[code](#not-a-heading) `[span](nowhere.md)` [web](https://example.org/x)\n")
    assert anchors(page.read_text()) == {"title", "benchmark", "benchmark-1"}
    found = links(page)
    assert [link.target for link in found] == [
        "#benchmark-1", "#benchmark-2", "other.md", "#not-a-heading", "https://example.org/x"]
    verdicts = [broken(link, root=tmp_path) for link in found]
    assert verdicts[0] is None and verdicts[4] is None
    assert "no heading with anchor #benchmark-2" in verdicts[1]
    assert "no such file" in verdicts[2]
    assert "no heading with anchor #not-a-heading" in verdicts[3]
    outside = Link(page, 1, "../../etc/passwd")
    assert broken(outside, root=tmp_path)
