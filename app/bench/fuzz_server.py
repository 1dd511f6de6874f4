"""colibri-bench fuzz --server: hostile clients against colibri-serve for a time budget.

A real server (app.server over uvicorn, on a free loopback port) serves a small model while
seeded cases hit it over raw sockets: malformed request heads (flipped, cut, oversized,
contradictory framing), malformed and hostile bodies (wrong types, extreme numbers, deep nesting,
other media types), slow clients (a request a byte at a time; heads and bodies begun and never
finished), abrupt closes (before, during and after the reply), cross-origin requests and huge
ones. Each case must end in an HTTP answer (any status but a 500) or the server closing the
connection, within --case_timeout seconds and its own stalls; a 500, an answer that is not
HTTP, an error the server logs (an exception a gone client never saw) or the server thread
ending is a crash; a connection neither answered nor closed in time
is a hang. While connections stall, and at the end, a well-formed request must be answered
within 1 s.
"""
from __future__ import annotations

import json
import logging
import random
import re
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "tests" / "fixtures" / "hf" / "llama"  # converted to a temporary folder
PROMPT = "one two three four five"
JUNK: tuple[Any, ...] = (None, True, -1, 0, 2 ** 70, -2 ** 63, 1e308, -0.0, "", "x" * 5000, "\ud800", [], {},
                         [[[[[]]]]], {"a": {"b": {"c": None}}}, ["x"] * 200, "NaN", 3.5)
FIELDS = ("model", "messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
          "stream_options", "n", "chat_template_kwargs", "presence_penalty", "max_completion_tokens", "tools")
SLACK_S = 3.0  # beyond the server's own timeouts, before a silent connection counts as a hang


@dataclass
class Case:
    what: str
    chunks: list[bytes]  # sent in turn
    pause_s: float = 0.0  # between two chunks (a slow client)
    then: str = "read"  # "read" the answer, "close" at once, "reset" (RST), "read_some" then close


@dataclass
class ServerReport:
    cases: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # "200", "400", ..., "closed", "client gone"
    crashes: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    stalled_probe_s: list[float] = field(default_factory=list)  # a well-formed request beside stalled clients
    final_s: float | None = None  # a well-formed chat request at the end


def head(method: str, path: str, body: bytes = b"", extra: list[tuple[str, str]] | None = None,
         content_type: str | None = "application/json") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if content_type is not None and method == "POST":
        lines.append(f"Content-Type: {content_type}")
    if method == "POST" and not any(k.lower() == "content-length" for k, _ in extra or []):
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{k}: {v}" for k, v in extra or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _valid_body(rng: random.Random) -> tuple[str, dict]:
    stream = rng.random() < 0.3
    if rng.random() < 0.5:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2,
                                        "stream": stream}
    return "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "stream": stream}


def _request(rng: random.Random) -> bytes:
    if rng.random() < 0.2:
        return head("GET", rng.choice(("/v1/models", "/v1/models/x", "/v1/nothing")))
    path, body = _valid_body(rng)
    return head("POST", path, json.dumps(body).encode())


def _mutate_bytes(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    b = bytearray(data)
    kind = rng.choice(("flip", "cut", "insert", "crlf"))
    at = rng.randrange(len(b))
    if kind == "flip":
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == "cut":
        del b[at:]
    elif kind == "insert":
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
    else:
        b[at:at] = b"\r\n" * rng.randint(1, 3)
    return f"{kind} at {at}", bytes(b)


def case_head(rng: random.Random) -> Case:
    """A request head made wrong."""
    path, body = _valid_body(rng)
    raw = json.dumps(body).encode()
    pick = rng.randrange(10)
    if pick == 0:
        what, data = _mutate_bytes(rng, _request(rng))
        return Case(f"head {what}", [data])
    if pick == 1:
        n = rng.choice(("-1", "abc", str(2 ** 63), "1e3", "0x10", " 5", str(len(raw) + 50)))
        return Case(f"content-length {n!r}", [head("POST", path, b"", [("Content-Length", n)]) + raw])
    if pick == 2:
        return Case("two content-lengths", [head("POST", path, raw, [("Content-Length", str(len(raw))),
                                                                      ("Content-Length", "3")])])
    if pick == 3:
        size = rng.choice(("zz", "-1", "ffffffffffffffff", "5", ""))
        data = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Transfer-Encoding: chunked\r\n\r\n{size}\r\n").encode() + raw[:5] + b"\r\n0\r\n\r\n"
        return Case(f"chunk size {size!r}", [data])
    if pick == 4:
        return Case("a 70 KB header", [head("GET", "/v1/models", extra=[("X-Big", "a" * 70_000)])])
    if pick == 5:
        return Case("2000 headers", [head("GET", "/v1/models", extra=[(f"X-{i}", "v") for i in range(2000)])])
    if pick == 6:
        return Case("a 100 KB path", [head("GET", "/v1/models/" + "x" * 100_000)])
    if pick == 7:
        return Case("no Host, HTTP/1.0", [b"GET /v1/models HTTP/1.0\r\n\r\n"])
    if pick == 8:
        return Case("a bad method", [bytes(rng.randrange(33, 127) for _ in range(8)) + b" / HTTP/1.1\r\n\r\n"])
    return Case("random bytes", [bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))])


def case_body(rng: random.Random) -> Case:
    """A well-framed request whose body is wrong."""
    path, body = _valid_body(rng)
    pick = rng.randrange(5)
    if pick == 0:
        for _ in range(rng.randint(1, 3)):
            body[rng.choice(FIELDS)] = rng.choice(JUNK)
        raw = json.dumps(body).encode()
        return Case(f"fields {sorted(body)}", [head("POST", path, raw)])
    if pick == 1:
        what, raw = _mutate_bytes(rng, json.dumps(body).encode())
        return Case(f"body {what}", [head("POST", path, raw)])
    if pick == 2:
        depth = rng.choice((100, 5000, 40_000))
        return Case(f"nesting {depth}", [head("POST", path, b"[" * depth + b"]" * depth)])
    if pick == 3:
        kind = rng.choice(("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None))
        return Case(f"content-type {kind}", [head("POST", path, json.dumps(body).encode(), content_type=kind)])
    content = rng.choice(("\x00" * 100, "<|im_end|>" * 50, "{{ 7*7 }}{% for x in range(9**9) %}{% endfor %}",
                          "\u202e" * 100, "😀" * 500))
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    return Case("hostile text", [head("POST", "/v1/chat/completions", json.dumps(body).encode())])


def case_slow(rng: random.Random) -> Case:
    """A slow client: a whole request in small pieces, or one that stops part way."""
    data = _request(rng)
    if rng.random() < 0.5:
        step = rng.randint(1, 16)
        return Case(f"{step} bytes at a time", [data[i:i + step] for i in range(0, len(data), step)], pause_s=0.002)
    cut = rng.randrange(1, len(data))
    return Case(f"stops after {cut} of {len(data)} bytes", [data[:cut]])


def case_close(rng: random.Random) -> Case:
    """The client goes away: before the body ends, right after the request, or mid-reply."""
    path, body = _valid_body(rng)
    body.update(stream=True, max_tokens=4)
    data = head("POST", path, json.dumps(body).encode())
    then = rng.choice(("close", "reset", "read_some"))
    cut = rng.randrange(1, len(data) + 1)
    return Case(f"{then} after {cut} of {len(data)} bytes", [data[:cut]], then=then)


def case_origin(rng: random.Random) -> Case:
    origin = rng.choice(("https://evil.example", "null", "http://localhost.evil.example", "http://[x", "file://"))
    path, body = _valid_body(rng)
    return Case(f"Origin {origin}", [head("POST", path, json.dumps(body).encode(), [("Origin", origin)])])


def case_huge(rng: random.Random) -> Case:
    path, body = _valid_body(rng)
    pick = rng.randrange(3)
    if pick == 0:
        return Case("a 2 MB body", [head("POST", path, b'{"prompt": "' + b"a" * (2 << 20) + b'"}')])
    if pick == 1:
        return Case("declares 1 TB", [head("POST", path, b"", [("Content-Length", str(1 << 40))])])
    return Case("a 60 KB prompt", [head("POST", "/v1/completions", json.dumps(
        {"prompt": "colibri " * 7500, "max_tokens": 2}).encode())])


KINDS: list[Callable[[random.Random], Case]] = [case_head, case_body, case_slow, case_close, case_origin, case_huge]


def _answer(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """What the server sent until its reply is complete (its length, the end of a stream) or it closed;
    and whether that happened before the deadline."""
    data = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except OSError:  # reset by the server
            return data, True
        if not chunk:
            return data, True
        data += chunk
        if b"\r\n\r\n" in data:
            top, rest = data.split(b"\r\n\r\n", 1)
            n = re.search(rb"(?im)^content-length:\s*(\d+)", top)
            if (n and len(rest) >= int(n.group(1))) or rest.endswith(b"0\r\n\r\n") or b"data: [DONE]" in rest:
                return data, True
    return data, False


def run_case(address: tuple[str, int], case: Case, wait_s: float) -> tuple[str, str]:
    """("crash" | "hang" | an outcome such as "400" or "closed", detail) of one case on a new connection."""
    sock = socket.create_connection(address, timeout=5)
    try:
        try:
            for i, chunk in enumerate(case.chunks):
                sock.sendall(chunk)
                if case.pause_s and i + 1 < len(case.chunks):
                    time.sleep(case.pause_s)
        except OSError:  # the server closed on a part it refused: fine, if it said why or said nothing
            pass
        if case.then in ("close", "reset"):
            if case.then == "reset":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return "client gone", ""
        if case.then == "read_some":
            sock.settimeout(wait_s)
            try:
                sock.recv(200)
            except OSError:
                pass
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return "client gone", ""
        data, ended = _answer(sock, time.monotonic() + wait_s)
    finally:
        sock.close()
    if not ended:
        return "hang", f"neither answered nor closed in {wait_s:.0f} s (got {data[:80]!r})"
    if not data:
        return "closed", ""
    status = re.match(rb"HTTP/1\.[01] (\d{3}) ", data)
    if status is None:
        return "crash", f"not an HTTP answer: {data[:120]!r}"
    code = status.group(1).decode()
    if code.startswith("5") and code != "503":
        return "crash", data.split(b"\r\n\r\n", 1)[-1][:300].decode("utf-8", "replace")
    return code, ""


def well_formed(address: tuple[str, int], model: str) -> float:
    """Seconds a well-formed chat request takes (a short reply); raises if it is not a 200."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                       "temperature": 0}).encode()
    t0 = time.monotonic()
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(head("POST", "/v1/chat/completions", body, [("Connection", "close")]))
        data, _ = _answer(sock, t0 + 30)
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"a well-formed request got {data[:300]!r}")
    return time.monotonic() - t0


def stalled_probe(address: tuple[str, int], model: str, rng: random.Random, n: int = 12) -> float:
    """A well-formed request's seconds while `n` connections stall (a head or a body begun, or
    a next head after a reply); the stalled ones are left for the server to close."""
    socks = []
    for i in range(n):
        s = socket.create_connection(address, timeout=5)
        data = _request(rng)
        s.sendall(data[:rng.randrange(1, len(data))] if i % 2 else head("GET", "/v1/models") + b"G")
        socks.append(s)
    try:
        return well_formed(address, model)
    finally:
        for s in socks:
            s.close()


class LoggedErrors(logging.Handler):
    """The errors the server and uvicorn log (each an exception a request raised), kept off the
    console while the fuzzer runs."""
    NAMES = ("colibri.server", "uvicorn.error")

    def __init__(self):
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        kind = f" ({record.exc_info[0].__name__})" if record.exc_info and record.exc_info[0] else ""
        self.seen.append(record.getMessage()[:200] + kind)

    def __enter__(self) -> LoggedErrors:
        self._saved = [(logging.getLogger(n), logging.getLogger(n).propagate) for n in self.NAMES]
        for logger, _ in self._saved:
            logger.addHandler(self)
            logger.propagate = False
        return self

    def __exit__(self, *exc: Any) -> None:
        for logger, propagate in self._saved:
            logger.removeHandler(self)
            logger.propagate = propagate


def serve_tiny(workdir: Path, model: Path | None, limits: Any) -> Any:
    """A server on a free loopback port over `model` (a converted folder) or the tiny test model."""
    from app import server as S
    from engine.api import Engine
    if model is None:
        from engine.convert.convert import convert
        model = convert(TINY_MODEL, workdir / "tiny", "keep").path
    engine = Engine(model, threads=1, context_length=512)
    handle = S.start(engine, "127.0.0.1", 0, limits=limits)
    handle.service.scheduler.warmed.wait(600)
    return handle, engine


def fuzz_server(seconds: float, seed: int, case_timeout: float, model: Path | None = None, log=print,
                cases: int | None = None) -> ServerReport:
    """Hostile cases against a real server until `seconds` have passed (or `cases` are done)."""
    import tempfile

    from app import server as S
    limits = S.Limits(max_body_bytes=256 * 1024, head_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1,
                      max_tokens=8, max_queue=8, slots=2, heartbeat_s=0.5, max_connections=128,
                      max_connections_per_client=64)
    wait_s = limits.head_timeout_s + limits.body_timeout_s + SLACK_S
    rng = random.Random(seed)
    report = ServerReport()
    with tempfile.TemporaryDirectory(prefix="colibri-fuzz-server-") as work, LoggedErrors() as errors:
        handle, engine = serve_tiny(Path(work), model, limits)
        try:
            host, port = handle.url.split("//")[1].split("/")[0].rsplit(":", 1)
            address = (host, int(port))
            end, last = time.monotonic() + seconds, ""
            while time.monotonic() < end and (cases is None or report.cases < cases):
                if report.cases % 25 == 24:
                    report.stalled_probe_s.append(stalled_probe(address, handle.model_id, rng))
                kind = KINDS[report.cases % len(KINDS)]
                case = kind(rng)
                outcome, detail = run_case(address, case, wait_s + case.pause_s * len(case.chunks))
                report.cases += 1
                report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
                if errors.seen and outcome != "crash":  # logged during this case, or just after the last
                    outcome, detail = "crash", f"the server logged (after {last!r}): " + "; ".join(errors.seen)
                errors.seen.clear()
                last = case.what
                if outcome in ("crash", "hang"):
                    line = f"{kind.__name__}: {case.what}: {detail}"
                    (report.crashes if outcome == "crash" else report.hangs).append(line)
                    log(f"{outcome.upper()} {line}")
                if not handle.running:
                    report.crashes.append(f"the server thread ended after {case.what}")
                    break
            deadline = time.monotonic() + wait_s
            while handle.status()["busy"] and time.monotonic() < deadline:  # abandoned replies end
                time.sleep(0.05)
            if handle.status()["busy"]:
                report.hangs.append("the engine still ran a reply whose client had gone")
            report.final_s = well_formed(address, handle.model_id)
        finally:
            handle.stop()
            engine.close()
    return report


def summary(r: ServerReport) -> str:
    probes = f", stalled-client probes up to {max(r.stalled_probe_s):.2f} s" if r.stalled_probe_s else ""
    final = f"{r.final_s:.2f} s" if r.final_s is not None else "none"
    return (f"{r.cases} hostile cases against colibri-serve: "
            f"{', '.join(f'{k} {v}' for k, v in sorted(r.outcomes.items()))}; {len(r.crashes)} crashes, "
            f"{len(r.hangs)} hangs{probes}; a well-formed request at the end: {final}")
