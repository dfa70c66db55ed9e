"""Streaming generation for the replica: tokens handed over as ``model.generate`` makes
them, turned into text deltas (never a half character, never text a stop sequence will
cut) and framed as OpenAI server-sent events. No Django: this runs in a Slurm job."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass

DONE = b"data: [DONE]\n\n"
Texts = Generator[str, None, None]  # text deltas (closing one ends its generation)
Events = Generator[bytes, None, None]  # server-sent events, framed
POLL_S = 0.5  # how often a waiting reader looks whether generation died


def sse(data: dict) -> bytes:
    """One server-sent event, the way OpenAI frames a stream's chunks."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters could still be the start of a stop sequence."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


@dataclass
class TextDeltas:
    """New token ids in, text deltas out. The deltas always add up to what the
    non-streaming answer says: the same decode, cut at the same stop sequence."""

    decode: Callable[[list[int]], str]
    eos_ids: set[int]
    stops: tuple[str, ...] = ()
    tokens: int = 0  # completion tokens, the end-of-text token not counted
    done: bool = False  # an end-of-text token or a stop sequence: no more text
    stopped: bool = False

    def __post_init__(self) -> None:
        self._ids: list[int] = []
        self._sent = 0

    def push(self, ids: list[int]) -> str:
        if self.done:
            return ""
        for token in ids:
            if token in self.eos_ids:
                self.done = self.stopped = True
                break
            self._ids.append(token)
            self.tokens += 1
        text = self.decode(self._ids)
        cuts = [text.find(s) for s in self.stops if s in text]
        if cuts:
            self.done = self.stopped = True
            return self._emit(text[: min(cuts)])
        if self.done:
            return self._emit(text)
        end = len(text) - _held_back(text, self.stops)
        while end > self._sent and text[end - 1] == "\ufffd":  # a character's first bytes
            end -= 1
        return self._emit(text[:end])

    def flush(self) -> str:
        """What is left once generation ended (held-back text that was no stop after all)."""
        if self.done:
            return ""
        self.done = True
        return self._emit(self.decode(self._ids))

    def _emit(self, text: str) -> str:
        delta, self._sent = text[self._sent :], max(self._sent, len(text))
        return delta


class TokenQueue:
    """A transformers streamer: ``generate`` puts the prompt, then each new token."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True  # the prompt's ids come first: not new text
            return
        self.queue.put(value.reshape(-1).tolist())

    def end(self) -> None:
        self.queue.put(None)

    def fail(self, exc: BaseException) -> None:
        self.queue.put(exc)


def cancel_criteria(tokens: TokenQueue):
    """Ends ``generate`` at the next token once the reader has gone."""
    from transformers import StoppingCriteria

    class Cancelled(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            import torch

            done = tokens.cancelled.is_set()
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool)

    return Cancelled()


def token_batches(run: Callable[[], None], tokens: TokenQueue) -> Generator[list[int], None, None]:
    """Run generation (``run``, which calls generate with ``tokens`` as its streamer) in
    a thread and yield the new token ids as they come. Closing the iterator ends
    generation at its next token."""

    def work() -> None:
        try:
            run()
        except BaseException as exc:  # handed to the reader, which raises it
            tokens.fail(exc)
        else:
            tokens.end()

    thread = threading.Thread(target=work, name="replica-generate", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = tokens.queue.get(timeout=POLL_S)
            except queue.Empty:
                if not thread.is_alive() and tokens.queue.empty():
                    raise RuntimeError("generation stopped without a word") from None
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        tokens.cancelled.set()
        thread.join()


@dataclass
class StreamHead:
    """What every chunk of one answer repeats."""

    id: str
    object: str  # "text_completion" or "chat.completion.chunk"
    created: int
    model: str

    @property
    def chat(self) -> bool:
        return self.object == "chat.completion.chunk"

    def chunk(self, text: str | None, finish: str | None = None, *, first: bool = False) -> dict:
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self.__dict__, "choices": [choice]}


def stream_events(
    head: StreamHead,
    texts: Texts,
    deltas: TextDeltas,
    *,
    prompt_tokens: int,
    max_tokens: int,
    include_usage: bool = False,
) -> Events:
    """A completion as OpenAI streams it: a chunk per delta, one with the finish
    reason, the usage if asked, then [DONE]. A failure midway is one error event and
    the end of the stream (no [DONE]: the answer is not whole)."""
    try:
        if head.chat:
            yield sse(head.chunk(None, first=True))
        for text in texts:
            yield sse(head.chunk(text))
    except Exception as exc:
        message = f"Generation failed: {exc}"
        yield sse({"error": {"message": message, "type": "server_error", "param": None}})
        return
    finally:
        texts.close()
    stopped = deltas.stopped or deltas.tokens < max_tokens
    yield sse(head.chunk(None, "stop" if stopped else "length"))
    if include_usage:
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": deltas.tokens,
            "total_tokens": prompt_tokens + deltas.tokens,
        }
        yield sse({**head.__dict__, "choices": [], "usage": usage})
    yield DONE
