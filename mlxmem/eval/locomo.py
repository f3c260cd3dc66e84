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
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import re
import statistics
import string
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import Stemmer

from mlxmem.bench.common import Progress, no_progress
from mlxmem.defaults import DEFAULT_REPLACE_FACTS, DEFAULT_SUMMARY
from mlxmem.engine import Engine, Message
from mlxmem.errors import InputError
from mlxmem.eval.runlog import KEEP_EVERY, RunDir
from mlxmem.memory.companion import ChatSettings, Companion, check_summary_kind
from mlxmem.memory.context.budget import AssembledPrompt, PromptBudget, recall_block
from mlxmem.memory.store import Store
from mlxmem.memory.tables.dates import unanchored
from mlxmem.memory.tables.terms import STOPWORDS
from mlxmem.memory.window import as_messages
from mlxmem.text import OLD_COUNT_NAMES, with_old_names

CONFIGS = ("no_memory", "window", "mlxmem", "recall", "oracle")
# With each session its own conversation (run_locomo's per_session), the questions are asked
# in a new conversation: what a new chat gets without memory, with the facts (instructions +
# facts: the prompt of a new chat), with the facts and recall across conversations, and the
# oracle.
PER_SESSION_CONFIGS = ("no_memory", "facts", "recall", "oracle")
# What a new chat gets from the facts, then from recall; and the oracle's room above nothing.
PER_SESSION_PAIRS = (("facts", "no_memory"), ("recall", "facts"), ("oracle", "no_memory"))
# The differences read per evidence place in one conversation: the summary's (with the facts)
# worth over the plain window, recall's over that, and the memory's over none.
PLACE_PAIRS = (("mlxmem", "window"), ("recall", "mlxmem"), ("recall", "no_memory"))
NEW_CHAT = "questions"  # where the per-session questions are asked: never logged
# The modes whose questions are asked in a new chat (PER_SESSION_CONFIGS): the per-session
# replay's, and benchmarks/new_chat_on_replay.py's on a one-conversation replay.
NEW_CHAT_MODES = ("conversation_per_session", "new_chat_after_one_conversation")
# The KV slot each configuration answers on. Three, as many as the llama.cpp engine keeps at
# once (so that no question evicts the prefix the next one reuses): the short prompts share
# the instructions, recall's prompt extends mlxmem's (facts's in a new chat).
PROBE_SLOTS = {
    "no_memory": "probe/short",
    "oracle": "probe/short",
    "window": "probe/window",
    "mlxmem": "probe/mlxmem",
    "recall": "probe/mlxmem",
}
NEW_CHAT_SLOTS = {
    "no_memory": "probe/short",
    "oracle": "probe/short",
    "facts": "probe/facts",
    "recall": "probe/facts",
}
# The three F1 scores of an answer (see the module's docstring and `answer_scores`).
SCORERS = ("f1", "f1_locomo", "f1_amem")
# Per item and configuration; aggregated alike (None: not measured, e.g. no answer generated).
METRICS = (*SCORERS, "exact", "evidence_in_prompt", "answer_in_prompt")
# Verified against the files (qa/*.qa.json): 1 has several evidence turns per question (96%),
# 2 asks "when", 3 asks what someone "would likely" do, 4 has one evidence turn (96%), 5 has
# an `adversarial_answer` instead of an answer.
CATEGORIES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}
SCORED = (1, 2, 3, 4)  # `overall` is over these; adversarial is reported apart
# A-Mem's published row for Qwen2.5-1.5B (Xu et al. 2025, "A-Mem: Agentic Memory for LLM
# Agents", Table 1): its token F1 x100 per LoCoMo category. Its columns are LoCoMo's categories
# 1-4 by number, whatever their headers call them, so the row is keyed by number; set beside
# our `f1_amem`, the F1 its evaluation code computes (`amem_f1`).
AMEM_QWEN25_1_5B_F1 = {1: 18.2, 2: 24.3, 3: 16.5, 4: 23.6}
AMEM_ROW_LABEL = "A-Mem (published)"  # Qwen2.5-1.5B, as the report says
# Whom a question names: the person (the logged user's speaker), the other speaker, both or
# neither. The facts are about the person by design, so what they carry is read on "user".
SUBJECTS = ("user", "other", "both", "neither")
DATA_ENV = "MLXMEM_LOCOMO"
ANSWER_TOKENS = 24
QUESTION_ROOM = 96  # tokens kept for the question when the window config packs turns
BOOTSTRAP_SAMPLES = 1000
CONVERSATION = "locomo"
NO_ANSWER_RE = re.compile(
    r"not mentioned|no information|don'?t know|do not know|not sure|unknown|cannot|can'?t tell|"
    r"no mention|not say|didn'?t say|never (said|mentioned)",
    re.IGNORECASE,
)


# -- the data ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    category: int
    evidence: tuple[str, ...]
    index: int = 0  # its place in the conversation's question file: its id in a run's folder


@dataclass
class LocomoConversation:
    id: str
    user_name: str
    assistant_name: str
    turns: list[dict]  # role, text, session, session_time, id
    questions: list[Question]


def default_data_dir() -> Path:
    """$MLXMEM_LOCOMO, else ../shared/corpora/locomo beside the working directory or the
    repository (never copied into the project)."""
    import os

    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    repo = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), repo):
        found = base.parent / "shared" / "corpora" / "locomo"
        if found.is_dir():
            return found
    return Path.cwd().parent / "shared" / "corpora" / "locomo"


def no_data_hint(data: Path) -> str:
    """How to get LoCoMo's data, for an error that found none in `data`."""
    return (
        f"no LoCoMo data in {data}. It is not shipped (CC BY-NC): download data/locomo10.json "
        "from github.com/snap-research/locomo, write it out with `mlxmem eval convert-locomo "
        f"locomo10.json DIR`, then pass --data DIR (or set ${DATA_ENV})"
    )


def available_conversations(data: Path) -> list[str]:
    """Conversations that have questions (the development set)."""
    return sorted(p.name.removesuffix(".qa.json") for p in (data / "qa").glob("*.qa.json"))


def load_conversation(data: Path, conv_id: str) -> LocomoConversation:
    transcript, qa_file = data / f"{conv_id}.jsonl", data / "qa" / f"{conv_id}.qa.json"
    if not transcript.is_file() or not qa_file.is_file():
        have = available_conversations(data)
        if not have:
            raise InputError(no_data_hint(data))
        raise InputError(
            f"no LoCoMo conversation {conv_id!r} with questions in {data} ({', '.join(have)})"
        )
    try:
        turns = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
        qa = json.loads(qa_file.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read LoCoMo conversation {conv_id}: {exc}") from None
    questions = [
        Question(
            q["question"],
            str(q.get("answer", q.get("adversarial_answer", ""))),
            int(q["category"]),
            tuple(q.get("evidence", ())),
            index,
        )
        for index, q in enumerate(qa["qa"])
    ]
    return LocomoConversation(conv_id, qa["user"], qa["assistant"], turns, questions)


def first_sessions(conv: LocomoConversation, sessions: int | None) -> LocomoConversation:
    """The conversation cut after its first `sessions` sessions, with only the questions whose
    evidence turns all lie in them (a question without evidence turns cannot be placed and is
    left out): a smaller honest subset for slow models, the same replay up to that point."""
    if sessions is None:
        return conv
    if sessions < 1:
        raise InputError(f"--sessions must be at least 1, not {sessions}")
    turns = [t for t in conv.turns if t["session"] <= sessions]
    ids = {t["id"] for t in turns}
    questions = [q for q in conv.questions if q.evidence and set(q.evidence) <= ids]
    return replace(conv, turns=turns, questions=questions)


def pick_questions(questions: Sequence[Question], limit: int | None) -> list[Question]:
    """`limit` questions spread evenly over the file (it runs roughly in session order, so the
    first N would all be about the first sessions)."""
    if not limit or limit >= len(questions):
        return list(questions)
    return [questions[i * len(questions) // limit] for i in range(limit)]


def stratified_sample(questions: Sequence[Question], size: int) -> list[Question]:
    """About `size` of the questions of categories 1-4 (SCORED; adversarial ones compare with
    nothing published), each category given its share of `size` by largest remainder and at
    least one, its questions spread evenly over the file (`pick_questions`). The categories
    are interleaved, each in file order, so that a run stopped part-way (a --run-dir
    sitting) has asked each category its share so far. A category's interval is over its
    own n."""
    groups = {c: [q for q in questions if q.category == c] for c in SCORED}
    groups = {c: qs for c, qs in groups.items() if qs}
    total = sum(len(qs) for qs in groups.values())
    if size >= total:
        return [q for q in questions if q.category in groups]
    quotas = {c: size * len(qs) / total for c, qs in groups.items()}
    counts = {c: max(1, int(q)) for c, q in quotas.items()}
    by_remainder = sorted(groups, key=lambda c: quotas[c] - int(quotas[c]), reverse=True)
    for c in by_remainder[: max(0, size - sum(counts.values()))]:
        counts[c] += 1
    picked = [pick_questions(qs, counts[c]) for c, qs in groups.items()]
    # Categories taken in turn (the file groups them), so that a run stopped part-way (a
    # --run-dir sitting) has asked each category its share so far, not the first ones only.
    ordered = [(k / len(p), q.category, q) for p in picked for k, q in enumerate(p)]
    return [q for *_, q in sorted(ordered, key=lambda t: t[:2])]


# LoCoMo dates its sessions like "7:30 pm on 21 June, 2023".
SESSION_TIME_FORMAT = "%I:%M %p on %d %B, %Y"
NEW_CONVERSATION = "(a new conversation begins)"
NO_REPLY = "(no reply)"


def session_time(text: str) -> datetime:
    """A LoCoMo session time ("7:30 pm on 21 June, 2023") as a time in this device's time zone,
    so that a prompt shows the session's own day."""
    try:
        return datetime.strptime(" ".join(text.split()), SESSION_TIME_FORMAT).astimezone()
    except ValueError:
        raise InputError(f"not a LoCoMo session time: {text!r}") from None


def transcript(conv: LocomoConversation) -> list[list]:
    """The messages to log, in order: [role, text, dialogue ids, session time or None] each.
    Consecutive messages of one role in one session are joined; where one speaker ends a
    session and begins the next, the other's turn between them is a placeholder (no message
    spans two days); roles alternate from a user turn to a reply."""
    merged: list[list] = []
    session = None
    for t in conv.turns:
        text, at = t["text"].strip(), t.get("session_time")
        at = session_time(at) if at else None
        same_speaker = bool(merged) and merged[-1][0] == t["role"]
        if same_speaker and t["session"] == session:
            merged[-1][1] += "\n" + text
            merged[-1][2].append(t["id"])
            continue
        if same_speaker and t["role"] == "user":
            merged.append(["assistant", NO_REPLY, [], merged[-1][3]])
        elif same_speaker:
            merged.append(["user", NEW_CONVERSATION, [], at])
        merged.append([t["role"], text, [t["id"]], at])
        session = t["session"]
    if merged and merged[0][0] == "assistant":
        merged.insert(0, ["user", NEW_CONVERSATION, [], merged[0][3]])
    if merged and merged[-1][0] == "user":
        merged.append(["assistant", NO_REPLY, [], merged[-1][3]])
    return merged


def exchanges(conv: LocomoConversation) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The transcript as (user, reply) exchanges (see `transcript`), and dialogue id -> log
    seq."""
    merged = transcript(conv)
    seq_of = {dia: i + 1 for i, (_, _, ids, _) in enumerate(merged) for dia in ids}
    pairs = [(merged[i][1], merged[i + 1][1]) for i in range(0, len(merged), 2)]
    return pairs, seq_of


def sessions_apart(conv: LocomoConversation) -> list[tuple[str, LocomoConversation]]:
    """Each session as a conversation of its own, as a companion app opens a new chat each
    day: (the mlxmem conversation's name, the session alone), in order. `exchanges` and
    `exchange_times` of each give what to log in it."""
    numbers = sorted({t["session"] for t in conv.turns})
    return [
        (session_name(n), replace(conv, turns=[t for t in conv.turns if t["session"] == n]))
        for n in numbers
    ]


def session_name(number: int) -> str:
    return f"session {number:02d}"


def exchange_times(conv: LocomoConversation) -> list[tuple[datetime | None, datetime | None]]:
    """When each exchange's message and reply were written: their sessions' times."""
    merged = transcript(conv)
    return [(merged[i][3], merged[i + 1][3]) for i in range(0, len(merged), 2)]


# -- scoring ----------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """LoCoMo's normalization: lowercase, no commas or punctuation, no a/an/the (nor 'and', as
    its script drops too), one space."""
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the|and)\b", " ", text)
    return " ".join(text.split())


# PyStemmer's objects are not thread-safe: one per thread.
_local = threading.local()


def _porter() -> Stemmer.Stemmer:
    # LoCoMo's script stems with NLTK's PorterStemmer; NLTK is not a dependency, PyStemmer is
    # (recall's index). Its "porter" is the original Porter algorithm, which NLTK's default
    # mode extends for a few rare words (e.g. "dying": "dy" here, "die" there): F1 can differ
    # from the official figures on those words only.
    stemmer = getattr(_local, "porter", None)
    if stemmer is None:
        stemmer = _local.porter = Stemmer.Stemmer("porter")
    return stemmer


def answer_tokens(text: str, stem: bool = False) -> list[str]:
    """The words LoCoMo's F1 counts: normalized, and Porter-stemmed with `stem`."""
    words = normalize_answer(text).split()
    return _porter().stemWords(words) if stem else words


def token_f1(prediction: str, truth: str, stem: bool = False) -> float:
    """LoCoMo's token F1 (a bag of words: a repeated word counts as often as both have it)."""
    pred, gold = answer_tokens(prediction, stem), answer_tokens(truth, stem)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def gold_answer(question: Question) -> str:
    """The answer LoCoMo scores against: an open-domain question's first (before ';')."""
    return question.answer.split(";")[0] if question.category == 3 else question.answer


def said_no_answer(prediction: str) -> float:
    """1.0 if an answer says the conversation does not tell (adversarial questions)."""
    return float(bool(NO_ANSWER_RE.search(prediction)))


def locomo_f1(prediction: str, question: Question, stem: bool = False) -> float:
    """F1 of one answer per LoCoMo's rules for its category: adversarial, said none; multi-hop,
    the gold answer's comma-separated parts each matched to the best part of the answer, and
    averaged; else the token F1 against the gold answer."""
    if question.category == 5:
        return said_no_answer(prediction)
    truth = gold_answer(question)
    if question.category != 1:
        return token_f1(prediction, truth, stem)
    parts = [p for p in prediction.split(",") if p.strip()] or [prediction]
    golds = [g for g in truth.split(",") if g.strip()] or [truth]
    return sum(max(token_f1(p, g, stem) for p in parts) for g in golds) / len(golds)


# What A-Mem's tokenizer splits at besides whitespace (its utils.py `simple_tokenize`).
_AMEM_SEPARATORS = str.maketrans(".,!?", "    ")


def amem_words(text: str) -> set[str]:
    """The set of words A-Mem's F1 compares: lowercase, split at whitespace and . , ! ?"""
    return set(text.lower().translate(_AMEM_SEPARATORS).split())


def amem_f1(prediction: str, reference: str) -> float:
    """A-Mem's token F1, as its evaluation code computes it (github.com/WujiangXu/AgenticMemory,
    utils.py, `calculate_metrics`, read for this): over SETS of words (a repeated word counts
    once), no stemming, articles kept; 0 if either is empty or they share no word. It takes
    the gold answer as it is, whatever the category: an adversarial question's is the answer
    the conversation does not hold, so saying "not mentioned" scores 0 here."""
    pred, ref = amem_words(prediction), amem_words(reference)
    common = len(pred & ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def score(prediction: str, question: Question) -> tuple[float, float]:
    """(F1 unstemmed, exact match) of one answer, per LoCoMo's rules for its category."""
    f1 = locomo_f1(prediction, question)
    if question.category == 5:
        return f1, f1
    exact = normalize_answer(prediction) == normalize_answer(gold_answer(question))
    return f1, float(exact)


def answer_scores(prediction: str, question: Question) -> dict[str, float]:
    """Every score of one answer: SCORERS and exact match."""
    f1, exact = score(prediction, question)
    return {
        "f1": f1,
        "f1_locomo": locomo_f1(prediction, question, stem=True),
        "f1_amem": amem_f1(prediction, question.answer),
        "exact": exact,
    }


def rescore(item: dict, configs: Sequence[str] = (*CONFIGS, *PER_SESSION_CONFIGS)) -> dict:
    """`item` (of a result file) with every configuration's stored answer scored anew by
    `answer_scores`: the scorers of this version on a run made before them. A configuration
    without an answer (--no-answers) is left as it is."""
    question = Question(item["question"], str(item["answer"]), item["category"], ())
    for config in configs:
        done = item.get(config)
        if isinstance(done, dict) and done.get("answer") is not None:
            done |= answer_scores(done["answer"], question)
    return item


def bootstrap_ci(values: Sequence[float], seed: int = 0) -> list[float] | None:
    """95% percentile bootstrap interval of the mean."""
    if not values:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(BOOTSTRAP_SAMPLES))
    return [means[int(0.025 * BOOTSTRAP_SAMPLES)], means[int(0.975 * BOOTSTRAP_SAMPLES) - 1]]


def aggregate(items: Sequence[dict], seed: int = 0, configs: Sequence[str] = CONFIGS) -> dict:
    """Per configuration: each of METRICS per category and overall (categories 1-4), each
    {mean, ci, n}; items that did not measure a metric (None, or from before it existed) are
    left out of it."""
    out: dict = {}
    for config in configs:
        table: dict = {}
        for metric in METRICS:

            def values(keep, metric=metric, config=config) -> list[float]:
                found = (i[config].get(metric) for i in items if keep(i["category"]))
                return [v for v in found if v is not None]

            groups = {CATEGORIES[c]: values(lambda k, c=c: k == c) for c in CATEGORIES}
            groups["overall"] = values(lambda k: k in SCORED)
            table[metric] = {
                name: {
                    "mean": sum(v) / len(v) if v else None,
                    "ci": bootstrap_ci(v, seed),
                    "n": len(v),
                }
                for name, v in groups.items()
            }
        out[config] = table
    return out


def paired_difference(
    items: Sequence[dict], a: str, b: str, seed: int = 0, metric: str = "f1"
) -> dict:
    """Overall F1 (`metric`, of SCORERS) of config `a` minus config `b` on the same questions
    (categories 1-4), with a 95% bootstrap interval over questions: what decides whether `a`
    beats `b`. Items without `metric` for both (not answered, or older) are left out."""
    diffs = [
        i[a][metric] - i[b][metric]
        for i in items
        if i["category"] in SCORED and i[a].get(metric) is not None and i[b].get(metric) is not None
    ]
    mean = sum(diffs) / len(diffs) if diffs else None
    ci = bootstrap_ci(diffs, seed)
    return {"mean": mean, "ci": ci, "n": len(diffs), "beats": bool(ci and ci[0] > 0)}


def by_subject(
    items: Sequence[dict], pairs: Sequence[tuple[str, str]], seed: int = 0, metric: str = "f1"
) -> dict:
    """`pairs`' paired differences (of `metric`) over the questions about each subject
    (SUBJECTS) that has some; items from before `about` was recorded are left out."""
    out = {}
    for name in SUBJECTS:
        group = [i for i in items if i.get("about") == name]
        scored = sum(i["category"] in SCORED for i in group)
        if scored:
            out[name] = {"questions": scored} | {
                f"{a}_vs_{b}": paired_difference(group, a, b, seed, metric) for a, b in pairs
            }
    return out


# -- the layers, measured ---------------------------------------------------------------------

_CAPITALIZED_RE = re.compile(r"^[A-Z][a-z]+$")


def named_entities(text: str) -> set[str]:
    """Capitalized words that do not open a sentence (a crude stand-in for named entities)."""
    found = set()
    for sentence in re.split(r"(?<=[.!?])\s+|\n", text):
        for word in sentence.split()[1:]:
            word = word.strip(string.punctuation + "’")
            if _CAPITALIZED_RE.match(word) and word != "I":
                found.add(word)
    return found


def entity_survival(
    conv: LocomoConversation, seq_of: dict[str, int], summary_text: str, last_seq: int
) -> dict:
    """Of the named entities in the evidence turns that were folded into the summary, the share
    the summary still names."""
    texts = {t["id"]: t["text"] for t in conv.turns}
    evidence = {e for q in conv.questions for e in q.evidence if seq_of.get(e, 10**9) <= last_seq}
    entities = set().union(*(named_entities(texts[e]) for e in evidence if e in texts))
    words = set(re.findall(r"[a-z]+", summary_text.lower()))
    kept = {e for e in entities if e.lower() in words}
    return {
        "evicted_evidence_turns": len(evidence),
        "entities": len(entities),
        "entities_in_summary": len(kept),
        "share": len(kept) / len(entities) if entities else None,
    }


# -- probes -----------------------------------------------------------------------------------


def probe_text(conv: LocomoConversation, question: Question) -> str:
    return (
        f"(You are {conv.assistant_name}; I am {conv.user_name}.) Question: "
        f"{question.question} Answer in a few words."
    )


def subject(conv: LocomoConversation, question: str) -> str:
    """Whom `question` names, of SUBJECTS, by the speakers' names as whole words."""

    def names(name: str) -> bool:
        return re.search(rf"\b{re.escape(name)}\b", question) is not None

    user, other = names(conv.user_name), names(conv.assistant_name)
    if user and other:
        return "both"
    return "user" if user else "other" if other else "neither"


def window_prompt(companion: Companion, text: str):
    """Config `window`: the newest logged turns that fit, then the question; no summary, no
    facts. Turns are chosen with a fixed room for the question, so every probe shares them."""
    budget: PromptBudget = companion.budget
    instructions = companion.settings.instructions
    turns = companion.store.turns(companion.conversation)
    room = budget.available - budget.system_tokens(instructions, [], None) - QUESTION_ROOM
    chosen, used = [], 0
    for t in reversed(turns):
        used += (t.token_count or companion.engine.count_text(t.text)) + 8
        if used > room:
            break
        chosen.append(t)
    chosen.reverse()
    while chosen and chosen[0].role != "user":
        chosen.pop(0)
    first = len(turns) - len(chosen)
    before = turns[first - 1].created_at if chosen and first > 0 else None
    messages = as_messages(chosen, companion.engine.model_id, before)
    return budget.assemble(instructions, [], None, [*messages, Message("user", text)])


def oracle_prompt(companion: Companion, conv: LocomoConversation, question: Question, text: str):
    """Config `oracle`: the evidence turns, with their session dates and speakers' roles, in the
    same block recall uses, then the question."""
    by_id = {t["id"]: t for t in conv.turns}
    lines = [
        f"- [{by_id[e].get('session_time', '')}] {by_id[e]['role']}: {by_id[e]['text']}"
        for e in question.evidence
        if e in by_id
    ]
    return companion.budget.assemble(
        companion.settings.instructions, [], None, [Message("user", recall_block(lines, text))]
    )


def prompt_text(prompt: AssembledPrompt, probe: str) -> str:
    """What the model is shown, as text (every message of the assembled prompt, recalled turns
    included), without the probe's own question."""
    *head, newest = prompt.messages
    return "\n".join([*(m.content for m in head), newest.content.replace(probe.strip(), "", 1)])


def evidence_in_prompt(conv: LocomoConversation, question: Question, text: str) -> float | None:
    """1.0 if one of the question's evidence turns is in `text` whole (whitespace folded), else
    0.0; None for a question without evidence turns in the transcript."""
    by_id = {t["id"]: t["text"] for t in conv.turns}
    turns = [" ".join(by_id[e].split()) for e in question.evidence if e in by_id]
    if not turns:
        return None
    shown = " ".join(unanchored(text).split())  # a recalled turn's days said outright
    return float(any(t in shown for t in turns))


def answer_words(question: Question) -> list[str]:
    """The gold answer's content words after LoCoMo's normalization (for an open-domain
    question, its first answer, as `score` takes it); all its words if none is a content
    word ("Yes")."""
    words = normalize_answer(gold_answer(question)).split()
    return [w for w in words if w not in STOPWORDS] or words


def answer_in_prompt(question: Question, text: str) -> float | None:
    """1.0 if every content word of the gold answer is a word of `text` (both normalized as
    LoCoMo normalizes answers), else 0.0; None for an empty answer."""
    words = answer_words(question)
    if not words:
        return None
    shown = set(normalize_answer(text).split())
    return float(all(w in shown for w in words))


def ask(engine: Engine, tokens: list[int], slot: str) -> tuple[str, dict]:
    """The answer's first line, and what it cost: seconds, and the prompt's tokens read from
    the slot's cache (the prefix shared with the slot's last question) and prefilled."""
    start = time.perf_counter()
    result = engine.generate(tokens, slot=slot, max_tokens=ANSWER_TOKENS, temp=0.0)
    lines = [line.strip() for line in result.text.strip().splitlines() if line.strip()]
    cost = {
        "seconds": round(time.perf_counter() - start, 3),
        "cached_tokens": result.stats.cached_tokens,
        "prefilled_tokens": result.stats.prefilled_tokens,
    }
    return (lines[0] if lines else ""), cost


def probe(
    companion: Companion,
    conv: LocomoConversation,
    question: Question,
    log: LogView | None = None,
    answers: Collection[str] = CONFIGS,
) -> dict:
    """One question under every configuration; nothing is logged. For each, what reached the
    prompt (`evidence_in_prompt`, `answer_in_prompt`) and, for those in `answers`, the model's
    answer and its scores (else they are None). `companion` holds the
    replayed conversation: a chat session over it, with recall on or off, assembles the
    prompt of configs mlxmem and recall (`Companion.context`, which reads the store and never
    writes it). `log` (from `log_view`, the same for every question) says where the evidence
    turns sit: the item records whether they had left the verbatim window, and how many
    the recall config brought back."""
    log = log or log_view(companion, exchanges(conv)[1])
    engine, text = companion.engine, probe_text(conv, question)
    prompts = {
        "no_memory": companion.budget.assemble(
            companion.settings.instructions, [], None, [Message("user", text)]
        ),
        "window": window_prompt(companion, text),
    }
    for config, recall in (("mlxmem", False), ("recall", True)):
        # A probe runs no turn: no look for facts, so no read of the marks it would resume.
        settings = replace(companion.settings, recall=recall, extract_facts=False)
        session = Companion(
            engine,
            companion.store,
            CONVERSATION,
            companion.budget.budget,
            companion.response_reserve,
            settings,
        )
        prompts[config] = session.context(text, at=log.last_at)  # asked after the last session
    prompts["oracle"] = oracle_prompt(companion, conv, question, text)
    item = scored(engine, conv, question, text, prompts, answers, PROBE_SLOTS)
    recalled = prompts["recall"].recalled
    evidence = sorted(log.seq_of[e] for e in question.evidence if e in log.seq_of)
    item["evidence_seqs"] = evidence
    item["evicted_upto"] = log.evicted_upto
    item["recall"]["recalled"] = recalled
    item["recall"]["recall_tokens"] = prompts["recall"].layers.recall
    recalled_seqs = {log.seq_of_id[i] for i in recalled if i in log.seq_of_id}
    item["recall"]["evidence_recalled"] = len(recalled_seqs.intersection(evidence))
    item["mlxmem"] |= facts_shown(question, log.facts, prompt_text(prompts["mlxmem"], text))
    item["place"] = evidence_place(item)
    return item


def scored(
    engine: Engine,
    conv: LocomoConversation,
    question: Question,
    text: str,
    prompts: dict[str, AssembledPrompt],
    answers: Collection[str],
    slots: dict[str, str],
) -> dict:
    """The item of one question: for each configuration's prompt, what reached it and (for
    those in `answers`) the model's answer, its scores and its cost. Each configuration
    answers on the KV slot `slots` names for it: a slot is shared by configurations whose
    prompts share a prefix (recall's extends mlxmem's), and its cache keeps the prefix the
    questions share (instructions, facts, summary, window), so a question prefills only what
    follows it."""
    item = {
        "index": question.index,
        "question": question.question,
        "answer": question.answer,
        "category": question.category,
        "evidence": list(question.evidence),
        "about": subject(conv, question.question),
    }
    for config, prompt in prompts.items():
        answered = config in answers
        answer, cost = ask(engine, prompt.tokens, slots[config]) if answered else (None, {})
        unscored: dict[str, float | None] = dict.fromkeys((*SCORERS, "exact"))
        shown = prompt_text(prompt, text)
        item[config] = {
            "answer": answer,  # kept: any scoring can be redone from the result (`rescore`)
            **(unscored if answer is None else answer_scores(answer, question)),
            "evidence_in_prompt": evidence_in_prompt(conv, question, shown),
            "answer_in_prompt": answer_in_prompt(question, shown),
            "prompt_tokens": len(prompt.tokens),
            **cost,
        }
    return item


def probe_new_chat(
    engine: Engine,
    store: Store,
    conv: LocomoConversation,
    question: Question,
    budget: tuple[int, int],
    at: datetime | None,
    facts: Sequence[str],
    answers: Collection[str],
    where: dict[str, int],
) -> dict:
    """One question asked in a new conversation (NEW_CHAT, never logged) after every session
    was logged as a conversation of its own, under PER_SESSION_CONFIGS. `budget`: the context
    budget and response reserve; `at`: when it is asked (after the last session); `facts`: the
    texts of the facts kept; `where`: LoCoMo's dialogue ids to the ids of the turns they were
    logged as. The item also says how many of the facts the `facts` prompt held and how many
    of those hold a content word of the gold answer, which turns recall brought (`recalled`,
    by message id), and where the evidence was (`evidence_place`)."""
    text = probe_text(conv, question)

    def new_chat(recall: bool) -> Companion:
        settings = ChatSettings(temp=0.0, seed=0, extract_facts=False, recall=recall)
        return Companion(engine, store, NEW_CHAT, *budget, settings)

    chat = new_chat(recall=False)
    prompts = {
        "no_memory": chat.budget.assemble(
            chat.settings.instructions, [], None, [Message("user", text)]
        ),
        "facts": chat.context(text, at=at),
        "recall": new_chat(recall=True).context(text, at=at),
        "oracle": oracle_prompt(chat, conv, question, text),
    }
    item = scored(engine, conv, question, text, prompts, answers, NEW_CHAT_SLOTS)
    item["facts"] |= facts_shown(question, facts, prompt_text(prompts["facts"], text))
    item["recall"]["recalled"] = prompts["recall"].recalled
    item["recall"]["recall_tokens"] = prompts["recall"].layers.recall
    evidence = {where[e] for e in question.evidence if e in where}
    item["evidence_seqs"] = sorted(evidence)
    item["recall"]["evidence_recalled"] = len(evidence & set(item["recall"]["recalled"]))
    item["place"] = evidence_place(item)
    return item


def facts_shown(question: Question, facts: Sequence[str], shown: str) -> dict:
    """How many of the facts `facts` the prompt text `shown` held, and how many of those hold
    a content word of the gold answer."""
    in_prompt = [f for f in facts if f in shown]
    words = set(answer_words(question))
    return {
        "facts_in_prompt": len(in_prompt),
        "facts_with_answer_word": sum(
            bool(words & set(normalize_answer(f).split())) for f in in_prompt
        ),
    }


# Where a question's evidence was when it was asked, most direct first (`evidence_place`).
PLACES = ("window", "recalled", "fact", "folded", "nowhere", "unplaced")


def evidence_place(item: dict) -> str:
    """Where the question's evidence was for the memory's own prompt (mlxmem's in one
    conversation, facts's in a new chat): an evidence turn in the verbatim window; else one
    recalled; else a fact in the prompt holding a word of the answer; else folded into the
    summary only (one conversation: the turns left the window through a fold); else nowhere
    in the prompt. `unplaced`: the question names no evidence turn found in the replay."""
    seqs = item.get("evidence_seqs")
    if not seqs:
        return "unplaced"
    if "evicted_upto" in item and any(s > item["evicted_upto"] for s in seqs):
        return "window"
    if item["recall"].get("evidence_recalled"):
        return "recalled"
    memory = item.get("mlxmem") or item.get("facts") or {}
    if memory.get("facts_with_answer_word"):
        return "fact"
    return "folded" if "mlxmem" in item else "nowhere"


def by_evidence_place(
    items: Sequence[dict], configs: Sequence[str], pairs: Sequence[tuple[str, str]], seed: int = 0
) -> dict:
    """Per evidence place (PLACES) that has questions of categories 1-4: their number, each
    configuration's F1 of every scorer, and the paired differences `pairs` of each scorer.
    The summary's worth shows on `folded` (mlxmem - window), a fact's on `fact`."""
    out: dict[str, dict] = {}
    for place in PLACES:
        group = [i for i in items if i["category"] in SCORED and i.get("place") == place]
        if not group:
            continue
        out[place] = {"questions": len(group)}
        for metric in SCORERS:
            means = {}
            for config in configs:
                values = [i[config][metric] for i in group if i[config].get(metric) is not None]
                means[config] = {
                    "mean": sum(values) / len(values) if values else None,
                    "ci": bootstrap_ci(values, seed),
                }
            out[place][metric] = means | {
                f"{a}_vs_{b}": paired_difference(group, a, b, seed, metric) for a, b in pairs
            }
    return out


@dataclass(frozen=True)
class LogView:
    seq_of: dict[str, int]  # LoCoMo dialogue id -> seq of the logged message holding it
    seq_of_id: dict[int, int]  # logged message id -> its seq
    evicted_upto: int  # the newest summary's last seq: turns up to it left the window
    last_at: datetime | None = None  # when the newest turn was written
    facts: tuple[str, ...] = ()  # the texts of the facts kept


def log_view(companion: Companion, seq_of: dict[str, int]) -> LogView:
    summaries = companion.store.summaries(companion.conversation)
    turns = companion.store.turns(companion.conversation)
    return LogView(
        seq_of,
        {t.id: t.seq for t in turns},
        summaries[-1].last_seq if summaries else 0,
        turns[-1].created_at if turns else None,
        tuple(f.text for f in companion.store.facts()),
    )


def evicted_evidence(items: Sequence[dict], seed: int = 0, metric: str = "f1") -> dict:
    """The questions recall is for: those (categories 1-4) with an evidence turn that had left
    the verbatim window. How often recall put one of their evidence turns in the prompt (a
    retrieval figure, the same for any model), and what that did to F1 (`metric`), recall minus
    mlxmem, overall and on single-hop questions. Items from before these fields existed are
    left out."""

    def left_window(item: dict) -> bool:
        return any(s <= item["evicted_upto"] for s in item["evidence_seqs"])

    chosen = [
        i for i in items if i["category"] in SCORED and "evidence_seqs" in i and left_window(i)
    ]

    def summary(group: list[dict]) -> dict:
        hits = [float(i["recall"]["evidence_recalled"] > 0) for i in group]
        return {
            "questions": len(group),
            "evidence_recalled": int(sum(hits)),
            "share": sum(hits) / len(hits) if hits else None,
            "share_ci": bootstrap_ci(hits, seed),
            "recall_vs_mlxmem": paired_difference(group, "recall", "mlxmem", seed, metric),
        }

    return {
        "overall": summary(chosen),
        "single_hop": summary([i for i in chosen if i["category"] == 4]),
    }


# -- the run ----------------------------------------------------------------------------------


@dataclass
class EvalResult:
    settings: dict
    conversations: list[dict] = field(default_factory=list)

    @property
    def items(self) -> list[dict]:
        return [i for c in self.conversations for i in c["items"]]

    def to_dict(self) -> dict:
        if self.settings.get("mode") in NEW_CHAT_MODES:
            return self._per_session_dict()
        seed = self.settings.get("seed", 0)
        scores = aggregate(self.items, seed)
        return {
            "configs": list(CONFIGS),
            "kind": "eval",
            "settings": self.settings,
            **scores,
            "recall_vs_mlxmem": paired_difference(self.items, "recall", "mlxmem", seed),
            "recall_vs_window": paired_difference(self.items, "recall", "window", seed),
            "oracle_vs_no_memory": paired_difference(self.items, "oracle", "no_memory", seed),
            "evicted_evidence": evicted_evidence(self.items, seed),
            "by_evidence_place": by_evidence_place(self.items, CONFIGS, PLACE_PAIRS, seed),
            "cost": question_cost(self.items, CONFIGS),
            "per_conversation": {
                c["id"]: {
                    config: aggregate(c["items"], seed)[config]["f1"]["overall"]
                    for config in CONFIGS
                }
                for c in self.conversations
            },
            "layers": {c["id"]: c["layers"] for c in self.conversations},
            "conversations": self.conversations,
        }

    def _per_session_dict(self) -> dict:
        seed, items = self.settings.get("seed", 0), self.items
        scores = aggregate(items, seed, PER_SESSION_CONFIGS)
        facts = [i["facts"] for i in items if i["category"] in SCORED]
        return {
            "kind": "eval",
            "configs": list(PER_SESSION_CONFIGS),
            "settings": self.settings,
            **scores,
            **{f"{a}_vs_{b}": paired_difference(items, a, b, seed) for a, b in PER_SESSION_PAIRS},
            # The facts are about the person: what they carry shows on questions about them.
            "by_subject": by_subject(items, PER_SESSION_PAIRS, seed),
            "by_evidence_place": by_evidence_place(
                items, PER_SESSION_CONFIGS, PER_SESSION_PAIRS, seed
            ),
            "cost": question_cost(items, PER_SESSION_CONFIGS),
            "facts_in_prompt_mean": _mean([f["facts_in_prompt"] for f in facts]),
            "facts_with_answer_word_mean": _mean([f["facts_with_answer_word"] for f in facts]),
            "per_conversation": {
                c["id"]: {
                    config: aggregate(c["items"], seed, PER_SESSION_CONFIGS)[config]["f1"][
                        "overall"
                    ]
                    for config in PER_SESSION_CONFIGS
                }
                for c in self.conversations
            },
            "layers": {c["id"]: c["layers"] for c in self.conversations},
            "conversations": self.conversations,
        }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def question_cost(items: Sequence[dict], configs: Sequence[str]) -> dict:
    """What a question cost, per configuration: median seconds (the answer's whole call) and
    mean tokens of the prompt, of it read from the slot's cache, and prefilled; and the
    median seconds of a question over all configurations (assembly included). Items from
    before these were recorded are left out."""
    out: dict = {"questions": len(items)}
    for config in configs:
        answered = [i[config] for i in items if i[config].get("seconds") is not None]
        out[config] = {
            "seconds_median": _median([a["seconds"] for a in answered]),
            **{
                f"{k}_mean": _mean([a[k] for a in answered])
                for k in ("prompt_tokens", "cached_tokens", "prefilled_tokens")
            },
        }
    out["question_seconds_median"] = _median([i["seconds"] for i in items if "seconds" in i])
    return out


def run_locomo(
    engine: Engine,
    data: Path,
    conversation_ids: Sequence[str],
    context_tokens: int,
    response_reserve: int,
    *,
    limit: int | None = None,
    sample: int | None = None,
    facts: bool = False,
    seed: int = 0,
    progress: Progress = no_progress,
    answers: bool = True,
    answer_configs: Sequence[str] | None = None,
    sessions: int | None = None,
    per_session: bool = False,
    run_dir: Path | None = None,
    summary: str = DEFAULT_SUMMARY,
    replace_facts: bool = DEFAULT_REPLACE_FACTS,
    categories: Sequence[int] | None = None,
) -> EvalResult:
    """Replay each conversation into a scratch store and ask its questions (`limit` each, or a
    `sample` stratified by category); without `answers`, only assemble their prompts and
    measure what reached them; with `answer_configs`, answer those configurations only (of
    the mode's) and measure the others' prompts. With `sessions`, only the first that many
    sessions of each and their questions (`first_sessions`). With `per_session`, each
    session is logged as a conversation of its own, with fact extraction on as in a chat, and
    the questions are asked in a new conversation (PER_SESSION_CONFIGS); `facts` is then
    always on. With `run_dir`, the run is kept there as it goes and a rerun goes on where it
    stopped (`RunDir`).
    `summary`: how the replay's folds write their summaries (ChatSettings.summary);
    `replace_facts`: whether a fact noted may replace an older one (ChatSettings);
    `categories`: ask only the questions of these LoCoMo categories (1-5); `limit` or `sample`
    then choose among them (every open-domain question of a conversation, say, where a sample
    of 60 holds a few)."""
    check_summary_kind(summary)
    if categories and set(categories) - set(CATEGORIES):
        raise InputError("LoCoMo's categories are 1 to 5")
    if sample and categories and not set(categories) & set(SCORED):
        raise InputError("--sample asks categories 1-4 only; use --limit for category 5")
    mode_configs = PER_SESSION_CONFIGS if per_session else CONFIGS
    chosen = set(answer_configs or ())
    if chosen and not answers:
        raise InputError("give --answer-config or --no-answers, not both")
    if chosen - set(mode_configs):
        raise InputError(
            f"no configuration {', '.join(sorted(chosen - set(mode_configs)))} in this mode; "
            f"answer some of {', '.join(mode_configs)}"
        )
    answered = tuple(c for c in mode_configs if c in chosen) or (mode_configs if answers else ())
    settings = {
        "mode": "conversation_per_session" if per_session else "one_conversation",
        "data": str(data),
        "conversations": list(conversation_ids),
        "limit": limit,
        "sample": sample,
        "sessions": sessions,
        "context_tokens": context_tokens,
        "response_reserve": response_reserve,
        "facts": facts or per_session,
        "summary": summary,
        "replace_facts": replace_facts and (facts or per_session),  # only noted facts
        "answers": answers,
        # None: every configuration (or none, without answers), as a run from before it.
        "answer_configs": list(answered) if chosen and chosen != set(mode_configs) else None,
        "answer_tokens": ANSWER_TOKENS,
        "categories": sorted(set(categories)) if categories else None,
        "seed": seed,
        "model_id": engine.model_id,
        "f1": "LoCoMo token F1 without stemming",
        "f1_locomo": "LoCoMo token F1, Porter-stemmed (PyStemmer), as its evaluation script",
        "f1_amem": "A-Mem's set F1 (utils.py calculate_metrics): no stemming, no category rule",
        "entities": "capitalized words not opening a sentence",
    }
    result = EvalResult(settings)
    convs = [first_sessions(load_conversation(data, cid), sessions) for cid in conversation_ids]
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlxmem-eval-")))
        run = RunDir(run_dir, settings)
        for conv in convs:
            asked = [q for q in conv.questions if not categories or q.category in categories]
            questions = stratified_sample(asked, sample) if sample else pick_questions(asked, limit)
            budget = (context_tokens, response_reserve)
            # Recall on, so that the window keeps its room free; an imported exchange recalls
            # nothing (its reply is given). Per session, facts are noted as in a chat.
            replay = ChatSettings(
                temp=0.0,
                seed=0,
                extract_facts=facts or per_session,
                recall=True,
                summary=summary,
                replace_facts=replace_facts,
            )
            run_conversation = _run_per_session if per_session else _run_one
            one = run_conversation(engine, conv, budget, questions, progress, answered, run, replay)
            result.conversations.append(one)
    return result


def _replay(
    companion: Companion,
    run: RunDir,
    conv_id: str,
    pairs: Sequence[tuple[str, str]],
    times: Sequence[tuple[datetime | None, datetime | None]],
    tick: Callable[[str], None],
) -> None:
    """Import `pairs` into `companion`'s conversation from the first one not logged yet,
    writing a line per exchange to the run (facts noted, what the looks found, seconds)."""
    done = len(companion.store.turns(companion.conversation)) // 2
    for i in range(done, len(pairs)):
        tick(f"replay {i + 1}/{len(pairs)}")
        start = time.perf_counter()
        result = companion.import_exchange(*pairs[i], times[i])
        line = {
            "conversation": companion.conversation,
            "exchange": i,
            "noted": len(result.noted),
            "looks": dict(Counter(result.looks)),
            # Each fold's summary: the model's kept, or why not (FoldEvent.fallback).
            "folds": [f.fallback or "model" for f in result.folds],
            "seconds": round(time.perf_counter() - start, 3),
            "sitting": run.sitting,
        }
        run.add_exchange(conv_id, line)
        if (i + 1 - done) % KEEP_EVERY == 0:
            run.keep_store(conv_id)


def _resumable_store(run: RunDir, conv_id: str, conversations: Sequence[str]) -> Store:
    """The store of `conv_id`'s replay in the run: as left, unless a conversation of it ends
    inside an exchange (a message logged without its reply: the replay was stopped there) or
    it holds another count of exchanges than the replay's lines, in which case it goes on from
    the store's last copy (RunDir.keep_store), or starts over when there is none."""
    path = run.store_path(conv_id)
    if path.exists() and run.replayed(conv_id) is None:
        store = Store(path)
        logged = [store.turns(c) for c in conversations]
        whole = not any(t and t[-1].role != "assistant" for t in logged)
        # A kill after an exchange was logged but before its line was written: the lines and
        # the store disagree, and the copy puts them back in step.
        if whole and sum(len(t) // 2 for t in logged) == len(run.exchanges(conv_id)):
            return store
        path = run.fresh_store(conv_id)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    return Store(path)


def _replay_figures(run: RunDir, conv_id: str) -> tuple[int, Counter[str], float, int]:
    """Facts noted, what the looks found, seconds, and sittings, over the replay's lines."""
    lines = run.exchanges(conv_id)
    outcomes: Counter[str] = Counter()
    for line in lines:
        outcomes.update(line["looks"])
    sittings = len({line.get("sitting") for line in lines})
    return (
        sum(line["noted"] for line in lines),
        outcomes,
        sum(line["seconds"] for line in lines),
        sittings,
    )


def _ask_all(
    run: RunDir,
    conv_id: str,
    questions: Sequence[Question],
    ask_one: Callable[[Question], dict],
    tick: Callable[[str], None],
) -> list[dict]:
    """Each question's item: from the run if it was answered, else asked now and written."""
    done = run.items(conv_id)
    items = []
    for j, question in enumerate(questions):
        tick(f"question {j + 1}/{len(questions)}")
        item = done.get(question.index)
        if item is None:
            start = time.perf_counter()
            item = ask_one(question)
            item["seconds"] = round(time.perf_counter() - start, 3)
            run.add_item(conv_id, item)
        items.append(item)
    return items


def _run_one(
    engine: Engine,
    conv: LocomoConversation,
    budget: tuple[int, int],
    questions: Sequence[Question],
    progress: Progress,
    answers: Collection[str],
    run: RunDir,
    settings: ChatSettings,
) -> dict:
    pairs, seq_of = exchanges(conv)
    times = exchange_times(conv)
    total, steps = len(pairs) + len(questions), iter(range(len(pairs) + len(questions)))

    def tick(what: str) -> None:
        progress(f"{conv.id} {what}", next(steps), total)

    store = _resumable_store(run, conv.id, [CONVERSATION])
    companion = Companion(engine, store, CONVERSATION, *budget, settings)
    layers = run.replayed(conv.id)
    if layers is None:
        _replay(companion, run, conv.id, pairs, times, tick)
        engine.drop_slot(companion.slot)
        added, outcomes, seconds, sittings = _replay_figures(run, conv.id)
        layers = _layer_stats(
            companion, conv, seq_of, len(pairs), settings.extract_facts, added, outcomes
        )
        layers |= {"replay_seconds": seconds, "replay_sittings": sittings}
        run.replay_done(conv.id, layers)
    else:
        for _ in pairs:
            next(steps)
    log = log_view(companion, seq_of)
    items = _ask_all(
        run, conv.id, questions, lambda q: probe(companion, conv, q, log, answers), tick
    )
    for slot in set(PROBE_SLOTS.values()):
        engine.drop_slot(slot)
    layers["probe_seconds"] = sum(i.get("seconds", 0.0) for i in items)
    return {"id": conv.id, "exchanges": len(pairs), "items": items, "layers": layers}


def _run_per_session(
    engine: Engine,
    conv: LocomoConversation,
    budget: tuple[int, int],
    questions: Sequence[Question],
    progress: Progress,
    answers: Collection[str],
    run: RunDir,
    settings: ChatSettings,
) -> dict:
    sessions = [(name, s, *exchanges(s), exchange_times(s)) for name, s in sessions_apart(conv)]
    turns = sum(2 * len(pairs) for _, _, pairs, _, _ in sessions)
    total = turns // 2 + len(questions)
    steps = iter(range(total))

    def tick(what: str) -> None:
        progress(f"{conv.id} {what}", next(steps), total)

    def tick_in(session: str, what: str) -> None:
        tick(f"{session} {what}")

    store = _resumable_store(run, conv.id, [name for name, *_ in sessions])
    where: dict[str, int] = {}  # dialogue id -> turn id
    last_at = None
    replayed = run.replayed(conv.id)
    for name, _, pairs, seq_of, times in sessions:
        if replayed is None:
            companion = Companion(engine, store, name, *budget, settings)
            _replay(companion, run, conv.id, pairs, times, functools.partial(tick_in, name))
            engine.drop_slot(companion.slot)
        else:
            for _ in pairs:
                next(steps)
        ids = {t.seq: t.id for t in store.turns(name)}
        where |= {dia: ids[seq] for dia, seq in seq_of.items() if seq in ids}
        last_at = times[-1][1] if times else last_at
    kept = store.facts()
    texts = [f.text for f in kept]
    if replayed is None:
        added, outcomes, seconds, sittings = _replay_figures(run, conv.id)
        facts = {
            "extraction": "on",
            "added": added,
            "kept": len(kept),
            "per_100_turns": 100 * added / turns if turns else None,
            "outcomes": dict(outcomes),
            "texts": texts,
        }
        replayed = {
            "turns": turns,
            "conversations": len(sessions),
            "facts": with_old_names(facts, OLD_COUNT_NAMES),
            "replay_seconds": seconds,
            "replay_sittings": sittings,
        }
        run.replay_done(conv.id, replayed)

    def ask_one(question: Question) -> dict:
        return probe_new_chat(engine, store, conv, question, budget, last_at, texts, answers, where)

    items = _ask_all(run, conv.id, questions, ask_one, tick)
    for slot in set(NEW_CHAT_SLOTS.values()):
        engine.drop_slot(slot)
    layers = with_old_names(replayed, OLD_COUNT_NAMES)
    layers["probe_seconds"] = sum(i.get("seconds", 0.0) for i in items)
    return {"id": conv.id, "exchanges": turns // 2, "items": items, "layers": layers}


def _layer_stats(companion, conv, seq_of, n_pairs, facts, added, outcomes) -> dict:
    store = companion.store
    summaries = store.summaries(CONVERSATION)
    latest = summaries[-1] if summaries else None
    sizes = [s.token_count or 0 for s in summaries]
    turns = 2 * n_pairs
    stats = {
        "extraction": "on" if facts else "off (for speed)",
        "added": added,
        "per_100_turns": 100 * added / turns if facts and turns else None,
        # What became of each message sent to the extractor: kept, duplicate, or the filter
        # that rejected the answer (see mlxmem.memory.extraction).
        "outcomes": dict(outcomes),
    }
    layers = {
        "turns": turns,
        "facts": with_old_names(stats, OLD_COUNT_NAMES),
        "summaries": {
            "count": len(summaries),
            "tokens_mean": sum(sizes) / len(sizes) if sizes else None,
            "tokens_max": max(sizes, default=None),
            "cap": companion.window.summary_cap,
            # How many were the model's (alone, or with the specifics it left out after it) and
            # how many extractive (the model's failed the check).
            "sources": dict(Counter(s.source or "unknown" for s in summaries)),
            "final": latest.text if latest else None,
        },
        "entity_survival": entity_survival(
            conv, seq_of, latest.text if latest else "", latest.last_seq if latest else 0
        ),
    }
    return with_old_names(layers, OLD_COUNT_NAMES)


def headline(results: dict) -> dict:
    """Overall F1 per configuration (categories 1-4), each of SCORERS (None for a run stored
    before it), and what reached recall's prompt, for the bench history table."""

    def overall(config: str, metric: str):
        return results.get(config, {}).get(metric, {}).get("overall", {}).get("mean")

    f1s = {f"{metric}_{c}": overall(c, metric) for metric in SCORERS for c in CONFIGS}
    reached = {
        f"{metric}_recall": overall("recall", metric)
        for metric in ("evidence_in_prompt", "answer_in_prompt")
    }
    return f1s | reached


def beside_amem(results: dict) -> dict[str, dict[int, float | None]]:
    """Our `f1_amem` x100 per LoCoMo category 1-4 for each configuration of `results` (None
    where not measured), and A-Mem's published row (AMEM_ROW_LABEL) last, for the report."""
    rows = {}
    for config in results.get("configs", CONFIGS):
        cells = results.get(config, {}).get("f1_amem", {})
        means = {c: cells.get(CATEGORIES[c], {}).get("mean") for c in SCORED}
        rows[config] = {c: None if m is None else 100 * m for c, m in means.items()}
    return rows | {AMEM_ROW_LABEL: dict(AMEM_QWEN25_1_5B_F1)}
