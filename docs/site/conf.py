"""Sphinx configuration of the course's website (`make site`, docs/site/README.md says why Sphinx with MyST-NB).

The source folder is the repository itself, so every relative link between README.md, docs/ and lessons/ works
as it does on GitHub; `include_patterns` keeps the site to the pages the course publishes. The notebooks are read
with the outputs of their committed full run: nothing is executed (nb_execution_mode = "off").
"""
import importlib.metadata
import re
import tomllib
from pathlib import Path

from docutils import nodes

ROOT = Path(__file__).resolve().parents[2]
REPO = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Repository"]

project = "minwiola"
author = "the minwiola authors"
copyright = "the minwiola authors, MIT licence"
root_doc = "docs/site/index"
include_patterns = ["docs/site/index.md", "README.md", "AGENTS.md", "docs/*.md", "data/README.md", "lessons/[0-9][0-9]_*.ipynb"]
exclude_patterns = [".venv", "build", "lessons/mine", "student"]

extensions = ["myst_nb"]
# MathJax 3 from the site itself, not from a CDN (a reader offline, and the browser test, reach no CDN): the
# sphinx-mathjax-offline distribution ships its files (its own module is not importable, so only they are used).
MATHJAX = importlib.metadata.distribution("sphinx-mathjax-offline").locate_file("sphinx-mathjax-offline/static")
html_static_path = [str(MATHJAX)]
mathjax_path = "mathjax/tex-chtml.js"
nb_execution_mode = "off"                      # the committed outputs are the lesson; never run a lesson here
nb_ipywidgets_js = {}                          # a widget's script comes from a CDN the site must not need
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None),
                              ("html", "application/vnd.jupyter.widget-state+json", None)]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 4                       # GitHub's #anchors (the README and docs/ link to headings)

html_theme = "sphinx_book_theme"
html_title = "minwiola: build a small language model"
html_theme_options = {
    "repository_url": REPO,
    "repository_branch": "main",
    "path_to_docs": "",
    "use_repository_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "show_toc_level": 2,
}
html_context = {"default_mode": "auto"}       # unset, the theme's script logs an error on a reader's first visit
html_favicon = "favicon.svg"                   # else the browser asks for /favicon.ico, which is not there


SOURCE = re.compile(r"(?:minwiola|benchmarks|lessons/exercises)/[\w/]+\.py")
LESSON = re.compile(r"\b([Ll]essons? )(\d\d)\b")


def _stems():
    return {p.stem[:2]: p.stem for p in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")}


def link_source_and_lessons(app, doctree, docname):
    """`minwiola/train.py` in the text links to that file on GitHub; "lesson 06" in a lesson links to lesson 06.
    Neither is written into the notebooks, so they stay as the course commits them."""
    for literal in list(doctree.findall(nodes.literal)):
        text = literal.astext()
        if SOURCE.fullmatch(text) and (ROOT / text).is_file() and not isinstance(literal.parent, nodes.reference):
            ref = nodes.reference("", "", refuri=f"{REPO}/blob/main/{text}", internal=False)
            literal.replace_self(ref)
            ref.append(literal)
    if not docname.startswith("lessons/"):
        return
    stems, here = _stems(), Path(docname).name
    for text in list(doctree.findall(nodes.Text)):
        if isinstance(text.parent, (nodes.reference, nodes.literal, nodes.literal_block, nodes.title,
                                    nodes.math, nodes.math_block, nodes.raw)) or not LESSON.search(text):
            continue
        parts, last = [], 0
        for m in LESSON.finditer(text):
            stem = stems.get(m[2])
            if stem is None or stem == here:
                continue
            parts += [nodes.Text(text[last:m.start(2)]),
                      nodes.reference("", m[2], refuri=f"{stem}.html", internal=True)]
            last = m.end(2)
        if parts:
            parts.append(nodes.Text(text[last:]))
            text.parent.replace(text, parts)


def front_door(app, error):
    """build/site/index.html: the site's first page is docs/site/index.html (the source folder is the repository)."""
    if error is None and app.builder.format == "html":
        (Path(app.outdir) / "index.html").write_text(
            '<!DOCTYPE html><meta charset="utf-8"><meta http-equiv="refresh" content="0; url=docs/site/index.html">'
            '<title>minwiola</title><a href="docs/site/index.html">minwiola: the course</a>\n', encoding="utf-8")


def setup(app):
    app.connect("doctree-resolved", link_source_and_lessons)
    app.connect("build-finished", front_door)
