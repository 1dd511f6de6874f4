"""colibri-serve: an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)
over one model, on http://127.0.0.1:4242/v1 by default.

Without --model it serves the default model (converted into the user data folder on first use).
Listening on any address other than this machine's needs an API key (--api_key or COLIBRI_API_KEY);
clients then send `Authorization: Bearer KEY`. Ctrl-C stops the server (a second Ctrl-C, or
STOP_S seconds without an end, stops it at once).
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from engine import kernels
from engine import params as P
from engine.errors import ColibriError

if TYPE_CHECKING:  # app.server and engine.api load after engine.kernels.setup() (main)
    from engine.api import Engine

STOP_S = 20.0  # a stop that takes longer than this is a bug: say where it hangs, then end anyway


def build_parser() -> argparse.ArgumentParser:
    from app import server as S
    ap = argparse.ArgumentParser(prog="colibri-serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = S.Limits()
    ap.add_argument("--model", help="a Colibri model folder or a .gguf file (default: the bundled SmolLM2)")
    ap.add_argument("--host", default=S.DEFAULT_HOST, help="address to listen on [default: %(default)s]")
    ap.add_argument("--port", type=int, default=S.DEFAULT_PORT,
                    help="port (0: any free one) [default: %(default)s]")
    ap.add_argument("--api_key", help="require this Bearer key on every request (default: $COLIBRI_API_KEY; "
                    "needed for any --host other than loopback)")
    ap.add_argument("--max_body_bytes", type=int, default=d.max_body_bytes,
                    help="largest request body [default: %(default)s]")
    ap.add_argument("--max_prompt_tokens", type=int, help="longest prompt [default: the context length - 1]")
    ap.add_argument("--max_reply_tokens", type=int,
                    help="largest max_tokens a request may ask [default: the context length]")
    ap.add_argument("--max_queue", type=int, default=d.max_queue,
                    help="requests waiting for the engine; more get 429 [default: %(default)s]")
    ap.add_argument("--slots", type=int, default=d.slots,
                    help="requests decoded together, one forward pass per token for all (continuous "
                         "batching) [default: %(default)s]")
    ap.add_argument("--prefix_cache_mb", type=int, default=d.prefix_cache_bytes >> 20,
                    help="KV of recent prompts kept for requests that share their start (a system prompt, "
                         "earlier turns); 0: off [default: %(default)s]")
    ap.add_argument("--body_timeout", type=float, default=d.body_timeout_s,
                    help="seconds a request body may take to arrive [default: %(default)s]")
    P.add_arguments(ap)  # engine settings, and the sampling defaults of requests that do not set them
    return ap


def warm_apart(engine: Engine) -> float:
    """engine.warmup() on a thread of its own that then ends, so the server's scheduler thread is the
    only one keeping an OpenMP team (libgomp keeps one per thread that ran parallel kernels). Returns
    the seconds it took; its error is raised here."""
    out: list = []

    def run() -> None:
        try:
            out.append(engine.warmup())
        except BaseException as e:  # noqa: BLE001 - raised on the caller's thread below
            out.append(e)
    t = threading.Thread(target=run, name="colibri-warmup")
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _kernel_flags(argv: list[str] | None) -> tuple[str | None, str | None]:
    """--simd and --simd_path, read before the parser: its defaults come from app.server, which
    imports engine.api (after engine.kernels.setup())."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--simd")
    ap.add_argument("--simd_path")
    known, _ = ap.parse_known_args(argv)
    return known.simd, known.simd_path


def main(argv: list[str] | None = None) -> int:
    try:
        kernels.setup(*_kernel_flags(argv))
    except ValueError as e:
        print(f"colibri-serve: error: {e}", file=sys.stderr)
        return 1
    from app import server as S
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        engine_p, sampling = P.from_args(args, "engine"), P.from_args(args, "sampling")
        engine_p.setdefault("log_level", "WARN")
        from app.cli_chat import resolve_model
        from engine.api import Engine

        def load() -> Engine:
            engine = Engine(resolve_model(args.model), **engine_p, **sampling)
            print("warming up…", end="", file=sys.stderr, flush=True)
            print(f" ready ({warm_apart(engine):.1f} s)", file=sys.stderr)
            return engine
        limits = S.Limits(max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                          max_tokens=args.max_reply_tokens, max_queue=args.max_queue,
                          body_timeout_s=args.body_timeout, slots=args.slots,
                          prefix_cache_bytes=args.prefix_cache_mb << 20)
        # start checks the address (and $COLIBRI_API_KEY) before load runs: no minutes of loading first
        handle = S.start(load, args.host, args.port, args.api_key, limits, log_level="info")
    except (ColibriError, ValueError, OSError) as e:
        print(f"colibri-serve: error: {e}", file=sys.stderr)
        return 1
    sched = handle.service.scheduler
    try:
        if not sched.warmed.is_set():  # requests sent meanwhile wait in the queue
            print("warming up batched steps…", end="", file=sys.stderr, flush=True)
            while not sched.warmed.wait(0.5) and handle.running:
                pass
            print(f" ready ({sched.warm_s:.1f} s)", file=sys.stderr)
        print(f"serving {handle.model_id} at {handle.url}  (Ctrl-C stops)", file=sys.stderr)
        while handle.running:
            handle.wait(0.5)
    except KeyboardInterrupt:
        print("\nstopping (Ctrl-C again quits at once)", file=sys.stderr)
    arm_stop_deadline()
    handle.stop()
    handle.service.engine.close()
    return 0


def arm_stop_deadline(seconds: float = STOP_S) -> None:
    """A second Ctrl-C ends the process at once; a stop still running after `seconds` (the
    interpreter's exit included: it waits for worker threads) prints every thread's stack, which
    says what holds it, and ends the process with status 1 — a user's Ctrl-C never hangs."""
    def force(signum: int, frame: object) -> None:
        os._exit(130)

    def watch() -> None:
        time.sleep(seconds)
        print(f"colibri-serve: still stopping after {seconds:g} s; the threads:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(1)
    signal.signal(signal.SIGINT, force)
    threading.Thread(target=watch, name="colibri-stop-deadline", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
