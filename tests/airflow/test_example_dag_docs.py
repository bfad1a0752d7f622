"""The example DAGs' docs (doc_md) link the documentation pages they mention to the served docs
(pure: the DAG files' docstrings are read with ast, nothing is imported)."""

from __future__ import annotations

import ast
import glob
import os
import re

from airflow_upsert_provider.operators.params import DOCS_HREF
from tests.conftest import REPO_ROOT

MENTION = re.compile(r"docs/([a-z0-9-]+)\.md")
LINK = re.compile(r"\[([^\]]*)\]\(([^)]*)\)")


def _doc_md(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return ast.get_docstring(ast.parse(handle.read())) or ""


def test_every_docs_page_a_dag_doc_mentions_is_a_link_to_the_served_page():
    checked = 0
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "dags", "*.py"))):
        doc = _doc_md(path)
        linked = set()
        for text, target in LINK.findall(doc):
            for page in MENTION.findall(text):
                assert target.split("#")[0] == DOCS_HREF + page, (path, text, target)
                assert os.path.exists(os.path.join(REPO_ROOT, "docs", f"{page}.md")), (path, page)
                linked.add(page)
                checked += 1
        # Every mention outside a link's words is a link too.
        bare = MENTION.findall(LINK.sub("", doc))
        assert not bare, (path, bare)
    assert checked >= 3
