"""`mlxmem eval locomo`: does the memory remember? LoCoMo's long conversations replayed through
the memory system session by session, then its questions asked as probes, under five
configurations on the same model in the same run:

- no_memory: the question alone;
- window: the newest turns that fit the budget, no summary, no facts;
- mlxmem: facts + rolling summary + verbatim window, the prompt a chat turn would get;
- recall: mlxmem plus turns recalled from the log (mlxmem.memory.recall);
- oracle: the evidence turns LoCoMo marks for the question, with their session dates.

A probe is never logged and changes no memory: it is assembled from the store (a chat would
prompt the same way), answered greedily on its own KV slot, whose cached prefix (the stable
blocks) is reused and trimmed back by the next probe; the chat slot is not touched.

What reached the prompt is measured for every configuration, with no model needed:
`evidence_in_prompt` (an evidence turn's text, whitespace folded, is in the assembled prompt)
and `answer_in_prompt` (after LoCoMo's normalization, every content word of the gold answer is
in the prompt; the probe's own question does not count). They bound what any model could
answer, and with `answers=False` (`--no-answers`) only they are measured: the replay runs and
the prompts are assembled, but no answer is generated. `answer_configs` (`--answer-config`)
answers some configurations only, and measures the others' prompts so: the summary's worth,
say, needs only `window` and `mlxmem` answered, each in a second or two after the shared
prefix, where `recall` takes several.

Each answer is scored three ways (SCORERS), and kept, so that any scoring can be redone from a
result file (`rescore`):

- `f1_locomo`: LoCoMo's official token F1: its answer normalization (lowercase, commas and
  punctuation out, articles a/an/the and "and" out, whitespace folded), every word
  Porter-stemmed, multi-hop answers split at commas, open-domain answers cut at ';';
- `f1`: the same without stemming (what this eval reported before `f1_locomo`: older results
  compare on it);
- `f1_amem`: A-Mem's set F1 (Xu et al. 2025), for its published table: the sets of lowercase
  words, no stemming, no article removed, no rule per category;

plus exact match. Adversarial questions (category 5) have no answer in the conversation: under
LoCoMo's rules a probe scores 1 if it says so, and they are reported apart.

The package, by concern: `data` (the conversations, questions and configurations), `scoring`
(an answer against the gold one, and aggregates), `probes` (a question asked under each
configuration, and what reached its prompt), `evidence` (where the evidence was when asked),
`results` (a run's result and its picture), `runner` (the resumable run), `convert` (LoCoMo's
published file into the layout read here). What front ends and scripts call is named here.
"""

from __future__ import annotations

from mlxmem.eval.locomo.data import (
    CATEGORIES,
    CONVERSATION,
    DATA_ENV,
    NEW_CHAT,
    NEW_CHAT_MODES,
    NEW_CHAT_SLOTS,
    NEW_CONVERSATION,
    NO_REPLY,
    PER_SESSION_CONFIGS,
    PER_SESSION_PAIRS,
    PLACE_PAIRS,
    PROBE_SLOTS,
    SCORED,
    LocomoConversation,
    Question,
    available_conversations,
    default_data_dir,
    exchange_times,
    exchanges,
    first_sessions,
    load_conversation,
    no_data_hint,
    pick_questions,
    session_time,
    sessions_apart,
    stratified_sample,
)
from mlxmem.eval.locomo.evidence import (
    PLACES,
    by_evidence_place,
    by_subject,
    evicted_evidence,
    log_view,
    named_entities,
)
from mlxmem.eval.locomo.probes import (
    answer_in_prompt,
    answer_words,
    ask,
    evidence_in_prompt,
    probe_new_chat,
    probe_text,
    subject,
)
from mlxmem.eval.locomo.results import (
    EvalResult,
    question_cost,
)
from mlxmem.eval.locomo.runner import (
    run_locomo,
)
from mlxmem.eval.locomo.scoring import (
    AMEM_QWEN25_1_5B_F1,
    AMEM_ROW_LABEL,
    METRICS,
    aggregate,
    amem_f1,
    amem_words,
    answer_scores,
    answer_tokens,
    beside_amem,
    bootstrap_ci,
    normalize_answer,
    paired_difference,
    rescore,
    score,
    token_f1,
)
from mlxmem.measure import CONFIGS, SCORERS
from mlxmem.measure import eval_headline as headline

__all__ = [
    "sessions_apart",
    "question_cost",
    "named_entities",
    "evicted_evidence",
    "by_subject",
    "by_evidence_place",
    "bootstrap_ci",
    "aggregate",
    "PLACE_PAIRS",
    "PLACES",
    "NEW_CHAT",
    "AMEM_QWEN25_1_5B_F1",
    "AMEM_ROW_LABEL",
    "CATEGORIES",
    "CONFIGS",
    "CONVERSATION",
    "DATA_ENV",
    "EvalResult",
    "LocomoConversation",
    "METRICS",
    "NEW_CHAT_MODES",
    "NEW_CHAT_SLOTS",
    "NEW_CONVERSATION",
    "NO_REPLY",
    "PER_SESSION_CONFIGS",
    "PER_SESSION_PAIRS",
    "PROBE_SLOTS",
    "Question",
    "SCORED",
    "SCORERS",
    "amem_f1",
    "amem_words",
    "answer_in_prompt",
    "answer_scores",
    "answer_tokens",
    "answer_words",
    "ask",
    "available_conversations",
    "beside_amem",
    "default_data_dir",
    "evidence_in_prompt",
    "exchange_times",
    "exchanges",
    "first_sessions",
    "headline",
    "load_conversation",
    "log_view",
    "no_data_hint",
    "normalize_answer",
    "paired_difference",
    "pick_questions",
    "probe_new_chat",
    "probe_text",
    "rescore",
    "run_locomo",
    "score",
    "session_time",
    "stratified_sample",
    "subject",
    "token_f1",
]
