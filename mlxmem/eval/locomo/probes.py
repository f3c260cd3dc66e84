"""The probes: a question asked under each configuration, on its own KV slot, never logged; the
prompt each configuration assembles, and what reached it."""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime

from mlxmem.engine import Engine, Message, Sampling
from mlxmem.eval.locomo.data import (
    ANSWER_TOKENS,
    CONVERSATION,
    NEW_CHAT,
    NEW_CHAT_SLOTS,
    PROBE_SLOTS,
    QUESTION_ROOM,
    LocomoConversation,
    Question,
    exchanges,
)
from mlxmem.eval.locomo.evidence import LogView, evidence_place, log_view
from mlxmem.eval.locomo.scoring import answer_scores, gold_answer, normalize_answer
from mlxmem.measure import CONFIGS, SCORERS
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.context.budget import AssembledPrompt, PromptBudget, recall_block
from mlxmem.memory.store import Store
from mlxmem.memory.tables.dates import unanchored
from mlxmem.memory.tables.terms import STOPWORDS
from mlxmem.memory.window import as_messages


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
    result = engine.generate(tokens, Sampling(max_tokens=ANSWER_TOKENS), slot=slot)
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
