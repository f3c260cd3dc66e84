"""The budget assembler: packs facts, the rolling summary and the newest turns into a prompt
whose exact token count plus the response reserve fits the model's context budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from mlxmem.engine import Engine, Message
from mlxmem.errors import MlxmemError
from mlxmem.memory.tables.dates import Span, day_range, unanchored

DEFAULT_FACTS_SHARE = 0.15
SYSTEM_MEMO_ENTRIES = 16  # system texts whose token counts a PromptBudget remembers
# A shortened message keeps at least this many tokens (head and tail).
MIN_MESSAGE_TOKENS = 48
FACTS_HEADER = "What you know about the user (they can see and edit this list):"
SUMMARY_HEADER = "Summary of the earlier conversation:"
# Recalled turns (mlxmem.memory.recall) ride inside the new message, after every stable block.
RECALL_SHARE = 0.125  # of the context budget, at most
RECALLED_TURN_TOKENS = 120  # a longer recalled turn shows its head and tail
RECALL_HEADER = "From earlier conversations (recalled from the log):"
RECALL_FOOTER = "(end of recalled turns)"


def context_budget(asked: int | None, model_tokens: int) -> int:
    """The prompt's context budget, resolved here only: the one asked for (a setting,
    --context-tokens), else the model's (models.toml)."""
    return asked or model_tokens


def response_reserve(wanted: int, budget: int) -> int:
    """Tokens kept free for the reply: the model's reserve, but never over a quarter of the
    budget (a small window still needs room for the conversation)."""
    return max(1, min(wanted, budget // 4))


class BudgetError(MlxmemError):
    """The fixed parts (instructions, reserve) leave no room for a single message."""


@dataclass
class Layers:
    """Tokens spent on each layer; the seven fields add up to the budget."""

    instructions: int
    facts: int
    summary: int
    turns: int
    recall: int  # turns recalled from the log, set inside the newest message
    reserve: int
    free: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class AssembledPrompt:
    messages: list[Message]
    tokens: list[int]
    layers: Layers
    budget: int
    facts_left_out: int = 0
    shortened: int = 0  # messages shortened (head and tail kept) to fit
    omitted: int = 0  # oldest turns left out of this prompt as a last resort
    # Tokens of the prompt with oversized messages clipped, before any further shrinking:
    # what the window must fit, so that no turn is shortened or left out to make room.
    natural_tokens: int = 0
    recalled: list[int] = field(default_factory=list)  # ids of the turns recalled into it
    # `tokens` cut by message (`Engine.encode_chat_blocks`): one block per message, then the
    # template's tail (the generation prompt); kept so that what follows the assembly (warming
    # the cache) reuses them instead of encoding the messages again.
    blocks: list[list[int]] = field(default_factory=list)

    def body_tokens(self) -> list[int]:
        """The ids of the messages, without the template's tail after the last one."""
        return self.tokens[: len(self.tokens) - len(self.blocks[-1])] if self.blocks else []

    def fits(self, headroom: int = 0) -> bool:
        """Did every turn fit as clipped, with the reserve and `headroom` still free? If not,
        the window must fold."""
        return self.natural_tokens + self.layers.reserve + headroom <= self.budget


def system_text(
    instructions: str, facts: Sequence[str], summary: str | None, summary_span: Span | None = None
) -> str:
    """The system message, laid out stable-first: instructions, facts, then the summary, whose
    header names the days it covers (`summary_span`: when its first and last turns were
    written)."""
    parts = [instructions.strip()]
    if facts:
        parts.append(FACTS_HEADER + "\n" + "\n".join(f"- {f}" for f in facts))
    if summary:
        parts.append(summary_header(summary_span) + "\n" + summary.strip())
    return "\n\n".join(parts)


def summary_header(span: Span | None) -> str:
    """SUMMARY_HEADER, with the days the summary covers: "... conversation (8 May 2023 to 25
    May 2023):"."""
    if span is None:
        return SUMMARY_HEADER
    return f"{SUMMARY_HEADER.removesuffix(':')} ({day_range(*span)}):"


def shorten(engine: Engine, text: str, max_tokens: int) -> str:
    """Keep the head and tail of `text` within about `max_tokens`, with a marker between."""
    tokens = engine.encode_text(text)
    if len(tokens) <= max_tokens:
        return text
    marker = f"\n[... {len(tokens) - max_tokens} tokens left out here ...]\n"
    keep = max(2, max_tokens - engine.count_text(marker))
    head, tail = tokens[: keep - keep // 2], tokens[len(tokens) - keep // 2 :]
    return engine.decode(head) + marker + engine.decode(tail)


CLIPPED_KEPT = 64  # long messages whose shortened text a PromptBudget remembers


class PromptBudget:
    """Assembles prompts for one model and context budget."""

    def __init__(
        self,
        engine: Engine,
        budget: int,
        reserve: int,
        facts_share: float = DEFAULT_FACTS_SHARE,
    ):
        self.engine = engine
        self.budget = budget
        self.reserve = reserve
        self.facts_share = facts_share
        # What does not change from turn to turn, computed once: the system message's token
        # count per text, and the facts packed from the last list of facts.
        self._system_counts: dict[str, int] = {}
        self._packed: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        # Messages without token ids (imported, synced) that were over the cap, shortened once:
        # a long one is in the window for many turns, and encoding it is most of a turn's cost.
        self._clipped: dict[tuple[str, int], str] = {}

    @property
    def available(self) -> int:
        """Tokens the prompt itself may use."""
        return self.budget - self.reserve

    def system_tokens(
        self,
        instructions: str,
        facts: Sequence[str],
        summary: str | None,
        summary_span: Span | None = None,
    ) -> int:
        text = system_text(instructions, facts, summary, summary_span)
        count = self._system_counts.get(text)
        if count is None:  # encoded once per change of instructions, facts or summary
            count = self.engine.count_chat([Message("system", text)], False)
            if len(self._system_counts) >= SYSTEM_MEMO_ENTRIES:
                self._system_counts.clear()
            self._system_counts[text] = count
        return count

    def pack_facts(self, instructions: str, facts: Sequence[str]) -> list[str]:
        """The facts, in priority order, that fit the facts share. Each line is counted on its
        own (one encode per fact, not per prefix of the list); the prompt as a whole is still
        counted exactly by `assemble`, so the budget never rests on this sum."""
        facts = tuple(facts)
        if self._packed is not None and self._packed[0] == facts:
            return list(self._packed[1])  # the same facts as last time: packed alike
        room = int(self.budget * self.facts_share) - self.engine.count_text(FACTS_HEADER) - 4
        used: list[str] = []
        for fact in facts:
            cost = self.engine.count_text(f"\n- {fact}")
            if cost <= room:
                used.append(fact)  # a long fact that does not fit leaves room for shorter ones
                room -= cost
        self._packed = (facts, tuple(used))
        return used

    @property
    def max_message_tokens(self) -> int:
        """No single message takes more than half the prompt's room."""
        return self.available // 2

    def clip(self, turns: Sequence[Message]) -> list[Message]:
        """Shorten messages longer than `max_message_tokens`, the same way every time, so an
        oversized message keeps its place (and its cached prefix) in the window."""
        cap = self.max_message_tokens
        clipped = []
        for t in turns:
            if t.tokens is not None:
                long = len(t.tokens) > cap
                clipped.append(Message(t.role, shorten(self.engine, t.content, cap)) if long else t)
                continue
            short = self._clipped.get((t.content, cap))
            if short is None:
                short = shorten(self.engine, t.content, cap)
                if short is not t.content:  # remembered only when long: few, and worth it
                    if len(self._clipped) >= CLIPPED_KEPT:
                        self._clipped.pop(next(iter(self._clipped)))
                    self._clipped[(t.content, cap)] = short
            clipped.append(t if short is t.content else Message(t.role, short))
        return clipped

    def assemble(
        self,
        instructions: str,
        facts: Sequence[str],
        summary: str | None,
        turns: Sequence[Message],
        summary_span: Span | None = None,
    ) -> AssembledPrompt:
        """Facts first (capped), then the summary (with the days it covers, `summary_span`),
        then `turns` (oldest first, newest last), shortening long messages and, only if that
        is not enough, leaving out the oldest."""
        used = self.pack_facts(instructions, facts)
        system = Message("system", system_text(instructions, used, summary, summary_span))
        clipped = self.clip(turns)
        shortened = sum(a is not b for a, b in zip(turns, clipped, strict=True))
        turns = clipped
        omitted = 0
        stuck: set[int] = set()  # messages that shortening no longer makes smaller
        blocks = self.engine.encode_chat_blocks([system, *turns])
        tokens = _joined(blocks)
        natural = len(tokens)
        while len(tokens) > self.available:
            over = len(tokens) - self.available
            i = self._longest_shrinkable(turns, stuck)
            if i is not None:
                size = self.engine.count_text(turns[i].content)
                target = max(MIN_MESSAGE_TOKENS, size - over - 8)
                short = shorten(self.engine, turns[i].content, target)
                if self.engine.count_text(short) >= size:
                    stuck.add(i)
                    continue
                turns[i] = Message(turns[i].role, short)
                shortened += 1
            elif len(turns) > 1:  # never the newest message
                turns.pop(0)
                stuck = {j - 1 for j in stuck if j > 0}
                omitted += 1
            else:
                raise BudgetError(
                    f"a context budget of {self.budget} tokens with {self.reserve} reserved for "
                    "the reply leaves no room for a message; use a larger budget"
                )
            blocks = self.engine.encode_chat_blocks([system, *turns])
            tokens = _joined(blocks)
        layers = self._layers(instructions, used, summary, len(tokens), summary_span)
        return AssembledPrompt(
            messages=[system, *turns],
            tokens=tokens,
            layers=layers,
            budget=self.budget,
            facts_left_out=len(facts) - len(used),
            shortened=shortened,
            omitted=omitted,
            natural_tokens=natural,
            blocks=blocks,
        )

    def add_recall(
        self, prompt: AssembledPrompt, recalled: Sequence[tuple[int, str]]
    ) -> AssembledPrompt:
        """`prompt` with recalled lines (turn id, text; best first) set before its newest
        message, as many as fit both the recall share and the room left free; the stable blocks
        before the newest message, and so the cached prefix, are untouched."""
        if not recalled or prompt.messages[-1].role != "user":
            return prompt
        cap = min(int(self.budget * RECALL_SHARE), prompt.layers.free)
        each = min(RECALLED_TURN_TOKENS, cap // 2)  # room for two turns at least
        lines = [(i, self._line(text, each)) for i, text in recalled]
        *head, newest = prompt.messages
        while lines:
            text = recall_block([line for _, line in lines], newest.content)
            blocks = self.engine.encode_chat_blocks([*head, Message("user", text)])
            tokens = _joined(blocks)
            extra = len(tokens) - len(prompt.tokens)
            if extra <= cap:
                layers = replace(prompt.layers, recall=extra, free=prompt.layers.free - extra)
                return replace(
                    prompt,
                    messages=[*head, Message("user", text)],
                    tokens=tokens,
                    layers=layers,
                    recalled=[i for i, _ in lines],
                    blocks=blocks,
                )
            lines.pop()  # the weakest match goes first
        return prompt

    def _line(self, line: str, each: int) -> str:
        """A recalled line in at most `each` tokens: whole if it fits, else without the days it
        says outright (dates.anchored) first, since the turn's own words come before them, and
        then shortened."""
        if self.engine.count_text(line) <= each:
            return line
        return shorten(self.engine, unanchored(line), each)

    def _longest_shrinkable(self, turns: list[Message], stuck: set[int]) -> int | None:
        # The newest message is shortened last: earlier ones go first when they can.
        sizes = [self.engine.count_text(t.content) for t in turns]
        order = sorted(range(len(turns)), key=lambda i: (i == len(turns) - 1, -sizes[i]))
        for i in order:
            if i not in stuck and sizes[i] > MIN_MESSAGE_TOKENS + 8:
                return i
        return None

    def _layers(
        self,
        instructions: str,
        facts: list[str],
        summary: str | None,
        total: int,
        summary_span: Span | None = None,
    ) -> Layers:
        t_instr = self.system_tokens(instructions, [], None)
        t_facts = self.system_tokens(instructions, facts, None) - t_instr
        t_system = self.system_tokens(instructions, facts, summary, summary_span)
        return Layers(
            instructions=t_instr,
            facts=t_facts,
            summary=t_system - t_instr - t_facts,
            turns=total - t_system,
            recall=0,
            reserve=self.reserve,
            free=self.budget - self.reserve - total,
        )


def _joined(blocks: list[list[int]]) -> list[int]:
    return [t for block in blocks for t in block]


def recall_block(lines: Sequence[str], message: str) -> str:
    """The new message with the recalled turns before it, clearly set apart."""
    if not lines:
        return message
    return "\n".join([RECALL_HEADER, *lines, RECALL_FOOTER, "", message.strip()])
