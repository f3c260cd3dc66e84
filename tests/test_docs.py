"""The documentation against the code: the command reference is what the commands print, every
relative link and anchor resolves, the pages keep to their sizes, and the Python API page's
example runs as written."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import runner
from markdown_it import MarkdownIt

from mlxmem.cli import reference
from mlxmem.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
# Every page a reader reaches from README (the notebook included).
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/**/*.md")]
    + list(ROOT.glob("benchmarks/*.md"))
)
# markdown-it-py (rich's own Markdown parser) reads the pages as GitHub renders them, so a
# link inside code is not a link.
MARKDOWN = MarkdownIt("commonmark").enable("table")


def test_the_cli_reference_is_what_the_commands_print_now():
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == reference.render(), (
        f"docs/cli.md is out of date with the commands: run `{reference.REGENERATE}`"
    )


def test_the_cli_reference_holds_each_command_help_as_typed():
    for path, text in reference.command_help():
        shown = runner.invoke(app, [*path, "--help"], prog_name="mlxmem").output
        assert shown.rstrip() == text.rstrip(), path


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation but hyphens dropped, each space
    a hyphen (so `Across conversations: --x` is `across-conversations---x`)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The ids of a page's headings, a repeated one suffixed -1, -2 as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    tokens = MARKDOWN.parse(page.read_text(encoding="utf-8"))
    for opening, inline in zip(tokens, tokens[1:], strict=False):
        if opening.type != "heading_open":
            continue
        text = "".join(child.content for child in inline.children or [])
        slug = github_anchor(text)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def links(page: Path) -> list[str]:
    """The targets of a page's links and images."""
    found = []
    for token in MARKDOWN.parse(page.read_text(encoding="utf-8")):
        for child in token.children or []:
            target = child.attrGet("href") or child.attrGet("src")
            if target:
                found.append(str(target))
    return found


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / unquote(path)).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where} (no such heading)")
    assert broken == [], "\n".join(broken)


def test_the_anchor_rule_reads_headings_as_github_does():
    page = "Across conversations: --conversation-per-session"
    assert github_anchor(page) == "across-conversations---conversation-per-session"
    assert github_anchor("Sync at 100,000 turns") == "sync-at-100000-turns"
    assert github_anchor("The llama.cpp engine") == "the-llamacpp-engine"


@pytest.mark.parametrize("name, most", [("README.md", 200), ("docs/memory-quality.md", 400)])
def test_the_reading_path_stays_short(name, most):
    lines = len((ROOT / name).read_text(encoding="utf-8").splitlines())
    assert lines <= most, f"{name} has {lines} lines; move detail to a page of docs/"


@pytest.mark.e2e
def test_the_python_api_page_runs_as_written(capsys):
    """docs/api.md's examples, in order, in one namespace, on the tiny model in this test's own
    data directory: each runs, and the fake engine's example prints what the page says."""
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = [t.content for t in MARKDOWN.parse(page) if t.type == "fence" and t.info == "python"]
    assert len(blocks) >= 5
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), namespace)
    assert capsys.readouterr().out.endswith("Noted.\n")
    from mlxmem import Store

    assert [c.name for c in Store().conversations()] == ["scratch", "test"]
