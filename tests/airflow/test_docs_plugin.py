"""The documentation the api-server serves, and the Providers page link that leads to it."""

from __future__ import annotations

import glob
import html
import json
import os
import re
import sys
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_upsert_provider.plugins.docs import (
    DOCUMENTATION_URL,
    INDEX_PATH,
    PLUGIN_NAME,
    URL_PREFIX,
    app,
    create_docs_app,
    documentation_root,
)
from tests.airflow.conftest import failure_text
from tests.conftest import REPO_ROOT

# What a browser does with the Providers page: read the page's <base href>, resolve the provider's
# documentation-url against it, follow that, then follow a page link from the index.
API_SERVER_PROBE = r"""
import json, re, sys
from urllib.parse import urljoin, urlsplit

from fastapi.testclient import TestClient

from airflow import plugins_manager
from airflow.api_fastapi.app import create_app
from airflow.providers_manager import ProvidersManager

base_url = sys.argv[1]
documentation_url = ProvidersManager().providers["airflow-upsert-provider"].data["documentation-url"]
plugins_manager.ensure_plugins_loaded()
plugins, import_errors = plugins_manager._get_plugins()
fastapi_apps, _ = plugins_manager.get_fastapi_plugins()

client = TestClient(create_app(), base_url="{0.scheme}://{0.netloc}".format(urlsplit(base_url)))
providers_page = urljoin(base_url, "providers")
ui = client.get(providers_page)
base_href = re.search(r'<base href="([^"]*)"', ui.text).group(1)
link = urljoin(urljoin(providers_page, base_href), documentation_url)
anonymous = client.get(link)
# Signed in, as the UI is: the session cookie the api-server sets at login.
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
client.cookies.set(COOKIE_NAME_JWT_TOKEN, get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin")))
index = client.get(link)
page_hrefs = re.findall(r'<li><a href="([^"]+)"', index.text)
first_page = client.get(urljoin(link, page_hrefs[0])) if page_hrefs else None
print(json.dumps({
    "documentation_url": documentation_url,
    "plugins": {p.name: str(p.source) for p in plugins},
    "import_errors": import_errors,
    "fastapi_apps": [{"name": a.get("name"), "url_prefix": a.get("url_prefix")} for a in fastapi_apps],
    "link": link,
    "anonymous_status": anonymous.status_code,
    "index": [index.status_code, index.text],
    "page_hrefs": page_hrefs,
    "first_page": [first_page.status_code, first_page.text] if first_page else None,
}))
"""


def _probe_api_server(airflow_home, base_url: str) -> dict:
    env = dict(airflow_home.base_env, AIRFLOW__API__BASE_URL=base_url)
    # As deployed: only the installed distribution. With the source tree on sys.path its
    # *.egg-info would be a second copy of the entry points, and Airflow would report the
    # plugin's second registration as an import error.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != os.path.abspath(REPO_ROOT)
    )
    proc = airflow_home.run([sys.executable, "-c", API_SERVER_PROBE, base_url], env)
    assert proc.returncode == 0, failure_text(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _docs_pages_in_repo() -> list[str]:
    return sorted(Path(p).stem for p in glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))


def _index_links(text: str) -> list[str]:
    return re.findall(r'<li><a href="([^"]+)"', text)


def _strip_tags(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def _signed_in(client: TestClient) -> TestClient:
    # The pages ask Airflow for the signed-in user; these tests are about the pages.
    client.app.dependency_overrides[get_user] = lambda: "test-user"
    return client


@pytest.fixture(scope="module")
def plugin_client() -> TestClient:
    return _signed_in(TestClient(app))


def test_pages_need_a_signed_in_airflow_user():
    anonymous = TestClient(create_docs_app(documentation_root()))
    assert anonymous.get("/docs/").status_code == 401
    assert anonymous.get("/docs/errors").status_code == 401


# --- (a) + (c): Airflow itself, from the installed distribution's metadata and entry points ------


@pytest.mark.parametrize("base_url", ["http://localhost:8080/", "http://localhost:8080/airflow/"],
                         ids=["root", "sub-path"])
def test_providers_page_link_reaches_the_docs_through_the_api_server(airflow_home, base_url):
    found = _probe_api_server(airflow_home, base_url)
    # Provider discovery reads [project.urls] Documentation from the installed metadata.
    assert found["documentation_url"] == DOCUMENTATION_URL == URL_PREFIX.lstrip("/") + INDEX_PATH
    # The plugin manager loaded the plugin from the airflow.plugins entry point of this package.
    assert found["import_errors"] == {}
    assert PLUGIN_NAME in found["plugins"]
    assert found["plugins"][PLUGIN_NAME].startswith("airflow-upsert-provider==")
    assert "group='airflow.plugins'" in found["plugins"][PLUGIN_NAME]
    assert {"name": "airflow-upsert-provider documentation", "url_prefix": URL_PREFIX} in found["fastapi_apps"]
    # Resolved as the browser resolves it, the link stays under the api-server's root path (a
    # leading "/" would leave a sub-path deployment) and the api-server serves the index there.
    assert found["link"] == urljoin(base_url, DOCUMENTATION_URL)
    # Only for a signed-in user, as Airflow's own pages.
    assert found["anonymous_status"] == 401
    status, index = found["index"]
    assert status == 200, index[:2000]
    assert found["page_hrefs"] == ["README", *_docs_pages_in_repo()]
    status, first_page = found["first_page"]
    assert status == 200 and "<h1" in first_page, first_page[:2000]


# --- (b): the plugin's app -------------------------------------------------------------------------


def test_index_lists_the_readme_then_every_docs_page_with_its_title(plugin_client):
    response = plugin_client.get(INDEX_PATH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert _index_links(response.text) == ["README", *_docs_pages_in_repo()]
    for name in _docs_pages_in_repo():
        with open(os.path.join(REPO_ROOT, "docs", f"{name}.md"), encoding="utf-8") as f:
            title = next(line[2:].strip() for line in f if line.startswith("# ")).replace("`", "")
        match = re.search(rf'<a href="{re.escape(name)}">(.*?)</a>', response.text)
        assert match and _strip_tags(match.group(1)) == title


def test_every_page_renders_its_headings_and_no_script(plugin_client):
    for name in ["README", *_docs_pages_in_repo()]:
        response = plugin_client.get(INDEX_PATH + name)
        assert response.status_code == 200, name
        source = os.path.join(REPO_ROOT, "README.md" if name == "README" else f"docs/{name}.md")
        with open(source, encoding="utf-8") as f:
            first_heading = next(line[2:].strip() for line in f if line.startswith("# ")).replace("`", "")
        h1 = re.search(r'<h1 id="[^"]+">(.*?)</h1>', response.text)
        assert h1 and _strip_tags(h1.group(1)) == first_heading, name
        assert "<script" not in response.text.lower()
        assert "script-src" not in response.headers["content-security-policy"]


def test_readme_links_to_docs_pages_lead_to_served_pages(plugin_client):
    page_url = "http://testserver" + INDEX_PATH + "README"
    readme = plugin_client.get(page_url).text
    hrefs = [h for h in re.findall(r'<a href="([^"]+)"', readme) if not urlsplit(h).scheme and h != "./"]
    assert hrefs, "the README links no docs page"
    assert not any(".md" in h for h in hrefs), hrefs
    for href in hrefs:
        target = urljoin(page_url, href)
        assert urlsplit(target).path.startswith(INDEX_PATH), href
        assert plugin_client.get(target).status_code == 200, href


def test_unknown_page_is_404(plugin_client):
    response = plugin_client.get(INDEX_PATH + "no-such-page")
    assert response.status_code == 404
    assert "no-such-page" in response.text


@pytest.mark.parametrize("path", [
    "..%2Fpyproject.toml", "%2E%2E%2Fpyproject.toml", "%2E%2E/pyproject.toml", "../pyproject.toml",
    "%2Fetc%2Fpasswd", "/etc/passwd", "docs%2Ferrors.md", ".%2E%2FREADME.md",
])
def test_path_outside_the_pages_is_refused(plugin_client, path):
    response = plugin_client.get(INDEX_PATH + path)
    assert response.status_code in (400, 404), response.status_code
    assert "[build-system]" not in response.text and "root:" not in response.text


# --- (b): link rewriting and anchors, on pages whose content the test controls --------------------


@pytest.fixture
def sample_client(tmp_path) -> TestClient:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Sample\n\nSee [errors](docs/errors.md), [exit codes](docs/errors.md#exit-codes), "
        "[the DAGs](dags/) and [a site](https://example.com/x.md).\n\n<script>alert(1)</script>\n"
    )
    (tmp_path / "docs" / "errors.md").write_text(
        "# Errors\n\n## Exit codes\n\n## Exit codes\n\nBack to the [README](../README.md), "
        "[same page](#exit-codes), [operator](operator.md#arguments).\n"
    )
    (tmp_path / "docs" / "operator.md").write_text("# `Operator`\n\n## Arguments\n")
    (tmp_path / "docs" / "notes.txt").write_text("not a page")
    return _signed_in(TestClient(create_docs_app(tmp_path)))


def test_relative_links_resolve_to_served_pages_and_anchors(sample_client):
    assert _index_links(sample_client.get(INDEX_PATH).text) == ["README", "errors", "operator"]
    readme = sample_client.get(INDEX_PATH + "README").text
    assert '<a href="errors">errors</a>' in readme
    assert '<a href="errors#exit-codes">exit codes</a>' in readme
    assert '<a href="https://example.com/x.md">' in readme
    # A repository path the api-server does not serve keeps its words, loses the dead link.
    assert '<a href="dags/' not in readme and '<span class="unserved"' in readme and "the DAGs" in readme
    # Raw HTML in the Markdown is shown as text.
    assert "<script>" not in readme and "&lt;script&gt;" in readme

    errors = sample_client.get(INDEX_PATH + "errors").text
    assert '<h2 id="exit-codes">' in errors and '<h2 id="exit-codes-1">' in errors
    assert '<a href="README">README</a>' in errors
    assert '<a href="#exit-codes">' in errors
    assert '<a href="operator#arguments">' in errors
    operator = sample_client.get(INDEX_PATH + "operator").text
    assert '<h2 id="arguments">' in operator
    assert re.search(r'<h1 id="operator"><code>Operator</code></h1>', operator)
    assert sample_client.get(INDEX_PATH + "notes.txt").status_code == 404
    assert sample_client.get(INDEX_PATH + "notes").status_code == 404
