"""An ordinary Hugging Face `Trainer` script, with nothing of unstall in it.

A tiny BERT made from a config (no download, no network) classifies made-up token
sequences. `Trainer` makes a DataLoader and accelerate replaces it with its own
`DataLoaderShard`; ``unstall run -- python examples/frameworks/hf_trainer.py``
reports the one that trained.
"""

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Tokens(Dataset):
    """``n`` sequences of 16 token ids; the label is whether the first id is even."""

    def __init__(self, n: int, vocab: int = 64):
        self.n, self.vocab = n, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        g = torch.Generator().manual_seed(index)
        ids = torch.randint(1, self.vocab, (16,), generator=g)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones(16, dtype=torch.long),
            "labels": int(ids[0]) % 2,
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            num_train_epochs=args.epochs,
            per_device_train_batch_size=args.batch_size,
            dataloader_num_workers=args.workers,
            learning_rate=1e-3,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            seed=0,
        )
        trainer = Trainer(model=model, args=training, train_dataset=Tokens(args.samples))
        result = trainer.train()
    print(f"trained {args.epochs} epochs, {result.global_step} steps")


if __name__ == "__main__":
    main()
