"""OpenAI clients work unchanged: the official `openai` package, pointed at an
endpoint's base URL on a real HTTP server in front of mtc, with an mtc API token as
its key, lists the model, completes, chats and streams (tokens as they are made) from
an in-process replica. Also: Bearer auth, errors before and after the first byte."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from rest_framework.test import APIClient

from clusters.models import Cluster
from mtc.tokens import token_create
from serving import routing
from serving.models import Endpoint, Replica

from .conftest import make_spec
from .test_serving_support import (
    redis_forget_serving,
    replica_server,
    tiny_model_dir,
    version_make,
)

__all__ = ["replica_server", "tiny_model_dir"]  # fixtures these tests use
TOKEN_DELAY_S = 0.05  # each forward pass, slowed so "as they arrive" can be seen


def replica_add(endpoint: Endpoint, number: int, host: str, port: int) -> Replica:
    return Replica.objects.create(
        endpoint=endpoint, number=number, state="READY", host=host, port=port, run_dir="/none"
    )


@pytest.fixture(autouse=True)
def replicas_in_this_process(monkeypatch):
    """The replicas here are servers in the test's own process (mtc's uid), standing in
    for the endpoint owner's jobs: the owner check before a token is sent
    (serving.transport) expects mtc's uid, as for mtc's own endpoints."""
    from serving import selectors

    monkeypatch.setattr(selectors, "account_for", lambda *, user: None)


@pytest.fixture
def endpoint(transactional_db, replica_server, tiny_model_dir, user) -> Endpoint:
    redis_forget_serving()
    server, token = replica_server
    cluster = Cluster.objects.create(
        cluster_id="so", spec=make_spec("so", nodes=1), state="RUNNING"
    )
    endpoint = Endpoint.objects.create(
        name="tiny-1",
        owner=user,
        version=version_make(tiny_model_dir),
        cluster=cluster,
        chat=True,
        replica_token=token,
        state="READY",
    )
    replica_add(endpoint, 1, *server.server_address[:2])
    return endpoint


@pytest.fixture
def api_key(user) -> str:
    return token_create(user=user)[1]


@pytest.fixture
def client(live_server, endpoint, api_key) -> Iterator[openai.OpenAI]:
    # Closed after the test: a kept-alive connection holds a live-server thread, and
    # with it that thread's database connection, past the test.
    with openai.OpenAI(
        base_url=f"{live_server.url}/api/v1/endpoints/{endpoint.pk}",
        api_key=api_key,
        max_retries=0,
        timeout=60,
    ) as client:
        yield client


@pytest.fixture
def slow_tokens(replica_server):
    """Each token takes TOKEN_DELAY_S: a buffered answer would arrive all at once."""
    model = replica_server[0].generator.model
    handle = model.register_forward_hook(lambda *args: time.sleep(TOKEN_DELAY_S))
    yield
    handle.remove()


def test_models_list_and_retrieve(client, endpoint):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny@1"]
    model = models.data[0]
    assert model.object == "model" and model.owned_by == "uma" and model.created > 0
    assert client.models.retrieve("tiny@1").id == "tiny@1"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other@2")


def test_completion_stream_matches_the_whole_answer(client, slow_tokens):
    args = {"model": "tiny@1", "prompt": "hello world", "max_tokens": 12, "temperature": 0}
    whole = client.completions.create(**args)
    assert whole.object == "text_completion" and whole.model == "tiny@1"
    assert whole.usage.completion_tokens == 12

    texts, arrivals, finish = [], [], None
    stream = client.completions.create(**args, stream=True)
    for chunk in stream:
        assert chunk.object == "text_completion" and chunk.id.startswith("cmpl-")
        if chunk.choices[0].text:
            texts.append(chunk.choices[0].text)
            arrivals.append(time.monotonic())
        finish = chunk.choices[0].finish_reason or finish
    assert len(texts) > 1, texts
    assert "".join(texts) == whole.choices[0].text
    assert finish == whole.choices[0].finish_reason == "length"
    # Relayed as generated: the first token came well before the last was made.
    assert arrivals[-1] - arrivals[0] >= 5 * TOKEN_DELAY_S, arrivals


def test_chat_stream_matches_the_whole_answer(client, slow_tokens):
    args = {
        "model": "tiny@1",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**args)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"

    chunks = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(deltas) > 1, deltas
    assert "".join(deltas) == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason


def test_bearer_and_token_auth(live_server, endpoint, api_key):
    bad = openai.OpenAI(
        base_url=f"{live_server.url}/api/v1/endpoints/{endpoint.pk}",
        api_key="not-a-key",
        max_retries=0,
    )
    with bad, pytest.raises(openai.AuthenticationError) as caught:
        bad.models.list()
    assert caught.value.status_code == 401

    api = APIClient()
    url = f"/api/v1/endpoints/{endpoint.pk}/models"
    for header, code in [
        ("Bearer not-a-key", 401),
        ("Bearer", 401),
        (f"Bearer {api_key}", 200),
        (f"bearer {api_key}", 200),
        (f"Token {api_key}", 200),
    ]:
        response = api.get(url, HTTP_AUTHORIZATION=header)
        assert response.status_code == code, (header, response.content)
        if code == 401:
            assert response.json()["error"]["code"] == "UNAUTHENTICATED"
    assert api.get(url).status_code == 401  # no credentials at all
    answer = api.post(
        f"/api/v1/endpoints/{endpoint.pk}/completions",
        {"prompt": "hi", "max_tokens": 2},
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {api_key}",
    )
    assert answer.status_code == 200 and answer.json()["object"] == "text_completion"


def stream_post(api_key: str, endpoint: Endpoint, **body):
    body = {"prompt": "hello", "max_tokens": 4, "stream": True, **body}
    return APIClient().post(
        f"/api/v1/endpoints/{endpoint.pk}/completions",
        body,
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {api_key}",
    )


def sse_data(response) -> list[str]:
    """The data of each event, checking the framing: 'data: ...' then a blank line."""
    raw = b"".join(response.streaming_content).decode()
    assert raw.endswith("\n\n"), raw
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: ") :] for e in events]


def test_sse_framing_and_failover_before_the_first_byte(endpoint, api_key, monkeypatch):
    response = stream_post(api_key, endpoint)
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    data = sse_data(response)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")

    # A replica that cannot be reached is passed over before anything is sent.
    monkeypatch.setattr(routing, "tie_break", lambda rs: rs.sort(key=lambda r: -r.number))
    replica_add(endpoint, 2, "127.0.0.1", 9)  # the discard port: refused
    response = stream_post(api_key, endpoint)
    assert response.status_code == 200 and response["X-MTC-Replica"] == "1"
    assert sse_data(response)[-1] == "[DONE]"
    assert Replica.objects.get(endpoint=endpoint, number=2).state == "UNHEALTHY"


def test_errors_before_the_first_byte_keep_mtc_json_shape(endpoint, api_key):
    for body, field in [({"max_tokens": 0}, "max_tokens"), ({"stream": "yes"}, "stream")]:
        response = stream_post(api_key, endpoint, **body)
        assert response.status_code == 400 and response["Content-Type"] == "application/json"
        error = response.json()["error"]
        assert error["code"] == "INVALID_ARGUMENT" and field in error["fields"], error
    Replica.objects.filter(endpoint=endpoint).update(state="UNHEALTHY")
    response = stream_post(api_key, endpoint)
    assert response.status_code == 503 and response.json()["error"]["code"] == "UNAVAILABLE"


class BrokenReplica(BaseHTTPRequestHandler):
    """Starts a stream, sends one chunk, and hangs up (a replica dying midway)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        event = b'data: {"object":"text_completion","choices":[{"text":"he"}]}\n\n'
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.write(b"40\r\ndata: {half an ev")  # and gone: no end of chunk, no [DONE]
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def broken_replica():
    server = ThreadingHTTPServer(("127.0.0.1", 0), BrokenReplica)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    yield server.server_address[:2]
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_a_failure_midway_ends_the_stream_with_an_error_event(endpoint, api_key, broken_replica):
    Replica.objects.filter(endpoint=endpoint).update(host=broken_replica[0], port=broken_replica[1])
    response = stream_post(api_key, endpoint)
    assert response.status_code == 200
    data = sse_data(response)
    assert json.loads(data[0])["choices"][0]["text"] == "he"
    assert len(data) == 2 and "half" not in data[1]  # never half an event
    error = json.loads(data[1])["error"]
    assert error["code"] == "UNAVAILABLE" and "Replica 1" in error["message"]
