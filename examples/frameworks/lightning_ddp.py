"""An ordinary Lightning DDP script: 2 CPU ranks (gloo), nothing of unstall in it.

Lightning starts the second rank itself (it runs this script again) and replaces
each training and validation loader by one with a `DistributedSampler`, so each
rank sees half of every epoch. ``unstall run -- python examples/frameworks/lightning_ddp.py``
reports one row per rank.
"""

import lightning as L
from lightning_train import Classifier, parse, trainer_kwargs


def main() -> None:
    args = parse()
    L.seed_everything(0, verbose=False)
    model = Classifier(args.batch_size, args.workers, args.samples, args.ids)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", **trainer_kwargs(args.epochs))
    trainer.fit(model)
    if trainer.global_rank == 0:
        print(f"trained {trainer.current_epoch} epochs, {trainer.global_step} steps per rank")


if __name__ == "__main__":
    main()
