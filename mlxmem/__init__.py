"""mlxmem: long memory for small on-device language models on MLX.

from mlxmem import ChatSettings, Companion, Store, load_engine

engine, spec = load_engine("llama-3.2-3b")
chat = Companion(engine, Store(), "default", spec.context_tokens, spec.response_reserve)
print(chat.send("I moved to Porto last week.").reply)
"""

import os

# transformers (loaded by mlx-lm for tokenizers only) warns that PyTorch is missing; mlxmem
# never needs PyTorch, so keep that advisory off the person's terminal unless they ask for it.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"

__all__ = ["ChatSettings", "Companion", "Store", "load_engine"]


def __getattr__(name: str):
    # The public way in, imported on first use so that `import mlxmem` stays light.
    if name in ("Companion", "ChatSettings"):
        from mlxmem.memory import companion

        return getattr(companion, name)
    if name == "Store":
        from mlxmem.memory.store import Store

        return Store
    if name == "load_engine":
        from mlxmem.engine import load_engine

        return load_engine
    raise AttributeError(f"module 'mlxmem' has no attribute {name!r}")
