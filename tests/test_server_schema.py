"""schemathesis against the running server's own OpenAPI schema: for every endpoint of every head,
generated requests (valid and invalid) get no 5xx, answers that match the schema, and the server is
still healthy afterwards. The examples are few and their seed fixed; the load test is in test_load.py."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.checks import positive_data_acceptance  # noqa: E402
from server_utils import call, running_server  # noqa: E402

HEADS = ["classifier", "tagger", "reader", "masked"]
# 413 is TEI's status for a request over a limit (--max-texts, --max-chars, or more tokens than the model
# reads), so it is a right answer to an invalid request. A schema-valid request may get it too: how many
# tokens a text makes, and --max-chars for a text that is not to be truncated, are rules JSON Schema cannot state.
CONFIG = SchemathesisConfig.from_dict({"checks": {
    "negative_data_rejection": {"expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]},
    "positive_data_acceptance": {"expected-statuses": ["2xx", 401, 403, 404, 409, 413, 429]}}})
PORTS: dict[str, int] = {}


@pytest.fixture(scope="module", params=HEADS)
def api(request, checkpoints):
    flags = ("--max-texts", "8", "--max-chars", "300", "--max-body-bytes", "20000")
    with running_server(checkpoints[request.param], *flags) as (port, _):
        PORTS[request.param] = port
        yield schemathesis.openapi.from_url(f"http://127.0.0.1:{port}/openapi.json", config=CONFIG)
        status, body = call(port, "/health")  # still serving after everything schemathesis sent
        assert status == 200 and body["status"] == "ok"


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_api_conforms_to_its_schema(case):
    excluded = []
    body = case.body if isinstance(case.body, dict) else {}
    if case.path == "/classify" and isinstance(body.get("text_pairs"), list) and isinstance(body.get("texts"), list) \
            and len(body["text_pairs"]) != len(body["texts"]):
        # "as many pairs as texts" is the one rule JSON Schema cannot state; the server refuses it (422)
        excluded.append(positive_data_acceptance)
    parameters = body.get("parameters") if isinstance(body.get("parameters"), dict) else {}
    if parameters.get("max_seq_len") or parameters.get("doc_stride") or parameters.get("targets"):
        # QA's window must hold the question, the stride and some context (a rule across fields), and a fill-mask
        # target must be one token of the vocabulary: rules JSON Schema cannot state (422 when broken)
        excluded.append(positive_data_acceptance)
    if any(v is not None and body.get(k) is not None and body[k] != v for k, v in parameters.items()):
        # a feature-extraction setting given at the top level and in `parameters` with two values is refused (422)
        excluded.append(positive_data_acceptance)
    pairs = (("dimensions", "output_dimension"), ("truncate", "truncation"), ("task", "input_type"),
             ("embedding_type", "output_dtype"), ("encoding_format", "embedding_type"), ("encoding_format", "output_dtype"))
    if case.path.endswith("/embeddings") and any(body.get(a) is not None and body.get(b) is not None
                                                 and body[a] != body[b] for a, b in pairs):
        # one setting under Jina's, Voyage's and OpenAI's names, given twice with two values (400)
        excluded.append(positive_data_acceptance)
    case.call_and_validate(timeout=60, excluded_checks=excluded)
