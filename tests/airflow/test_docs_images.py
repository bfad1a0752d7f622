"""The served documentation shows its images: docs/img/* with their content type."""

from __future__ import annotations

from urllib.parse import urljoin

from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_upsert_provider.plugins.docs import INDEX_PATH, create_docs_app, documentation_root

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def _signed_in(client: TestClient) -> TestClient:
    client.app.dependency_overrides[get_user] = lambda: "test-user"
    return client


def test_the_ui_page_screenshot_is_served_as_a_png():
    client = _signed_in(TestClient(create_docs_app(documentation_root())))
    page = client.get(INDEX_PATH + "ui")
    assert page.status_code == 200
    assert '<img src="img/ui.png"' in page.text
    # What the browser asks for: the src resolved against the page's own URL.
    image = client.get(urljoin(INDEX_PATH + "ui", "img/ui.png"))
    assert image.status_code == 200, image.text
    assert image.headers["content-type"] == "image/png"
    assert image.content.startswith(b"\x89PNG")


def test_images_resolve_from_every_page_and_only_docs_img_is_served(tmp_path):
    (tmp_path / "docs" / "img").mkdir(parents=True)
    (tmp_path / "docs" / "img" / "shot.png").write_bytes(PNG)
    (tmp_path / "docs" / "img" / "notes.txt").write_text("not an image")
    (tmp_path / "docs" / "secret.png").write_bytes(PNG)
    (tmp_path / "README.md").write_text("# R\n\n![shot](docs/img/shot.png) ![gone](dags/x.png)\n")
    (tmp_path / "docs" / "page.md").write_text("# P\n\n![shot](img/shot.png) ![far](https://example.com/a.png)\n")
    client = _signed_in(TestClient(create_docs_app(tmp_path)))

    readme = client.get(INDEX_PATH + "README").text
    assert '<img src="img/shot.png" alt="shot"' in readme
    # An image the api-server does not serve keeps its alt text, not a broken image.
    assert "dags/x.png" not in readme and "gone" in readme
    page = client.get(INDEX_PATH + "page").text
    assert '<img src="img/shot.png" alt="shot"' in page and '<img src="https://example.com/a.png"' in page

    served = client.get(INDEX_PATH + "img/shot.png")
    assert (served.status_code, served.headers["content-type"], served.content) == (200, "image/png", PNG)
    assert client.get(INDEX_PATH + "img/notes.txt").status_code == 404
    assert client.get(INDEX_PATH + "img/missing.png").status_code == 404
    assert client.get(INDEX_PATH + "img/..%2Fsecret.png").status_code in (400, 404)


def test_images_need_a_signed_in_airflow_user():
    assert TestClient(create_docs_app(documentation_root())).get(INDEX_PATH + "img/ui.png").status_code == 401
