"""A turn's prompt (layer 1) for one conversation: the facts it shows, the rolling summary, the
verbatim window and the turns recalled, assembled within the context budget; the fold loop
that keeps the window within it, and the cache warm-up after a fold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from mlxmem.engine import Engine, Message
from mlxmem.errors import InputError
from mlxmem.memory.context.budget import (
    MIN_MESSAGE_TOKENS,
    RECALL_SHARE,
    AssembledPrompt,
    PromptBudget,
    response_reserve,
)
from mlxmem.memory.recall import RecallQuery, recall_line, recall_query, refers_to_past
from mlxmem.memory.store import Fact, Snapshot, Store, with_summary
from mlxmem.memory.tables.dates import dated, local_day, same_day
from mlxmem.memory.turn import ChatSettings, TurnTimings, timed
from mlxmem.memory.window import UNANSWERED, ConversationWindow, FoldEvent, summary_cap
from mlxmem.text import utc_now


def facts_joined_until(snap: Snapshot) -> datetime | None:
    """The time up to which automatic facts are in a conversation's prompt: when its newest
    summary was written, else when it began; None (all of them) before its first turn."""
    if snap.summary is not None:
        return snap.summary.created_at
    return snap.turns[0].created_at if snap.turns else None


def prompt_facts(snap: Snapshot) -> list[Fact]:
    """Manual facts first, then automatic ones newest first. An automatic fact joins a
    conversation's prompt at its next fold (it is in the verbatim turns already), so
    that the cached prefix stays put between folds, in one process or many: shown are
    those noted before the newest summary was written, or before the conversation began.
    Manual facts, and every edit and deletion, show at once. A replaced fact leaves when its
    replacement joins: at once for a manual one, at the next fold for an automatic one."""
    since = facts_joined_until(snap)

    def shown(f: Fact) -> bool:
        return f.source == "manual" or since is None or f.created_at <= since

    current = {f.id: f for f in snap.facts}
    waiting = [
        f for f in snap.replaced if f.replaced_by in current and not shown(current[f.replaced_by])
    ]
    facts = sorted([f for f in snap.facts + waiting if shown(f)], key=lambda f: f.id)
    manual = [f for f in facts if f.source == "manual"]
    return manual + [f for f in reversed(facts) if f.source == "automatic"]


def chat_slot(conversation: str) -> str:
    """The name of a conversation's chat slot: the KV cache its replies are written on."""
    return f"{conversation}/chat"


def turn_prompt(
    engine: Engine,
    store: Store,
    conversation: str,
    settings: ChatSettings,
    tokens: tuple[int, int],
) -> TurnPrompt:
    """The prompts of `conversation` within `tokens`: its context budget, resolved by the
    caller (context_budget), and the model's response reserve."""
    context_tokens, reserve = tokens
    budget = PromptBudget(engine, context_tokens, response_reserve(reserve, context_tokens))
    window = ConversationWindow(
        engine,
        store,
        conversation,
        budget,
        settings.instructions,
        chat_slot(conversation),
        model_summary=settings.summary == "model",
    )
    return TurnPrompt(window, settings, reserve)


class TurnPrompt:
    """The prompts of one conversation within its context budget (`budget.budget`, resolved
    once, by the caller): what a reply is written from, what a fold leaves, what the person
    sees with `context`."""

    def __init__(self, window: ConversationWindow, settings: ChatSettings, reserve: int):
        self.window = window
        self.engine = window.engine
        self.conversation = window.conversation
        self.slot = window.slot
        self.budget = window.budget
        self.settings = settings
        self.reserve = reserve  # the model's response reserve, before the budget caps it
        self.timings: TurnTimings | None = None  # the turn being begun, timed
        self.check_budget()

    def check_budget(self) -> None:
        """Refuse a budget too small for the instructions, the facts share, the summary cap,
        the reserve and the newest exchange at its shortest."""
        if self._tokens_needed(self.budget.budget) <= self.budget.budget:
            return
        enough = self.budget.budget
        while self._tokens_needed(enough) > enough:
            enough += 64
        recall = " (recall's room included: --no-recall frees it)" if self.settings.recall else ""
        raise InputError(
            f"a context budget of {self.budget.budget} tokens is too small for this model's "
            f"instructions, memory{recall} and reply; use at least {enough}"
        )

    def _tokens_needed(self, budget: int) -> int:
        b = self.budget
        return (
            b.system_tokens(self.settings.instructions, [], None)
            + int(budget * b.facts_share)
            + summary_cap(budget)
            + 32  # the headers of the facts and summary blocks
            + 2 * (MIN_MESSAGE_TOKENS + 16)
            + response_reserve(self.reserve, budget)
            + (int(budget * RECALL_SHARE) if self.settings.recall else 0)
        )

    @property
    def recall_room(self) -> int:
        """Tokens the window leaves free for a recall block when recall is on: folding keeps
        them free, so a recalled turn never waits for the next fold to fit."""
        return int(self.budget.budget * RECALL_SHARE) if self.settings.recall else 0

    @property
    def max_reply_tokens(self) -> int:
        """The reply's token limit: the settings' if lower than the response reserve."""
        if self.settings.max_tokens is None:
            return self.budget.reserve
        return max(1, min(self.settings.max_tokens, self.budget.reserve))

    def recall_query(self, text: str, at: datetime | None = None) -> RecallQuery:
        """What to search the log for, if recall is on and `text` (written at `at`, default
        now) may refer to the past: an empty query otherwise."""
        if not (self.settings.recall and refers_to_past(text)):
            return RecallQuery()
        return recall_query(text, local_day(at or utc_now()).date())

    def assemble(
        self, snap: Snapshot, draft: str | None = None, draft_at: datetime | None = None
    ) -> AssembledPrompt:
        """The prompt for `snap` (plus an unsent `draft` message, as if sent at `draft_at`,
        default now), with the turns `snap` recalled set before the newest message."""
        before = snap.summary_span and snap.summary_span[1]  # the turn before the window
        messages = self.window.messages(snap.turns, before)
        if draft is not None:
            if messages and messages[-1].role == "user":
                messages.append(Message("assistant", UNANSWERED))
            previous = snap.turns[-1].created_at if snap.turns else before
            draft_at = draft_at or utc_now()
            if previous is not None and not same_day(previous, draft_at):
                draft = dated(draft, draft_at)
            messages.append(Message("user", draft))
        facts = [f.text for f in prompt_facts(snap)]
        summary = snap.summary.text if snap.summary else None
        with timed(self.timings, "assembly"):
            prompt = self.budget.assemble(
                self.settings.instructions, facts, summary, messages, snap.summary_span
            )
        if not snap.recalled:
            return prompt
        return self.budget.add_recall(
            prompt, [(t.id, recall_line(t, self.conversation)) for t in snap.recalled]
        )

    def fitting(self, snap: Snapshot) -> AssembledPrompt:
        """The prompt of `snap` for a reply, never waiting for a fold. Folding ahead after each
        reply keeps room for a next message as long as the longest in the window; one longer
        (or a summary a deletion took away) leaves the window over budget. Then the oldest
        turns are left out of this one prompt, until it fits as a folded one would, and the
        fold after the reply puts them in the summary: they wait in the log meanwhile."""
        prompt = self.assemble(snap)
        turns = snap.turns
        while not prompt.fits(self.recall_room) and len(turns) > 1:
            turns = turns[1:]
            if len(turns) > 1 and turns[0].role == "assistant":
                turns = turns[1:]  # a reply goes with its message
            prompt = self.assemble(replace(snap, turns=turns))
        return prompt

    def next_message_room(self, snap: Snapshot) -> int:
        """Room for a next message as long as the longest the person wrote in the window."""
        sizes = [t.token_count or 0 for t in snap.turns if t.role == "user"]
        return min(max(sizes, default=0), self.budget.max_message_tokens)

    def fold_while_over_budget(
        self,
        on_status: Callable[[str], None] | None,
        headroom: int,
        snap: Snapshot,
        events: list[FoldEvent],
        prompt: AssembledPrompt | None = None,
        should_yield: Callable[[], bool] | None = None,
    ) -> tuple[Snapshot, AssembledPrompt]:
        """Fold until the assembled prompt fits with `headroom` to spare, appending each
        fold to `events` (its summary is not stored: the caller stores them); return the store
        as it will be once they are stored, and that prompt. `snap`: the store as just read,
        `prompt`: its prompt, if assembled already; `should_yield`: see fold_oldest."""
        while True:
            prompt = prompt or self.assemble(snap)
            if prompt.fits(headroom + self.recall_room):
                return snap, prompt
            if on_status:
                on_status("folding older turns into the summary")
            facts = prompt_facts(snap)
            event = self.window.fold_oldest(
                facts, snap.summary, snap.turns, snap.summary_span, should_yield
            )
            if event is None or event.summary is None:
                # Only the newest exchanges are left: the assembler shortens them.
                return snap, prompt
            events.append(event)
            snap, prompt = with_summary(snap, event.summary), None

    def warm_cache(self, prompt: AssembledPrompt) -> int:
        """After a fold, prefill the new prefix (summary and kept turns) now, while the
        person reads the reply, so the next turn only prefills its own message. The messages'
        tokens are the prompt's own, as assembled; only the template's tail is new (it ends
        the last message instead of opening a reply)."""
        tokens = prompt.body_tokens() + self.engine.chat_tail(prompt.messages, False)
        return self.engine.prefill(tokens, slot=self.slot)
