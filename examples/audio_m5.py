"""An audio-classification script in the shape of the M5 job (DS-Analyzer's audio task), with
nothing of unstall in it.

Each clip is read with soundfile (libsndfile opens and decodes the file in C: WAV, FLAC, MP3),
mixed to mono, resampled to 8 kHz with soxr and cut or zero-padded to a fixed length
(``--samples``, 80,000: 10 s); the batches are float32 ``(batch, 1, samples)`` made by
``--workers`` DataLoader workers. The model is M5 (Dai et al., 2017: a 1-D conv net on raw
waveforms), or simulated with ``--model-rate R``: each step holds the batch for
``batch / R`` seconds, so a fast accelerator (a high rate) leaves the job bound by the
workers' preparation.

Make clips with ``unstall make-dataset data/audio --audio 1000 --seconds 10``, then run it
as it is, ``python examples/audio_m5.py data/audio``, or unchanged under unstall with a
config: ``unstall run --config samples.json -- python examples/audio_m5.py data/audio``,
``samples.json`` = ``{"kwargs": {"cache": {"size": "8GiB", "hold": "samples"}}}``.
Each epoch prints its samples/s; ``--ids FILE`` writes, per sample, the epoch, its label
and the SHA-256 of its waveform's bytes as JSON lines (for the tests).
"""

import argparse
import hashlib
import json
import os
import time

import numpy as np
import soundfile
import soxr
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")


class ClipFolder(Dataset):
    """Clips in class folders (``root/<class>/<clip>``), as mono waveforms at ``rate`` Hz
    of exactly ``samples`` samples, with their class's index."""

    def __init__(self, root, rate=8000, samples=80_000):
        self.rate, self.samples = rate, samples
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.files, self.labels = [], []
        for label, name in enumerate(self.classes):
            folder = os.path.join(root, name)
            for clip in sorted(os.listdir(folder)):
                if clip.lower().endswith(SUFFIXES):
                    self.files.append(os.path.join(folder, clip))
                    self.labels.append(label)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        audio, rate = soundfile.read(self.files[index], dtype="float32", always_2d=True)
        mono = audio.mean(axis=1)
        wave = soxr.resample(mono, rate, self.rate) if rate != self.rate else mono
        wave = wave[: self.samples]
        if len(wave) < self.samples:
            wave = np.pad(wave, (0, self.samples - len(wave)))
        wave = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))
        return wave[None], self.labels[index]


class M5(nn.Module):
    """M5: four 1-D conv blocks on the raw waveform, global average pooling, a linear layer."""

    def __init__(self, classes, channels=32, stride=16):
        super().__init__()

        def block(cin, cout, kernel, stride=1):
            return [nn.Conv1d(cin, cout, kernel, stride), nn.BatchNorm1d(cout), nn.ReLU()]

        self.features = nn.Sequential(
            *block(1, channels, 80, stride),
            nn.MaxPool1d(4),
            *block(channels, channels, 3),
            nn.MaxPool1d(4),
            *block(channels, 2 * channels, 3),
            nn.MaxPool1d(4),
            *block(2 * channels, 2 * channels, 3),
            nn.MaxPool1d(4),
        )
        self.head = nn.Linear(2 * channels, classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=int, default=8000, help="resample to this (Hz)")
    parser.add_argument("--samples", type=int, default=80_000, help="samples kept per clip")
    parser.add_argument(
        "--model-rate", type=float, default=0.0, help="simulated model (samples/s); 0: M5"
    )
    parser.add_argument("--ids", default=None, help="write each sample's hash and label here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = ClipFolder(args.data, rate=args.rate, samples=args.samples)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
    )
    model = M5(len(dataset.classes)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = open(args.ids, "a") if args.ids else None  # noqa: SIM115 (closed at exit)
    samples, t0 = 0, time.perf_counter()
    for epoch in range(args.epochs):
        count, e0 = 0, time.perf_counter()
        for waves, target in loader:
            if ids is not None:
                for wave, label in zip(waves, target.tolist(), strict=True):
                    digest = hashlib.sha256(wave.numpy().tobytes()).hexdigest()
                    record = {"epoch": epoch, "label": label, "sha256": digest}
                    record.update(dtype=str(wave.dtype), shape=list(wave.shape))
                    ids.write(json.dumps(record) + "\n")
            waves = waves.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            if args.model_rate > 0:
                time.sleep(len(target) / args.model_rate)  # the simulated model's step
            else:
                opt.zero_grad()
                nn.functional.cross_entropy(model(waves), target).backward()
                opt.step()
            count += len(target)
        seconds = time.perf_counter() - e0
        print(f"epoch {epoch + 1}: {count} samples in {seconds:.2f} s, {count / seconds:.1f}/s")
        samples += count
    if ids is not None:
        ids.close()
    seconds = time.perf_counter() - t0
    print(f"samples/s: {samples / seconds:.1f} ({samples} samples in {seconds:.2f} s)")


if __name__ == "__main__":
    main()
