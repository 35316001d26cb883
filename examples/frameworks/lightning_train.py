"""An ordinary Lightning script on one device, with nothing of unstall in it.

Lightning makes the loop: a sanity check on the validation loader, then per epoch
the training loader (stopped after ``len(loader)`` batches, not exhausted) and
validation. Try it plainly, then ``unstall run -- python examples/frameworks/lightning_train.py``
(or ``unstall analyze -- ...``). Seconds on a laptop CPU.
"""

import argparse
import json
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    """``n`` noisy 2-D points in two classes, made on the fly from the index."""

    def __init__(self, n: int, offset: int = 0):
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(self.offset + index)
        label = index % 2
        x = torch.randn(16, generator=g) + (1.0 if label else -1.0)
        return x, label, index


class Classifier(L.LightningModule):
    def __init__(self, batch_size: int, workers: int, samples: int, ids: str | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
        self.batch_size, self.workers, self.samples = batch_size, workers, samples
        self.ids, self.seen = ids, []

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        self.seen.extend(index.tolist())
        return nn.functional.cross_entropy(self.net(x), y)

    def on_train_epoch_end(self):
        if self.ids:  # the sample ids this rank trained on in this epoch
            path = Path(self.ids) / f"rank{self.global_rank}-epoch{self.current_epoch}.json"
            path.write_text(json.dumps(self.seen))
        self.seen = []

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(
            Points(self.samples),
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.workers,
        )

    def val_dataloader(self):
        return DataLoader(
            Points(self.samples // 4, offset=10**6),
            batch_size=self.batch_size,
            num_workers=self.workers,
        )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ids", help="a folder: write the sample ids trained on per rank, epoch")
    return parser.parse_args()


def trainer_kwargs(epochs: int) -> dict:
    """Quiet, fast settings: no logger files, checkpoints or progress bar."""
    return dict(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def main() -> None:
    args = parse()
    L.seed_everything(0, verbose=False)
    model = Classifier(args.batch_size, args.workers, args.samples, args.ids)
    trainer = L.Trainer(accelerator="cpu", devices=1, **trainer_kwargs(args.epochs))
    trainer.fit(model)
    print(f"trained {trainer.current_epoch} epochs, {trainer.global_step} steps")


if __name__ == "__main__":
    main()
