"""RandomResizedCrop + flip + normalize for a whole batch in a few kernels (any device).

Per-image Python loops cost more than the GPU work itself (~3,500 img/s vs
~15,000 for decode alone on an H100): here every image's crop box and flip
become one row of an affine matrix, and one ``affine_grid`` + ``grid_sample``
pass resizes all crops at once. Sampling is bilinear at the same source
positions as ``F.interpolate(crop, size, mode="bilinear", align_corners=False)``
with coordinates clamped to the crop, so it equals that per-image reference up
to float rounding; it does not antialias (the CPU path does), which matters
only where a crop is shrunk by more than about 2x.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from unstall.pipeline import IMAGENET_MEAN, IMAGENET_STD


def pad_batch(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack ``3 x h_i x w_i`` uint8 images of different sizes into one zero-padded batch."""
    if not images:
        raise ValueError("images is empty: nothing to crop")
    height = max(int(im.shape[-2]) for im in images)
    width = max(int(im.shape[-1]) for im in images)
    first = images[0]
    out = torch.zeros((len(images), 3, height, width), dtype=first.dtype, device=first.device)
    for i, im in enumerate(images):
        out[i, :, : im.shape[-2], : im.shape[-1]] = im
    return out


def crop_flip_normalize(
    images: torch.Tensor | Sequence[torch.Tensor],
    boxes: torch.Tensor,
    flips: torch.Tensor,
    size: tuple[int, int],
    *,
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    """Crop ``boxes`` out of ``images``, resize to ``size``, flip, normalize: one batch.

    Args:
        images: ``N x 3 x H x W`` uint8 (padded) batch, or a list of ``3 x h x w`` images.
        boxes: ``N x 4`` crops as (left, top, width, height) in pixels.
        flips: ``N`` bools, True to mirror horizontally.
        size: output (height, width).
        mean, std: normalize ``(x / 255 - mean) / std``; both None: return 0-255 floats.
        dtype: float dtype of the result.
        channels_last: lay the result out channels_last.

    Returns:
        ``N x 3 x size[0] x size[1]`` tensor on the images' device.
    """
    batch = images if isinstance(images, torch.Tensor) else pad_batch(images)
    n, _, in_h, in_w = batch.shape
    if boxes.shape != (n, 4) or flips.shape != (n,):
        raise ValueError(
            f"boxes has shape {tuple(boxes.shape)} and flips {tuple(flips.shape)}; "
            f"expected ({n}, 4) and ({n},) for {n} images"
        )
    device = batch.device
    b = boxes.to(device=device, dtype=torch.float64)
    left, top, w, h = b.unbind(1)
    sign = 1.0 - 2.0 * flips.to(device=device, dtype=torch.float64)
    # Normalized input x = a * output x + c maps output pixel centres onto the crop
    # exactly as interpolate(align_corners=False) does; flipping negates a.
    theta = torch.zeros((n, 2, 3), dtype=torch.float64, device=device)
    theta[:, 0, 0] = sign * w / in_w
    theta[:, 0, 2] = (2 * left + w) / in_w - 1
    theta[:, 1, 1] = h / in_h
    theta[:, 1, 2] = (2 * top + h) / in_h - 1
    out_h, out_w = size
    grid = F.affine_grid(theta.float(), [n, 3, out_h, out_w], align_corners=False)
    # Clamp to the crop's first/last pixel centres, as interpolate clamps to the crop's edge.
    lo = torch.stack(((2 * left + 1) / in_w - 1, (2 * top + 1) / in_h - 1), 1)
    hi = torch.stack(((2 * (left + w) - 1) / in_w - 1, (2 * (top + h) - 1) / in_h - 1), 1)
    grid = torch.maximum(
        torch.minimum(grid, hi.float().view(n, 1, 1, 2)), lo.float().view(n, 1, 1, 2)
    )
    src = batch.to(torch.float32)
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=False)
    if mean is not None and std is not None:
        m = torch.tensor(mean, dtype=torch.float64)
        s = torch.tensor(std, dtype=torch.float64)
        mul = (1.0 / (255.0 * s)).to(torch.float32).view(1, -1, 1, 1).to(device)
        add = (-m / s).to(torch.float32).view(1, -1, 1, 1).to(device)
        out = out.mul_(mul).add_(add)
    elif (mean is None) != (std is None):
        raise ValueError(f"pass both mean and std or neither; got {mean=}, {std=}")
    if channels_last:
        out = out.contiguous(memory_format=torch.channels_last)
    return out if dtype == torch.float32 else out.to(dtype)


def reference_crop_flip_normalize(
    images: Sequence[torch.Tensor],
    boxes: torch.Tensor,
    flips: torch.Tensor,
    size: tuple[int, int],
    *,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> torch.Tensor:
    """The per-image loop `crop_flip_normalize` replaces (for tests and comparisons)."""
    m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    out = []
    for im, box, flip in zip(images, boxes.tolist(), flips.tolist(), strict=True):
        left, top, w, h = (int(v) for v in box)
        crop = im[:, top : top + h, left : left + w].to(torch.float32).unsqueeze(0)
        x = F.interpolate(crop, size=size, mode="bilinear", align_corners=False)[0]
        if flip:
            x = x.flip(-1)
        out.append((x / 255.0 - m) / s)
    return torch.stack(out)
