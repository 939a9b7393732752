"""The course's website (`make site`): built from the committed notebooks and docs/, then read page by page in a
real browser, headless Chromium driven over its DevTools protocol. Every page loads without a console error, shows
every figure its notebook holds, leaves no raw $...$ of math behind, and links only to pages and headings that
exist. Skipped, saying why, where Chromium or the site's tools (the `site` extra) are not installed."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit
from urllib.request import urlopen

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
MISSING = [m for m in ("sphinx", "myst_nb", "sphinx_book_theme", "websocket") if importlib.util.find_spec(m) is None]
RAW_MATH = re.compile(r"\$[^$\s](?:[^$\n]*[^$\s\\])?\$|\\\(|\\\[|\\begin\{")   # $x$, \(x\), \[x\], \begin{
FIGURES = ("image/png", "image/jpeg", "image/svg+xml")

WHY_NOT = ("no Chromium on PATH (Debian: apt-get install chromium)" if BROWSER is None else
           f"the site's tools are not installed ({', '.join(MISSING)}): pip install -e '.[site]' (make setup does)"
           if MISSING else None)
REQUIRED = os.environ.get("MINWIOLA_SITE_REQUIRED") == "1"        # .ci/run: CI runs these, it never skips them
pytestmark = [pytest.mark.once, pytest.mark.skipif(WHY_NOT is not None and not REQUIRED, reason=str(WHY_NOT))]


def build(out: Path) -> subprocess.CompletedProcess:
    """`make site`'s command: every warning (a broken reference, an image not found) fails it."""
    return subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-c",
                           "docs/site", ".", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)


def figures_in(notebook: Path) -> int:
    """The figures a lesson's committed outputs hold (cells the site removes do not count)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return sum(any(kind in out.get("data", {}) for kind in FIGURES)
               for c in cells if c["cell_type"] == "code" and "remove-cell" not in c["metadata"].get("tags", [])
               for out in c["outputs"])


class Chromium:
    """Headless Chromium and one page of it, spoken to over the DevTools protocol's websocket."""

    def __init__(self, profile: Path):
        import websocket
        self.proc = subprocess.Popen([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--remote-debugging-port=0", "--remote-allow-origins=*",
                                      f"--user-data-dir={profile}", "--window-size=1280,1000", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.proc.poll() is None and time.monotonic() < deadline, "Chromium did not start"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        page = next(t for t in json.load(urlopen(f"http://127.0.0.1:{port}/json/list")) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id, self.events = 0, []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]
            self.events.append(message)

    def wait_for(self, event: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not any(e.get("method") == event for e in self.events):
            assert time.monotonic() < deadline, f"no {event} within {seconds} s"
            self.events.append(json.loads(self.ws.recv()))

    def errors(self) -> list[str]:
        """What the page said to its console at error level: uncaught exceptions, console.error, failed loads."""
        said = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                said.append(p["exceptionDetails"].get("exception", {}).get("description")
                            or p["exceptionDetails"]["text"])
            elif method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                said.append(" ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                said.append(f"{p['entry']['text']} {p['entry'].get('url', '')}")
        return said

    def visit(self, url: str) -> dict:
        """Load a page, let MathJax finish, and read what a reader would see."""
        self.events = []
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        result = self.call("Runtime.evaluate", expression=READ_PAGE, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return {**json.loads(result["result"]["value"]), "errors": self.errors()}

    def screenshot(self, path: Path) -> None:
        """The whole page, as tall as it is."""
        height = self.call("Runtime.evaluate", expression="document.documentElement.scrollHeight",
                           returnByValue=True)["result"]["value"]
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": 1280, "height": min(height, 16000), "scale": 1})
        import base64
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


# What a reader sees, read once MathJax has typeset the page: the main text outside code and typeset math, the
# figures in the cells' outputs (loaded: naturalWidth > 0), every link, and the Colab links.
READ_PAGE = """
(async () => {
  if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
  const main = document.querySelector("main") || document.body;
  const skip = "pre, code, script, style, mjx-container, .MathJax, textarea";
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  const text = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode())
    if (!n.parentElement.closest(skip)) text.push(n.nodeValue);
  const shown = [...main.querySelectorAll(".cell_output img")];
  return JSON.stringify({
    text: text.join(""),
    figures: shown.filter(i => i.complete && i.naturalWidth > 0).length,
    broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    math: document.querySelectorAll("mjx-container").length,
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    colab: [...document.querySelectorAll("a[href^='https://colab.research.google.com/github/']")].length,
  });
})()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site, served on the loopback address, and every page of it read in Chromium."""
    assert WHY_NOT is None, f"MINWIOLA_SITE_REQUIRED=1, but {WHY_NOT}"
    out = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    done = build(out)
    assert done.returncode == 0, f"the site's build failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    built = time.monotonic() - started
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = Chromium(tmp_path_factory.mktemp("profile"))
    shots = tmp_path_factory.mktemp("screenshots")
    try:
        pages = {}
        for page in sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html")
                           if not p.relative_to(out).parts[0].startswith("_") and p != out / "index.html"):
            pages[page] = browser.visit(base + page)
            if page in ("lessons/06_srpe.html", "lessons/11_training.html"):
                browser.screenshot(shots / page.replace("/", "_").replace(".html", ".png"))
    finally:
        browser.close()
        server.shutdown()
    print(f"\nsite: built in {built:.1f} s, {len(pages)} pages read in {time.monotonic() - started - built:.1f} s; "
          f"screenshots in {shots}")
    return out, base, pages


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_every_lesson_and_guide_is_a_page(site):
    out, _, pages = site
    wanted = [f"lessons/{p.stem}.html" for p in LESSONS] + [f"docs/{p.stem}.html" for p in (ROOT / "docs").glob("*.md")]
    assert [p for p in wanted if p not in pages] == []
    assert all(pages[f"lessons/{p.stem}.html"]["colab"] >= 1 for p in LESSONS), "a lesson without its Colab link"
    door = re.search(r'url=([^"]+)"', (out / "index.html").read_text(encoding="utf-8"))   # the site's front door
    assert door and door[1] in pages


def test_no_page_says_an_error_in_the_console(site):
    _, _, pages = site
    said = {page: r["errors"] for page, r in pages.items() if r["errors"]}
    assert said == {}


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem[:2])
def test_every_figure_of_the_notebook_is_shown(site, lesson):
    _, _, pages = site
    page = pages[f"lessons/{lesson.stem}.html"]
    assert page["broken"] == []
    assert page["figures"] == figures_in(lesson) > 0


def test_math_is_typeset_and_no_raw_dollars_are_left(site):
    _, _, pages = site
    raw = {page: RAW_MATH.findall(r["text"])[:3] for page, r in pages.items() if RAW_MATH.search(r["text"])}
    assert raw == {}
    assert all(pages[f"lessons/{p.stem}.html"]["math"] > 0 for p in LESSONS if p.stem != "00_start_here")


def test_every_internal_link_resolves(site):
    out, base, pages = site
    ids: dict[Path, set[str]] = {}
    broken = []
    for page, r in pages.items():
        for link in r["links"]:
            if not link.startswith(base):
                continue
            parts = urlsplit(link)
            target = out / unquote(parts.path).lstrip("/")
            target = target / "index.html" if target.is_dir() else target
            if not target.is_file():
                broken.append(f"{page} -> {link[len(base):]}")
            elif parts.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text(encoding="utf-8")))
                if unquote(parts.fragment) not in ids[target]:
                    broken.append(f"{page} -> {link[len(base):]} (no such anchor)")
    assert broken == []


def test_the_checks_catch_what_they_should():
    """The raw-math pattern and the figure count, on what they must find and what they must let pass."""
    assert RAW_MATH.search("the scale $1/\\sqrt{d_h}$ keeps") and RAW_MATH.search("where \\(x\\) is")
    assert RAW_MATH.search("pair $j$ of")
    assert not RAW_MATH.search("costs $5 and $ alone, 2 $ signs")
    lesson = json.loads((ROOT / "lessons" / "06_srpe.ipynb").read_text(encoding="utf-8"))
    assert figures_in(ROOT / "lessons" / "06_srpe.ipynb") == sum(
        "image/png" in o.get("data", {}) for c in lesson["cells"] if c["cell_type"] == "code" for o in c["outputs"])
