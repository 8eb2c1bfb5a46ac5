"""The server renders answers with json.dumps instead of FastAPI's jsonable_encoder walk: the bytes must not change."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("fastapi")
from fastapi.encoders import jsonable_encoder  # noqa: E402
from fastapi.responses import JSONResponse, Response  # noqa: E402

from bertforge.server.apis.common import rendered  # noqa: E402


@pytest.mark.parametrize("content", [
    {"object": "list", "data": [{"index": 0, "embedding": [0.1, -2.5e-8, 3.0, 1e300]}], "model": "é 中 🙂"},
    [[1.0, 2.0], [3.5]],
    [{"index": 3, "value": 0.25}, {"index": 7, "value": 1 / 3}],
    {"tuple": (1, 2), "none": None, "bool": True, 1: "an int key"},
    {"set": {3}, "path": __import__("pathlib").PurePosixPath("a/b")},  # not plain JSON: jsonable_encoder first
    "text",
])
def test_rendered_bytes_equal_fastapis(content):
    got = rendered(content)
    assert got.media_type == "application/json" and got.status_code == 200
    assert got.body == JSONResponse(jsonable_encoder(content)).body


def test_nan_is_refused_as_fastapi_refuses_it_and_responses_pass_through():
    with pytest.raises(ValueError):
        JSONResponse(jsonable_encoder([math.nan]))
    with pytest.raises(ValueError):
        rendered([math.nan])
    response = Response(b"x", media_type="text/plain")
    assert rendered(response) is response
