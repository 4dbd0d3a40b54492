"""A user's loop over an image folder through our loader, written as a user writes it: ``loader.ImageFolder``
with the built-in ``"train"`` transform, ``loader.DataLoader`` with a cache and the form of its records
forced (``--cache-form``, "raw" by default). No step: decode and augmentation set the pace.

    python train_ours.py --data DIR [--epochs N] [--cache-form raw|prepared|auto]

Prints one line per epoch: the form the cache held.
"""

from __future__ import annotations

import argparse

import loader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--cache-form", default="raw")
    args = p.parse_args()
    dataset = loader.ImageFolder(args.data, transform="train")
    dl = loader.DataLoader(
        dataset, batch_size=32, shuffle=True, num_workers=2, cache_bytes="auto", cache_form=args.cache_form
    )
    for epoch in range(1, args.epochs + 1):
        samples = sum(len(labels) for _, labels in dl)
        print(f"epoch {epoch}: {samples} samples, cache_form {dl.stats().cache_form}", flush=True)


if __name__ == "__main__":
    main()
