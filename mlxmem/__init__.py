"""mlxmem: long memory for small on-device language models on MLX.

from mlxmem import open_companion

chat = open_companion("llama-3.2-3b", "default")
print(chat.send("I moved to Porto last week.").reply)

`Companion(engine, store, conversation, context_tokens, response_reserve, settings)` builds one
on an engine of your own (`load_engine`, or a fake one for tests).
"""

import os

# transformers (loaded by mlx-lm for tokenizers only) warns that PyTorch is missing; mlxmem
# never needs PyTorch, so keep that advisory off the person's terminal unless they ask for it.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"

__all__ = ["ChatSettings", "Companion", "Store", "load_engine", "open_companion"]


def __getattr__(name: str):
    # The public way in, imported on first use so that `import mlxmem` stays light.
    if name in ("Companion", "ChatSettings", "open_companion"):
        from mlxmem.memory import companion

        return getattr(companion, name)
    if name == "Store":
        from mlxmem.memory.store import Store

        return Store
    if name == "load_engine":
        from mlxmem.engine import load_engine

        return load_engine
    raise AttributeError(f"module 'mlxmem' has no attribute {name!r}")
