"""The provider's documentation, served by the Airflow api-server itself.

The project has no web site. Airflow's Providers page links the provider's name to
``[project.urls] Documentation``, which is ``DOCUMENTATION_URL`` (``upsert-provider/docs/``). It has
no leading slash on purpose: the UI page sets ``<base href>`` to the api-server's root path, so the
browser resolves it to ``<root path>upsert-provider/docs/``, which is this app whether Airflow is
served at ``/`` or under a sub-path (``[api] base_url``). Setuptools also refuses a Project-URL that
starts with ``/``.

The pages are README.md and docs/*.md, shipped as package data under ``documentation/``: in the
source tree that directory holds two symlinks, so an editable install reads the live files and a
wheel (or sdist) holds copies.
"""

from __future__ import annotations

import html
import posixpath
import re
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from urllib.parse import urlsplit

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from markdown_it import MarkdownIt
from markdown_it.token import Token

PLUGIN_NAME = "upsert_provider_docs"
URL_PREFIX = "/upsert-provider"
INDEX_PATH = "/docs/"
# What pyproject.toml declares as [project.urls] Documentation (tests check the two agree).
DOCUMENTATION_URL = URL_PREFIX.lstrip("/") + INDEX_PATH

README_PAGE = "README"
# A page is named by its file's stem: no separators, no leading dot, so no name can leave the tree.
PAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# The pages' images: files of docs/img/, served under docs/img/ with their type.
IMAGE_DIR = "img"
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
               ".webp": "image/webp"}

# The pages are static text: no script may run, styles are inline only.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'",
    "X-Content-Type-Options": "nosniff",
}

STYLE = """
body { font: 16px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
       max-width: 52rem; margin: 0 auto; padding: 1.5rem 1rem 4rem; }
nav { font-size: 0.9rem; margin-bottom: 1.5rem; padding-bottom: 0.5rem; border-bottom: 1px solid #d0d7de; }
a { color: #0969da; }
h1, h2, h3 { line-height: 1.25; margin-top: 1.8em; }
h1 { margin-top: 0; }
code { font: 0.875em ui-monospace, SFMono-Regular, Menlo, monospace; background: #f3f4f6;
       padding: 0.1em 0.3em; border-radius: 4px; }
pre { background: #f6f8fa; padding: 0.9rem; overflow-x: auto; border-radius: 6px; line-height: 1.4; }
pre code { background: none; padding: 0; }
table { border-collapse: collapse; margin: 1rem 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: 0.35rem 0.7rem; text-align: left; vertical-align: top; }
blockquote { margin: 0; padding: 0 1rem; color: #59636e; border-left: 0.25rem solid #d0d7de; }
.unserved { border-bottom: 1px dotted #59636e; }
ol.pages li { margin: 0.3rem 0; }
ol.pages .file { color: #59636e; font-size: 0.85rem; }
"""


@dataclass(frozen=True)
class DocPage:
    """One Markdown page: ``name`` is its URL segment under docs/, ``source_path`` its path in
    the repository, which is what relative links in other pages name."""

    name: str
    source_path: str
    resource: Traversable

    def markdown(self) -> str:
        return self.resource.read_text(encoding="utf-8")


def documentation_root() -> Traversable:
    """The shipped copy of README.md and docs/ (the live files in an editable install)."""
    return files("airflow_upsert_provider.plugins") / "documentation"


def find_pages(root: Traversable) -> dict[str, DocPage]:
    """The pages by name, in reading order: README first, then docs/*.md by file name."""
    pages: dict[str, DocPage] = {}
    readme = root / "README.md"
    if readme.is_file():
        pages[README_PAGE] = DocPage(README_PAGE, "README.md", readme)
    docs_dir = root / "docs"
    if docs_dir.is_dir():
        for entry in sorted(docs_dir.iterdir(), key=lambda e: e.name):
            name = entry.name.removesuffix(".md")
            if entry.name.endswith(".md") and entry.is_file() and PAGE_NAME.fullmatch(name):
                # The README keeps its name if docs/ ever holds a README.md of its own.
                pages.setdefault(name, DocPage(name, f"docs/{entry.name}", entry))
    return pages


def markdown_parser() -> MarkdownIt:
    # Raw HTML in the Markdown is shown as text, never passed through: the pages carry no markup
    # but what the renderer makes.
    return MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def plain_text(inline: Token) -> str:
    """The visible text of an inline token (a heading's words without Markdown markup)."""
    return "".join(child.content for child in inline.children or () if child.type in ("text", "code_inline"))


def heading_anchor(text: str) -> str:
    """The fragment a heading gets, as GitHub names it, so ``errors.md#exit-codes`` links keep
    working both on the repository host and here."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def page_title(page: DocPage, parser: MarkdownIt) -> str:
    tokens = parser.parse(page.markdown())
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type == "heading_open" and opening.tag == "h1":
            return plain_text(inline) or page.name
    return page.name


def served_href(href: str, source_path: str, names_by_source: dict[str, str]) -> str | None:
    """Where a link in the page at ``source_path`` points once served: unchanged if it leaves the
    repository (or stays in the page), the served page's name if it names another page, None if
    it names a repository file that is not served."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or not parts.path:
        return href
    if parts.path.startswith("/"):
        return None
    target = posixpath.normpath(posixpath.join(posixpath.dirname(source_path), parts.path))
    name = names_by_source.get(target)
    if name is None:
        return None
    # Relative to the page's own URL (docs/<name>), so it also holds under a sub-path deployment.
    return name + (f"#{parts.fragment}" if parts.fragment else "")


def served_image(src: str, source_path: str) -> str | None:
    """Where an image of the page at ``source_path`` is served, relative to the page's URL
    (``img/<file>``) when it is a file of docs/img/; unchanged when it leaves the repository;
    None for a repository file that is not served."""
    parts = urlsplit(src)
    if parts.scheme or parts.netloc:
        return src
    if not parts.path or parts.path.startswith("/"):
        return None
    target = posixpath.normpath(posixpath.join(posixpath.dirname(source_path), parts.path))
    folder, _, name = target.rpartition("/")
    if folder != f"docs/{IMAGE_DIR}" or not PAGE_NAME.fullmatch(name):
        return None
    return f"{IMAGE_DIR}/{name}"


def image_type(name: str) -> str | None:
    """The content type of an image file name, None for a file that is not a served image."""
    return IMAGE_TYPES.get(posixpath.splitext(name)[1].lower()) if PAGE_NAME.fullmatch(name) else None


def render_page(page: DocPage, pages: dict[str, DocPage], parser: MarkdownIt) -> str:
    """The page's Markdown as HTML: headings get anchors, links to other pages point at them,
    images at the served docs/img/ files."""
    names_by_source = {p.source_path: p.name for p in pages.values()}
    tokens = parser.parse(page.markdown())
    anchors_used: dict[str, int] = {}
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type == "heading_open":
            anchor = heading_anchor(plain_text(inline))
            seen = anchors_used.get(anchor, 0)
            anchors_used[anchor] = seen + 1
            opening.attrSet("id", f"{anchor}-{seen}" if seen else anchor)
    for token in tokens:
        unserved_open = False
        for child in token.children or ():
            if child.type == "link_open":
                href = str(child.attrGet("href") or "")
                target = served_href(href, page.source_path, names_by_source)
                if target is None:
                    # A link to a file the api-server does not serve would only 404: keep the words.
                    child.tag, child.attrs = "span", {"class": "unserved", "title": f"{href} in the source repository"}
                    unserved_open = True
                else:
                    child.attrSet("href", target)
            elif child.type == "link_close" and unserved_open:
                child.tag, unserved_open = "span", False
            elif child.type == "image":
                src = served_image(str(child.attrGet("src") or ""), page.source_path)
                if src is None:
                    # Shown as its alt text rather than as a broken image.
                    child.type, child.content = "text", child.content or str(child.attrGet("src") or "")
                else:
                    child.attrSet("src", src)
    return parser.renderer.render(tokens, parser.options, {})


def html_document(title: str, body: str, *, back_to_index: bool) -> str:
    nav = (
        '<nav><a href="./">airflow-upsert-provider documentation</a></nav>'
        if back_to_index
        else "<nav>airflow-upsert-provider documentation</nav>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{nav}<main>{body}</main></body></html>\n"
    )


def html_response(title: str, body: str, *, status_code: int = 200, back_to_index: bool = True) -> HTMLResponse:
    return HTMLResponse(
        html_document(title, body, back_to_index=back_to_index), status_code=status_code, headers=SECURITY_HEADERS
    )


def create_docs_app(root: Traversable) -> FastAPI:
    """The documentation app: ``/docs/`` lists the pages, ``/docs/<name>`` renders one.

    Pages are read on each request, so an editable install serves what is in the tree now.
    """
    from fastapi import Depends

    from airflow.api_fastapi.core_api.security import get_user

    # Airflow mounts plugin apps without its authentication: every page asks for the signed-in
    # user the way Airflow's own routes do (the UI's session cookie, or a bearer token).
    # No OpenAPI pages: FastAPI's own would take /docs.
    app = FastAPI(title="airflow-upsert-provider documentation", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(get_user)])
    parser = markdown_parser()

    @app.get(INDEX_PATH, response_class=HTMLResponse)
    def index() -> HTMLResponse:
        items = "".join(
            f'<li><a href="{html.escape(page.name)}">{html.escape(page_title(page, parser))}</a> '
            f'<span class="file">{html.escape(page.source_path)}</span></li>'
            for page in find_pages(root).values()
        )
        body = f'<h1>airflow-upsert-provider documentation</h1><ol class="pages">{items}</ol>'
        return html_response("airflow-upsert-provider documentation", body, back_to_index=False)

    @app.get(INDEX_PATH + IMAGE_DIR + "/{file_name}")
    def image(file_name: str) -> Response:
        content_type = image_type(file_name)
        entry = root / "docs" / IMAGE_DIR / file_name if content_type else None
        if entry is None or not entry.is_file():
            return html_response("Image not found", f"<h1>No image named {html.escape(file_name)}</h1>",
                                 status_code=404)
        return Response(entry.read_bytes(), media_type=content_type, headers=SECURITY_HEADERS)

    @app.get(INDEX_PATH + "{page_name:path}", response_class=HTMLResponse)
    def page(page_name: str) -> HTMLResponse:
        if not PAGE_NAME.fullmatch(page_name):
            return html_response("Not a page name", "<h1>Not a page name</h1>", status_code=400)
        pages = find_pages(root)
        found = pages.get(page_name)
        if found is None:
            body = f"<h1>No page named {html.escape(page_name)}</h1>"
            return html_response("Page not found", body, status_code=404)
        return html_response(page_title(found, parser), render_page(found, pages, parser))

    return app


app = create_docs_app(documentation_root())


class UpsertProviderDocsPlugin(AirflowPlugin):
    """Mounts the documentation app on the api-server under ``URL_PREFIX``."""

    name = PLUGIN_NAME
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "airflow-upsert-provider documentation"}]
