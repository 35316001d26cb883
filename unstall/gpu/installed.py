"""Which GPU decoder is installed, by the import system alone: no torch, no CUDA.

``unstall analyze``'s own process names the machine's GPU decoder without importing torch
where the job's process found no CUDA device (`unstall.analysis.measure.machine`); with one,
`unstall.gpu.engine.available_decoder` measures the decoders on it.
"""

from __future__ import annotations

import importlib.util

#: Batch decoders named when no CUDA device can measure them, in order of preference.
IMPORTABLE = (("nvidia.nvimgcodec", "nvImageCodec"), ("torchvision.io", "torchvision"))


def dali_importable() -> bool:
    """Whether NVIDIA DALI is installed (``pip install 'unstall[dali]'``), without importing it."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def installed_decoder() -> str | None:
    """DALI by name and version if installed, else the first importable of `IMPORTABLE`
    (by its module spec only), else None."""
    if dali_importable():
        import nvidia.dali  # type: ignore[import-not-found]

        return f"DALI {nvidia.dali.__version__} (mixed: hardware JPEG decoder, else nvJPEG)"
    for module, name in IMPORTABLE:
        try:
            if importlib.util.find_spec(module) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return None
