"""RandomResizedCrop + flip + normalize for a whole batch in a few kernels (any device).

Per-image Python loops cost more than the GPU work itself (DESIGN.md section 8): here
every image's crop box and flip become two small weight matrices (rows: output
pixels, columns: input pixels), and two batched matrix products resize many crops at
once (one pass per size group, so memory stays bounded when image sizes vary, as in
ImageNet). The weights are those of the CPU path's resize,
``F.interpolate(crop, size, mode="bilinear", antialias=True, align_corners=False)``
(PIL's triangle filter, widened by the scale when shrinking, renormalized at the
edges), so the result equals that per-image reference up to float rounding; the CPU
path rounds to uint8 (a quarter of a grey level on average).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from unstall.pipeline import IMAGENET_MEAN, IMAGENET_STD
from unstall.pipeline.transforms import normalize_affine


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


#: Elements of one padded float32 group (``k x 3 x H x W``): 48 Mi, i.e. 192 MiB. Crops are
#: padded to their group's largest, so one 4,000 px photo among 500 px ones gets a group of
#: its own instead of a whole batch padded to its size (tens of GB).
GROUP_ELEMENTS = 48 * 2**20


def size_groups(shapes: Sequence[tuple[int, int]], max_elements: int) -> list[list[int]]:
    """Indices of ``h x w`` images grouped so each group padded to its largest fits the budget.

    Largest first; a group takes the next image while ``count x 3 x max_h x max_w`` stays
    within ``max_elements`` (an image larger than the budget is a group of its own).
    Every index appears exactly once.
    """
    order = sorted(range(len(shapes)), key=lambda i: shapes[i][0] * shapes[i][1], reverse=True)
    groups: list[list[int]] = []
    height = width = 0
    for i in order:
        h, w = shapes[i]
        grown_h, grown_w = max(height, h), max(width, w)
        if groups and (len(groups[-1]) + 1) * 3 * grown_h * grown_w <= max_elements:
            groups[-1].append(i)
            height, width = grown_h, grown_w
        else:
            groups.append([i])
            height, width = h, w
    return groups


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
    max_elements: int = GROUP_ELEMENTS,
) -> torch.Tensor:
    """Crop ``boxes`` out of ``images``, resize to ``size``, flip, normalize: one batch.

    A list of images is cropped first (views) and the crops are resampled in a few
    size groups, so memory stays near ``max_elements`` floats whatever the image sizes.

    Args:
        images: ``N x 3 x H x W`` uint8 (padded) batch, or a list of ``3 x h x w`` images.
        boxes: ``N x 4`` crops as (left, top, width, height) in pixels.
        flips: ``N`` bools, True to mirror horizontally.
        size: output (height, width).
        mean, std: normalize ``(x / 255 - mean) / std``; both None: return 0-255 floats.
        dtype: float dtype of the result.
        channels_last: lay the result out channels_last.
        max_elements: budget of one padded float group (list input only).

    Returns:
        ``N x 3 x size[0] x size[1]`` tensor on the images' device.
    """
    n = images.shape[0] if isinstance(images, torch.Tensor) else len(images)
    if boxes.shape != (n, 4) or flips.shape != (n,):
        raise ValueError(
            f"boxes has shape {tuple(boxes.shape)} and flips {tuple(flips.shape)}; "
            f"expected ({n}, 4) and ({n},) for {n} images"
        )
    if (mean is None) != (std is None):
        raise ValueError(f"pass both mean and std or neither; got {mean=}, {std=}")
    if isinstance(images, torch.Tensor):
        out = _resample(images, boxes, flips, size)
    else:
        out = _resample_crops(images, boxes, flips, size, max_elements)
    if mean is not None and std is not None:
        mul, add = normalize_affine(tuple(mean), tuple(std), out.device)
        out = out.mul_(mul).add_(add)
    if channels_last:
        out = out.contiguous(memory_format=torch.channels_last)
    return out if dtype == torch.float32 else out.to(dtype)


def box_inside(box: Sequence[int], height: int, width: int) -> bool:
    """Whether ``box`` (left, top, width, height) is non-empty and inside the image."""
    left, top, w, h = box
    return w >= 1 and h >= 1 and left >= 0 and top >= 0 and left + w <= width and top + h <= height


def _resample_crops(
    images: Sequence[torch.Tensor],
    boxes: torch.Tensor,
    flips: torch.Tensor,
    size: tuple[int, int],
    max_elements: int,
) -> torch.Tensor:
    """Crop each image to its box (a view), then resample the crops group by group."""
    if not images:
        raise ValueError("images is empty: nothing to crop")
    crops = []
    for i, (im, (left, top, w, h)) in enumerate(zip(images, boxes.tolist(), strict=True)):
        height, width = int(im.shape[-2]), int(im.shape[-1])
        if not box_inside((left, top, w, h), height, width):
            raise ValueError(
                f"box {i} (left, top, width, height) = {(left, top, w, h)} "
                f"is not inside its {width} x {height} image"
            )
        crops.append(im[:, top : top + h, left : left + w])
    device, flips = images[0].device, flips.cpu()
    groups = size_groups([(int(c.shape[-2]), int(c.shape[-1])) for c in crops], max_elements)
    out: torch.Tensor | None = None
    for group in groups:
        index = torch.tensor(group, dtype=torch.int64)
        whole = torch.tensor([[0, 0, crops[i].shape[-1], crops[i].shape[-2]] for i in group])
        resampled = _resample(pad_batch([crops[i] for i in group]), whole, flips[index], size)
        if len(groups) == 1 and group == sorted(group):
            return resampled  # one group in input order: nothing to reassemble
        if out is None:
            out = torch.empty((len(crops), 3, *size), dtype=torch.float32, device=device)
        out.index_copy_(0, to_device(index, device), resampled)
    assert out is not None
    return out


def _resample(
    batch: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor, size: tuple[int, int]
) -> torch.Tensor:
    """Antialiased bilinear crop-resize-flip of a padded batch: 0-255 floats.

    ``out = Wy @ image @ Wx^T`` per image and channel, the weights built on the device
    from a few per-image numbers (sent in one small copy, so the thread never waits).
    """
    in_h, in_w = batch.shape[-2:]
    left, top, w, h = boxes.to(dtype=torch.float32, device="cpu").unbind(1)
    params = torch.stack((left, top, w, h, flips.to(dtype=torch.float32, device="cpu")), 1)
    left, top, w, h, flip = to_device(params, batch.device).unbind(1)
    out_h, out_w = size
    rows = _weights(top, h, in_h, out_h, torch.zeros_like(flip))  # n x out_h x in_h
    cols = _weights(left, w, in_w, out_w, flip)  # n x out_w x in_w
    src = batch.to(torch.float32)
    rows, cols_t = rows.unsqueeze(1), cols.transpose(1, 2).unsqueeze(1)
    if in_h * in_w * out_w + out_h * in_h * out_w <= out_h * in_h * in_w + out_h * in_w * out_w:
        return rows @ (src @ cols_t)  # columns first: the fewer multiply-adds
    return (rows @ src) @ cols_t


def _weights(
    start: torch.Tensor, length: torch.Tensor, padded: int, out: int, flip: torch.Tensor
) -> torch.Tensor:
    """``n x out x padded`` resize weights along one axis for crops ``[start, start + length)``.

    As torch's antialiased bilinear kernel: output ``i`` is centred at ``scale * (i + 0.5)``
    in the crop (``scale = length / out``), input ``j`` weighs ``max(0, 1 - |d| / support)``
    with ``d`` the distance of its centre and ``support = max(scale, 1)``; weights outside
    the crop are dropped and each row renormalized. A flip reverses the output order.
    """
    scale = (length / out).view(-1, 1, 1)
    support = scale.clamp(min=1.0)
    i = torch.arange(out, dtype=torch.float32, device=start.device).view(1, -1, 1)
    i = torch.where(flip.view(-1, 1, 1) > 0.5, out - 1 - i, i)
    j = torch.arange(padded, dtype=torch.float32, device=start.device).view(1, 1, -1)
    j = j - start.view(-1, 1, 1)  # input positions relative to the crop
    weight = (1.0 - ((j + 0.5 - scale * (i + 0.5)).abs() / support)).clamp_(min=0.0)
    weight = weight * ((j >= 0) & (j < length.view(-1, 1, 1)))
    return weight / weight.sum(-1, keepdim=True).clamp_(min=1e-12)


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor on ``device``: pinned and non-blocking for CUDA (no host wait)."""
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def reference_crop_flip_normalize(
    images: Sequence[torch.Tensor],
    boxes: torch.Tensor,
    flips: torch.Tensor,
    size: tuple[int, int],
    *,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> torch.Tensor:
    """The per-image loop `crop_flip_normalize` replaces, the CPU path's resize (for tests)."""
    m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    out = []
    for im, box, flip in zip(images, boxes.tolist(), flips.tolist(), strict=True):
        left, top, w, h = (int(v) for v in box)
        crop = im[:, top : top + h, left : left + w].to(torch.float32).unsqueeze(0)
        x = F.interpolate(crop, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
        if flip:
            x = x.flip(-1)
        out.append((x / 255.0 - m) / s)
    return torch.stack(out)
