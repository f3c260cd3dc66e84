"""Named defaults shared by the library and the CLI."""

import enum

# The model chat and serve run when none is named (mlxmem.models.choice.builtin_default): the
# 3B, MLX on Apple silicon and its GGUF on llama.cpp elsewhere; OFFLINE_MODEL where the hub
# cannot be reached or only MLX's CPU path runs here: a trained GGUF from the package index.
DEFAULT_MODEL = "llama-3.2-3b"
OFFLINE_MODEL = "qwen2.5-coder-1.5b"
DEFAULT_CONTEXT_TOKENS = 4096
DEFAULT_RESPONSE_RESERVE = 512
DEFAULT_CONVERSATION = "default"
DEFAULT_TEMP = 0.7
DEFAULT_TOP_P = 0.95
DEFAULT_SEED = 0
# The longest message accepted, in characters (about 25,000 tokens of English: six times a
# 4,096-token window). The log keeps a message whole; the prompt shows its head and tail.
DEFAULT_MAX_MESSAGE_CHARS = 100_000
# The longest message any front end may be set to accept, and the longest an import or a sync
# takes: a message arriving from a file is bounded like one typed (a 10 MB one made every
# later turn of its conversation slow).
MAX_MESSAGE_CHARS = 1_000_000
CHAT_SLOT = "chat"
FACTS_SLOT = "facts"
# Slots held in memory at once, in bytes of KV state (the least recently used are freed).
DEFAULT_SLOT_MEMORY_BYTES = 2 * 1024**3
# Recall old turns from the log into a message that may refer to the past. Decided by
# `mlxmem eval locomo` (configuration `recall` against `window` and `mlxmem`), not by taste:
# with Qwen2.5-Coder-1.5B, on 77 questions of the five development conversations, recall -
# window was +0.161 F1 [+0.09, +0.23] and recall - mlxmem +0.14 [+0.08, +0.21]
# (docs/memory-quality.md, "In one conversation").
DEFAULT_RECALL = True
# Let a new automatic fact replace an older one it makes out of date (a lexical gate, then one
# "is the old fact still true?" call per candidate; mlxmem.memory.extraction). Off: measured on
# Qwen2.5-Coder-1.5B, the call cannot tell an update from a look-alike. On 73 labelled pairs of
# LoCoMo's observations it caught 3 of 16 updates and replaced a fact wrongly in 29 pairs
# (`mlxmem eval facts --updates`); its margin orders an update's old fact above the other gated
# facts no better than chance (AUC 0.53, benchmarks/fact_replacement_margins.py); and in three
# whole-conversation replays it hid 54 of the 204 facts noted, of which at most 3 were a
# change of the same thing, read one by one (docs/memory-quality.md). A fact hidden by mistake
# is memory lost; with both kept, the prompt holds the old and the new. `--replace-facts` turns
# it on, for a model shown to do better.
DEFAULT_REPLACE_FACTS = False


class SummaryKind(str, enum.Enum):
    """How a fold writes the rolling summary: the model (checked; the extractive one where the
    check fails or the fold gives way), or extractive (the sentences of the folded turns that
    carry the most names, numbers and dates, each under its speaker and day: no model call)."""

    model = "model"
    extractive = "extractive"


SUMMARY_KINDS = tuple(kind.value for kind in SummaryKind)
# Extractive: measured on Qwen2.5-Coder-1.5B over every question of two whole LoCoMo
# conversations replayed both ways (conv-42, conv-43; 377 questions, docs/memory-quality.md),
# the model's summary adds nothing the extractive one does not: mlxmem(extractive) -
# mlxmem(model) +0.014 [-0.005, +0.032] A-Mem F1, and on the 39 questions whose evidence was
# folded and not recalled +0.041 [+0.005, +0.082], the extractive one better; on conv-43 the
# model's summary passed its check at 19 of 21 folds. A fold then costs no model call (conv-42's
# replay 21 min instead of 26). `--summary model` asks the model, for one shown to do better.
DEFAULT_SUMMARY = SummaryKind.extractive.value
