"""mok: mixture-of-experts layer for expert-parallel training (drop-in for Mixture-of-Kittens)."""

from mok import functional, ops
from mok.layer import MoEFunction, MoELayer
from mok.status import MoKDeviceError

__version__ = "0.1.0"

__all__ = ["MoEFunction", "MoELayer", "MoKDeviceError", "__version__", "functional", "ops"]
