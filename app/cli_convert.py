"""colibri-convert: a GGUF file or Hugging Face folder -> a Colibri model directory."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from engine.convert.convert import QUANTIZE_CHOICES, Progress, convert, in_place_refusal
from engine import kernels
from engine.errors import ColibriError


def _progress_printer(stream=None):
    stream = sys.stderr if stream is None else stream  # the stderr of the call, not of the import
    last, stage = [0.0], {"name": "", "t0": 0.0}

    def show(p: Progress) -> None:
        now = time.monotonic()
        if p.stage != stage["name"]:  # each stage's time left is extrapolated from its own start
            stage.update(name=p.stage, t0=now)
        if now - last[0] < 0.2 and p.done_bytes < p.total_bytes:
            return
        last[0] = now
        if p.stage == "calibration":  # layers of the forward over the calibration text
            stream.write(f"\r{p.fraction:6.1%}  {p.tensor}{_time_left(now - stage['t0'], p.fraction):<24}"
                         + ("\n" if p.done_bytes == p.total_bytes else ""))
        else:
            stream.write(f"\r{p.fraction:6.1%}  {p.done_bytes / 1e6:8.1f} / {p.total_bytes / 1e6:.1f} MB  "
                         f"{p.tensor[:48]:<48}")
        stream.flush()
    return show


def _time_left(elapsed: float, fraction: float) -> str:
    """', 1 min 20 s left' once a stage has progressed enough to extrapolate from."""
    if fraction <= 0 or fraction >= 1:
        return ""
    left = elapsed * (1 - fraction) / fraction
    return f", {int(left // 60)} min {int(left % 60)} s left" if left >= 60 else f", {left:.0f} s left"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="colibri-convert",
        description="Convert a GGUF file or a Hugging Face safetensors folder into a Colibri model "
                    "directory (one file per expert, memory-mappable).")
    ap.add_argument("--model_path", required=True, help="a .gguf file or a Hugging Face model folder")
    ap.add_argument("--output_path", required=True, help="the model directory to create")
    ap.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                    help="weight format; default: keep a GGUF's own formats, int8 for float checkpoints")
    ap.add_argument("--calibration_data", metavar="FILE",
                    help="a text file (UTF-8) whose activations weight the rounding (importance-weighted, "
                         "as llama.cpp's imatrix); for int4, int8 and the K presets")
    ap.add_argument("--split_experts", action=argparse.BooleanOptionalAction, default=True,
                    help="one file per expert (default), or --no-split_experts for one file per layer")
    ap.add_argument("--copy", action="store_true",
                    help="write the tensors into the model folder; default for a GGUF kept in its own formats: "
                         "the folder indexes the GGUF, which runs in place (no second copy; keep the file where "
                         "it is)")
    ap.add_argument("--repack_experts", action=argparse.BooleanOptionalAction, default=None,
                    help="expert matrices in the CPU kernels' 8-row groups (default: a streamed expert needs no "
                         "work after its read), or --no-repack_experts for the stored (GGUF) layout")
    ap.add_argument("--num_experts", type=int, help="check the source has this many experts per layer")
    ap.add_argument("--top_k", type=int, help="experts used per token (default: the model's own; --moefy needs it)")
    ap.add_argument("--moefy", type=int, metavar="N",
                    help="cut a dense model's MLPs into N experts by co-activation, with a router per layer "
                         "(engine/convert/moefy.py); the source may also be a Colibri model folder")
    ap.add_argument("--force", action="store_true", help="replace an existing output folder")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.moefy and not args.top_k:
        ap.error("--moefy needs --top_k K, the experts each token uses; what it costs on the default model "
                 "(perplexity 12.6 dense): 6 of 8 experts 45.6, 4 of 8 624, 2 of 8 47700 (README: Real routing)")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    kernels.setup()  # (repacking and calibration run kernels)
    try:
        if args.moefy:
            return _moefy(args)
        in_place = not args.copy and args.repack_experts is None and Path(args.model_path).is_file() and \
            in_place_refusal("gguf", args.quantize or "keep", args.split_experts, args.calibration_data) is None
        result = convert(args.model_path, args.output_path, args.quantize, split_experts=args.split_experts,
                         repack_experts=args.repack_experts is not False, in_place=in_place,
                         num_experts=args.num_experts, top_k=args.top_k, force=args.force,
                         progress=None if args.quiet else _progress_printer(),
                         calibration_data=args.calibration_data)
    except KeyboardInterrupt:
        print("\ncolibri-convert: interrupted; nothing was written", file=sys.stderr)
        return 130
    except ColibriError as e:
        print(f"\ncolibri-convert: error: {e}", file=sys.stderr)
        return 1
    if in_place:
        print(f"\nwrote {result.path}: {result.config.architecture}, {result.config.num_layers} layers, "
              f"{result.config.num_experts} expert(s), an index of {args.model_path} ({result.bytes_written / 1e3:.0f} KB, "
              f"no tensor copied) in {result.seconds:.1f} s; the model runs from the GGUF: keep it where it is "
              f"(--copy for a folder of its own)")
        return 0
    mb = result.bytes_written / 1e6
    types = ", ".join(f"{n} {k}" for k, n in sorted(result.tensor_types.items()))
    print(f"\nwrote {result.path}: {result.config.architecture}, {result.config.num_layers} layers, "
          f"{result.config.num_experts} expert(s), {mb:.1f} MB in {result.seconds:.1f} s "
          f"({mb / max(result.seconds, 1e-9):.0f} MB/s); tensors: {types}")
    if result.calibration:
        c = result.calibration
        print(f"calibration: {c['tokens']} tokens, {c['weighted_matrices']} matrices importance-weighted"
              + (f", {c['unrouted_expert_matrices']} of {c['expert_matrices']} expert matrices never routed to "
                 f"(weight-only rounding)" if c["expert_matrices"] else ""))
    return 0


def _moefy(args: argparse.Namespace) -> int:
    """A dense model as an MoE: converted first (into a temporary folder) unless it is a Colibri folder."""
    import shutil
    import tempfile
    from pathlib import Path

    from engine.convert.moefy import moefy
    src, tmp = Path(args.model_path), None
    if not (src / "manifest.json").is_file():
        tmp = Path(tempfile.mkdtemp(prefix=".moefy-dense-", dir=Path(args.output_path).resolve().parent))
        src = convert(args.model_path, tmp / "dense", args.quantize, force=True).path
    try:
        r = moefy(src, args.output_path, args.moefy, args.top_k, force=args.force)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    err = sum(min(x.error_lsq, x.error_gate) for x in r.layers) / len(r.layers)
    print(f"wrote {r.path}: {r.num_experts} experts per layer, top-{r.top_k}, calibrated on {r.tokens} tokens; "
          f"mean FFN output error {err:.3f} (routers: "
          f"{sum(x.router == 'lsq' for x in r.layers)} least-squares, {sum(x.router == 'gate' for x in r.layers)} gate "
          f"rows); measure its perplexity: colibri-bench perplexity --model {r.path} --text FILE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
