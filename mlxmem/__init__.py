"""mlxmem: long memory for small on-device language models on MLX."""

import os

# transformers (loaded by mlx-lm for tokenizers only) warns that PyTorch is missing; mlxmem
# never needs PyTorch, so keep that advisory off the person's terminal unless they ask for it.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"
