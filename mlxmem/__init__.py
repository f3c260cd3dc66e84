"""mlxmem: long memory for small on-device language models on MLX."""

__version__ = "0.1.0"
