"""Models the benchmarks and `unstall analyze --model` train: a simulated accelerator
(no GPU: it holds each batch as long as the model would) and the real networks
(torchvision's architectures, built without torchvision) for a GPU."""

from __future__ import annotations

from unstall.models.simulated import MODEL_RATES, SimulatedAccelerator

__all__ = ["MODEL_RATES", "SimulatedAccelerator"]
