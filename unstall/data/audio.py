"""Synthetic audio datasets: music-like clips (WAV, FLAC or MP3) in class folders.

The paper this project follows trains M5 on FMA's 30 s MP3s; the audio bench and example
need such clips without a download. Clip ``i`` depends only on ``(seed, i)`` and the
parameters (its class on ``i % classes``): a melody of notes with harmonics (a timbre and
key per class), an attack-decay envelope per note, a stereo pan, and pink noise of its own
in each channel. The noise sets the compressed size as a recording's room and grain do:
a 10 s 44.1 kHz stereo MP3 at 160 kbit/s is ~200 KB, a FLAC ~1.2 MB, a 16-bit WAV 1.76 MB.
Encoding is soundfile's own (libsndfile with LAME and mpg123, bundled in its wheel);
the same parameters give the same bytes, so a run can be resumed.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unstall import machine
from unstall.data.synthetic import Written, write_missing
from unstall.stores import Store

#: Bump when the clips a (seed, index) produces change: old datasets are then rejected.
RECIPE_VERSION = 1
#: format -> (soundfile format, subtype, file suffix).
FORMATS = {
    "wav": ("WAV", "PCM_16", "wav"),
    "flac": ("FLAC", "PCM_16", "flac"),
    "mp3": ("MP3", "MPEG_LAYER_III", "mp3"),
}
#: MP3s are encoded at a constant 160 kbit/s (soundfile's compression level 0.5).
MP3_LEVEL = 0.5
#: The sample rates an MP3 can have (MPEG-1, 2 and 2.5).
MP3_RATES = (8_000, 11_025, 12_000, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000)
_CHUNK = 4
_SCALE = np.array([0, 2, 3, 5, 7, 8, 10, 12, 14, 15])  # minor-scale steps, in semitones
_HARMONICS = 6


@dataclass(frozen=True)
class AudioInfo(Written):
    """What `make_audio_dataset` wrote: where, how many clips, how big."""

    clips: int = 0
    classes: int = 0


def clip_key(index: int, *, clips: int, classes: int, format: str) -> str:
    """The key of clip ``index``: ``class_XXX/clip_XXXXXX.<format>``, class ``index % classes``."""
    cw, iw = max(3, len(str(classes - 1))), max(6, len(str(clips - 1)))
    return f"class_{index % classes:0{cw}d}/clip_{index:0{iw}d}.{FORMATS[format][2]}"


def clip_seconds(seed: int, index: int, seconds: float, max_seconds: float | None) -> float:
    """Clip ``index``'s duration: ``seconds``, or drawn in ``[seconds, max_seconds]`` by
    ``(seed, index)``, to a tenth of a second."""
    if max_seconds is None or max_seconds == seconds:
        return float(seconds)
    draw = np.random.default_rng([seed, 2_000_003, index]).uniform(seconds, max_seconds)
    return round(float(draw), 1)


def render_clip(
    seed: int,
    index: int,
    *,
    classes: int,
    seconds: float = 10.0,
    max_seconds: float | None = None,
    rate: int = 44_100,
    channels: int = 2,
) -> np.ndarray:
    """Clip ``index``'s samples, float32 ``(frames, channels)`` in [-1, 1]: a function of
    the arguments only (see the module notes for what it holds)."""
    rng = np.random.default_rng([seed, index])
    palette = np.random.default_rng([seed, 1_000_003, index % classes])
    frames = round(clip_seconds(seed, index, seconds, max_seconds) * rate)
    base = 110.0 * 2 ** (int(palette.integers(0, 24)) / 12)  # the class's key
    timbre = palette.uniform(0.2, 1.0, _HARMONICS) / np.arange(1, _HARMONICS + 1)
    # notes: lengths 0.15-0.8 s, pitches on the class's scale, continuous phase
    lengths = np.round(rng.uniform(0.15, 0.8, frames // int(0.15 * rate) + 2) * rate).astype(int)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    notes = int(np.searchsorted(starts, frames, side="left"))
    pitch = base * 2 ** (rng.choice(_SCALE, notes) / 12)
    note_of = np.repeat(np.arange(notes), lengths[:notes])[:frames]
    phase = np.cumsum(2 * np.pi * pitch[note_of] / rate)
    since = (np.arange(frames) - starts[note_of]) / rate  # seconds into the note
    decay = rng.uniform(1.5, 5.0, notes)[note_of]
    envelope = np.minimum(since / 0.01, 1.0) * np.exp(-since * decay)
    tone = sum(a * np.sin(k * phase) for k, a in enumerate(timbre, start=1)) * envelope
    pan = rng.uniform(0.3, 0.7)
    gains = [1 - pan, pan] if channels == 2 else [0.5] * channels
    out = np.empty((frames, channels), np.float32)
    level = rng.uniform(0.05, 0.12)
    for c in range(channels):
        out[:, c] = tone * gains[c] + _pink(rng, frames) * level
    return out * np.float32(0.8 / max(float(np.abs(out).max()), 1e-6))


def encode_clip(samples: np.ndarray, *, rate: int, format: str) -> bytes:
    """``samples`` (float32 ``(frames, channels)``) as a file of ``format`` (`FORMATS`)."""
    import soundfile

    kind, subtype, _ = FORMATS[format]
    extra: dict[str, Any] = {}
    if kind == "MP3":
        extra = {"compression_level": MP3_LEVEL, "bitrate_mode": "CONSTANT"}
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=kind, subtype=subtype, **extra)
    return out.getvalue()


def make_audio_dataset(
    dest: str | os.PathLike[str] | Store,
    *,
    clips: int,
    classes: int = 10,
    seconds: float = 10.0,
    max_seconds: float | None = None,
    format: str = "mp3",
    rate: int = 44_100,
    channels: int = 2,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
) -> AudioInfo:
    """Write ``clips`` synthetic clips in ``classes`` class folders to ``dest``.

    ``dest`` is a directory (created if missing) or any URL `open_store` accepts. A
    manifest (``unstall-dataset.json``) records the parameters: re-running with the same
    ones skips clips already there; different ones raise, naming the parameter.
    ``max_seconds``: durations drawn per clip in ``[seconds, max_seconds]``.

    Raises:
        ValueError: a bad parameter, or ``dest`` holds a dataset made with other ones.
        ModuleNotFoundError: soundfile is not installed (``pip install 'unstall[audio]'``).
    """
    params = _check_params(
        clips=clips,
        classes=classes,
        seconds=seconds,
        max_seconds=max_seconds,
        format=format,
        rate=rate,
        channels=channels,
        seed=seed,
    )
    import soundfile  # noqa: F401  (say it is missing before anything is written)

    keys = [clip_key(i, clips=clips, classes=classes, format=format) for i in range(clips)]
    written = write_missing(
        dest,
        params,
        keys,
        _write_chunk,
        workers=workers,
        progress=progress,
        what="clips",
        chunk=_CHUNK,
    )
    return AudioInfo(clips=clips, classes=classes, **written)


def ensure_audio_dataset(
    clips: int,
    *,
    seconds: float = 10.0,
    format: str = "mp3",
    classes: int = 10,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> Path:
    """The path of a synthetic audio dataset in the cache, made the first time it is asked
    for: ``<cache_dir>/datasets/audio-<clips>x<seconds>s-<format>-seed<seed>``, where
    ``cache_dir`` defaults to ``$UNSTALL_CACHE_DIR`` or ``~/.cache/unstall``."""
    base = cache_dir or machine.cache_dir()
    name = f"audio-{clips}x{seconds:g}s-{classes}c-{format}-seed{seed}"
    path = Path(base).expanduser() / "datasets" / name
    make_audio_dataset(
        path,
        clips=clips,
        classes=classes,
        seconds=seconds,
        format=format,
        seed=seed,
        progress=progress,
    )
    return path


def _pink(rng: np.random.Generator, frames: int) -> np.ndarray:
    """Pink noise (power ~ 1/f), unit RMS: white noise shaped in the frequency domain."""
    spectrum = np.fft.rfft(rng.standard_normal(frames))
    spectrum /= np.sqrt(np.maximum(np.arange(spectrum.size), 1))
    noise = np.fft.irfft(spectrum, frames)
    return noise / max(float(noise.std()), 1e-12)


def _check_params(
    *,
    clips: int,
    classes: int,
    seconds: float,
    max_seconds: float | None,
    format: str,
    rate: int,
    channels: int,
    seed: int,
) -> dict[str, Any]:
    ints = {
        "clips": (clips, clips >= 1, "at least 1"),
        "classes": (classes, 1 <= classes <= max(clips, 1), "between 1 and clips"),
        "rate": (rate, 8_000 <= rate <= 192_000, "a sample rate between 8000 and 192000"),
        "channels": (channels, channels in (1, 2), "1 or 2"),
        "seed": (seed, seed >= 0, "a non-negative int"),
    }
    for name, (value, ok, want) in ints.items():
        if not isinstance(value, int) or isinstance(value, bool) or not ok:
            raise ValueError(f"{name}={value!r} must be {want}")
    if not 0.1 <= seconds <= 600:
        raise ValueError(f"seconds={seconds!r} must be between 0.1 and 600")
    if max_seconds is not None and not seconds <= max_seconds <= 600:
        raise ValueError(f"max_seconds={max_seconds!r} must be between seconds and 600")
    if format not in FORMATS:
        raise ValueError(f"format={format!r} must be one of {', '.join(FORMATS)}")
    if format == "mp3" and rate not in MP3_RATES:
        raise ValueError(f"rate={rate!r} is not an MP3 sample rate: one of {MP3_RATES}")
    return {
        "recipe": RECIPE_VERSION,
        "kind": "audio",
        "clips": clips,
        "classes": classes,
        "seconds": float(seconds),
        "max_seconds": None if max_seconds is None else float(max_seconds),
        "format": format,
        "rate": rate,
        "channels": channels,
        "seed": seed,
    }


def _write_chunk(job: tuple[Store, dict[str, Any], list[int]]) -> tuple[int, int]:
    store, p, indices = job
    nbytes = 0
    for i in indices:
        samples = render_clip(
            p["seed"],
            i,
            classes=p["classes"],
            seconds=p["seconds"],
            max_seconds=p["max_seconds"],
            rate=p["rate"],
            channels=p["channels"],
        )
        data = encode_clip(samples, rate=p["rate"], format=p["format"])
        store.put(clip_key(i, clips=p["clips"], classes=p["classes"], format=p["format"]), data)
        nbytes += len(data)
    return len(indices), nbytes
