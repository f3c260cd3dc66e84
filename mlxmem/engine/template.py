"""Exact token counts on a model's chat template, shared by every engine.

The template is rendered with numbered placeholders where the messages' contents go, cut at
them, and each piece of template text encoded with special tokens parsed; each content is
encoded as plain text, so special-token strings a person types never become control tokens.
An engine supplies four things: how to render the template (`_render`), how to tokenize
(`_tokenize`), its BOS token (`_bos`) and whether its tokenizer adds one (`_adds_bos`).
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from mlxmem.engine.base import Engine, Message
from mlxmem.errors import InputError
from mlxmem.text import check_text

# Encodings remembered per engine: every turn re-assembles the same facts, summary and window,
# and the tokenizer's Python wrapper costs ~0.1 ms a call (a few hundred calls a prompt).
ENCODING_MEMO_ENTRIES = 4096
# Chat templates rendered and cut per shape of conversation (its roles): a window's shapes
# recur from one fold to the next, with and without the generation prompt.
LAYOUT_MEMO_ENTRIES = 512
# A template is probed once a day with conversations of up to this many messages, and one of
# PROBE_LONG, to find whether it writes every message alike wherever it stands (see
# TemplatedEngine._learn_parts).
PROBE_MESSAGES = 6
PROBE_LONG = 24
# The probe costs a few dozen renders (14 ms for SmolLM2's template, 70 ms for Qwen2.5's on
# this CPU): only a process that has rendered this many shapes (a conversation going on, not
# a one-shot call) pays it.
RENDERS_BEFORE_PROBING = 4


# Placeholders for message contents while the template renders: private-use characters that
# no template touches, so the rendered text splits cleanly into template parts and contents.
_PLACEHOLDER = "\ue000mlxmem{}\ue001"
_PLACEHOLDER_RE = re.compile("\ue000mlxmem(\\d+)\ue001")


class TemplatedEngine(Engine):
    """An engine whose token counts come from its chat template (see the module docstring)."""

    def _init_template(self) -> None:
        self._encodings: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        # Encoding text may come from another thread than the model's (a message logged while
        # the model works): a tokenizer's settings may switch per call, which is not atomic,
        # and the memo is shared, so one encoding runs at a time.
        self._encoding = threading.Lock()
        self._renders: OrderedDict[tuple, tuple] = OrderedDict()
        self._parts: dict[tuple[bool, str], tuple[dict, dict, dict] | None] = {}
        self._shapes_rendered = 0
        self._system_role = self._supports_system_role()

    # -- what an engine supplies ----------------------------------------------------------

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The chat template rendered as text; InputError if the template refuses."""
        raise NotImplementedError

    def _tokenize(self, text: str, plain: bool) -> list[int]:
        """Token ids of `text`, nothing added; `plain`: special-token strings are text."""
        raise NotImplementedError

    def _bos(self) -> tuple[str | None, int | None]:
        """The BOS token's text and id (None where the model has none)."""
        raise NotImplementedError

    def _adds_bos(self) -> bool:
        """Whether the tokenizer puts a BOS before a text it encodes."""
        raise NotImplementedError

    # -- the template, cut by message ---------------------------------------------------

    def encode_chat_blocks(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[list[int]]:
        merged = not self._system_role and bool(messages) and messages[0].role == "system"
        rendered = _without_system(messages) if merged else list(messages)
        head, pieces, tail = self._layout(tuple(m.role for m in rendered), add_generation_prompt)
        blocks = [[*before, *self._content(rendered[index])] for before, index in pieces]
        if [index for _, index in pieces] != list(range(len(rendered))):
            # A template that drops or reorders messages: the ids stay exact, but they cannot
            # be cut by message, so the last message's block holds them all.
            every = [t for block in blocks for t in block]
            blocks = [[] for _ in rendered]
            blocks[-1:] = [every]
        if not blocks:
            return [[*head, *tail]]
        blocks[0][:0] = head
        if merged and len(blocks) < len(messages):
            blocks.insert(0, [])  # the system text opens the first user message, in its block
        return [*blocks, list(tail)]

    def _content(self, message: Message) -> list[int]:
        if message.tokens is not None:
            return list(message.tokens)
        return self.encode_text(message.content.strip())

    def chat_tail(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        merged = not self._system_role and bool(messages) and messages[0].role == "system"
        roles = tuple(m.role for m in (_without_system(messages) if merged else messages))
        head, _, tail = self._layout(roles, add_generation_prompt)
        return list(tail) if roles else [*head, *tail]

    def _layout(
        self, roles: tuple[str, ...], add_generation_prompt: bool
    ) -> tuple[tuple[int, ...], list[tuple[tuple[int, ...], int]], tuple[int, ...]]:
        """The template for these roles, cut at the messages' contents and encoded: the ids
        it opens with (a BOS the tokenizer adds), then per message the ids of the template's
        text before its content, then the ids after the last content. It depends only on the
        roles (and the date, which some templates print): rendered once per shape and day,
        and the most recent shapes are remembered."""
        day = time.strftime("%Y-%m-%d")
        key = (roles, add_generation_prompt, day)
        layout = self._renders.get(key)
        if layout is not None:
            self._renders.move_to_end(key)
            return layout
        rendered = None
        if self._shapes_rendered >= RENDERS_BEFORE_PROBING:
            rendered = self._composed(roles, add_generation_prompt, day)
        if rendered is None:
            rendered = self._render_shape(roles, add_generation_prompt)
            self._shapes_rendered += 1
        bos, bos_id = self._bos()
        head = (
            (bos_id,)
            if bos and bos_id is not None and not rendered.startswith(bos) and self._adds_bos()
            else ()
        )
        pieces = []
        pos = 0
        for match in _PLACEHOLDER_RE.finditer(rendered):
            pieces.append(
                (tuple(self._encode_template(rendered[pos : match.start()])), int(match.group(1)))
            )
            pos = match.end()
        layout = (head, pieces, tuple(self._encode_template(rendered[pos:])))
        self._renders[key] = layout
        if len(self._renders) > LAYOUT_MEMO_ENTRIES:
            self._renders.popitem(last=False)
        return layout

    def _render_shape(self, roles: tuple[str, ...], add_generation_prompt: bool) -> str:
        """The template rendered for `roles`, each content a numbered placeholder."""
        return self._render(
            [{"role": r, "content": _PLACEHOLDER.format(i)} for i, r in enumerate(roles)],
            add_generation_prompt,
        )

    def _composed(
        self, roles: tuple[str, ...], add_generation_prompt: bool, day: str
    ) -> str | None:
        """What `_render_shape` gives for `roles`, put together without running the template
        from the text it writes before the first message, between two messages and after the
        last, when the template was found to write these alike wherever a message stands
        (`_learn_parts`); None when it was not, or for roles never seen in that order. A new
        shape of conversation (every turn makes one) then costs a join, not a render."""
        key = (add_generation_prompt, day)
        if key not in self._parts:
            self._parts = {k: v for k, v in self._parts.items() if k[1] == day}  # today's
            self._parts[key] = self._learn_parts(add_generation_prompt)
        parts = self._parts[key]
        if parts is None or not roles:
            return None
        first, between, after = parts
        try:
            out = [first[roles[0]], _PLACEHOLDER.format(0)]
            for i in range(1, len(roles)):
                out += [between[roles[i - 1], roles[i]], _PLACEHOLDER.format(i)]
            out.append(after[roles[-1]])
        except KeyError:
            return None
        return "".join(out)

    def _learn_parts(self, add_generation_prompt: bool) -> tuple[dict, dict, dict] | None:
        """The template's text before the first message (per role), between two messages (per
        pair of roles) and after the last (per role), read from renders of alternating
        conversations of 1 to PROBE_MESSAGES messages and of PROBE_LONG, with a system message
        first and without; None if any render disagrees with another on any of them (a
        template that writes a message differently by its place or by how many there are)."""
        first: dict[str, str] = {}
        between: dict[tuple[str, str], str] = {}
        after: dict[str, str] = {}
        for opening in (("system",), ()):
            for n in (*range(1, PROBE_MESSAGES + 1), PROBE_LONG):
                roles = opening + tuple(("user", "assistant")[i % 2] for i in range(n))
                try:
                    rendered = self._render_shape(roles, add_generation_prompt)
                except InputError:
                    continue  # that shape is refused when rendered too
                cuts = _PLACEHOLDER_RE.split(rendered)
                if cuts[1::2] != [str(i) for i in range(len(roles))]:
                    return None  # messages dropped, repeated or reordered
                texts = cuts[0::2]
                found: list[tuple[dict[Any, str], str | tuple[str, ...], str]] = [
                    (first, roles[0], texts[0]),
                    (after, roles[-1], texts[-1]),
                ]
                found += [(between, roles[i - 1 : i + 1], texts[i]) for i in range(1, len(roles))]
                for table, key, text in found:
                    if table.setdefault(key, text) != text:
                        return None
        return (first, between, after) if first else None

    def _supports_system_role(self) -> bool:
        probe = [
            {"role": "system", "content": _PLACEHOLDER.format(0)},
            {"role": "user", "content": "x"},
        ]
        try:
            return _PLACEHOLDER.format(0) in self._render(probe, True)
        except InputError:
            return False

    def encode_text(self, text: str) -> list[int]:
        check_text(text)
        return self._encode(text, True)

    def _encode_template(self, text: str) -> list[int]:
        return self._encode(text, False)

    def _encode(self, text: str, plain: bool) -> list[int]:
        """`plain`: special-token strings are text. Remembered (least recently used go)."""
        if not text:
            return []
        key = (text, plain)
        with self._encoding:
            ids = self._encodings.get(key)
            if ids is None:
                ids = tuple(self._tokenize(text, plain))
                self._encodings[key] = ids
                if len(self._encodings) > ENCODING_MEMO_ENTRIES:
                    self._encodings.popitem(last=False)
            else:
                self._encodings.move_to_end(key)
        return list(ids)


def _without_system(messages: Sequence[Message]) -> list[Message]:
    """For templates with no system role: the system text opens the first user message."""
    if not messages or messages[0].role != "system":
        return list(messages)
    system, rest = messages[0], list(messages[1:])
    if rest and rest[0].role == "user":
        rest[0] = Message("user", f"{system.content.strip()}\n\n{rest[0].content.strip()}")
        return rest
    return [Message("user", system.content), *rest]
