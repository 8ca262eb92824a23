"""The leaderboard website (`fedbench leaderboard site`): files, links, no network, escaping, the CLI's
usage errors, and, in headless Chromium (skipped without it), sorting, links and a clean console."""

from __future__ import annotations

import functools
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from fedbench.cli import app
from fedbench.reporting import leaderboard as lb
from fedbench.reporting import ranking, site
from fedbench.reporting.thumbnails import THUMBNAIL_FILE

COMMITTED = Path(__file__).resolve().parents[1] / "leaderboards"
# a version 1 inversion board (mean ± spread cells, every row ranked): the retired leakage-types board,
# kept as a test fixture since its three attacker positions became three version 2 boards
V1_BOARD = "leakage-types-mnist5k-mlp"
GOLDEN_V1 = Path(__file__).resolve().parent / "golden" / "boards" / V1_BOARD
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def committed_site(tmp_path_factory):
    """The site of the committed boards and the version 1 fixture board (`boards_of`), built once for the
    module."""
    base = tmp_path_factory.mktemp("site")
    shutil.copytree(COMMITTED, base / "leaderboards")
    shutil.copytree(GOLDEN_V1, base / "leaderboards" / V1_BOARD)
    out = base / "site"
    site.build_site(base / "leaderboards", out)
    return out


def boards_of(site_dir: Path) -> Path:
    """The boards a site of `committed_site` was built from: the committed ones and `V1_BOARD`."""
    return site_dir.parent / "leaderboards"


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


class _Refs(HTMLParser):
    """Every (tag, attribute, value) of a page that points somewhere: href, src."""

    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.refs += [(tag, k, v or "") for k, v in attrs if k in ("href", "src")]


def _refs(page: Path) -> list[tuple[str, str, str]]:
    parser = _Refs()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.refs


# ------------------------------------------------------------------------------------ without browser


def test_every_committed_board_has_its_page_plot_and_csv(committed_site):
    names = lb.board_names(boards_of(committed_site))
    assert len(names) >= 2
    for name in names:
        for file in (site.PAGE, site.PLOT, lb.CSV_FILE):
            assert (committed_site / name / file).is_file(), (name, file)
        assert (committed_site / name / site.PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        board, entries = lb.load_board(boards_of(committed_site) / name)
        assert (committed_site / name / lb.CSV_FILE).read_text() == lb.render_csv(board, entries)
    index = (committed_site / site.PAGE).read_text()  # a slice is in its board's row, not one of its own
    full = [n for n in names if not lb.load_board(boards_of(committed_site) / n)[0].slice_of]
    assert all(f'href="{n}/index.html"' in index for n in full)
    assert not list(committed_site.parent.glob(".site-*")), "the temporary folder is left behind"


def test_every_link_resolves_to_a_generated_file(committed_site):
    pages = sorted(committed_site.rglob("*.html"))
    assert len(pages) == len(lb.board_names(boards_of(committed_site))) + 1
    seen = 0
    for page in pages:
        for tag, attr, value in _refs(page):
            parts = urlsplit(value)
            assert not parts.scheme and not parts.netloc, f"{page}: {tag} {attr}={value} is not relative"
            if not parts.path:  # a fragment: the page itself
                continue
            target = (page.parent / parts.path).resolve()
            assert target.is_file(), f"{page}: {tag} {attr}={value} -> {target} does not exist"
            assert committed_site.resolve() in target.parents, f"{page}: {value} leaves the site"
            seen += 1
    assert seen >= 3 * len(pages)  # stylesheet, script, navigation at least


def test_no_page_loads_anything_from_the_network(committed_site):
    for path in [
        *committed_site.rglob("*.html"),
        *committed_site.rglob("*.css"),
        *committed_site.rglob("*.js"),
    ]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), path
        assert not re.search(r"url\(\s*[\"']?(https?:)?//", text), path
        assert "@import" not in text and "fetch(" not in text and "XMLHttpRequest" not in text, path
        assert "http://" not in text and "https://" not in text, path


def test_board_page_shows_the_ranked_table_and_its_sections(committed_site):
    name = V1_BOARD
    board, entries = lb.load_board(boards_of(committed_site) / name)
    assert board.board_version == 1, f"{name} is version {board.board_version}: name a version 1 board"
    html = (committed_site / name / site.PAGE).read_text()
    order = [e["defense"] for _, e in ranking.ranked(board, entries)]
    cells = re.findall(r'<td data-sort="([^"]*)">([^<]*)</td>', html)
    defenses = [text for sort, text in cells if text in order]
    assert defenses == order  # the README's order
    acc = next(e for e in entries if e["defense"] == "none")["metrics"]["test_acc"]
    assert f"{100 * acc['mean']:.1f} ± {100 * acc['spread']:.1f}" in html  # as format_cell writes it
    assert '<th scope="col" data-type="number" tabindex="0" title="click to sort">rank stability' in html
    for section in ("leaderboard", "tradeoff", "scenario", "threat-model", "reconstructions", "regenerate"):
        assert f'<section id="{section}">' in html
    assert board.command in html
    drawn = (
        boards_of(committed_site) / name / "reconstructions.png"
    ).exists()  # committed thumbnails, or how to draw them
    assert (f"fedbench leaderboard thumbnails {name}" if drawn else "fedbench plot reconstructions") in html
    assert ('id="reported"' in html) == bool(board.reported)  # the papers' numbers, where the preset has them
    assert ", ".join(board.attack_suite) in html


def test_v2_board_pages_show_the_tuning_rule_realistic_protocol_budget_check_and_removed_rows(committed_site):
    """What a v2 board's README says beyond its table is on its page too: the tuning rule, the realistic
    protocol's rates, the budget check, the verification stamp and the rows taken off; markdown links
    become text naming the repository path (the site cannot follow a README's relative link)."""
    from fedbench.reporting.board_realistic import realistic_table

    seen = set()
    for name in lb.board_names(boards_of(committed_site)):
        board, _ = lb.load_board(boards_of(committed_site) / name)
        html = (committed_site / name / site.PAGE).read_text()
        assert "](" not in html, f"{name}: a markdown link left in the page"
        if board.board_version < 2:
            continue
        if board.tuning:
            assert "Tuning rule: " in html
            seen.add("tuning")
        assert ('<section id="realistic">' in html) == bool(board.realistic)
        if board.realistic:
            _, headers, rows = realistic_table(board.realistic)
            cells = re.findall(
                r"<td>(.*?)</td>", html.split('<section id="realistic">')[1].split("</section>")[0]
            )
            assert len(cells) == len(rows) * len(headers)
            assert [c for c in cells if "%" in c][: len(rows[0]) - 2] == [c for c in rows[0][1:-1] if c]
            seen.add("realistic")
        assert ('<section id="attack-budgets">' in html) == bool(board.budget_check)
        seen |= {"budget"} if board.budget_check else set()
        assert ("Removed from this board after it was built" in html) == bool(board.removed)
        seen |= {"removed"} if board.removed else set()
        assert ('<section id="verified">' in html) == (board.verified is not None)
    assert seen == {"tuning", "realistic", "budget", "removed"}, seen  # the committed boards exercise each


def test_rank_stability_column_only_when_the_entries_have_it(board_root, tmp_path):
    site.build_site(board_root, tmp_path / "a")
    assert ">rank stability</th>" in (tmp_path / "a" / "synthetic" / site.PAGE).read_text()
    for path in (board_root / "synthetic" / lb.ENTRIES_DIR).glob("*.json"):
        _edit_json(path, lambda d: d.pop("rank_stability"))
    site.build_site(board_root, tmp_path / "b")
    html = (tmp_path / "b" / "synthetic" / site.PAGE).read_text()
    assert "rank stability" not in html.lower() and "<td" in html


def test_reported_numbers_come_from_the_boards_preset(board_root, tmp_path):
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "synthetic.toml").write_text(
        '[grid]\nname = "synthetic"\n\n[[dataset]]\nname = "mnist5k"\n\n[[model]]\nname = "mlp"\n\n'
        '[[defense]]\nname = "none"\n\n'
        '[[reported]]\ndataset = "mnist"\ndefense = "dp-gaussian"\nattack = "idlg"\npsnr = 12.5\n'
        'source = "Table 3"\n'
    )
    site.build_site(board_root, tmp_path / "s", preset_dirs=(presets,))
    html = (tmp_path / "s" / "synthetic" / site.PAGE).read_text()
    section = html[html.index('<section id="reported">') :]
    assert "dp-gaussian" in section and "12.50" in section and "Table 3" in section
    site.build_site(board_root, tmp_path / "t")  # the preset is not found: no section
    assert 'id="reported"' not in (tmp_path / "t" / "synthetic" / site.PAGE).read_text()


def test_a_board_without_an_attack_suite_says_why_it_has_no_plot(board_root, tmp_path):
    folder = board_root / "synthetic"
    _edit_json(folder / lb.BOARD_FILE, lambda d: d.update(attack_suite=[], metrics=[]))
    for path in (folder / lb.ENTRIES_DIR).glob("*.json"):
        _edit_json(path, lambda d: d.update(attack_suite=[]))
    site.build_site(board_root, tmp_path / "s")
    html = (tmp_path / "s" / "synthetic" / site.PAGE).read_text()
    assert not (tmp_path / "s" / "synthetic" / site.PLOT).exists() and "<img" not in html
    assert "no trade-off plot" in html and "utility only" in html


def test_board_text_is_escaped(board_root, tmp_path):
    _edit_json(
        board_root / "synthetic" / lb.BOARD_FILE, lambda d: d.update(title="<script>alert(1)</script> & co")
    )
    site.build_site(board_root, tmp_path / "s")
    for page in (tmp_path / "s" / site.PAGE, tmp_path / "s" / "synthetic" / site.PAGE):
        html = page.read_text()
        assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in html


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_writes_the_site_and_rebuilds_over_its_own(board_root, tmp_path):
    out = tmp_path / "site"
    res = run("leaderboard", "site", "-o", out, "--dir", board_root)
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and (out / "synthetic" / site.PAGE).is_file()
    (out / "stale.html").write_text("from before")
    res = run("leaderboard", "site", "synthetic", "-o", out, "--dir", board_root)
    assert res.exit_code == 0, res.output
    assert not (out / "stale.html").exists() and (out / site.PAGE).is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def _one_line_error(result, pattern):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and pattern in lines[0], result.output


def test_cli_refuses_a_folder_that_is_not_a_site_and_writes_nothing(board_root, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    _one_line_error(run("leaderboard", "site", "-o", out, "--dir", board_root), "not empty")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    _one_line_error(run("leaderboard", "site", "-o", out / "notes.txt", "--dir", board_root), "is a file")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cli_usage_errors(board_root, tmp_path):
    _one_line_error(run("leaderboard", "site", "-o", tmp_path / "s", "--dir", tmp_path / "none"), "no boards")
    _one_line_error(
        run("leaderboard", "site", "synthtic", "-o", tmp_path / "s", "--dir", board_root), "synthetic"
    )
    _edit_json(board_root / "synthetic" / lb.BOARD_FILE, lambda d: d.update(headline="nonsense"))
    _one_line_error(run("leaderboard", "site", "-o", tmp_path / "s", "--dir", board_root), "headline")
    assert not (tmp_path / "s").exists()


def test_a_failure_while_writing_leaves_the_old_site(board_root, tmp_path, monkeypatch):
    out = tmp_path / "site"
    site.build_site(board_root, out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(site, "board_page", broken)
    with pytest.raises(RuntimeError):
        site.build_site(board_root, out)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_help_has_examples():
    res = run("leaderboard", "site", "--help")
    assert res.exit_code == 0 and "Examples" in res.output and res.output.count("fedbench ") >= 2


# ------------------------------------------------------------------------------------------ browser


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    found = _chromium()
    if found is None:
        pytest.skip("no headless Chromium and chromedriver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(found[1]), options=options)  # no Selenium Manager download
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


def _console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _column(driver, table_id: str, label: str) -> list[str]:
    from selenium.webdriver.common.by import By

    headers = driver.find_elements(By.CSS_SELECTOR, f"#{table_id} thead th")
    col = [h.text.replace("⇅", "").replace("▲", "").replace("▼", "").strip() for h in headers].index(label)
    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")
    return [r.find_elements(By.TAG_NAME, "td")[col].get_attribute("data-sort") for r in rows]


def test_console_check_sees_a_script_error(browser, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><title>x</title><script>notDefined()</script>")
    browser.get(page.as_uri())
    assert any("notDefined" in m for m in _console_errors(browser))


def _natural_compare(x: str, y: str) -> int:
    """site.js's naturalCompare: case-folded, digit runs as numbers, other runs by code unit."""
    a, b = (re.findall(r"\d+|\D+", s.lower()) for s in (x, y))
    for p, q in zip(a, b, strict=False):
        d = int(p) - int(q) if p.isdigit() and q.isdigit() else (p > q) - (p < q)
        if d:
            return d
    return (len(a) - len(b)) or (x > y) - (x < y)


def test_natural_order_puts_shorter_numbers_first():
    names = ["gradient-pruning[p=0.99]", "gradient-pruning[p=0.9]", "mixup[k=16]", "mixup[k=4]", "None"]
    assert sorted(names, key=functools.cmp_to_key(_natural_compare)) == [
        "gradient-pruning[p=0.9]",
        "gradient-pruning[p=0.99]",
        "mixup[k=4]",
        "mixup[k=16]",
        "None",
    ]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed: site.js's sort not run")
def test_site_js_natural_compare_is_the_mirrored_order(tmp_path):
    """The browser's order is the one the Chromium test expects: site.js's comparator, run in node."""
    import subprocess

    js = (Path(site.__file__).parent / "static" / "site.js").read_text()
    function = re.search(r"function naturalCompare\(.*?\n}\n", js, re.S).group(0)
    names = [
        "soteria[prune=0.8]",
        "gradient-pruning[p=0.99]",
        "Gradient-pruning[p=0.9]",
        "dp-gaussian[clip=1,sigma=0.1]",
        "dp-gaussian[clip=1,sigma=0.01]",
        "mixup[k=16]",
        "mixup[k=4]",
        "none",
        "a",
        "a1",
        "a-1",
        "10",
        "9",
    ]
    script = tmp_path / "order.js"
    script.write_text(function + f"console.log(JSON.stringify({json.dumps(names)}.sort(naturalCompare)));\n")
    out = subprocess.run(["node", str(script)], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == sorted(names, key=functools.cmp_to_key(_natural_compare))


def test_index_and_board_in_chromium_sort_and_follow_links(browser, committed_site):
    from selenium.webdriver.common.by import By

    browser.get((committed_site / site.PAGE).as_uri())
    assert _console_errors(browser) == []
    assert browser.title == "fedbench leaderboards"
    entries = _column(browser, "boards", "entries")
    browser.find_element(By.XPATH, "//table[@id='boards']//th[starts-with(., 'entries')]").click()
    assert _column(browser, "boards", "entries") == sorted(entries, key=int)

    browser.find_element(By.LINK_TEXT, V1_BOARD).click()
    assert browser.current_url.endswith(f"/{V1_BOARD}/index.html")
    assert browser.find_element(By.TAG_NAME, "h1").text == V1_BOARD
    assert _console_errors(browser) == []
    img = browser.find_element(By.CSS_SELECTOR, "#tradeoff img")
    assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 100

    table = "leaderboard-table"
    ranks = _column(browser, table, "rank")
    assert ranks == sorted(ranks, key=int)  # as built: rank order
    th = browser.find_element(By.XPATH, f"//table[@id='{table}']//th[starts-with(., 'test_acc')]")
    th.click()
    acc = [float(v) for v in _column(browser, table, "test_acc (%) ↑")]
    assert acc == sorted(acc) and acc != [float(v) for v in _column(browser, table, "rank")]
    assert th.get_attribute("aria-sort") == "ascending"
    th.click()
    assert [float(v) for v in _column(browser, table, "test_acc (%) ↑")] == sorted(acc, reverse=True)
    assert th.get_attribute("aria-sort") == "descending"
    browser.find_element(By.XPATH, f"//table[@id='{table}']//th[starts-with(., 'defense')]").click()
    names = _column(browser, table, "defense")
    assert names == sorted(names, key=functools.cmp_to_key(_natural_compare))
    assert _console_errors(browser) == []

    browser.find_element(By.LINK_TEXT, "fedbench leaderboards").click()
    assert browser.current_url.endswith(f"{committed_site.name}/index.html")
    assert _console_errors(browser) == []


# ------------------------------------------------------------------------------- layout and screenshots

VIEWPORT = (1400, 900)
SCREENSHOTS_ENV = "FEDBENCH_SCREENSHOTS"  # a folder (docs/img): the screenshots are saved there too
BOARD_SHOT = "malicious-server-mnist5k-fcnn"  # a v2 board with committed reconstruction thumbnails
# the page's and the leaderboard's geometry, in CSS pixels of the viewport
LAYOUT_JS = """
const table = document.getElementById("leaderboard-table");
const box = table.closest(".scroll");
const rect = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.right, r.top, r.bottom]; };
return {
  page: document.documentElement.scrollWidth, width: window.innerWidth, height: window.innerHeight,
  heads: Array.from(table.tHead.rows[0].cells).slice(0, 3).map(rect),
  box: rect(box), boxScroll: box.scrollWidth, boxWidth: box.clientWidth,
};
"""


def _viewport(driver, width: int, height: int) -> None:
    """The viewport's exact size in CSS pixels (a window size would include the browser's frame)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def _screenshot(driver, path: Path) -> None:
    """The viewport as a small PNG (a 64-colour palette), also under $FEDBENCH_SCREENSHOTS when set."""
    import io
    import os

    from PIL import Image

    image = Image.open(io.BytesIO(driver.get_screenshot_as_png()))
    assert image.size == VIEWPORT
    image.convert("RGB").quantize(colors=64).save(path, format="PNG", optimize=True)
    assert path.stat().st_size < 150_000
    if os.environ.get(SCREENSHOTS_ENV):
        shutil.copyfile(path, Path(os.environ[SCREENSHOTS_ENV]) / path.name)


def _inside(box, width: float) -> bool:
    left, right, _top, _bottom = box
    return 0 <= left and right <= width


@pytest.fixture
def viewport(browser):
    """The browser at VIEWPORT for one test, back to its window's size after it."""
    _viewport(browser, *VIEWPORT)
    yield browser
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_screenshots_keep_the_first_columns_and_the_reconstructions_in_view(
    viewport, committed_site, tmp_path
):
    """At 1400 x 900 the index and a v2 board (rank, defense, then its primary metric) fit the
    width (the page never scrolls sideways);
    the board's first three columns are in the first screen; a wide table scrolls inside its box with
    its first two columns (rank, defense) kept in view, and a board's reconstructions image lies within
    the width. Screenshots of both pages: `FEDBENCH_SCREENSHOTS=docs/img` refreshes the committed ones."""
    from selenium.webdriver.common.by import By

    browser = viewport
    browser.get((committed_site / site.PAGE).as_uri())
    assert browser.execute_script("return document.documentElement.scrollWidth") <= VIEWPORT[0]
    _screenshot(browser, tmp_path / "site-index.png")

    browser.get((committed_site / BOARD_SHOT / site.PAGE).as_uri())
    layout = browser.execute_script(LAYOUT_JS)
    heads = browser.execute_script(
        "return Array.from(document.getElementById('leaderboard-table').tHead.rows[0].cells)"
        ".slice(0, 3).map((c) => c.textContent.trim());"
    )
    assert heads[0] == "rank" and heads[1] == "defense" and heads[2].startswith("reid"), heads
    assert layout["page"] <= layout["width"] == VIEWPORT[0]  # no sideways scrolling of the page
    for head in layout["heads"]:
        assert _inside(head, layout["width"]) and head[3] <= layout["height"], layout
    assert layout["boxScroll"] > layout["boxWidth"]  # the wide table scrolls inside its box
    _screenshot(browser, tmp_path / "site-board-malicious.png")

    # scrolled to its right end, the first two columns stay where they were, drawn over the others
    browser.execute_script(
        "const b = document.querySelector('#leaderboard-table').closest('.scroll');"
        "b.scrollLeft = b.scrollWidth;"
    )
    scrolled = browser.execute_script(LAYOUT_JS)
    assert [h[:2] for h in scrolled["heads"][:2]] == [h[:2] for h in layout["heads"][:2]]
    assert scrolled["heads"][2][0] < layout["heads"][2][0]  # the third scrolled under them
    covering = browser.execute_script(
        "const c = document.querySelector('#leaderboard-table tbody tr').cells[1];"
        "const r = c.getBoundingClientRect();"
        "return document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2) === c;"
    )
    assert covering, "another column is drawn over the sticky second column"
    backgrounds = browser.execute_script(
        "return Array.from(document.querySelectorAll('#leaderboard-table tr')).slice(0, 3)"
        ".flatMap((row) => Array.from(row.cells).slice(0, 2))"
        ".map((c) => getComputedStyle(c).backgroundColor);"
    )
    assert len(backgrounds) == 6 and "rgba(0, 0, 0, 0)" not in backgrounds, backgrounds  # opaque

    boards = boards_of(committed_site)
    with_images = [n for n in lb.board_names(boards) if (boards / n / THUMBNAIL_FILE).is_file()]
    assert with_images, "no committed board has reconstruction thumbnails"
    for name in [BOARD_SHOT, *with_images]:
        browser.get((committed_site / name / site.PAGE).as_uri())
        images = browser.find_elements(By.CSS_SELECTOR, "#reconstructions img")
        assert len(images) == (name in with_images), name
        if not images:
            continue
        img = images[0]
        browser.execute_script("arguments[0].scrollIntoView()", img)
        assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 100
        box = browser.execute_script(
            "const r = arguments[0].getBoundingClientRect(); return [r.left, r.right];", img
        )
        assert 0 <= box[0] and box[1] <= VIEWPORT[0], (name, box)
        assert browser.execute_script("return document.documentElement.scrollWidth") <= VIEWPORT[0], name
    assert _console_errors(browser) == []
