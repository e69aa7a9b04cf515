"""The label action's URL from the forms an Airflow connection comes in."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from triage.operators.classify_documents import label_action_url


def conn(**fields: Any) -> SimpleNamespace:
    base = {"conn_type": "http", "host": None, "port": None, "schema": None, "extra_dejson": {}}
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        ({"host": "http://127.0.0.1:9000/labels"}, "http://127.0.0.1:9000/labels"),  # JSON form, whole URL
        ({"host": "h.example", "port": 8000, "schema": "labels"}, "http://h.example:8000/labels"),  # URI form
        ({"conn_type": "https", "host": "h.example", "schema": "v1/labels"}, "https://h.example/v1/labels"),
        ({"host": "h.example", "schema": "https", "extra_dejson": {"scheme": "https", "path": "/labels"}},
         "https://h.example/labels"),
        ({"host": "h.example"}, "http://h.example"),
    ],
)  # fmt: skip
def test_label_action_url(fields: dict[str, Any], url: str) -> None:
    assert label_action_url(conn(**fields)) == url
