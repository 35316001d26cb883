"""torchvision datasets and transforms, run as unstall's lean or GPU pipeline (``prep=``)."""

from unstall.adapt.ops import FolderPipeline, Op
from unstall.adapt.recognize import Recipe, Refusal, recognize

__all__ = ["FolderPipeline", "Op", "Recipe", "Refusal", "recognize"]
