"""GPU preparation: batched JPEG decode on the device, then crop/flip/normalize in a few kernels.

Used by ``unstall.DataLoader(..., device="cuda", prep="gpu")``; the batched
augmentation also runs on CPU tensors (tests, comparisons). GPU libraries are
optional (``pip install 'unstall[gpu]'``) and imported only when used.
"""

from unstall.gpu.augment import crop_flip_normalize, pad_batch, reference_crop_flip_normalize
from unstall.gpu.decode import GpuDecoder, cpu_decoder, pick_decoder
from unstall.gpu.prep import EncodedView, GpuPrep, collate_encoded

__all__ = [
    "EncodedView",
    "GpuDecoder",
    "GpuPrep",
    "collate_encoded",
    "cpu_decoder",
    "crop_flip_normalize",
    "pad_batch",
    "pick_decoder",
    "reference_crop_flip_normalize",
]
