"""The replica's model: request checks, transformers generation and OpenAI-shaped
answers. No Django here: this runs on a cluster node inside a Slurm job."""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from .streaming import (
    Events,
    StreamHead,
    TextDeltas,
    Texts,
    TokenQueue,
    cancel_criteria,
    stream_events,
    token_batches,
)

MAX_NEW_TOKENS = 2048
MAX_STOP_SEQUENCES = 4
CHAT_ROLES = ("system", "user", "assistant", "tool")


class RequestError(Exception):
    """A bad request (HTTP 400); ``param`` names the offending field."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


@dataclass
class Sampling:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False  # stream_options: a last chunk with the usage


@dataclass
class Generated:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of text or a stop sequence) or "length"


def _number(body: dict, key: str, default: float, low: float, high: float, *, low_open=False):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"'{key}' must be a number.", param=key)
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise RequestError(f"'{key}' must be in {bracket}{low}, {high}].", param=key)
    return float(value)


def sampling_parse(body: dict) -> Sampling:
    """The OpenAI sampling fields this replica supports (n=1)."""
    max_tokens = body.get("max_tokens", 16)
    if max_tokens is None:
        max_tokens = 16
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise RequestError("'max_tokens' must be an integer.", param="max_tokens")
    if not 1 <= max_tokens <= MAX_NEW_TOKENS:
        raise RequestError(f"'max_tokens' must be 1 to {MAX_NEW_TOKENS}.", param="max_tokens")
    if body.get("n", 1) not in (1, None):
        raise RequestError("Only n=1 is supported.", param="n")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false.", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise RequestError(
            "'stream_options' must be {\"include_usage\": true|false}.", param="stream_options"
        )
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop):
        stops = tuple(stop)
    else:
        raise RequestError("'stop' must be a string or a list of strings.", param="stop")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise RequestError(f"At most {MAX_STOP_SEQUENCES} stop sequences.", param="stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError("'seed' must be an integer.", param="seed")
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        stop=stops,
        seed=seed,
        stream=bool(stream),
        include_usage=bool(options.get("include_usage")),
    )


def prompt_parse(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError("'prompt' must be a string (one prompt per request).", param="prompt")
    return prompt


def messages_parse(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list.", param="messages")
    out = []
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in CHAT_ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise RequestError(
                f"messages[{i}] must be {{role: {'|'.join(CHAT_ROLES)}, content: string}}.",
                param=f"messages[{i}]",
            )
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _stop_criteria(tokenizer, stops: tuple[str, ...], prompt_len: int):
    """Stops generation once the new text contains a stop sequence."""
    from transformers import StoppingCriteria

    window = max(len(s) for s in stops) + 16  # tokens: enough to hold the longest stop

    class StopOnText(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            import torch

            tail = input_ids[0, max(prompt_len, input_ids.shape[1] - window) :]
            text = tokenizer.decode(tail, skip_special_tokens=True)
            done = any(s in text for s in stops)
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool)

    return StopOnText()


class Generator:
    """One model on one device; one generation at a time (a CPU has no room for more)."""

    def __init__(self, model_dir: str, *, name: str, threads: int = 1):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(1, threads))
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.name = name
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).to(self.device).eval()
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 2048)
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else eos
        self.eos_ids = {eos} if eos is not None else set()
        self.lock = threading.Lock()
        self.served = 0

    @property
    def busy(self) -> bool:
        return self.lock.locked()

    def _encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        if not ids and self.tokenizer.bos_token_id is not None:
            ids = [self.tokenizer.bos_token_id]
        if not ids:
            raise RequestError("The prompt is empty.", param="prompt")
        return list(ids)

    def _generate_args(self, ids: list[int], sampling: Sampling, *, param: str):
        """Checks a request against the model (before any answer is sent) and builds
        ``generate``'s arguments; the streaming and the whole answer share them."""
        import torch
        from transformers import StoppingCriteriaList

        if len(ids) + sampling.max_tokens > self.max_positions:
            raise RequestError(
                f"{len(ids)} prompt tokens + max_tokens {sampling.max_tokens} exceed the "
                f"model's {self.max_positions} positions.",
                param=param if len(ids) >= self.max_positions else "max_tokens",
            )
        input_ids = torch.tensor([ids], device=self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "attention_mask": torch.ones_like(input_ids),
            "pad_token_id": self.pad_id,
            "do_sample": sampling.temperature > 0,
            "stopping_criteria": StoppingCriteriaList(),
        }
        if sampling.temperature > 0:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if sampling.stop:
            kwargs["stopping_criteria"].append(
                _stop_criteria(self.tokenizer, sampling.stop, len(ids))
            )
        return input_ids, kwargs

    def _run(self, input_ids, kwargs: dict, sampling: Sampling):
        import torch

        with self.lock, torch.inference_mode():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(input_ids, **kwargs)
            self.served += 1
        return out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(self, ids: list[int], sampling: Sampling, *, param: str) -> Generated:
        input_ids, kwargs = self._generate_args(ids, sampling, param=param)
        out = self._run(input_ids, kwargs, sampling)
        new = out[0, len(ids) :].tolist()
        finish = "length"
        for i, token in enumerate(new):
            if token in self.eos_ids:
                new, finish = new[:i], "stop"
                break
        text = self._decode(new)
        cuts = [text.find(s) for s in sampling.stop if s in text]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        elif finish == "length" and len(new) < sampling.max_tokens:
            finish = "stop"
        return Generated(text, len(ids), len(new), finish)

    def generate_stream(
        self, ids: list[int], sampling: Sampling, *, param: str
    ) -> tuple[TextDeltas, Texts]:
        """Checks now (so a bad request is a 400, not a broken stream), then the text
        deltas as tokens are generated; the TextDeltas says how it ended."""
        input_ids, kwargs = self._generate_args(ids, sampling, param=param)
        tokens = TokenQueue()
        kwargs["streamer"] = tokens
        kwargs["stopping_criteria"].append(cancel_criteria(tokens))
        deltas = TextDeltas(decode=self._decode, eos_ids=self.eos_ids, stops=sampling.stop)

        def texts() -> Texts:
            batches = token_batches(lambda: self._run(input_ids, kwargs, sampling), tokens)
            try:
                for batch in batches:
                    if delta := deltas.push(batch):
                        yield delta
                    if deltas.done:
                        return  # a stop sequence or end of text: generation is cancelled
                if tail := deltas.flush():
                    yield tail
            finally:
                batches.close()

        return deltas, texts()

    def completion(self, body: dict) -> dict | Events:
        """The answer, or with ``"stream": true`` its server-sent events."""
        sampling = sampling_parse(body)
        ids = self._encode(prompt_parse(body))
        if sampling.stream:
            return self._stream("cmpl", "text_completion", ids, sampling, param="prompt")
        result = self.generate(ids, sampling, param="prompt")
        return self._answer(
            "cmpl",
            "text_completion",
            {"index": 0, "text": result.text, "logprobs": None},
            result,
        )

    def chat_completion(self, body: dict) -> dict | Events:
        if not self.chat:
            raise RequestError(
                "This model version has no chat template; use /v1/completions.",
                param="messages",
            )
        messages = messages_parse(body)
        sampling = sampling_parse(body)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # the template rejects these messages (e.g. role order)
            raise RequestError(f"The chat template refused these messages: {exc}") from exc
        ids = self._encode(text, add_special_tokens=False)
        if sampling.stream:
            kind = "chat.completion.chunk"
            return self._stream("chatcmpl", kind, ids, sampling, param="messages")
        result = self.generate(ids, sampling, param="messages")
        return self._answer(
            "chatcmpl",
            "chat.completion",
            {"index": 0, "message": {"role": "assistant", "content": result.text}},
            result,
        )

    def _stream(
        self, prefix: str, kind: str, ids: list[int], sampling: Sampling, *, param: str
    ) -> Events:
        deltas, texts = self.generate_stream(ids, sampling, param=param)
        return stream_events(
            StreamHead(f"{prefix}-{secrets.token_hex(12)}", kind, int(time.time()), self.name),
            texts,
            deltas,
            prompt_tokens=len(ids),
            max_tokens=sampling.max_tokens,
            include_usage=sampling.include_usage,
        )

    def _answer(self, prefix: str, kind: str, choice: dict, result: Generated) -> dict:
        return {
            "id": f"{prefix}-{secrets.token_hex(12)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.name,
            "choices": [{**choice, "finish_reason": result.finish_reason}],
            "usage": {
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        }
