"""Layer 3, best effort: extract at most one durable fact about the person from a message.

The model is asked with fixed instructions (their KV prefix stays cached in the facts slot);
its answer is kept only if it looks like one short plain sentence that is not already known.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from mlxmem.defaults import FACTS_SLOT
from mlxmem.engine import YIELD_BATCH, Engine, Message, Sampling
from mlxmem.memory.context.budget import shorten
from mlxmem.memory.tables.facts import normalize
from mlxmem.memory.tables.terms import terms as stemmed_terms
from mlxmem.text import GREETING_WORDS, INTERJECTION_WORDS, THANKS_WORDS

EXTRACTION_INSTRUCTIONS = (
    "You keep a short list of durable facts about the user: their name, important people, "
    "preferences, habits, plans, work, health, where they live. Read the user's message and "
    "answer with at most one new durable fact about the user as one short sentence in the "
    "third person. The user may write to a friend by name: the fact is about the user, who "
    "writes, never the friend. Ignore small talk, moods of the moment, praise, questions and "
    "anything about the assistant. If there is no such fact, answer exactly NONE."
)
# Worked examples, shown to the model as earlier turns of the same exchange (few-shot
# prompting, the usual way to show a small model the form of an answer): a fact about the
# user from a message to a friend, a message with only praise and a mood (NONE), and a fact
# about someone in the user's life. Made up; their names are in no fact of a real message
# (is_example). Fixed text, so their KV prefix stays cached in the facts slot.
EXAMPLES = (
    (
        "Hey Sam! I finally signed the lease on a flat in Leeds, I move in next month. "
        "How was your trip?",
        "The user is moving to a flat in Leeds next month.",
    ),
    (
        "Wow Priya, your garden looks amazing, you must be so proud! I'm pretty tired "
        "today, long week.",
        "NONE",
    ),
    (
        "Thanks, Tom! My daughter Lily started violin lessons this week and she loves them.",
        "The user's daughter Lily takes violin lessons.",
    ),
)
# The examples' names and things: in a fact from a message that has none of them, the model
# is copying an example ("The user's daughter Gina takes violin lessons.").
EXAMPLE_WORDS = ("Sam", "Leeds", "lease", "flat", "Priya", "garden", "Tom", "Lily", "violin")
MIN_MESSAGE_CHARS = 60
# The design's limit: a fact is one short sentence, at most 120 characters; a longer answer is
# a retelling, not a fact.
MAX_FACT_CHARS = 120
MAX_FACT_TOKENS = 48
# First and second person: an answer addressed to someone is chat, not a fact about the user.
_PERSON_RE = re.compile(r"\b(I|I'm|I’m|I've|me|my|you|you're|you’re|your|yours)\b", re.IGNORECASE)
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_ABBREVIATION_RE = re.compile(r"\b[A-Z][a-z]{0,2}\.$")  # St. Dr. Mrs.
# Words every fact about the user may have: they do not tie a fact to its message.
_COMMON_WORDS = {
    w[:5]
    for w in "user users their theirs they with about from that this have likes wants there "
    "would being called named the and has was are for his her hers him she who not but one "
    "all its also very".split()
}
# Whom a message speaks to, at the start of a sentence: a greeting or thanks and a name ("Hey
# Gina!", "Thanks, Gina."), a word such as "yeah" and a name a comma follows ("Yeah, Gina,
# thanks", "Yeah Gina, thanks"), or a name set off by a comma that no apposition follows
# ("Gina, you ever been in a show?", but not "Max, my golden retriever, ..."); or a name called
# out at the end of one ("Nice one, Gina!"). Narrower than the summary's rule on purpose: "my
# friend from college, Maria.", "Hi! Emma started school" or "Oh Mark called me" name people
# the user talks about, whose facts are kept.
_SENTENCE_START = r"(?:^|[.!?]\s+)"
_APPOSITION = r"(?:my|our|the|a|an|his|her|their|its|who|which|whose)\b"
_GREETED_RE = re.compile(
    "|".join(
        [
            rf"{_SENTENCE_START}(?i:{GREETING_WORDS}|{THANKS_WORDS})[\s,]+([A-Z][a-z]+)\b",
            rf"{_SENTENCE_START}(?i:{INTERJECTION_WORDS}),?\s+([A-Z][a-z]+),",
            # a lookahead: "Cool, Gina!" keeps its comma for the name called out
            rf"{_SENTENCE_START}(?=([A-Z][a-z]+),\s+(?!(?i:{_APPOSITION})))",
        ]
    )
)
# A name called out at the end is read as spoken to, but less surely ("..., Denver!").
_CALLED_OUT_RE = re.compile(r",\s+([A-Z][a-z]+)\s*[!?]")
# Sentences a message is read in, and whom each speaks of: the other person or the speaker.
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+")
_SECOND_RE = re.compile(r"\b(you|your|yours|yourself|you're|you’re|youre|you've|you’ve)\b", re.I)
_FIRST_RE = re.compile(r"\b(I|I'm|I’m|Im|I've|I’ve|my|me|mine|myself|we|we're|our|us)\b", re.I)
# A fact about the user names them ("The user ...", "... the user's sister ..."); one that does
# not is about someone else, most often the person the message speaks to, taken for the user
# ("Whoa, Nadia, how fun! Me, I took up fencing." -> "Nadia is doing fencing.").
_USER_RE = re.compile(r"\buser\b", re.I)
# A fact whose subject is the user and that names the user again, not as "the user's": the
# "you" of a sentence written to the other person, turned into the user ("I'm always there
# for you" -> "The user is always there for the user."; Qwen2.5-Coder-1.5B on LoCoMo conv-30).
# A fact about the user says "themselves"; one about a relative ("The user's mom taught the
# user to paint") starts with "The user's" and is not matched.
_USER_AS_OBJECT_RE = re.compile(r"^the user\b(?![’']s)\W.*\bthe user\b(?![’']s)", re.I)
# The instructions ask for nothing about the assistant; a fact that names it is the chat.
_ASSISTANT_RE = re.compile(r"\bthe assistant\b", re.I)
# Strings that only a chat template or a confused model would write.
_MARKUP_RE = re.compile(r"<\|[^|>]*\|>|<s>|</s>|\[INST\]|\[/INST\]|<start_of_turn>|<end_of_turn>")


# A paraphrase of a kept fact: of the smaller fact's content words (stemmed, "user" left out),
# this share or more are the other's. Checked by hand on the 37 facts Qwen2.5-Coder-1.5B kept
# from conv-26's first 8 sessions: of the 19 pairs sharing 40% or more, 9 say the same thing;
# at 0.8 the check refuses 5 of them and none of the other 10 ("The user's sister is called
# Melanie" and "... grandmother is called Melanie" share 0.67), and 3 of the 6 redundant facts
# would not have been kept. Lower, it refuses different facts that share a name.
PARAPHRASE_OVERLAP = 0.8
PARAPHRASE_MIN_WORDS = 3  # a shorter fact is a duplicate only as a whole (above)


def is_duplicate(candidate: str, existing: Iterable[str]) -> bool:
    """Equal after normalizing, or contained in an existing fact, or containing one, or a
    paraphrase of one (PARAPHRASE_OVERLAP)."""
    c = normalize(candidate)
    words = _content_words(candidate)
    for fact in existing:
        f = normalize(fact)
        if f and (c == f or f" {c} " in f" {f} " or f" {f} " in f" {c} "):
            return True
        other = _content_words(fact)
        smaller = min(len(words), len(other))
        if smaller >= PARAPHRASE_MIN_WORDS and len(words & other) >= PARAPHRASE_OVERLAP * smaller:
            return True
    return False


def _content_words(fact: str) -> set[str]:
    """A fact's stemmed words but stopwords and the word "user" (every fact has it)."""
    return set(stemmed_terms(fact)) - {"user"}


def judge(
    raw: str, special_tokens: Sequence[str] = (), message: str | None = None
) -> tuple[str | None, str]:
    """The fact in the model's answer and "kept", or None and the filter that rejected it:
    "none" (the model found nothing), "not_one_line" (empty, several lines or too long),
    "markup" (template or special tokens), "no_letters", "example" (the instructions' own
    example, or its name where the message has none), "not_third_person" (I, you: the model
    chatting instead of noting), "not_one_sentence", "ungrounded" (no word of it is in the
    `message` it came from), or
    "about_addressee" (it is about someone the message greets or addresses, "Thanks, Gina!",
    or every sentence it comes from speaks to the other person, "your store", or it has the
    user do something to the user, "for you" taken for the user: the other side of the chat,
    whom a small model takes for the user), "about_assistant" (it names the
    assistant: the chat, not the person), "not_about_user" (it does not name the user:
    someone else's life), or "not_said_of_self" (no sentence it comes from is in the first
    person: praise or a question for the other person, "Winning that game must have felt
    amazing!", taken for the user's news).
    Strict on purpose: a wrong fact is worse than none."""
    text = raw.strip().strip('"').strip()
    if normalize(text) in ("none", "none none") or normalize(text).startswith("none "):
        return None, "none"
    if not text or "\n" in text or len(text) > MAX_FACT_CHARS:
        return None, "not_one_line"
    if _MARKUP_RE.search(text) or any(s and s in text for s in special_tokens):
        return None, "markup"
    if not any(ch.isalpha() for ch in text):
        return None, "no_letters"
    if is_example(text, message):
        return None, "example"
    if _PERSON_RE.search(text):
        return None, "not_third_person"
    if sentence_count(text) > 1:
        return None, "not_one_sentence"
    if message is not None and not (content_words(text) & content_words(message)):
        return None, "ungrounded"
    if message is not None and about_addressee(text, message):
        return None, "about_addressee"
    if message is not None and said_of_the_addressee(text, message):
        return None, "about_addressee"
    if _USER_AS_OBJECT_RE.search(text):
        return None, "about_addressee"
    if _ASSISTANT_RE.search(text):
        return None, "about_assistant"
    if not _USER_RE.search(text):
        return None, "not_about_user"
    if message is not None and not said_of_self(text, message):
        return None, "not_said_of_self"
    return text, "kept"


def is_example(fact: str, message: str | None) -> bool:
    """The examples leaking: one of their facts, or a fact with one of their names or things
    (EXAMPLE_WORDS) that `message` does not hold ("The user's daughter Lily ..." from a message
    that names no Lily)."""
    if any(normalize(fact) == normalize(answer) for _, answer in EXAMPLES):
        return True
    if message is None:
        return False
    for word in EXAMPLE_WORDS:
        pattern = rf"\b{word}s?\b"
        if re.search(pattern, fact, re.I) and not re.search(pattern, message, re.I):
            return True
    return False


def said_of_self(fact: str, message: str) -> bool:
    """Some sentence of `message` that holds a word of the fact is in the first person (I,
    my, we): the writer speaking of themself. Chat that only speaks to or about the other
    person ("Congrats on the new job! Which bakery hired you?") tells nothing about the
    writer. Strict: "Currently reading a novel." with no "I" gives no fact either."""
    return any(_FIRST_RE.search(s) for s in source_sentences(fact, message))


def said_of_the_addressee(fact: str, message: str) -> bool:
    """Every sentence of `message` that holds a word of the fact speaks to the other person
    and not of the speaker ("How did you come to open a bike shop?" against "The user
    opened a bike shop"): the other side's life, given to the user."""
    hits = source_sentences(fact, message)
    return bool(hits) and all(_SECOND_RE.search(s) and not _FIRST_RE.search(s) for s in hits)


def source_sentences(fact: str, message: str) -> list[str]:
    """The sentences of `message` that hold a word of the fact: where it comes from."""
    words = content_words(fact)
    return [s for s in _SENTENCE_END_RE.split(message) if content_words(s) & words]


def greeted(message: str) -> set[str]:
    """The names `message` greets, thanks or opens a sentence with: surely the person spoken
    to, where a name called out at the end may be a place ("... last weekend, Denver!")."""
    return {name for names in _GREETED_RE.findall(message.strip()) for name in names if name}


def without_addressee(message: str) -> str:
    """`message` with the names it greets taken out where it greets them ("Hey Gina! My kids
    paint." -> "Hey! My kids paint."; "Yeah Gina, I ..." -> "Yeah, I ..."). The model reads
    the person spoken to as the person who writes (on the 1.5B, 146 of conv-41's 335 looks
    were refused as about the addressee); with the name gone, it has no one else to give the
    writer's news to. Only the greeting's own place: "My daughter is also called Anna, after
    my mother" keeps its Anna. Only after a greeting, thanks or interjection: a sentence that
    opens with "Name, " may open with a word ("Cool, Gina!"), and the check after the answer
    (`about_addressee`) still reads those."""
    message = message.strip()
    spans = [m.span(g) for m in _GREETED_RE.finditer(message) for g in (1, 2) if m.group(g)]
    # Where a name is spoken to, punctuation follows it ("Hey Gina!", "Yeah Gina, I ..."); a
    # word that runs on is the message's own ("Hi, My name is Ana", "Hey, Portland was great",
    # "Hey Gina's mom ...").
    spans = [(a, b) for a, b in spans if b == len(message) or message[b] in ",.!?"]
    for start, end in sorted(set(spans), reverse=True):  # "Thanks, Gina!" -> "Thanks!"
        message = message[:start].rstrip(" ,") + message[end:]
    return message


def about_addressee(fact: str, message: str) -> bool:
    """The fact is about someone `message` greets or calls out (_is_about)."""
    greets = greeted(message)
    called_out = set(_CALLED_OUT_RE.findall(message.strip()))
    return any(_is_about(fact, name, message, name in greets) for name in greets | called_out)


def _is_about(fact: str, name: str, message: str, is_greeted: bool) -> bool:
    """The fact is about `name`, whom `message` speaks to: it starts with the name ("Gina's
    store ..."), makes the user that person ("The user is Gina."), or, where the message names
    them only to speak to them, gives someone that name ("Thanks, Gina! ..." -> "The user's
    sister is called Gina.") or, if the message greets them, names them at all ("Hey Gina! My
    kids ..." -> "The user's daughter Gina paints."; "Wow Gina, so proud of you" -> "The user is
    proud of Gina."): the person spoken to, taken for someone the user speaks of."""
    escaped = re.escape(name)
    pattern = rf"\b{escaped}\b"
    once = len(re.findall(pattern, message)) == 1
    return bool(
        re.match(pattern, fact)
        or re.search(rf"\bthe user is {escaped}\b", fact, re.IGNORECASE)
        or (once and re.search(rf"\b(?:named|called) {escaped}\b", fact, re.I))
        or (once and is_greeted and re.search(pattern, fact))
    )


def sentence_count(text: str) -> int:
    """Sentences in `text`, where "St." or "Dr." before a capital does not end one."""
    count = 1
    for part in _SENTENCE_SPLIT_RE.split(text)[:-1]:
        count += not _ABBREVIATION_RE.search(part)
    return count


def content_words(text: str) -> set[str]:
    """Words of three letters or more, cut to five (a crude stem), minus the ones any fact
    about the user may have."""
    words = {w[:5] for w in normalize(text).split() if len(w) >= 3}
    return words - _COMMON_WORDS


# Replacement: a new automatic fact that gives an existing one a new value ("The user moved to
# Porto" over "The user lives in Lisbon") marks it replaced. A lexical gate finds candidates,
# and only then one short fixed-prompt call decides, so most kept facts cost no second call.
REPLACE_INSTRUCTIONS = (
    "You keep a list of facts about the user. You are shown an old fact and a new fact. "
    "Answer YES if the old fact is still true once the new fact is known (the new fact adds "
    "something, or says more about the same thing), or NO if the new fact makes the old one "
    "out of date (the user moved, changed jobs, ended a relationship, no longer likes "
    "something). Answer with one word: YES or NO."
)
REPLACE_CANDIDATES = 3
REPLACE_ANSWER_TOKENS = 6
# Words that name the same thing in different words: a move and where one lives share none.
# Each group is one subject a person's facts change on; a fact in it is a candidate for any
# other fact in it.
_SUBJECTS = [
    {"live", "move", "moved", "home", "hous", "apart", "citi", "reloc", "resid", "based"},
    {"work", "job", "employ", "career", "compani", "hire", "quit", "retir", "promot", "startup"},
    {
        "marri",
        "wife",
        "husband",
        "girlfriend",
        "boyfriend",
        "partner",
        "divorc",
        "date",
        "engag",
        "singl",
    },
    {"like", "love", "enjoy", "hate", "dislik", "prefer", "favorit", "favourit", "fan"},
    {"studi", "student", "colleg", "univers", "school", "degre", "graduat", "cours", "major"},
    {"vegetarian", "vegan", "diet", "eat", "pescatarian", "allerg"},
]


def replacement_candidates(fact: str, existing: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """The existing (id, text) facts a new `fact` may replace: those about the same person or
    thing (fact_subject) that share a content word with it, or a subject of _SUBJECTS; the
    closest REPLACE_CANDIDATES, newest first on ties."""
    words = _content_words(fact)
    subjects = [s for s in _SUBJECTS if words & s]
    about = fact_subject(fact)
    scored = []
    for fid, text in existing:
        if fact_subject(text) != about:
            continue
        other = _content_words(text)
        shared = len(words & other) + sum(bool(other & s) for s in subjects)
        if shared:
            scored.append((shared, fid, text))
    scored.sort(key=lambda c: (-c[0], -c[1]))
    return [(fid, text) for _, fid, text in scored[:REPLACE_CANDIDATES]]


def fact_subject(fact: str) -> str:
    """Whom or what a fact is about: "user" for "The user ...", "sister" for "The user's sister
    ...", else its first word. A fact replaces only one about the same: "The user's sister is
    vegan" says nothing against "The user is vegetarian"."""
    words = normalize(fact).split()  # "user's" is "users" once folded
    if words[:2] == ["the", "users"] and len(words) > 2:
        return words[2]
    if words[:2] == ["the", "user"]:
        return "user"
    if words[:1] == ["the"] and len(words) > 1:
        return words[1]
    return words[0] if words else ""


def replace_question(fact: str, old: str) -> str:
    return f"Old fact: {old}\nNew fact: {fact}\nIs the old fact still true?"


def still_true(answer: str) -> bool:
    """The model's YES or NO; anything else counts as YES (best effort: keep the old fact)."""
    return not normalize(answer).startswith("no")


def extraction_messages(message: str) -> list[Message]:
    """The instructions, the worked examples as earlier turns, then `message`."""
    shots = []
    for text, answer in EXAMPLES:
        shots += [Message("user", text), Message("assistant", answer)]
    return [Message("system", EXTRACTION_INSTRUCTIONS), *shots, Message("user", message)]


def should_extract(message: str) -> bool:
    return len(message.strip()) >= MIN_MESSAGE_CHARS


@dataclass(frozen=True)
class Look:
    """What the look for a fact in one message came to: the fact (or None); the outcome,
    "short" (not asked), "no_room", "postponed" (stopped: ask again later), "ran_long" (the
    answer ran to the token limit), a filter of `judge`, "duplicate", or "kept"; and the
    model's answer, if it gave one."""

    fact: str | None
    outcome: str
    answer: str | None = None


class FactExtractor:
    """One model call per long-enough message; never raises into the chat."""

    def __init__(self, engine: Engine, budget: int):
        self.engine = engine
        self.budget = budget

    @functools.cached_property
    def frame(self) -> int:
        """The tokens of the prompt around the message (instructions and worked examples):
        fixed text, counted once."""
        return self.engine.count_chat(extraction_messages(""))

    def prompt(self, message: str) -> list[int] | None:
        """The extraction prompt, with the message less the names it greets
        (`without_addressee`) and shortened so that the prompt plus the answer fits the
        budget; None if even a short message would not fit."""
        room = self.budget - MAX_FACT_TOKENS - self.frame - 8
        if room < 16:
            return None
        message = shorten(self.engine, without_addressee(message), room)
        tokens = self.engine.encode_chat(extraction_messages(message))
        return tokens if len(tokens) + MAX_FACT_TOKENS <= self.budget else None

    def replaces(self, fact: str, existing: Sequence[tuple[int, str]]) -> int | None:
        """The id of the existing (id, text) fact that `fact` makes out of date, if any: the
        lexical gate, then, closest candidate first, one short call each ("is the old fact
        still true?") until one is answered NO. Asking whether both can hold, one pair at a
        time, keeps more true facts than asking which of a list is replaced (measured with
        benchmarks/fact_replacement.py)."""
        for fid, old in replacement_candidates(fact, existing):
            tokens = self.engine.encode_chat(
                [
                    Message("system", REPLACE_INSTRUCTIONS),
                    Message("user", replace_question(fact, old)),
                ]
            )
            if len(tokens) + REPLACE_ANSWER_TOKENS > self.budget:
                return None
            result = self.engine.generate(
                tokens, Sampling(max_tokens=REPLACE_ANSWER_TOKENS), slot=FACTS_SLOT
            )
            if not still_true(result.text):
                return fid
        return None

    def extract(
        self,
        message: str,
        existing: Iterable[str],
        should_stop: Callable[[], bool] | None = None,
    ) -> Look:
        """Look for the fact `message` gives, not one of the `existing` facts. If
        `should_stop()` turns true while the model answers, the call stops there."""
        if not should_extract(message):
            return Look(None, "short")
        prompt = self.prompt(message)
        if prompt is None:
            return Look(None, "no_room")
        result = self.engine.generate(
            prompt,
            Sampling(max_tokens=MAX_FACT_TOKENS),
            slot=FACTS_SLOT,
            should_stop=should_stop,
            prefill_batch=YIELD_BATCH if should_stop else None,
        )
        answer = result.text
        if result.stats.finish_reason == "interrupted":
            return Look(None, "postponed", answer)
        if result.stats.finish_reason == "length":
            # An answer that ran to the limit is not one short sentence.
            return Look(None, "ran_long", answer)
        fact, outcome = judge(answer, self.engine.special_tokens, message)
        if fact is not None and is_duplicate(fact, existing):
            return Look(None, "duplicate", answer)
        return Look(fact, outcome, answer)
