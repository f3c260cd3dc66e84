"""LoCoMo's conversations as the eval reads them (one `conv-N.jsonl` and its `qa/` file each), the
questions, the sessions and their times, and the configurations the questions are asked under."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from mlxmem.errors import InputError

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

# Verified against the files (qa/*.qa.json): 1 has several evidence turns per question (96%),
# 2 asks "when", 3 asks what someone "would likely" do, 4 has one evidence turn (96%), 5 has
# an `adversarial_answer` instead of an answer.
CATEGORIES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}

SCORED = (1, 2, 3, 4)  # `overall` is over these; adversarial is reported apart

# Whom a question names: the person (the logged user's speaker), the other speaker, both or
# neither. The facts are about the person by design, so what they carry is read on "user".
SUBJECTS = ("user", "other", "both", "neither")

DATA_ENV = "MLXMEM_LOCOMO"

ANSWER_TOKENS = 24

QUESTION_ROOM = 96  # tokens kept for the question when the window config packs turns

CONVERSATION = "locomo"


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
    repo = Path(__file__).resolve().parents[3]  # mlxmem/eval/locomo/data.py -> the repository
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
