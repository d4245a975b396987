"""The reference backend: every stage in plain PyTorch (CPU or GPU), the oracle of the kernels."""
