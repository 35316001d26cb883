"""`unstall make-dataset DIR`: write a synthetic dataset: realistic JPEGs in ImageFolder layout
(``--images``), or audio clips in class folders (``--audio``)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-dataset",
        help="write a synthetic dataset: ~500x375 JPEGs, or audio clips (WAV/FLAC/MP3)",
        description="Write IMAGES synthetic JPEGs (class_XXX/img_XXXXXX.jpg), or CLIPS "
        "synthetic audio clips (class_XXX/clip_XXXXXX.mp3: 44.1 kHz stereo music-like tones "
        "and noise), to DIR, a directory or a storage URL. The same seed gives the same bytes; "
        "re-running into the same directory with the same parameters only writes what is "
        "missing.",
    )
    p.add_argument("dir", metavar="DIR", help="destination directory or URL (s3://bucket/prefix)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--images", type=int, help="number of images")
    what.add_argument("--audio", type=int, metavar="CLIPS", help="number of audio clips")
    p.add_argument(
        "--classes",
        type=int,
        default=None,
        help="number of classes (folders); audio: 10 (fewer clips: one each)",
    )
    p.add_argument("--seed", type=int, default=0, help="content seed (default: 0)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality, 1-100 (default: 90)")
    audio = p.add_argument_group("audio clips (--audio)")
    audio.add_argument("--seconds", type=float, default=10.0, help="clip length (default: 10)")
    audio.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="draw each clip's length between --seconds and this (default: all --seconds)",
    )
    audio.add_argument("--format", choices=("mp3", "flac", "wav"), default="mp3")
    audio.add_argument("--rate", type=int, default=44_100, help="sample rate (default: 44100)")
    audio.add_argument("--channels", type=int, default=2, help="1 or 2 (default: 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    try:
        if args.audio is not None:
            line = _audio(args)
        elif args.classes is None:
            raise ValueError("--images needs --classes (the number of class folders)")
        else:
            line = _images(args)
    except (ValueError, ModuleNotFoundError) as exc:
        if isinstance(exc, ModuleNotFoundError):
            exc = ValueError(f"audio clips need {exc.name}: pip install 'unstall[audio]'")
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        return 2
    console.print(line, highlight=False, soft_wrap=True)
    return 0


def _images(args: argparse.Namespace) -> str:
    from unstall.data.synthetic import make_dataset

    info = make_dataset(
        args.dir,
        images=args.images,
        classes=args.classes,
        quality=args.quality,
        **_shared(args),
    )
    return f"{info.images} images in {info.classes} classes at {info.root}: " + _written(info)


def _audio(args: argparse.Namespace) -> str:
    from unstall.data.audio import make_audio_dataset

    info = make_audio_dataset(
        args.dir,
        clips=args.audio,
        classes=min(10, max(args.audio, 1)) if args.classes is None else args.classes,
        seconds=args.seconds,
        max_seconds=args.max_seconds,
        format=args.format,
        rate=args.rate,
        channels=args.channels,
        **_shared(args),
    )
    return (
        f"{info.clips} {args.format.upper()} clips in {info.classes} classes at {info.root}: "
        + _written(info)
    )


def _shared(args: argparse.Namespace) -> dict[str, Any]:
    """The options both kinds of dataset take alike: the seed, the processes that write,
    the progress bar."""
    return {"seed": args.seed, "workers": args.workers, "progress": not args.no_progress}


def _written(info: Any) -> str:
    size = f"mean {info.mean_bytes / 1000:.1f} KB, " if info.sized else ""
    return (
        f"{info.written} written, {info.skipped} already there; "
        f"{size}{info.total_bytes / 1e6:.1f} MB in {info.seconds:.1f} s"
    )
