"""Layer 1: the sliding window of verbatim turns and the rolling summary they fold into.

The verbatim window is every turn after the newest summary's range; the chat log (layer 2)
is the only place turns live. When instructions + facts + summary + window + the response
reserve no longer fit the budget, the oldest half of the window is folded into a new summary,
generated on the chat slot's cached prefix: the prompt is the chat prompt cut after the evicted
turns plus a summarization request, so only the request is prefilled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from mlxmem.engine import Engine, Message
from mlxmem.memory.budget import PromptBudget
from mlxmem.memory.db import crash_point
from mlxmem.memory.store import Fact, Store, Summary, Turn

# Keep at least the newest two exchanges verbatim.
MIN_VERBATIM = 4
SUMMARY_MAX_TOKENS = 160
UNANSWERED = "(no reply: it was interrupted)"
SUMMARY_REQUEST = (
    "Pause the conversation. Write an updated summary of everything so far: merge the earlier "
    "summary, if there is one, with the messages above. Use 2-3 sentences. Keep names, "
    "decisions and open questions. Answer with the summary only."
)


@dataclass
class CollapseEvent:
    evicted_turns: int
    first_seq: int
    last_seq: int
    summary_tokens: int
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def as_messages(turns: Sequence[Turn], model_id: str) -> list[Message]:
    """Logged turns as prompt messages; a reply this model sampled keeps its token ids. A user
    turn left unanswered (the reply was killed) gets a placeholder reply, so that the roles
    still alternate, as many chat templates demand."""
    messages = []
    for i, t in enumerate(turns):
        messages.append(
            Message(t.role, t.text, t.sampled_ids if t.sampled_by == model_id else None)
        )
        if t.role == "user" and i + 1 < len(turns) and turns[i + 1].role == "user":
            messages.append(Message("assistant", UNANSWERED))
    return messages


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
    ):
        self.engine = engine
        self.store = store
        self.conversation = conversation
        self.budget = budget
        self.instructions = instructions
        self.slot = slot
        self.summary_cap = summary_cap(budget.budget)

    def messages(self, turns: Sequence[Turn]) -> list[Message]:
        return as_messages(turns, self.engine.model_id)

    def collapse_oldest(
        self,
        facts: Sequence[Fact],
        summary: Summary | None,
        turns: Sequence[Turn],
        epoch: int | None = None,
    ) -> CollapseEvent | None:
        """Fold the oldest half of the verbatim `turns` into a new rolling summary; `facts`
        and `summary` are what the chat prompt holds now, so its cached prefix is reused.
        The summary records the facts it saw, and is written only if nothing was deleted
        since the store was read at forget epoch `epoch` (else StaleError)."""
        n = evict_count(turns)
        if n == 0:
            return None
        evicted = turns[:n]
        start = time.perf_counter()
        prompt = self._summary_budget().assemble(
            self.instructions,
            [f.text for f in facts],
            summary.text if summary else None,
            [*self.messages(evicted), Message("user", SUMMARY_REQUEST)],
        )
        result = self.engine.generate(
            prompt.tokens, slot=self.slot, max_tokens=self.summary_cap, temp=0.0
        )
        written = result.text.strip()
        if prompt.omitted:
            written = ""  # the model did not see every evicted turn: never record that range
        text = self._cap(written or self._fallback(summary, evicted))
        tokens = self.engine.count_text(text)
        first = summary.first_seq if summary else evicted[0].seq
        seen = [f.id for f in facts]
        self.store.add_summary(
            self.conversation, text, first, evicted[-1].seq, tokens, seen, epoch=epoch
        )
        crash_point("turn:summary-written")
        return CollapseEvent(
            evicted_turns=n,
            first_seq=first,
            last_seq=evicted[-1].seq,
            summary_tokens=tokens,
            prompt_tokens=result.stats.prompt_tokens,
            cached_tokens=result.stats.cached_tokens,
            prefilled_tokens=result.stats.prefilled_tokens,
            seconds=time.perf_counter() - start,
        )

    def _summary_budget(self) -> PromptBudget:
        return PromptBudget(
            self.engine, self.budget.budget, self.summary_cap, self.budget.facts_share
        )

    def _cap(self, text: str) -> str:
        return shorten_to(self.engine, text, self.summary_cap)

    def _fallback(self, summary: Summary | None, evicted) -> str:
        # No usable summary from the model: keep the newest of the person's own words (or, if
        # they wrote none here, the replies) rather than lose the turns; the cap allows no more.
        words = [summary.text] if summary else []
        said = [t.text for t in evicted if t.role == "user" and t.text.strip()]
        words += said or [t.text for t in evicted]
        tokens = self.engine.encode_text(" ".join(words).strip())
        return self.engine.decode(tokens[-self.summary_cap :]).strip() or "(nothing was said)"


def shorten_to(engine: Engine, text: str, max_tokens: int) -> str:
    """Cut `text` to at most `max_tokens` tokens (the head is what a summary leads with)."""
    tokens = engine.encode_text(text)
    keep = max_tokens
    while len(tokens) > max_tokens and keep > 0:
        text = engine.decode(engine.encode_text(text)[:keep]).strip()
        tokens = engine.encode_text(text)
        keep -= 1
    return text
