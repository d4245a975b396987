"""mok: mixture-of-experts layer for expert-parallel training (drop-in for Mixture-of-Kittens)."""

from mok import functional, ops
from mok.status import MoKDeviceError

__version__ = "0.1.0"

__all__ = ["MoKDeviceError", "__version__", "functional", "ops"]
