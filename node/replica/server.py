"""An inference replica: an OpenAI-style HTTP server for one model version.

    python -m node.replica.server --model-dir DIR --name tiny@1 --token-file F \
        --state-file run/replica.json [--host 127.0.0.1] [--advertise HOST] [--threads 1]

Runs inside a Slurm job, with the standard library's HTTP server and transformers
(no Django). Every request needs ``Authorization: Bearer <token>`` (the token mtc
wrote to --token-file). Once the model is loaded and the port bound, it writes
``{"host", "port", "pid", "job_id", "restart"}`` to --state-file (atomically), which
is how mtc learns where it listens.

    GET  /health               {"status": "ok", "model", "chat", "busy", "served"}
    GET  /v1/models
    POST /v1/completions       prompt, max_tokens, temperature, top_p, n=1, stop, seed,
                               stream (server-sent events, chunked), stream_options
    POST /v1/chat/completions  messages, ... (only when the tokenizer has a chat template)
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import signal
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .generation import Generator, RequestError
from .streaming import Events

MAX_BODY_BYTES = 1024 * 1024
log = logging.getLogger("mtc.replica")


class ReplicaServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], generator: Generator, token: str):
        super().__init__(address, ReplicaHandler)
        self.generator = generator
        self.token = token


class ReplicaHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the router reuses its connections
    # Headers and body go out as two writes; with Nagle on, the body would wait for
    # the client's delayed ACK (~40 ms) on a kept-alive connection.
    disable_nagle_algorithm = True
    server: ReplicaServer

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would fill the job's output; errors are logged

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, *, param: str | None = None, kind: str = ""):
        kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self._send(status, {"error": {"message": message, "type": kind, "param": param}})

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        if given and hmac.compare_digest(given.encode(), self.server.token.encode()):
            return True
        self._error(401, "A valid bearer token is required.", kind="authentication_error")
        return False

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if not self._authorized():
            return
        generator = self.server.generator
        if self.path == "/health":
            self._send(
                200,
                {
                    "status": "ok",
                    "model": generator.name,
                    "chat": generator.chat,
                    "busy": generator.busy,
                    "served": generator.served,
                },
            )
        elif self.path == "/v1/models":
            model = {"id": generator.name, "object": "model", "owned_by": "mtc"}
            self._send(200, {"object": "list", "data": [model]})
        else:
            self._error(404, f"No route {self.path}.")

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._error(413, f"The body is over {MAX_BODY_BYTES} bytes.")
            return
        raw = self.rfile.read(length)
        if not self._authorized():
            return
        routes = {
            "/v1/completions": self.server.generator.completion,
            "/v1/chat/completions": self.server.generator.chat_completion,
        }
        handler = routes.get(self.path)
        if handler is None:
            self._error(404, f"No route {self.path}.")
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise RequestError("The body must be a JSON object.")
            answer = handler(body)
        except json.JSONDecodeError as exc:
            self._error(400, f"The body is not JSON: {exc}")
        except RequestError as exc:
            self._error(exc.status, exc.message, param=exc.param)
        except Exception as exc:
            log.exception("generation failed")
            self._error(500, f"Generation failed: {exc}")
        else:
            if isinstance(answer, dict):
                self._send(200, answer)
            else:
                self._send_events(answer)

    def _send_events(self, events: Events) -> None:
        """Server-sent events in HTTP/1.1 chunks, each written as generation makes it.
        A reader that goes away cancels the generation (closing ``events``)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the reader hung up: this connection is done
            self.close_connection = True
        finally:
            events.close()


def state_write(path: Path, state: dict) -> None:
    """Write-then-rename, so mtc never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".replica-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--name", required=True, help="The model name in answers")
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--state-file", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind")
    parser.add_argument("--advertise", default="", help="Address mtc should call")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    state_file = Path(args.state_file)
    state_file.unlink(missing_ok=True)  # an earlier run's address is no longer true
    token = Path(args.token_file).read_text().strip()
    started = time.monotonic()
    generator = Generator(args.model_dir, name=args.name, threads=args.threads)
    server = ReplicaServer((args.host, args.port), generator, token)
    port = server.server_address[1]
    log.info(
        "serving %s on %s:%d (%s, chat %s), loaded in %.1f s",
        args.name,
        args.host,
        port,
        generator.device,
        generator.chat,
        time.monotonic() - started,
    )

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    state_write(
        state_file,
        {
            "host": args.advertise or args.host,
            "port": port,
            "pid": os.getpid(),
            "job_id": os.environ.get("SLURM_JOB_ID", ""),
            "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
        },
    )
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        state_file.unlink(missing_ok=True)
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
