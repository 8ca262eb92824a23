"""The random-image floor: uniform random images in [0, 1] scored against a dataset's images.

An attack whose reconstruction scores at or below this leaked nothing a coin could not produce. Each
image is compared with its own random image (no matching, as for a batch of one), scored with
fedbench's PSNR and MSE. Usage (the README's numbers):

    .venv/bin/python docs/random_floor.py mnist5k
"""

from __future__ import annotations

import argparse

import numpy as np

from fedbench.data import load_dataset
from fedbench.metrics.reconstruction import mse, psnr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?", default="mnist5k")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    bundle = load_dataset(args.dataset, {}, None, False)
    if not bundle.meta.is_image:
        raise SystemExit(f"{args.dataset} is not an image dataset")
    x = bundle.denormalize(bundle.x_train).clamp(0, 1).numpy().astype(np.float64)
    rand = np.random.default_rng(args.seed).random(x.shape)
    p, m = psnr(x, rand), mse(x, rand)
    print(
        f"{args.dataset}: {len(x)} training images, uniform random image per image: "
        f"PSNR mean {p.mean():.2f} dB "
        f"(5th-95th percentile {np.percentile(p, 5):.2f}-{np.percentile(p, 95):.2f}), "
        f"MSE mean {m.mean():.3f} (max {m.max():.3f}); a flat 0.5 grey image: "
        f"MSE {float(((x - 0.5) ** 2).mean()):.3f}"
    )


if __name__ == "__main__":
    main()
