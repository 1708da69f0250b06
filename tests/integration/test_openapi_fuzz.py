"""Every operation of openapi/openai-subset.v1.yaml, fuzzed by schemathesis against a live
server (real frontend + real core, tiny model): generated valid and malformed input, a bounded
number of cases. No 5xx, no hang, every error is the OpenAI error document, every response
matches the document, and the server still serves afterwards."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case, GenerationMode, Response
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

from tests.conftest import TinyModels
from tests.fixtures.live_server import REPO, LiveServer, default_engine, live_server

pytestmark = pytest.mark.integration

DOC_PATH = REPO / "openapi" / "openai-subset.v1.yaml"
MODEL_ID = "tiny"
MAX_EXAMPLES = 100  # per operation and generation mode: ~1000 cases, ~15 s
REQUEST_TIMEOUT_S = 30.0  # a hang fails the test: no request may take this long
# schemathesis stops reading an event stream after 20 events (and closes the connection): a
# longer stream then looked truncated. The short context bounds every stream far below this.
MAX_STREAM_EVENTS = 1000
MAX_BODY = 65536
GENERATED = {("POST /v1/chat/completions", "200"), ("POST /v1/completions", "200")}
ERROR_KEYS = {"message", "type", "param", "code"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,  # JSON bodies, and each SSE event's data (contentSchema)
]
CHUNK_SCHEMAS = {"/v1/chat/completions": "ChatCompletionChunk", "/v1/completions": "TextCompletion"}


def load_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(DOC_PATH.read_text())
    return doc


def component_validator(doc: dict[str, Any], name: str) -> Any:
    """A JSON Schema validator for components.schemas[name], its $refs resolved in `doc`."""
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema_rs.Draft202012Validator(root)


def load_schema(doc: dict[str, Any]) -> Any:
    """The document as schemathesis reads it: every event stream read to its end."""
    config = SchemathesisConfig.from_dict({"max-stream-events": MAX_STREAM_EVENTS})
    return schemathesis.openapi.from_dict(doc, config=config)


def has_body(operation: APIOperation) -> bool:
    """Something to make malformed. (The one path parameter's only malformed value, "", makes
    no URL: schemathesis can generate no negative case for it.)"""
    return bool(operation.get_request_payload_content_types())


@pytest.fixture(scope="module")
def server(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # a short context bounds every generation: fuzzed max_tokens cannot make a case slow
    engine = default_engine(tiny.hf, model_id=MODEL_ID, max_model_len=96, max_body_bytes=MAX_BODY)
    with live_server(tmp_path_factory.mktemp("fuzz"), engine) as live:
        yield live


class Fuzzer:
    """Runs generated cases against the live server; counts outcomes, keeps what went wrong."""

    def __init__(self, server: LiveServer, doc: dict[str, Any]) -> None:
        self.server = server
        self.session = requests.Session()
        self.failures: list[str] = []
        # (operation, mode, "status code (param)") -> cases
        self.outcomes: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.error_doc = component_validator(doc, "Error")
        self.chunk_docs = {path: component_validator(doc, n) for path, n in CHUNK_SCHEMAS.items()}

    @property
    def cases(self) -> int:
        return sum(self.outcomes.values())

    def base_urls(self, operation: APIOperation) -> list[str]:
        """The document's servers: /healthz on both ports, /readyz and /metrics on health."""
        api, health = self.server.api, self.server.health
        on_health = {"/healthz": [api, health], "/readyz": [health], "/metrics": [health]}
        return on_health.get(operation.path, [api])

    def run(self, operation: APIOperation, mode: GenerationMode) -> None:
        positive = mode is GenerationMode.POSITIVE
        # valid cases name the served model 3 times in 4, so most get past the model check
        served_model = st.sampled_from([True, True, True, False])

        @given(case=operation.as_strategy(generation_mode=mode), served=served_model)
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.generate],  # no shrinking: failures are collected, not minimized
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Case, served: bool) -> None:
            if positive and served:
                serve_model(case)
            for base_url in self.base_urls(operation):
                self.call(case, base_url, mode)

        fuzz()

    def call(self, case: Case, base_url: str, mode: GenerationMode) -> None:
        positive = mode is GenerationMode.POSITIVE
        label = f"{case.operation.label} [{mode.value}] at {base_url}"
        t0 = time.monotonic()
        try:
            response = case.call(base_url=base_url, session=self.session, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as e:
            self.failures.append(f"{label}: {e!r} after {time.monotonic() - t0:.1f} s\n{case!r}")
            return
        problems = self.shape_problems(case, response)
        if response.stream_cut_short:  # not read to its end: what it lacks cannot be told
            problems.append(
                f"event stream not read to its end ({MAX_STREAM_EVENTS} events, "
                f"{REQUEST_TIMEOUT_S:g} s)"
            )
        outcome = str(response.status_code)
        if response.status_code >= 400 and not problems:
            error = response.json()["error"]
            outcome += f" {error['code']}" + (f" ({error['param']})" if positive else "")
        self.outcomes[(case.operation.label, mode.value, outcome)] += 1
        too_large = response.status_code == 413
        if too_large and len(json.dumps(case.body, default=str).encode()) <= MAX_BODY:
            problems.append(f"413 for a body within max_body_bytes ({MAX_BODY})")
        # a body over max_body_bytes is refused before it is read, with 413 whatever it holds:
        # the right answer, though not one of the statuses negative_data_rejection expects
        checks = CHECKS if positive or too_large else [*CHECKS, negative_data_rejection]
        try:
            case.validate_response(response, checks=checks)
        except (AssertionError, FailureGroup) as e:
            problems.append(str(e))
        if problems:
            self.failures.append(
                f"{label} -> {response.status_code} {response.text[:400]!r}\n"
                f"request body: {case.body!r:.400}\nheaders: {case.headers}\n" + "\n".join(problems)
            )

    def shape_problems(self, case: Case, response: Response) -> list[str]:
        """What we check ourselves: the error shape of every non-2xx, every SSE event."""
        problems = []
        if response.status_code >= 500:
            problems.append(f"server error {response.status_code}")
        if response.status_code >= 400:
            try:
                document = response.json()
            except ValueError:
                return [*problems, "an error response that is not JSON"]
            if not (isinstance(document, dict) and set(document.get("error", {})) == ERROR_KEYS):
                problems.append(f"not the OpenAI error shape: {document!r:.200}")
            elif not self.error_doc.is_valid(document):
                problems.append(f"error document off the schema: {document!r:.200}")
        content_type = response.headers.get("content-type", [""])[0]
        if content_type.startswith("text/event-stream"):
            problems += self.stream_problems(case.operation.path, response.text)
        return problems

    def stream_problems(self, path: str, body: str) -> list[str]:
        """Every event is a chunk; the stream ends with [DONE], or with one error event."""
        events = [e for e in body.split("\n\n") if e and not e.startswith(":")]
        if not body.endswith("\n\n") or not all(e.startswith("data: ") for e in events):
            return [f"not an event stream: {body[:200]!r}"]
        data = [e[len("data: ") :] for e in events]
        if data[-1] == "[DONE]":
            chunks = data[:-1]
        else:
            *chunks, last = data
            if not self.error_doc.is_valid(json.loads(last)):
                return [f"a stream ending neither in [DONE] nor an error: {last[:200]!r}"]
        ids = {json.loads(c)["id"] for c in chunks}
        problems = [f"{len(ids)} ids in one stream"] if len(ids) != 1 else []
        validator = self.chunk_docs[path]
        return problems + [
            f"chunk off the schema: {c[:200]}"
            for c in chunks
            if not validator.is_valid(json.loads(c))
        ]

    def summary(self) -> str:
        lines = [f"{self.cases} cases:"]
        for (label, mode, outcome), n in sorted(self.outcomes.items()):
            lines.append(f"  {label:28} {mode:8} {outcome}: {n}")
        return "\n".join(lines)


def serve_model(case: Case) -> None:
    """Name the served model, so a valid case gets past the model check into generation."""
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL_ID
    if "model" in (case.path_parameters or {}):
        case.path_parameters = {**case.path_parameters, "model": MODEL_ID}


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]} | fields


def post(url: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(url, json=body, timeout=REQUEST_TIMEOUT_S)


def test_fuzz_every_operation(server: LiveServer, record_property: Any) -> None:
    doc = load_doc()
    fuzzer = Fuzzer(server, doc)
    operations = [result.ok() for result in load_schema(doc).get_all_operations()]
    assert len(operations) == 16
    t0 = time.monotonic()
    for operation in operations:
        fuzzer.run(operation, GenerationMode.POSITIVE)
        if has_body(operation):
            fuzzer.run(operation, GenerationMode.NEGATIVE)
    print(f"\nopenapi fuzz: {fuzzer.summary()}\nin {time.monotonic() - t0:.1f} s")
    record_property("openapi_fuzz_cases", fuzzer.cases)
    shown = "\n\n".join(fuzzer.failures[:6])
    assert not fuzzer.failures, (
        f"{len(fuzzer.failures)} of {fuzzer.cases} cases failed:\n{shown}\n\n"
        f"server log, last lines:\n{server.log()[-4000:]}"
    )
    # the cases reached generation itself, not only the validation in front of it
    generated = sum(n for (op, _, out), n in fuzzer.outcomes.items() if (op, out) in GENERATED)
    assert generated >= 50, fuzzer.summary()
    assert "Traceback" not in server.log(), server.log()[-3000:]

    # still serving: a plain chat request, whole and streamed
    reply = post(server.api + "/v1/chat/completions", chat_body(max_tokens=4, temperature=0))
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] in {"stop", "length"}
    streamed = post(server.api + "/v1/chat/completions", chat_body(max_tokens=4, stream=True))
    assert streamed.status_code == 200
    assert streamed.text.endswith("data: [DONE]\n\n")


def test_a_long_stream_is_read_to_its_end(server: LiveServer) -> None:
    """Once a flake of the fuzz run: schemathesis cut streams of more than 20 events short (and closed
    the connection: the frontend logged "client went away"), so a long generation looked like
    a stream that ended after a content chunk with neither [DONE] nor an error event."""
    doc = load_doc()
    fuzzer = Fuzzer(server, doc)
    [chat] = [
        result.ok()
        for result in load_schema(doc).get_all_operations()
        if result.ok().path == "/v1/chat/completions"
    ]
    body = chat_body(max_tokens=60, ignore_eos=True, temperature=0, stream=True)
    fuzzer.call(
        chat.Case(body=body, media_type="application/json"), server.api, GenerationMode.POSITIVE
    )
    assert not fuzzer.failures, fuzzer.failures
    assert fuzzer.outcomes == {("POST /v1/chat/completions", "positive", "200"): 1}


def test_every_document_example_is_served(server: LiveServer) -> None:
    """The request examples in the document succeed as written (but for the model id)."""
    doc = load_doc()
    examples = {
        path: item["post"]["requestBody"]["content"]["application/json"]["example"]
        for path, item in doc["paths"].items()
        if "requestBody" in item.get("post", {})
    }
    assert len(examples) == 7
    for path, example in examples.items():
        reply = post(server.api + path, example | {"model": MODEL_ID})
        assert reply.status_code == 200, (path, reply.text)


@pytest.mark.parametrize(
    "fields",
    [{"top_k": 2**70}, {"stop_token_ids": [5, 2**70]}, {"top_k": 2**63, "stop_token_ids": [2**64]}],
)
def test_integers_beyond_64_bits_are_served(server: LiveServer, fields: dict[str, Any]) -> None:
    """Found by the fuzzer: these were 500s (the Submit to the core could not be encoded)."""
    for path, body in (
        ("/v1/chat/completions", chat_body(max_tokens=2)),
        ("/v1/completions", {"model": MODEL_ID, "prompt": "a", "max_tokens": 2}),
    ):
        reply = post(server.api + path, body | fields)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1


TOO_LARGE = b'{"input": "' + b"a" * MAX_BODY + b'"}'


@pytest.mark.parametrize(
    "refusal",
    [
        ("api", "GET", "/v1/chat/completions", None, 405, "method_not_allowed"),
        ("api", "DELETE", "/v1/models", None, 405, "method_not_allowed"),
        ("api", "GET", "/v1/nothing", None, 404, "not_found"),
        ("api", "POST", "/v1/completions", b"{not json", 400, "invalid_json"),
        ("api", "POST", "/v1/embeddings", TOO_LARGE, 413, "request_too_large"),
        ("health", "GET", "/v1/models", None, 404, "not_found"),
        ("health", "POST", "/readyz", None, 405, "method_not_allowed"),
    ],
)
def test_refusals_outside_the_operations_are_openai_errors(
    server: LiveServer, refusal: tuple[str, str, str, bytes | None, int, str]
) -> None:
    """What no operation of the document generates: wrong methods and routes, broken bodies."""
    port, method, path, body, status, code = refusal
    base = server.api if port == "api" else server.health
    reply = requests.request(method, base + path, data=body, timeout=REQUEST_TIMEOUT_S)
    assert reply.status_code == status, reply.text
    assert reply.headers["X-Request-Id"]
    error = reply.json()["error"]
    assert set(error) == ERROR_KEYS
    assert (error["code"], error["type"]) == (code, "invalid_request_error")
    if status == 405:
        assert reply.headers["Allow"]
