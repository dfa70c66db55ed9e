"""The replica server on its own: OpenAI-shaped answers from real transformers
generation, its request checks, and its bearer token."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from node.replica.streaming import StreamHead, TextDeltas, sse, stream_events

from .test_serving_support import replica_server, tiny_model_dir

__all__ = ["replica_server", "tiny_model_dir"]  # fixtures these tests use


def call(server, token, path: str, body: dict | None = None) -> tuple[int, dict]:
    host, port = server.server_address[:2]
    request = urllib.request.Request(
        f"http://{host}:{port}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_health_and_models_need_the_token(replica_server):
    server, token = replica_server
    assert call(server, "wrong", "/health")[0] == 401
    assert call(server, "", "/v1/completions", {"prompt": "hi"})[0] == 401
    status, health = call(server, token, "/health")
    assert status == 200 and health["model"] == "tiny@1" and health["chat"] is True
    assert call(server, token, "/v1/models")[1]["data"][0]["id"] == "tiny@1"


def test_completion_greedy_usage_and_stop(replica_server):
    server, token = replica_server
    body = {"prompt": "hello world", "max_tokens": 8, "temperature": 0}
    status, first = call(server, token, "/v1/completions", body)
    assert status == 200, first
    assert first["object"] == "text_completion" and first["id"].startswith("cmpl-")
    choice = first["choices"][0]
    assert choice["finish_reason"] in ("length", "stop") and choice["logprobs"] is None
    usage = first["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert call(server, token, "/v1/completions", body)[1]["choices"][0] == choice  # greedy

    text = choice["text"]
    stop = text[len(text) // 2 :][:1]
    if stop.strip():
        cut = call(server, token, "/v1/completions", {**body, "stop": [stop]})[1]["choices"][0]
        assert cut["text"] == text[: text.index(stop)] and cut["finish_reason"] == "stop"

    sampled = {"prompt": "hello", "max_tokens": 4, "temperature": 0.9, "top_p": 0.9, "seed": 7}
    one = call(server, token, "/v1/completions", sampled)[1]["choices"][0]["text"]
    assert call(server, token, "/v1/completions", sampled)[1]["choices"][0]["text"] == one


def test_chat_completion(replica_server):
    server, token = replica_server
    status, answer = call(
        server,
        token,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert status == 200, answer
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["role"] == "assistant"


def test_bad_requests_name_the_field(replica_server):
    server, token = replica_server
    cases = [
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "n": 2}, "n"),
        ({"prompt": "hi", "temperature": 3}, "temperature"),
        ({"prompt": "hi", "stop": [1]}, "stop"),
        ({"prompt": "hi", "stream": "yes"}, "stream"),
        (
            {"prompt": "hi", "stream": True, "stream_options": {"include_usage": 1}},
            "stream_options",
        ),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "hello " * 200}, "prompt"),  # past the model's 128 positions
        ({"prompt": "hi", "max_tokens": 127}, "max_tokens"),
    ]
    for body, param in cases:
        status, answer = call(server, token, "/v1/completions", body)
        assert status == 400 and answer["error"]["param"] == param, (body, answer)
    status, answer = call(server, token, "/v1/chat/completions", {"messages": [{"role": "x"}]})
    assert status == 400 and answer["error"]["param"] == "messages[0]"
    assert call(server, token, "/v1/nothing", {})[0] == 404


def test_concurrent_requests_take_turns(replica_server):
    server, token = replica_server
    results: list[int] = []

    def one():
        results.append(call(server, token, "/v1/completions", {"prompt": "hi", "max_tokens": 4})[0])

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * 4


def stream(server, token, path: str, body: dict) -> tuple[list[bytes], str]:
    """The raw server-sent events of one streamed answer, and its Content-Type."""
    host, port = server.server_address[:2]
    request = urllib.request.Request(
        f"http://{host}:{port}{path}",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().split(b"\n\n")[:-1], response.headers["Content-Type"]


def test_streaming_adds_up_to_the_whole_answer(replica_server):
    server, token = replica_server
    for extra in ({}, {"stop": ["|"]}):
        body = {"prompt": "hello world", "max_tokens": 12, "temperature": 0, **extra}
        whole = call(server, token, "/v1/completions", body)[1]["choices"][0]
        events, kind = stream(server, token, "/v1/completions", body)
        assert kind == "text/event-stream" and events[-1] == b"data: [DONE]"
        chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
        assert len({c["id"] for c in chunks}) == 1 and len(chunks) > 2
    assert call(server, token, "/v1/completions", {"prompt": "hi"})[0] == 200  # still serving


def test_text_deltas_hold_back_what_a_stop_may_cut():
    pieces = {1: "ab", 2: "c", 3: "XY", 4: "Z", 5: "\xe2", 6: "\x82\xac"}

    def decode(ids):  # bytes-level pieces, like a byte-level BPE
        raw = "".join(pieces[i] for i in ids).encode("latin-1")
        return raw.decode("utf-8", errors="replace")

    deltas = TextDeltas(decode=decode, eos_ids={0}, stops=("XYZ",))
    assert [deltas.push([1]), deltas.push([2]), deltas.push([3])] == ["ab", "c", ""]
    assert deltas.push([4]) == "" and deltas.stopped and deltas.tokens == 4

    deltas = TextDeltas(decode=decode, eos_ids={0}, stops=("XYZ",))
    assert deltas.push([3]) == "" and deltas.push([1]) == "XYab"  # no stop after all
    assert deltas.push([5]) == "" and deltas.push([6]) == "\u20ac"  # no half character
    assert deltas.push([0]) == "" and deltas.stopped and deltas.tokens == 4

    deltas = TextDeltas(decode=decode, eos_ids=set(), stops=("XYZ",))
    assert deltas.push([1, 3]) == "ab" and deltas.flush() == "XY"


def test_stream_events_frame_chunks_and_end_cleanly_on_failure():
    head = StreamHead("chatcmpl-1", "chat.completion.chunk", 1, "tiny@1")
    deltas = TextDeltas(decode=lambda ids: "", eos_ids=set())

    def texts():
        yield "he"
        raise RuntimeError("out of memory")

    events = list(stream_events(head, texts(), deltas, prompt_tokens=3, max_tokens=4))
    assert all(e.startswith(b"data: {") and e.endswith(b"}\n\n") for e in events)
    first, second, error = (json.loads(e[6:]) for e in events)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert second["choices"][0]["delta"] == {"content": "he"}
    assert "out of memory" in error["error"]["message"]  # and no [DONE]: not whole
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'
