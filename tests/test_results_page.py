"""The results page answers its questions in a page a reader can scroll: each question a plot
and a table, its numbers those of the ledger lines they link, the page small and short (it was
a ledger dump: 1.1 MB of HTML, about 54,000 px tall at 1,280 px wide, 46 tables). The browser
test reads the built site (`mkdocs build`, which the README's test command runs before pytest)
and the README's results table in headless Chromium."""

import json
import os
import re
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE_PAGE = os.path.join(ROOT, "site", "results", "index.html")
# The page as built: at most this many bytes of HTML and this many px tall at 1,280 px wide.
MAX_BYTES, MAX_HEIGHT, WIDTH = 300_000, 12_000, 1_280
# What mkdocs-material adds around a page's own HTML (navigation, search, header): the page's
# Markdown alone must leave it this much.
THEME_BYTES = 80_000


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _sections():
    """`{question id: its section of docs/results.md}`."""
    from benchmarks import questions, results_page

    page = _read(results_page.PAGE)
    found = {}
    for question in questions.QUESTIONS:
        start = page.index(f"{{#{question.id}}}")
        end = page.find("\n## ", start)
        found[question.id] = page[start : end if end > 0 else len(page)]
    return found


def test_each_question_has_its_plot_and_table():
    from benchmarks import questions

    sections = _sections()
    assert len(sections) >= 4
    for question in questions.QUESTIONS:
        text = sections[question.id]
        assert f"](img/{question.id}.png)" in text, question.id
        table = [line for line in text.splitlines() if line.startswith("|")]
        assert len(table) >= 4, question.id  # a head, a rule, rows
        assert any("](ledgers/" in line for line in table), question.id


def test_each_plot_is_drawn_from_the_ledger_numbers():
    """The points recorded beside each plot are what the question reads from the ledgers now,
    each the value of its ledger line's field (or the ratio of two), and each number of the
    question's table that links a ledger line is that line's field as shown."""
    from benchmarks import ledger, questions, results_page

    sections = _sections()
    for question in questions.QUESTIONS:
        with open(os.path.join(results_page.IMG, f"{question.id}.json"), encoding="utf-8") as f:
            recorded = json.load(f)
        assert recorded == {"question": question.id, "points": question.data()}, question.id
        assert recorded["points"], question.id
        for point in recorded["points"]:
            assert point["value"] == questions.value_of(point), point
            for name, number, field in point["reads"]:
                assert isinstance(ledger.read(name)[number - 1][field], (int, float)), point
        shown = re.findall(r"\[([-\d.,]+)\]\(ledgers/(\w+)\.md#\w+-(\d+)\)", sections[question.id])
        assert shown, question.id
        values = {}  # a number links its point's first line
        for point in recorded["points"]:
            name, number, _ = point["reads"][0]
            values.setdefault((name, number), []).append(point["value"])
        for text, name, number in shown:
            line = (name, int(number))
            assert any(results_page._number(v) == text for v in values.get(line, ())), (line, text)


def test_a_cell_without_a_ledger_line_says_so():
    """Where no ledger line measures a cell (TF Model Garden on a GPU, PyTorch on a CPU), the
    table says so rather than leaving it blank or inventing a number."""
    from benchmarks.questions import NOT_MEASURED

    sections = _sections()
    training = [line for line in sections["training-speed"].splitlines() if line.startswith("|")]
    assert any("TF Model Garden" in line and NOT_MEASURED in line for line in training)
    decoding = [line for line in sections["decoding-speed"].splitlines() if line.startswith("|")]
    assert any("TF Model Garden" in line and "not in this run" in line for line in decoding)
    for text in sections.values():
        for line in text.splitlines():
            if line.startswith("| ") and not line.startswith("|---"):
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
                assert all(cells[1:]), line[:120]


def test_results_page_is_small():
    """The page's own HTML (its Markdown as mkdocs renders it) leaves room for the theme within
    300 KB; the built page, when there is one, is under 300 KB."""
    markdown = pytest.importorskip("markdown", reason="the docs extra renders Markdown")
    from benchmarks import results_page

    html = markdown.markdown(
        _read(results_page.PAGE), extensions=["tables", "attr_list", "md_in_html", "toc"]
    )
    assert len(html.encode()) < MAX_BYTES - THEME_BYTES, len(html.encode())
    assert html.count("<table>") <= 8 and html.count("<img") == 4
    if os.path.exists(SITE_PAGE):
        assert os.path.getsize(SITE_PAGE) < MAX_BYTES


def _chromium():
    """The system's Chromium (Debian's `chromium`) and Playwright, or a reason to skip."""
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        return None, "no chromium on PATH (apt-get install -y chromium; .ci/run installs it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return None, "playwright is not installed (pip install -e '.[test]')"
    return executable, None


_MEASURE = """() => {
  const images = [...document.images].map(i => ({src: i.getAttribute('src'),
      loaded: i.complete && i.naturalWidth > 0}));
  const column = document.querySelector('article') || document.body;
  const limit = column.getBoundingClientRect().right + 1;
  const wide = [...document.querySelectorAll('table')]
      .filter(t => t.getBoundingClientRect().right > limit
          || t.scrollWidth > column.clientWidth + 1)
      .map(t => t.innerText.slice(0, 80));
  return {images, wide, height: document.documentElement.scrollHeight};
}"""


def _read_in_browser(executable, *urls):
    """What `_MEASURE` finds on each page, in one Chromium at 1,280 px wide."""
    from playwright.sync_api import sync_playwright

    found = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            for url in urls:
                page.goto(url, wait_until="load")
                found.append(page.evaluate(_MEASURE))
        finally:
            browser.close()
    return found


def test_results_page_and_readme_table_in_a_browser(tmp_path):
    """Headless Chromium at 1,280 px wide: the built results page shows each question's plot
    (loaded), no broken image, no table wider than the page's column, and is under 12,000 px
    tall; the README's results table, rendered as GitHub lays it out (an 830 px column), fits
    its column too."""
    from benchmarks import questions

    executable, reason = _chromium()
    if executable is None:
        pytest.skip(reason)
    if not os.path.exists(SITE_PAGE):
        pytest.skip("site/ is not built: mkdocs build (the README's test command runs it first)")
    from benchmarks import results_page

    if os.path.getmtime(SITE_PAGE) < os.path.getmtime(results_page.PAGE):
        pytest.skip("site/ is older than docs/results.md: mkdocs build")
    markdown = pytest.importorskip("markdown", reason="the docs extra renders Markdown")

    readme = _read(os.path.join(ROOT, "README.md"))
    body = markdown.markdown(readme, extensions=["tables", "fenced_code"])
    page = tmp_path / "README.html"
    page.write_text(
        "<!doctype html><meta charset=utf-8><style>body{font:16px sans-serif}"
        "article{max-width:830px;margin:auto}table{border-collapse:collapse;display:block;"
        "overflow:auto;max-width:100%}td,th{border:1px solid #ccc;padding:6px 13px}</style>"
        f'<base href="file://{ROOT}/"><article>{body}</article>',
        encoding="utf-8",
    )
    found, readme_found = _read_in_browser(executable, f"file://{SITE_PAGE}", f"file://{page}")
    broken = [image["src"] for image in found["images"] if not image["loaded"]]
    assert not broken, broken
    loaded = {image["src"].rsplit("/", 1)[-1] for image in found["images"]}
    assert {f"{q.id}.png" for q in questions.QUESTIONS} <= loaded, loaded
    assert not found["wide"], found["wide"]
    assert found["height"] < MAX_HEIGHT, found["height"]

    broken = [image["src"] for image in readme_found["images"] if not image["loaded"]]
    assert not broken, broken
    assert not readme_found["wide"], readme_found["wide"]
