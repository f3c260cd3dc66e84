"""The canary child of mlxmem.engine.native: `python -m mlxmem.engine.canary GGUF LOAD THREADS`
loads the model with the llama.cpp engine's own load (LOAD: "default" or "no-extra-bufts"),
decodes a prompt and a few tokens through the engine's own decode, and exits 0. A build that
crashes on this CPU kills this process, not the person's."""

from __future__ import annotations

import sys
from pathlib import Path

PROMPT_TOKENS = 32
DECODED_TOKENS = 4
CANARY_CONTEXT = 256  # cells: the prompt and the decoded tokens, with room to spare


def main(gguf: str, load: str, threads: int) -> int:
    import llama_cpp.llama_cpp as lc

    from mlxmem.engine import llamacpp
    from mlxmem.errors import ModelLoadError

    llamacpp._backend()
    try:
        model, ctx = llamacpp._load(Path(gguf), CANARY_CONTEXT, threads, load == "default")
    except ModelLoadError:
        return 2
    context = llamacpp.LlamaContext(ctx, CANARY_CONTEXT)
    slot = llamacpp.LlamaSlot("canary", context, lambda _: CANARY_CONTEXT)
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    tokens = [1 + (i * 7919) % max(1, n_vocab - 1) for i in range(PROMPT_TOKENS)]
    try:
        context.decode(slot, tokens)
        for _ in range(DECODED_TOKENS):
            context.decode_one(slot, tokens[0])
    except RuntimeError:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
