"""The docs site (mkdocs.yml, docs/): the reference pages generated from the code are the ones
committed, the site builds with --strict (a broken link, a missing anchor or a page left out
of the nav fails), and the built site, opened in Debian's headless Chromium, shows a reference
page's key table, finds a key through its search, and lays every page out readably at
1280 x 800 (the layout rules are above LAYOUT_PROBLEMS; a full-page screenshot of each page
goes to $HPCSUITE_DOCS_SHOTS)."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import struct
import threading
import urllib.request
from pathlib import Path

import pytest

import chromium
from conftest import REPO


@functools.cache
def generator():
    # scripts/ is on the path when the generator runs as a script; its two helpers live there
    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_generated_reference_pages_are_current():
    gen = generator()
    stale = gen.stale(gen.pages())
    names = ", ".join(str(p.relative_to(REPO)) for p in stale)
    assert not stale, (f"generated docs are stale: {names}; regenerate them with "
                       f"{gen.REGENERATE} and commit the result")


def test_the_reference_names_every_key_and_command():
    """Every dotted key the schemas accept and every command has its row or section."""
    import click

    from hpcsuite.cli import main
    from hpcsuite.study.points import Study
    from hpcsuite.submit.schema import key_paths
    from hpcsuite.submit.site_profile import SiteProfile
    from hpcsuite.submit.spec import JobSpec
    from hpcsuite.sweep.spec import Sweep

    pages = {p.name: text for p, text in generator().pages().items()}
    for page, schema in (("job-spec.md", JobSpec), ("site-profile.md", SiteProfile),
                         ("sweep.md", Sweep), ("study.md", Study)):
        for key in key_paths(schema):
            assert _row_of(key.replace("partitions.", "partitions.NAME."), pages[page]), \
                f"{page} has no row for {key}"
    gen = generator()
    paths = [ctx.command_path for ctx, _ in gen.reference_cli.commands(main, click.Context(main, info_name="hpcsuite"))]
    assert len(paths) > 30 and "hpcsuite study predict" in paths
    for path in paths:
        assert f"## `{path}`" in pages["cli.md"], path


def _row_of(key: str, page: str) -> bool:
    """The key's row, or (a record met again, as train.eval.data) its row in the section its
    parent links to."""
    if f"| `{key}` |" in page:
        return True
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:cut])
        line = next((l for l in page.splitlines() if l.startswith(f"| `{parent}` |")), "")
        if "](#" in line:
            target = line.split("](#", 1)[1].split(")", 1)[0]
            return f"| `{target}.{'.'.join(parts[cut:])}` |" in page
    return False


def test_a_new_schema_key_reaches_the_reference():
    """A field added to a record (as train.tracking will be) is in the page without any edit."""
    from hpcsuite.submit.spec import Train

    gen = generator()
    extra = dataclasses.field(default=3, metadata={"help": "a key added later", "min": 1})
    added = dataclasses.make_dataclass("Later", [("later_key", int, extra)], bases=(Train,),
                                       frozen=True)
    page = gen.schema_page("t", "x", "", added, gen.job_lock)
    assert "| `later_key` | integer | `3` | a key added later |" in page
    assert "- `later_key`: *Allowed:* at least 1.\n    { #key-later_key }" in page


ERROR_WORDING = re.compile(r"\bnot (a|an|one of|valid)\b", re.IGNORECASE)


ALLOWED = re.compile(r"^- (`[^`]+`): .*?\*Allowed:\* (.*?)\.(?: \*[A-Z][a-z ]*:\*|$)")


def test_the_reference_says_what_is_allowed_not_the_error_text():
    """What a key allows (*Allowed:* in its entry under the section's table) describes values
    and keys positively ("keys: environment variable names"), while the refusal a user gets
    keeps its own wording ("not a valid environment variable name")."""
    from hpcsuite.errors import ConfigError
    from hpcsuite.submit.schema import build
    from hpcsuite.submit.spec import JobSpec

    pages = {p.name: text for p, text in generator().pages().items() if p.name != "cli.md"}
    allowed = {f"{name} {m[1]}": m[2] for name, text in pages.items()
               for m in map(ALLOWED.match, text.splitlines()) if m}
    assert len(allowed) > 120, len(allowed)      # every key with a constraint: 126 of 191
    wrong = {k: v for k, v in allowed.items() if ERROR_WORDING.search(v)}
    assert not wrong, wrong
    assert allowed["job-spec.md `env`"].startswith("keys: environment variable names"), allowed
    assert allowed["job-spec.md `train.model_args`"].startswith("keys: Python argument names")
    assert allowed["job-spec.md `resources.extra_sbatch`"].startswith(
        "keys: sbatch long option names")
    with pytest.raises(ConfigError, match="env.1X: not a valid environment variable name"):
        build(JobSpec, {"name": "j", "env": {"1X": "a"}}, "job.yaml")


def test_a_mapping_with_a_key_pattern_needs_its_positive_keys_text():
    gen = generator()
    assert gen.allowed_text({"key_pattern": "[a-z]+", "keys": "names"}) == "keys: names (`[a-z]+`)"
    with pytest.raises(ValueError, match="no keys= text"):
        gen.allowed_text({"key_pattern": "[a-z]+", "key_help": "not a name"})


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(REPO / "mkdocs.yml"), "-d", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    return out


def test_the_site_builds_strict_with_every_page(site):
    for page in ("index.html", "user/quickstart/index.html", "ARCHITECTURE/index.html",
                 "BENCHMARKS/index.html", "CLUSTER/index.html", "reference/job-spec/index.html",
                 "reference/cli/index.html", "search/search_index.json"):
        assert (site / page).is_file(), page


@pytest.fixture
def served(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


SEARCH_DONE = ("(() => { const m = document.querySelector('.md-search-result__meta');"
               " return m && !/Initializing/.test(m.textContent) && m.textContent.trim(); })()")


@pytest.mark.timeout(120)
def test_a_reference_page_renders_and_its_search_finds_a_key(served):
    assert chromium.binary(), ("chromium is not installed: scripts/setup.sh installs it with the "
                               "Debian packages (apt-get install chromium)")
    with urllib.request.urlopen(f"{served}/search/search_index.json", timeout=10) as answer:
        assert "resources.gpu_sharing" in answer.read().decode()
    with chromium.Browser() as browser:
        tab = browser.open(f"{served}/reference/job-spec/?q=gpu_sharing")
        assert browser.wait_for(tab, "location.pathname === '/reference/job-spec/' && "
                                     "document.readyState === 'complete'")
        keys = browser.evaluate(tab, "[...document.querySelectorAll('table td:first-child code')]"
                                     ".map(c => c.textContent)")
        assert {"name", "train.batch_size", "resources.gpu_sharing"} <= set(keys), keys[:20]
        assert browser.evaluate(tab, "document.querySelector('.md-search__input').value") \
            == "gpu_sharing"
        found = browser.wait_for(tab, SEARCH_DONE)
        assert found and "matching document" in found, found
        links = browser.evaluate(tab, "[...document.querySelectorAll('.md-search-result__item a')]"
                                      ".map(a => a.getAttribute('href'))")
        assert any("/reference/job-spec/" in link for link in links), links


# ---------------------------------------------------------------------- every page at 1280 px
# Each page of the built site is opened at a 1280 x 800 desktop viewport (Material shows both
# sidebars there, so the content column is about 690 px) and measured after Material's own
# script has run (it wraps each table in .md-typeset__scrollwrap). A page passes when:
#   (a) the page itself does not scroll sideways: document.scrollingElement.scrollWidth is at
#       most window.innerWidth + 1;
#   (b) no text block (p, li, dt, dd, td, th, h1-h6, blockquote, figcaption) of the content
#       column is wider inside than its box (scrollWidth at most clientWidth + TEXT_SLACK_PX),
#       and none outside a scrolling container runs past the column's right edge; a code
#       block (pre) scrolls inside itself, so text inside one is not measured;
#   (c) tables are readable: a table wider than the column sits in Material's scroll wrapper
#       (.md-typeset__scrollwrap, which scrolls it); no cell holding more than
#       NARROW_CELL_WORDS words has a content box narrower than NARROW_CELL_PX (a squeezed
#       column, a word or two a line); and no cell's text wraps to more than CELL_MAX_LINES
#       lines (its text's height over its line height): a longer text is a paragraph, and
#       a paragraph goes under the table, not into a cell.
# (d) Every page's full-page screenshot (the whole document at 1280 px wide) is written as
#     PNG to $HPCSUITE_DOCS_SHOTS, else to the test's tmp dir, as PATH_TO_PAGE.png ("/" is
#     index.png, /reference/job-spec/ is reference_job-spec.png) for a person to look at.

VIEWPORT = (1280, 800)
# an inline code span wrapped at a line's end sticks out by its own padding (about 4 px, as
# Material pads code); an overflow a reader sees (an unbreakable word, a line that does not
# wrap) is tens of px
TEXT_SLACK_PX = 8
NARROW_CELL_PX = 60
NARROW_CELL_WORDS = 3
CELL_MAX_LINES = 6

# the page is laid out: loaded, its fonts ready, Material's script has wrapped its tables
LAID_OUT = ("document.readyState === 'complete' && document.fonts.status === 'loaded' && "
            "!!document.querySelector('.md-content__inner') && "
            "[...document.querySelectorAll('.md-content table:not([class])')]"
            ".every(t => t.closest('.md-typeset__scrollwrap'))")

LAYOUT_PROBLEMS = """(() => {
  const SLACK = %(slack)d, NARROW = %(narrow)d, WORDS = %(words)d, LINES = %(lines)d;
  const problems = [];
  const text = e => (e.textContent || '').replace(/\\s+/g, ' ').trim();
  const column = document.querySelector('.md-content__inner');
  const under = e => {         // the heading the element is under, to find it on the page
    let last = '';
    for (const h of column ? column.querySelectorAll('h1, h2, h3, h4') : [])
      if (h.compareDocumentPosition(e) & Node.DOCUMENT_POSITION_FOLLOWING)
        last = text(h).replace(/\\s*¶$/, '');
    return last;
  };
  const found = (rule, e, detail) => problems.push({rule, tag: e.tagName.toLowerCase(),
    text: text(e).slice(0, 60), detail: detail + (under(e) ? `; under "${under(e)}"` : '')});
  const px = (e, prop) => parseFloat(getComputedStyle(e)[prop]) || 0;
  const shown = e => e.getClientRects().length > 0;
  const inColumn = e => column && column.contains(e);
  const scroller = e => {      // the nearest ancestor that clips or scrolls sideways
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement)
      if (['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(a).overflowX)) return a;
    return null;
  };
  // (a) the page itself
  const page = document.scrollingElement;
  if (page.scrollWidth > innerWidth + 1) {
    const out = e => e.getBoundingClientRect().right > innerWidth + 1;
    const culprits = [...document.body.querySelectorAll('*')].filter(e => shown(e) && out(e) &&
      !scroller(e) && ![...e.children].some(out));     // the innermost, where nothing clips it
    for (const e of culprits.slice(0, 3))
      found('the page scrolls sideways', e, `scrollWidth ${page.scrollWidth} px > ` +
            `${innerWidth} px; this ends at ${Math.round(e.getBoundingClientRect().right)} px`);
    if (!culprits.length) found('the page scrolls sideways', document.documentElement,
                                `scrollWidth ${page.scrollWidth} px > ${innerWidth} px`);
  }
  if (!column) {
    found('no content column (.md-content__inner)', document.body, '');
    return {problems, blocks: 0, tables: 0, cells: 0, width: innerWidth};
  }
  const box = column.getBoundingClientRect();
  const right = box.right - px(column, 'paddingRight');
  const width = right - box.left - px(column, 'paddingLeft');
  // (b) text blocks
  const blocks = [...column.querySelectorAll(
    'p, li, dt, dd, td, th, h1, h2, h3, h4, h5, h6, blockquote, figcaption')]
    .filter(e => shown(e) && !e.closest('pre'));
  for (const e of blocks) {
    if (e.scrollWidth > e.clientWidth + SLACK)
      found('text overflows its box', e, `scrollWidth ${e.scrollWidth} px > clientWidth ` +
            `${e.clientWidth} px`);
    const clip = scroller(e);
    if (!clip || !inColumn(clip)) {
      const range = document.createRange();      // where the text ends, not its box
      range.selectNodeContents(e);
      const end = Math.max(e.getBoundingClientRect().right, range.getBoundingClientRect().right);
      if (end > right + SLACK)
        found('text runs past the content column', e,
              `ends at ${Math.round(end)} px, the column at ${Math.round(right)} px`);
    }
  }
  // (c) tables
  const tables = [...column.querySelectorAll('table')].filter(shown);
  let cells = 0;
  for (const t of tables) {
    const w = t.getBoundingClientRect().width;
    if (w > width + 1 && !t.closest('.md-typeset__scrollwrap'))
      found('a table wider than the content column, outside a scroll wrapper', t,
            `${Math.round(w)} px > ${Math.round(width)} px`);
    for (const c of t.querySelectorAll('td, th')) {
      cells += 1;
      const words = text(c).split(' ').filter(Boolean).length;
      const inner = c.clientWidth - px(c, 'paddingLeft') - px(c, 'paddingRight');
      if (words > WORDS && inner < NARROW)
        found('a narrow cell', c, `${words} words in ${Math.round(inner)} px`);
      const range = document.createRange();
      range.selectNodeContents(c);
      const lines = Math.round(range.getBoundingClientRect().height / (px(c, 'lineHeight') || 1));
      if (lines > LINES)
        found('a paragraph in a cell', c,
              `${lines} lines in ${Math.round(inner)} px, ${words} words`);
    }
  }
  return {problems, blocks: blocks.length, tables: tables.length, cells, width: innerWidth};
})()""" % {"slack": TEXT_SLACK_PX, "narrow": NARROW_CELL_PX, "words": NARROW_CELL_WORDS,
           "lines": CELL_MAX_LINES}


def _nav_pages() -> list[str]:
    """The URL path of every page mkdocs.yml's nav names ("user/gpus.md" is /user/gpus/)."""
    import yaml

    def leaves(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from leaves(item)
        elif isinstance(node, dict):
            for item in node.values():
                yield from leaves(item)

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    out = []
    for page in leaves(nav):
        stem = page.removesuffix(".md")
        stem = stem.removesuffix("index").rstrip("/")
        out.append(f"/{stem}/" if stem else "/")
    return out


def _shot_name(page: str) -> str:
    return (page.strip("/").replace("/", "_") or "index") + ".png"


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def _layout(browser, tab, page: str) -> tuple[list[str], dict]:
    """The page's layout problems, one line each naming the page and the element, and what
    was measured."""
    browser.wait_for(tab, LAID_OUT, timeout=10)
    report = browser.evaluate(tab, LAYOUT_PROBLEMS)
    lines = [f"{page}: {p['rule']}: <{p['tag']}> {p['text']!r} ({p['detail']})"
             for p in report.pop("problems")]
    return lines, report


def _need_chromium():
    assert chromium.binary(), ("chromium is not installed: scripts/setup.sh installs it with the "
                               "Debian packages (apt-get install chromium)")


@pytest.mark.timeout(600)
def test_every_page_reads_at_1280_px(site, served, tmp_path):
    _need_chromium()
    shots = Path(os.environ.get("HPCSUITE_DOCS_SHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    pages, nav = chromium.site_pages(site), _nav_pages()
    assert len(nav) >= 30, nav
    assert set(nav) <= set(pages), sorted(set(nav) - set(pages))
    problems, visited, measured = [], [], {"blocks": 0, "tables": 0, "cells": 0}
    with chromium.Browser(timeout=60) as browser:
        tab = browser.open("about:blank")
        browser.set_viewport(tab, *VIEWPORT)
        for page in pages:
            browser.navigate(tab, served + page)
            found, report = _layout(browser, tab, page)
            assert report["width"] == VIEWPORT[0], (page, report)
            problems += found
            for what in measured:
                measured[what] += report[what]
            png = browser.screenshot(tab)
            width, height = _png_size(png)
            assert width >= VIEWPORT[0] - 20 and height >= VIEWPORT[1] // 2, (page, width, height)
            (shots / _shot_name(page)).write_bytes(png)
            visited.append(page)
    assert len(visited) >= len(nav) and set(nav) <= set(visited), visited
    assert all((shots / _shot_name(p)).is_file() for p in visited)
    # the rules measured something: the reference pages alone have dozens of tables
    assert measured["blocks"] > 1000 and measured["tables"] > 50 and measured["cells"] > 1000, \
        measured
    assert not problems, (f"{len(problems)} layout problems at {VIEWPORT[0]}x{VIEWPORT[1]} "
                          f"(screenshots in {shots}):\n" + "\n".join(problems))


BAD_LAYOUT = """(() => {
  const column = document.querySelector('.md-content__inner');
  const add = html => column.insertAdjacentHTML('beforeend', html);
  add('<p id="bad-p" style="white-space: nowrap">a line that never wraps ' +
      'and so runs out of its paragraph '.repeat(8) + '</p>');
  add('<div id="bad-wide" style="width: 2400px; height: 4px"></div>');
  add('<table class="bad" style="width: 1000px"><tr><td>a table of its own</td></tr></table>');
  add('<div class="md-typeset__scrollwrap"><div class="md-typeset__table"><table>' +
      '<thead><tr><th>key</th><th>help</th></tr></thead><tbody><tr><td><code>k</code></td>' +
      '<td>this help is a whole paragraph ' + 'of words that goes on and on '.repeat(40) +
      '</td></tr></tbody></table></div></div>');
  add('<table class="squeezed"><tr><td style="width: 30px">a b c d e f</td>' +
      '<td>' + 'wide '.repeat(150) + '</td></tr></table>');
  return true;
})()"""


@pytest.mark.timeout(120)
def test_the_layout_check_finds_what_is_wrong(served):
    """The rules of test_every_page_reads_at_1280_px fire: elements that break each of them,
    added to a page that passes, are named with the page."""
    _need_chromium()
    with chromium.Browser() as browser:
        tab = browser.open("about:blank")
        browser.set_viewport(tab, *VIEWPORT)
        browser.navigate(tab, served + "/reference/sweep/")
        found, _ = _layout(browser, tab, "/reference/sweep/")
        assert found == [], found
        assert browser.evaluate(tab, BAD_LAYOUT)
        found = "\n".join(_layout(browser, tab, "/reference/sweep/")[0])
    for expected in ("/reference/sweep/: the page scrolls sideways: <div>",
                     "/reference/sweep/: text overflows its box: <p> 'a line that never wraps",
                     "/reference/sweep/: text runs past the content column: <p> 'a line",
                     "/reference/sweep/: a table wider than the content column, outside a "
                     "scroll wrapper: <table> 'a table of its own'",
                     "/reference/sweep/: a paragraph in a cell: <td> 'this help is a whole",
                     "/reference/sweep/: a narrow cell: <td> 'a b c d e f'"):
        assert expected in found, f"{expected!r} not in:\n{found}"


def test_readme_is_short_and_its_links_resolve():
    """The README is the front door (under 8,000 characters, the two commands first); every
    page it points to exists."""
    import re

    text = (REPO / "README.md").read_text()
    assert len(text) < 8000, len(text)
    assert text.startswith("# hpcsuite\n\n```bash\nmake demo   #") and "\nmake test   #" in text[:300]
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) > 20, links
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, missing


def test_benchmarks_open_with_the_summary_of_the_quality_bars():
    text = (REPO / "docs" / "BENCHMARKS.md").read_text()
    first = text.split("\n## ", 2)[1]
    assert first.startswith("Summary"), first[:80]
    header = "| # | quality bar | met? | date |"
    table, _, figures = first.split(header, 1)[1].partition("\n\n")
    rows = [l for l in table.splitlines() if l.startswith("| ") and "---" not in l]
    assert len(rows) >= 10, rows
    assert all(len(r.split(" | ")) == 4 for r in rows), rows
    # under the table, each bar's latest figure and the command that measured it, by number
    for n in range(1, len(rows) + 1):
        entry = re.search(rf"^{n}\. \*\*(.+?)\*\*: (.+?)\n   Command: (.+)$", figures, re.M)
        assert entry and entry.group(1) == rows[n - 1].split(" | ")[1], (n, rows[n - 1])


# ---------------------------------------------------------------------- the user docs' blocks
# Every ```yaml and ```bash block of docs/user is checked (tests/docblocks.py says how), so an
# example cannot rot: a whole file is linted against the local cluster's site profile, a
# fragment's keys go through the schema, a shell line names commands and options that exist.

def _local_profile(tmp_path, gpus: int = 0):
    from hpcsuite.site.slurm_conf import render_profile

    path = tmp_path / f"local-profile-{gpus}.yaml"
    path.write_text(render_profile(gpus))
    return path


def _quiet_env(tmp_path) -> dict:
    """No user or project layer but the ones a test writes, no ambient profile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCSUITE_", "SLURM_"))}
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}


def _yaml_blocks():
    import docblocks

    return [b for b in docblocks.blocks() if b.lang == "yaml"]


def test_the_user_docs_have_their_blocks_and_few_fragments():
    import docblocks

    found = docblocks.blocks()
    langs = {b.lang for b in found}
    assert langs <= {"yaml", "bash", "shell", "python"}, langs   # a new language needs its check
    for b in found:
        if b.lang == "python":          # a line of a script: it compiles
            compile(b.text, b.where, "exec")
    yaml_blocks = [b for b in found if b.lang == "yaml"]
    fragments = [b for b in yaml_blocks if b.kind in ("fragment", "alternatives")]
    assert len(yaml_blocks) >= 5 and len(fragments) <= 3, [b.where for b in fragments]


@pytest.mark.parametrize("block", _yaml_blocks(), ids=lambda b: b.where)
def test_every_yaml_block_of_the_user_docs_is_checked(block, tmp_path):
    from conftest import run_cli
    from hpcsuite.submit.schema import build
    from hpcsuite.submit.spec import JobSpec
    from hpcsuite.submit.strict_yaml import load

    if block.kind == "remotes":       # a remotes.yaml: each remote in it loads
        from hpcsuite.remote import config

        (tmp_path / "remotes.yaml").write_text(block.text)
        for name in load(block.text):
            config.load(name, tmp_path / "remotes.yaml")
        return
    if block.kind != "file":
        parts = [line for line in block.text.splitlines() if line.strip()
                 and not line.lstrip().startswith("#")] if block.kind == "alternatives" \
            else [block.text]
        for part in parts:
            build(JobSpec, load(part), block.where, partial=True)    # one ConfigError if not
        return
    data = load(block.text)
    shown = block.shows
    if shown is not None:
        assert data == load(shown.read_text()), f"{block.where} differs from {shown}"
        target, cwd = shown, shown.parent
    else:
        target, cwd = tmp_path / "job.yaml", tmp_path
        target.write_text(block.text)
    profile = _local_profile(tmp_path)
    if "axes" in data and "mode" in data:           # a study file
        argv = ["study", "run", str(target), "--dry-run", "--dir", str(tmp_path / "study")]
    elif "axes" in data:                            # a sweep file
        argv = ["sweep", "run", str(target), "--dry-run", "--dir", str(tmp_path / "sweep")]
    else:
        argv = ["lint", "--no-slurm", str(target)]
    proc = run_cli(*argv, "--profile", str(profile), cwd=cwd, env=_quiet_env(tmp_path), timeout=60)
    assert proc.returncode == 0, f"{block.where}: hpcsuite {' '.join(argv)}:\n{proc.stdout}{proc.stderr}"
    assert "error" not in proc.stderr.lower(), proc.stderr


def test_every_shell_block_of_the_user_docs_names_commands_and_options_that_exist():
    import docblocks
    from hpcsuite.cli import main

    shell = [b for b in docblocks.blocks() if b.lang in ("bash", "shell")]
    assert len(shell) >= 6
    problems = [p for b in shell for p in docblocks.shell_problems(b, main)]
    assert not problems, problems
    lines = sum(len(docblocks.commands(b.text)) for b in shell)
    assert lines > 30, lines


def test_the_shell_checker_finds_what_has_rotted():
    import docblocks
    from hpcsuite.cli import main

    page = REPO / "docs" / "user" / "quickstart.md"
    bad = docblocks.Block(page, 1, "bash", "hpcsuite submit job.yaml --wiat\n"
                          "hpcsuite templates list|whch\nmake demoo\ncd examples/nowhere\n"
                          "eval \"$(hpcsuite clster env)\"\nfrobnicate --now\n")
    problems = " ".join(docblocks.shell_problems(bad, main))
    for word in ("--wiat", "whch", "demoo", "examples/nowhere", "clster", "frobnicate"):
        assert word in problems, (word, problems)
    ok = docblocks.Block(page, 1, "bash", "hpcsuite logs RUN [-f] [--rank N] [-n 50]; "
                         "hpcsuite cancel RUN  # a comment's --words\n"
                         "hpcsuite study predict s --nodes 1,2 \\\n    --fabric ib-hdr\n")
    assert docblocks.shell_problems(ok, main) == []


def test_every_shipped_example_lints_quietly_on_the_local_cluster(tmp_path):
    """The examples a user runs on the project's own cluster (examples/, and sbatch/'s specs
    for its debug partition) lint without a warning that no partition is set: the local
    cluster's profile names the partition a job without one goes to."""
    from conftest import run_cli
    from hpcsuite.submit.golden import example_specs

    specs = [p for p in sorted((REPO / "examples").glob("*/*.yaml"))
             if "axes" not in p.read_text()]
    specs += [p for p in example_specs(REPO / "sbatch") if "partition: debug" in p.read_text()
              and "container:" not in p.read_text()]     # the local cluster runs no containers
    assert len(specs) >= 10, specs
    profile = _local_profile(tmp_path)
    for spec in specs:
        proc = run_cli("lint", "--no-slurm", "--profile", str(profile), str(spec), cwd=spec.parent,
                       env=_quiet_env(tmp_path), timeout=60)
        assert proc.returncode == 0, f"{spec}: {proc.stdout}{proc.stderr}"
        assert "partition" not in proc.stderr, f"{spec}: {proc.stderr}"
