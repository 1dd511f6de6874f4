"""colibri-cli: chat with a model in the terminal, or answer one --prompt and exit.

Without --model it uses the default model, converting it into the user data folder on first
use. A .gguf file is converted once into the same folder. Ctrl-C stops the reply, not the
program; Ctrl-D (or /exit) leaves.

With --remote URL it chats through an OpenAI-compatible endpoint instead (llama-server, vLLM,
Ollama, another colibri-serve); --model then names one of the endpoint's models (default: its
first). The API key comes from the system keyring's entry for that endpoint (--store_key puts it
there); COLIBRI_API_KEY is colibri-serve's own key and never sent to an endpoint.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.chat_session import DEFAULT_POLICY, LABELS, POLICIES, ChatSession, stream
from app.cli_convert import _progress_printer
from app.model_library import ensure_default_model
from app.paths import models_dir
from engine import default_model, kernels
from engine import params as P
from engine.errors import ColibriError

HELP_COMMANDS = "commands: /retry (another reply), /continue (a cut reply), /reset (new conversation), /stats, /exit"


def resolve_model(arg: str | None) -> Path:
    """A model directory to load: the default one, a converted .gguf, or the folder given."""
    from engine.convert.convert import convert
    if arg is None:
        print(f"model: {default_model.NAME} — {default_model.NOTE}", file=sys.stderr)
        from app.model_library import default_model_dir
        fresh = not (default_model_dir() / "manifest.json").exists()
        if fresh:
            print("converting the default model into your data folder (first run only)", file=sys.stderr)
        path = ensure_default_model(progress=_progress_printer())
        if fresh:
            print(file=sys.stderr)
        return path
    path = Path(arg).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":  # the folder recorded as made from this very file
        from app import model_library
        library = models_dir()
        done = model_library.converted_from(library, path)
        if done is not None:
            return done
        target = library / model_library.library_name(library, path, path.stem)
        print(f"converting {path.name} into {target} (once)", file=sys.stderr)
        convert(path, target, "keep", force=True, progress=_progress_printer())
        model_library.record_source(target, path)
        print(file=sys.stderr)
        return target
    return path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="colibri-cli", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Colibri model folder or a .gguf file (default: the bundled SmolLM2)")
    ap.add_argument("--prompt", help="answer this one message and exit (default: interactive chat)")
    ap.add_argument("--system", help="system prompt")
    ap.add_argument("--context_policy", choices=POLICIES, default=DEFAULT_POLICY, help="a chat that outgrows the "
                    "context: " + "; ".join(f"{k}: {v.lower()}" for k, v in LABELS.items()))
    ap.add_argument("--raw", action="store_true", help="continue --prompt as plain text, without the chat template")
    ap.add_argument("--remote", metavar="URL", help="chat through this OpenAI-compatible endpoint, e.g. "
                    "http://127.0.0.1:8080/v1 (llama-server); --model then names the endpoint's model")
    ap.add_argument("--store_key", action="store_true", help="with --remote: ask for the endpoint's API key and "
                    "keep it in the system keyring (never in a file), then exit")
    P.add_arguments(ap)
    return ap


def stream_reply(steps: Iterator, out=None) -> Any:
    """Print a reply's Steps as they stream (Ctrl-C ends it early); its last Step, None when nothing
    came. `out` defaults to the sys.stdout of the call, not of the import."""
    out, last = sys.stdout if out is None else out, [None]
    try:
        stream(steps, lambda text, step: (out.write(text), out.flush(), last.append(step)))
    except KeyboardInterrupt:
        out.write(" [stopped]")
    finally:
        steps.close()
        out.write("\n")
        out.flush()
    return last[-1]


def _speed(step, dropped: int = 0) -> str:
    if step is None:
        return ""
    return ((f"[context full: {dropped} earlier messages were left out of this reply] " if dropped else "") +
            f"[{step.generated_tokens} tokens, prefill {step.prefill_tok_s:.1f} tok/s "
            f"({step.prompt_tokens - step.cached_tokens} new, {step.cached_tokens} reused), "
            f"decode {step.decode_tok_s:.1f} tok/s, first token {step.ttft_s:.2f} s, "
            f"context {step.context_used}/{step.context_limit}]")


def chat(engine, system: str | None, sampling: dict, policy: str = DEFAULT_POLICY) -> None:
    print(f"chatting with {engine.stats().model} — {HELP_COMMANDS}", file=sys.stderr)
    session = ChatSession(engine, [{"role": "system", "content": system}] if system else [], policy)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        command = line.strip()
        if command in ("/exit", "/quit"):
            return
        if command == "/reset":
            del session.messages[1 if system else 0:]
            engine.reset()
        elif command == "/stats":
            snap = engine.stats()
            print(snap.remote or snap, file=sys.stderr)
        elif command:
            stream_reply(session.regenerate(**sampling) if command == "/retry" else session.resume(**sampling)
                         if command == "/continue" else session.send(line, **sampling))
            print(_speed(session.reply.step, session.reply.dropped), file=sys.stderr)


def open_remote(url: str, model: str | None, engine_p: dict, store: bool):
    """The endpoint as a backend (RemoteBackend), or None after --store_key kept the key."""
    from app import remote
    if store:
        import getpass
        remote.store_key(url, getpass.getpass(f"API key for {remote.normalize_url(url)} (empty: forget it): "))
        print(f"kept in the system keyring ({remote.KEYRING_SERVICE})", file=sys.stderr)
        return None
    ignored = sorted(k for k in engine_p if k != "log_level")
    if ignored:
        print(f"note: {', '.join(ignored)} applies to a local model; the endpoint uses its own", file=sys.stderr)
    if remote.plain_http_to_another_machine(url) and remote.stored_key(url):
        print(f"warning: the API key goes unencrypted (http://) to {remote.normalize_url(url)}; use https:// "
              f"if the server offers it", file=sys.stderr)
    backend = remote.RemoteBackend(url, model)
    print(f"model: {backend.model_id} at {backend.url} ({backend.card.owned_by or 'OpenAI-compatible'})",
          file=sys.stderr)
    return backend


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        kernels.setup(args.simd, args.simd_path)  # before engine.api (the remote path reads its records too)
        engine_p, sampling = P.from_args(args, "engine"), P.from_args(args, "sampling")
        engine_p.setdefault("log_level", "WARN")  # the terminal is for the conversation
        if args.store_key and not args.remote:
            raise ValueError("--store_key needs --remote URL (the endpoint the key is for)")
        if args.remote:
            engine = open_remote(args.remote, args.model, engine_p, args.store_key)
            if engine is None:
                return 0
        else:
            from engine.api import Engine
            engine = Engine(resolve_model(args.model), **engine_p)
            print("warming up…", end="", file=sys.stderr, flush=True)
            print(f" ready ({engine.warmup():.1f} s)", file=sys.stderr)
        if args.prompt is None:
            chat(engine, args.system, sampling, args.context_policy)
            return 0
        if args.raw:
            print(_speed(stream_reply(engine.generate(args.prompt, **sampling))), file=sys.stderr)
            return 0
        session = ChatSession(engine, [{"role": "system", "content": args.system}] if args.system else [],
                              args.context_policy)
        stream_reply(session.send(args.prompt, **sampling))
        print(_speed(session.reply.step, session.reply.dropped), file=sys.stderr)
        return 0
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ColibriError, ValueError) as e:
        print(f"colibri-cli: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
