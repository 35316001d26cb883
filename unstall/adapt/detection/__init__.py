"""torchvision v2 detection pipelines planned: boxes first, each output pixel made once."""

from unstall.adapt.detection.dataset import PlannedDetection
from unstall.adapt.detection.find import Found, find_detection
from unstall.adapt.detection.hook import adapt_detection, planned_dataset
from unstall.adapt.detection.plan import DetectionPlan
from unstall.adapt.detection.steps import Step, read_steps

__all__ = [
    "DetectionPlan",
    "Found",
    "PlannedDetection",
    "Step",
    "adapt_detection",
    "find_detection",
    "planned_dataset",
    "read_steps",
]
