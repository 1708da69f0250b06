"""openapi/openai-subset.v1.yaml is the served contract: a valid OpenAPI 3.1 document whose
routes are exactly the frontend's route tables, whose request schemas carry exactly the fields
the decoders accept, and whose response schemas hold the documents the frontend writes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import jsonschema_rs
import msgspec
import pytest
import schemathesis
import yaml
from aiohttp import web

from frontend.api.app import Services, make_api_app, make_health_app
from frontend.api.drain_gate import DrainGate
from frontend.api.metrics import Metrics
from frontend.core.client import CoreClient
from frontend.openai import requests as types
from frontend.openai import responses as docs
from frontend.openai.validation import MAX_LOGPROBS, MAX_STOP
from frontend.text.served_model import ServedModel
from shared.config import EngineConfig, parse_listen
from shared.errors import ErrorCode, ServingError
from shared.protocol import TokenLogprob, TopLogprob
from tests.conftest import TinyModels
from tests.fixtures.live_server import REPO

DOC_PATH = REPO / "openapi" / "openai-subset.v1.yaml"
METHODS = {"get", "post", "put", "delete", "patch", "head", "options"}
ERROR_STATUSES = {"400", "401", "404", "413", "422", "429", "503"}
HEAD = docs.Head(id="chatcmpl-x", created=1700000000, model="m")
TEXT_HEAD = docs.Head(id="cmpl-x", created=1700000000, model="m")
LOGPROBS = [
    TokenLogprob(token_id=97, logprob=-0.5, top=[TopLogprob(token_id=98, logprob=-1.0)], rank=2)
]


def BYTES(token_id: int) -> bytes:  # noqa: N802 - a constant-like helper
    return bytes([token_id])


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(DOC_PATH.read_text())
    return loaded


def schema_of(doc: dict[str, Any], name: str) -> dict[str, Any]:
    schema: dict[str, Any] = doc["components"]["schemas"][name]
    return schema


def validator(doc: dict[str, Any], name: str) -> Any:
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema_rs.Draft202012Validator(root)


def properties(doc: dict[str, Any], name: str) -> set[str]:
    """Every property a component names, through allOf and $ref."""
    schema = schema_of(doc, name)
    found = set(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        if "$ref" in part:
            found |= properties(doc, part["$ref"].rsplit("/", 1)[1])
        found |= set(part.get("properties", {}))
    return found


def ports_of(doc: dict[str, Any], item: dict[str, Any]) -> set[int]:
    """The ports (server variable defaults) a path is served on."""
    servers = item.get("servers", doc["servers"])
    return {int(s["variables"]["port"]["default"]) for s in servers}


def doc_routes(doc: dict[str, Any], port: int) -> set[tuple[str, str]]:
    return {
        (method.upper(), re.sub(r"\{[^}]*\}", "{}", path))
        for path, item in doc["paths"].items()
        if port in ports_of(doc, item)
        for method in item
        if method in METHODS
    }


def app_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of a route table; the HEAD aiohttp adds beside each GET is not ours."""
    routes = set()
    for route in app.router.routes():
        assert route.resource is not None
        if route.method != "HEAD":
            routes.add((route.method, re.sub(r"\{[^}]*\}", "{}", route.resource.canonical)))
    return routes


@pytest.fixture
async def apps(tiny: TinyModels) -> AsyncIterator[tuple[web.Application, web.Application]]:
    config = EngineConfig(
        model_dir=str(tiny.hf), spawn_core=False, core_address="tcp://127.0.0.1:1"
    )
    core = CoreClient(config.resolved_core_address)
    model = ServedModel.load(config.model_path, config.served_model_ids)
    services = Services(config, model, core, DrainGate(), Metrics(), None)
    yield make_api_app(services), make_health_app(services)
    await core.close()


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1.")
    schema = schemathesis.openapi.from_dict(doc)
    schema.validate()
    labels = {result.ok().label for result in schema.get_all_operations()}
    assert len(labels) == 16


def test_servers_are_the_default_listen_ports(doc: dict[str, Any]) -> None:
    config = EngineConfig()
    api, health = parse_listen(config.http_listen)[1], parse_listen(config.health_listen)[1]
    assert ports_of(doc, {}) == {api}
    assert ports_of(doc, doc["paths"]["/healthz"]) == {api, health}
    assert (
        ports_of(doc, doc["paths"]["/readyz"])
        == ports_of(doc, doc["paths"]["/metrics"])
        == {health}
    )


async def test_routes_are_the_route_tables(
    doc: dict[str, Any], apps: tuple[web.Application, web.Application]
) -> None:
    api, health = apps
    assert app_routes(api) == doc_routes(doc, 8000)
    assert app_routes(health) == doc_routes(doc, 9464)
    assert ("POST", "/v1/chat/completions") in app_routes(api)  # the helpers see real routes


@pytest.mark.parametrize(
    ("struct", "component"),
    [
        (types.ChatCompletionRequest, "ChatCompletionRequest"),
        (types.CompletionRequest, "CompletionRequest"),
        (types.EmbeddingRequest, "EmbeddingRequest"),
        (types.TokenizeRequest, "TokenizeRequest"),
        (types.DetokenizeRequest, "DetokenizeRequest"),
        (types.ChatMessage, "ChatMessage"),
        (types.TextPart, "TextPart"),
        (types.StreamOptions, "StreamOptions"),
        (docs.ChatCompletion, "ChatCompletion"),
        (docs.ChatCompletionChunk, "ChatCompletionChunk"),
        (docs.TextCompletion, "TextCompletion"),
        (docs.EmbeddingList, "EmbeddingList"),
        (docs.ModelList, "ModelList"),
        (docs.ModelEntry, "Model"),
        (docs.TokenizeResponse, "TokenizeResponse"),
        (docs.DetokenizeResponse, "DetokenizeResponse"),
        (docs.Usage, "Usage"),
    ],
)
def test_schema_fields_are_the_struct_fields(
    doc: dict[str, Any], struct: type[msgspec.Struct], component: str
) -> None:
    assert properties(doc, component) == set(struct.__struct_fields__)


def test_required_request_fields(doc: dict[str, Any]) -> None:
    for component, struct in (
        ("ChatCompletionRequest", types.ChatCompletionRequest),
        ("CompletionRequest", types.CompletionRequest),
        ("EmbeddingRequest", types.EmbeddingRequest),
        ("TokenizeRequest", types.TokenizeRequest),
        ("DetokenizeRequest", types.DetokenizeRequest),
    ):
        schema = schema_of(doc, component)
        parts = [schema, *schema.get("allOf", [])]
        required = {field for part in parts for field in part.get("required", [])}
        assert required == {f.name for f in msgspec.structs.fields(struct) if f.required}


def test_ranges_are_the_validators(doc: dict[str, Any]) -> None:
    sampling = schema_of(doc, "SamplingFields")["properties"]
    assert (sampling["temperature"]["minimum"], sampling["temperature"]["maximum"]) == (0, 2)
    assert (sampling["top_p"]["exclusiveMinimum"], sampling["top_p"]["maximum"]) == (0, 1)
    (array,) = [s for s in schema_of(doc, "Stop")["anyOf"] if s.get("type") == "array"]
    assert array["maxItems"] == MAX_STOP
    chat = schema_of(doc, "ChatCompletionRequest")["allOf"][1]["properties"]
    assert chat["max_tokens"]["minimum"] == chat["max_completion_tokens"]["minimum"] == 1
    assert chat["top_logprobs"]["maximum"] == MAX_LOGPROBS
    completion = schema_of(doc, "CompletionRequest")["allOf"][1]["properties"]
    assert completion["logprobs"]["maximum"] == MAX_LOGPROBS
    priority = doc["components"]["parameters"]["Priority"]
    assert (priority["name"], priority["schema"]["minimum"], priority["schema"]["maximum"]) == (
        "X-TL-Priority",
        -100,
        100,
    )


def test_error_schema_is_the_error_vocabulary(doc: dict[str, Any]) -> None:
    inner = schema_of(doc, "Error")["properties"]["error"]
    assert set(inner["required"]) == {"message", "type", "param", "code"}
    assert set(inner["properties"]["code"]["enum"]) == {code.value for code in ErrorCode}
    types_ = {ServingError(code, "").error_type for code in ErrorCode}
    assert set(inner["properties"]["type"]["enum"]) == types_
    check = validator(doc, "Error")
    for code in ErrorCode:
        assert check.is_valid(ServingError(code, "m", None).to_document())
        assert check.is_valid(ServingError(code, "m", "temperature").to_document())


def test_api_operations_document_the_pinned_error_statuses(doc: dict[str, Any]) -> None:
    responses = doc["components"]["responses"]
    assert "Retry-After" in responses["RateLimited"]["headers"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        documented = doc["paths"][path]["post"]["responses"]
        assert set(documented) >= ERROR_STATUSES | {"200"}
        assert documented["429"] == {"$ref": "#/components/responses/RateLimited"}
    for item in doc["paths"].values():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            for status, response in operation["responses"].items():
                if "$ref" in response:
                    response = responses[response["$ref"].rsplit("/", 1)[1]]
                assert "X-Request-Id" in response["headers"], (method, status)
                probe = "Readiness" in str(response) or "Liveness" in str(response)
                if int(status) >= 400 and not probe:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}


@pytest.mark.parametrize(
    ("component", "document"),
    [
        (
            "ChatCompletion",
            docs.chat_completion(HEAD, [docs.chat_choice(0, "hi", "stop")], docs.usage(3, 1, 2)),
        ),
        (
            "ChatCompletion",
            docs.chat_completion(
                HEAD,
                [
                    docs.chat_choice(0, "a", "length", docs.chat_logprobs(LOGPROBS, BYTES)),
                    docs.chat_choice(1, "b", "stop", docs.chat_logprobs(LOGPROBS, BYTES)),
                ],
                docs.usage(3, 2),
                docs.prompt_logprobs(LOGPROBS, BYTES, 1),
            ),
        ),
        ("ChatCompletionChunk", docs.chat_role_chunk(HEAD, 1)),
        ("ChatCompletionChunk", docs.chat_chunk(HEAD, "x")),
        ("ChatCompletionChunk", docs.chat_chunk(HEAD, "x", index=2, usage=docs.usage(1, 1))),
        ("ChatCompletionChunk", docs.chat_chunk(HEAD, None, "stop")),
        ("ChatCompletionChunk", docs.chat_usage_chunk(HEAD, docs.usage(1, 2))),
        (
            "TextCompletion",
            docs.text_completion(
                TEXT_HEAD, [docs.text_choice(0, "x", "length"), docs.text_choice(1, "y", "stop")]
            ),
        ),
        ("TextCompletion", docs.text_completion(TEXT_HEAD, [docs.text_choice(0, "x", None)])),
        (
            "TextCompletion",
            docs.text_completion(
                TEXT_HEAD,
                [
                    docs.text_choice(
                        0,
                        "a",
                        "stop",
                        docs.completion_logprobs(LOGPROBS, BYTES, first_token=5, top_n=1),
                        docs.prompt_logprobs(LOGPROBS, BYTES, 0),
                    )
                ],
                docs.usage(1, 1),
            ),
        ),
        ("TextCompletion", docs.text_usage_chunk(TEXT_HEAD, docs.usage(1, 1))),
        ("EmbeddingList", docs.embedding_list("m", [[0.6, 0.8]], None, 2)),
        ("EmbeddingList", docs.embedding_list("m", [[0.6, 0.8], [1.0, 0.0]], "base64", 3)),
        (
            "ModelList",
            docs.model_list(
                [
                    docs.ModelEntry(id=i, created=1, owned_by="tl-serve", max_model_len=8)
                    for i in "ab"
                ]
            ),
        ),
        ("TokenizeResponse", docs.TokenizeResponse(tokens=[1, 2], count=2, max_model_len=8)),
        (
            "TokenizeResponse",
            docs.TokenizeResponse(tokens=[1], count=1, max_model_len=8, token_strs=["a"]),
        ),
        ("DetokenizeResponse", docs.DetokenizeResponse(prompt="ab")),
    ],
)
def test_written_documents_match_their_schemas(
    doc: dict[str, Any], component: str, document: msgspec.Struct
) -> None:
    wire = msgspec.json.decode(msgspec.json.encode(document))
    check = validator(doc, component)
    assert check.is_valid(wire), list(check.iter_errors(wire))[:3]


def test_schemas_refuse_what_the_server_refuses(doc: dict[str, Any]) -> None:
    """Spot checks that the request schemas are not looser than the validators."""
    chat = validator(doc, "ChatCompletionRequest")
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert chat.is_valid(ok)
    assert chat.is_valid(ok | {"messages": [{"role": "assistant"}]})
    for bad in (
        {"temperature": 2.5},
        {"top_p": 0},
        {"max_tokens": 0},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"n": 129},
        {"echo": True},
        {"logit_bias": {"x": 1}},
        {"logit_bias": {"1": 101}},
        {"min_tokens": -1},
        {"priority": 101},
        {"cache_salt": ""},
        {"prompt_logprobs": 1, "stream": True},
        {"chat_template_kwargs": {"tools": []}},
        {"tools": []},
        {"top_logprobs": 2},
        {"messages": []},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
    ):
        assert not chat.is_valid(ok | bad), bad
    tokenize = validator(doc, "TokenizeRequest")
    assert tokenize.is_valid({"model": "m", "prompt": ""})
    assert not tokenize.is_valid({"model": "m"})
    assert not tokenize.is_valid({"model": "m", "prompt": "a", "messages": ok["messages"]})
    completion = validator(doc, "CompletionRequest")
    assert completion.is_valid({"model": "m", "prompt": [[1, 2]]})
    assert completion.is_valid({"model": "m", "prompt": ["a", "b"], "n": 3})
    assert completion.is_valid({"model": "m", "prompt": "a", "echo": True, "max_tokens": 0})
    assert not completion.is_valid({"model": "m", "prompt": "a", "max_tokens": 0})
    assert not completion.is_valid({"model": "m", "prompt": ""})
    assert not completion.is_valid({"model": "m", "prompt": ["a", ""]})
