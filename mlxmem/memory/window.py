"""Layer 1: the sliding window of verbatim turns and the rolling summary they fold into.

The verbatim window is every turn after the newest summary's range; the chat log (layer 2)
is the only place turns live. When instructions + facts + summary + window + the response
reserve no longer fit the budget, the oldest half of the window is folded into a new summary,
generated on the chat slot's cached prefix: the prompt is the chat prompt cut after the evicted
turns plus a summarization request, so only the request is prefilled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime

from mlxmem.engine import YIELD_BATCH, Engine, Message, Sampling
from mlxmem.memory.context.budget import PromptBudget
from mlxmem.memory.context.extractive import extractive_summary, shorten_to, specifics_left_out
from mlxmem.memory.context.speakers import speaker_names
from mlxmem.memory.context.summary_check import check_summary, prose_lines
from mlxmem.memory.store import Fact, Store, Summary, Turn
from mlxmem.memory.tables.dates import Span, dated, same_day
from mlxmem.text import utc_now

# Keep at least the newest two exchanges verbatim.
MIN_VERBATIM = 4
# The summary's hard cap (a tenth of a 4,096-token budget): with SmolLM2's tokenizer, the
# extractive summary of a whole LoCoMo conversation kept 34% of the named entities of its
# folded evidence turns at 160, 63% at 320 and 71% at 400, and the prompts held more of the
# gold answers' words each time (benchmarks/summary_entities.py; docs/notebook/benchmarks.md,
# "Summaries that keep more of what they fold").
SUMMARY_MAX_TOKENS = 400
# A model's summary that leaves this much of the cap free is followed by the folded turns'
# sentences that hold the names, numbers and dates it left out (extractive.specifics_left_out).
MIN_SPECIFICS_ROOM = 24
UNANSWERED = "(no reply: it was interrupted)"
_REQUEST = (
    "Pause the conversation. Write an updated summary of everything so far: merge the earlier "
    "summary, if there is one, with the messages above. Write it in the third person, about "
    '{people}; never write "I" or "you". Use 2-3 sentences. Keep names, places, numbers, '
    "dates, decisions and open questions. Answer with the summary only."
)


def summary_request(names: dict[str, str]) -> str:
    """The request that ends a fold's prompt, naming the speakers where `names` (role ->
    name, see speaker_names) knows them: a small model retells a chat as "I" unless told who
    is who."""
    people = " and ".join(
        f"{names[role]} (the {role})" if names.get(role) else f"the {role}"
        for role in ("user", "assistant")
    )
    return _REQUEST.format(people=people)


SUMMARY_REQUEST = summary_request({})  # the request when neither speaker's name is known


@dataclass
class FoldEvent:
    evicted_turns: int
    first_seq: int
    last_seq: int
    summary_tokens: int
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    seconds: float
    # Why the model's summary was not kept, if it was not: "gave way" (a message came),
    # "extractive asked", "turns left out" (of the model's prompt), or the check's problems.
    fallback: str | None = None
    # The summary the fold made, for the caller to store (not stored yet: its id is 0).
    summary: Summary | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "summary"}


def as_messages(
    turns: Sequence[Turn], model_id: str, before: datetime | None = None
) -> list[Message]:
    """Logged turns as prompt messages; a reply this model sampled keeps its token ids. A user
    turn left unanswered (the reply was killed) gets a placeholder reply, so that the roles
    still alternate, as many chat templates demand. A turn written on another day than the
    turn before it in the log (`before`: when the turn before the first was written, if any)
    starts with its date (see as_message)."""
    messages = []
    for i, t in enumerate(turns):
        messages.append(as_message(t, model_id, turns[i - 1].created_at if i else before))
        if t.role == "user" and i + 1 < len(turns) and turns[i + 1].role == "user":
            messages.append(Message("assistant", UNANSWERED))
    return messages


def as_message(turn: Turn, model_id: str, previous: datetime | None) -> Message:
    """One turn as a prompt message: its text, and first its date, "[8 May 2023]", if it was
    written on another day than the turn before it (written at `previous`). Decided by the log
    alone, so a turn reads the same wherever it sits in the window (the KV cache reuses it),
    and a conversation within one day shows no date. A dated message is encoded whole: its
    stored token ids are the text's alone."""
    if previous is not None and not same_day(previous, turn.created_at):
        return Message(turn.role, dated(turn.text, turn.created_at))
    return Message(turn.role, turn.text, turn.sampled_ids if turn.sampled_by == model_id else None)


def evict_count(turns: Sequence[Turn]) -> int:
    """How many of the oldest turns to fold: half, ending before a user turn when possible,
    keeping at least MIN_VERBATIM."""
    n = min(len(turns) // 2, len(turns) - MIN_VERBATIM)
    if n <= 0:
        return 0
    if turns[n].role != "user" and len(turns) - (n + 1) >= MIN_VERBATIM:
        n += 1
    return n


def summary_cap(budget: int) -> int:
    return max(32, min(SUMMARY_MAX_TOKENS, budget // 10))


class ConversationWindow:
    """The verbatim turns and rolling summary of one conversation, read from the store."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        conversation: str,
        budget: PromptBudget,
        instructions: str,
        slot: str,
        model_summary: bool = True,
    ):
        self.engine = engine
        self.model_summary = model_summary  # False: every fold writes the extractive summary
        self.store = store
        self.conversation = conversation
        self.budget = budget
        self.instructions = instructions
        self.slot = slot
        self.summary_cap = summary_cap(budget.budget)

    def messages(self, turns: Sequence[Turn], before: datetime | None = None) -> list[Message]:
        return as_messages(turns, self.engine.model_id, before)

    def fold_oldest(
        self,
        facts: Sequence[Fact],
        summary: Summary | None,
        turns: Sequence[Turn],
        summary_span: Span | None = None,
        should_yield: Callable[[], bool] | None = None,
    ) -> FoldEvent | None:
        """Fold the oldest half of the verbatim `turns` into a new rolling summary; `facts`,
        `summary` and `summary_span` (when its first and last turns were written) are what
        the chat prompt holds now, so its cached prefix is reused.
        The summary records the facts it saw; it is returned (`FoldEvent.summary`), not
        stored: the caller stores it with the turn's other writes, under its forget epoch.
        `should_yield()` turning true (the person's next message waits for the model) stops
        the model's summary, and the extractive one (no model call, milliseconds) is written
        instead: the fold finishes at once, and the person does not wait for it."""
        n = evict_count(turns)
        if n == 0:
            return None
        evicted = turns[:n]
        start = time.perf_counter()
        # Who is who, read from the whole window: a fold's half alone often greets too few
        # times to tell, and its summary then says "User" where the earlier one said "Tim".
        names = speaker_names([(t.role, t.text) for t in turns], [f.text for f in facts])
        hurried = should_yield is not None and should_yield()
        result, omitted = None, False
        if not hurried and self.model_summary:  # the request is assembled only to be asked
            prompt = self._summary_budget().assemble(
                self.instructions,
                [f.text for f in facts],
                summary.text if summary else None,
                [
                    *self.messages(evicted, summary_span and summary_span[1]),
                    Message("user", summary_request(names)),
                ],
                summary_span=summary_span,
            )
            omitted = bool(prompt.omitted)
            result = self.engine.generate(
                prompt.tokens,
                Sampling(max_tokens=self.summary_cap),
                slot=self.slot,
                should_stop=should_yield,
                prefill_batch=YIELD_BATCH if should_yield else None,
            )
            hurried = result.stats.finish_reason == "interrupted"
        # The model's summary, if it passes the check and the model saw every evicted turn;
        # else (or if it gave way) one extracted from the earlier summary and the evicted turns.
        text, source = self._cap(result.text.strip() if result else ""), "model"
        earlier = summary.text if summary else None
        # The specifics after an earlier model summary are picked again below, not asked of
        # the model: it is checked against that summary's own paragraph.
        checked = (
            prose_lines(summary.text)
            if summary and summary.source == "model+extractive"
            else earlier
        )
        if hurried:
            fallback = "gave way"
        elif not self.model_summary:
            fallback = "extractive asked"
        elif omitted:
            fallback = "turns left out"
        else:  # the check's problems, "" if none
            fallback = ", ".join(check_summary(text, [t.text for t in evicted], checked).problems)
        if fallback:
            text, source = self._fallback(summary, evicted, names), "extractive"
        else:
            room = self.summary_cap - self.engine.count_text(text) - 1  # a line break
            if room >= MIN_SPECIFICS_ROOM:
                extra = specifics_left_out(self.engine, room, text, evicted, names, earlier)
                if extra:
                    text, source = self._cap(f"{text}\n{extra}"), "model+extractive"
        tokens = self.engine.count_text(text)
        first = summary.first_seq if summary else evicted[0].seq
        seen = tuple(f.id for f in facts)
        made = Summary(
            0, self.conversation, text, first, evicted[-1].seq, tokens, utc_now(), seen, source
        )
        return FoldEvent(
            evicted_turns=n,
            first_seq=first,
            last_seq=evicted[-1].seq,
            summary_tokens=tokens,
            prompt_tokens=result.stats.prompt_tokens if result else 0,
            cached_tokens=result.stats.cached_tokens if result else 0,
            prefilled_tokens=result.stats.prefilled_tokens if result else 0,
            seconds=time.perf_counter() - start,
            fallback=fallback or None,
            summary=made,
        )

    def _summary_budget(self) -> PromptBudget:
        return PromptBudget(
            self.engine, self.budget.budget, self.summary_cap, self.budget.facts_share
        )

    def _cap(self, text: str) -> str:
        return shorten_to(self.engine, text, self.summary_cap)

    def _fallback(self, summary: Summary | None, evicted, names: dict[str, str]) -> str:
        """The earlier summary and the evicted turns, extracted within the cap (see
        mlxmem.memory.context.extractive): names, numbers and dates, who said them, and when."""
        text = extractive_summary(
            self.engine,
            self.summary_cap,
            summary.text if summary else None,
            evicted,
            names,
            earlier_is_extractive=bool(summary and summary.source == "extractive"),
        )
        return self._cap(text)
