"""The canary child of mlxmem.engine.native: `python -m mlxmem.engine.canary GGUF LOAD THREADS`
loads the model as the llama.cpp engine would (LOAD: "default" or "no-extra-bufts"), decodes a
prompt and a few tokens, and exits 0. A build that crashes on this CPU kills this process, not
the person's."""

from __future__ import annotations

import ctypes
import sys

PROMPT_TOKENS = 32
DECODED_TOKENS = 4


def main(gguf: str, load: str, threads: int) -> int:
    import llama_cpp.llama_cpp as lc

    quiet = lc.llama_log_callback(lambda *_: None)  # referenced until the process ends
    lc.llama_log_set(quiet, ctypes.c_void_p(0))
    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = -1
    mparams.use_extra_bufts = load == "default"
    model = lc.llama_model_load_from_file(gguf.encode(), mparams)
    if not model:
        return 2
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = 256
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        return 2
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    batch = lc.llama_batch_init(PROMPT_TOKENS, 0, 1)
    tokens = [1 + (i * 7919) % max(1, n_vocab - 1) for i in range(PROMPT_TOKENS)]
    for step, chunk in enumerate([tokens] + [[tokens[0]]] * DECODED_TOKENS):
        pos = 0 if step == 0 else PROMPT_TOKENS + step - 1
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(chunk) - 1
        if lc.llama_decode(ctx, batch) != 0:
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
