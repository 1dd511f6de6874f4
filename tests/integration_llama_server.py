"""Colibri's remote backend against a real llama.cpp llama-server (an integration script, not part
of the suite: it needs llama.cpp's build).

    python tests/integration_llama_server.py [--gguf FILE] [--bin .llama.cpp/build/bin]

Starts llama-server on the default model's GGUF (one slot, then with --api-key), and checks with
app.remote.RemoteBackend and colibri-cli --remote: the model list, a streamed greedy chat reply
equal to llama-server's own whole reply, its usage and timings on the dashboard snapshot, the
context from /props, Stop mid-stream (the next request is served at once), a wrong key in plain
words, and an unreachable address. Prints one line per check; exits 1 on the first failure.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app import remote as R  # noqa: E402
from app.bench.serve import ServerProcess, free_port  # noqa: E402
from engine import kernels  # noqa: E402

kernels.setup()  # the remote path reads engine.api's records

HI = [{"role": "user", "content": "Write one sentence about hummingbirds."}]


def check(what: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        raise SystemExit(1)


def llama(binary: Path, gguf: str, work: Path, threads: int, *extra: str) -> ServerProcess:
    port = free_port()
    cmd = [str(binary / "llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-c", "2048", "-np", "1", "--no-webui", *extra]
    key = extra[extra.index("--api-key") + 1] if "--api-key" in extra else None
    return ServerProcess("llama-server", cmd, port, "/health", work / f"llama-server-{port}.log", key)


def whole_reply(url: str, max_tokens: int, key: str | None = None) -> dict:
    body = json.dumps({"messages": HI, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/chat/completions", body, {"Content-Type": "application/json",
                                                                  **({"Authorization": f"Bearer {key}"} if key else {})})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def main() -> int:
    from engine.default_model import default_gguf_path
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=str(default_gguf_path()))
    ap.add_argument("--bin", default=str(Path(__file__).resolve().parents[1] / ".llama.cpp" / "build" / "bin"),
                    type=Path)
    ap.add_argument("--threads", type=int, default=2, help="llama-server's -t (1 on a machine shared with others)")
    ap.add_argument("--workdir", default="/tmp/colibri-llama-server-check", type=Path)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    srv = llama(args.bin, args.gguf, args.workdir, args.threads)
    try:
        models = R.list_models(srv.url)
        check("the model list comes from /v1/models", len(models) == 1 and models[0].owned_by == "llamacpp",
              str(models))
        rb = R.RemoteBackend(srv.url)
        check("the context per slot comes from /props", rb.context_limit == 2048, str(rb.context_limit))
        n = 24
        steps = list(rb.generate(HI, temperature=0.0, max_tokens=n))
        text = "".join(s.text for s in steps)
        whole = whole_reply(srv.url, n)
        check("a greedy streamed reply equals llama-server's whole reply", text ==
              whole["choices"][0]["message"]["content"] and len([s for s in steps if s.text]) > 3, repr(text[:60]))
        last = steps[-1]
        check("usage and finish reason: the endpoint's", last.prompt_tokens == whole["usage"]["prompt_tokens"]
              and last.generated_tokens == whole["usage"]["completion_tokens"]
              and last.finish_reason == whole["choices"][0]["finish_reason"], str(last))
        snap = rb.stats()
        check("the snapshot carries the endpoint's own timings", snap.remote.figures == "endpoint timings"
              and snap.decode_tok_s > 0, f"decode {snap.decode_tok_s:.1f} tok/s, prefill {snap.prefill_tok_s:.1f}")
        cancel = threading.Event()
        got = []
        for s in rb.generate(HI, cancel=cancel, temperature=0.0, max_tokens=1000):
            got.append(s)
            if len(got) == 3:
                cancel.set()
        again = list(rb.generate(HI, temperature=0.0, max_tokens=n))
        check("Stop ends the stream and the one slot is free at once (the next reply's first token as soon "
              "as the first one's)", got[-1].finish_reason == "cancelled" and len(got) < 10
              and "".join(s.text for s in again) == text and again[-1].ttft_s < 3 * last.ttft_s + 1,
              f"first token {again[-1].ttft_s:.2f} s after Stop, {last.ttft_s:.2f} s before")
        cli = subprocess.run([sys.executable, "-m", "app.cli_chat", "--remote", srv.url, "--prompt", HI[0]["content"],
                              "--temperature", "0", "--max_tokens", str(n)], capture_output=True, text=True,
                             timeout=300)
        check("colibri-cli --remote prints the same reply", cli.returncode == 0 and cli.stdout.strip() == text.strip(),
              cli.stderr.strip().splitlines()[-1] if cli.stderr.strip() else "")
        rb.close()
    finally:
        srv.stop()
    locked = llama(args.bin, args.gguf, args.workdir, args.threads, "--api-key", "right")
    try:
        try:
            R.RemoteBackend(locked.url, key="wrong")
            check("a wrong key is refused", False)
        except R.RemoteError as e:
            check("a wrong key is said in plain words", "refused the API key (401" in str(e), str(e))
        with R.RemoteBackend(locked.url, key="right") as rb:
            check("the right key works", bool("".join(s.text for s in rb.generate(HI, max_tokens=4))))
    finally:
        locked.stop()
    try:
        R.RemoteBackend(f"http://127.0.0.1:{free_port()}/v1")
        check("an unreachable address fails", False)
    except R.RemoteError as e:
        check("an unreachable address is said in plain words", "cannot reach" in str(e), str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
