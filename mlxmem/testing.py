"""A deterministic stand-in for the MLX engine, for logic tests and dry runs.

It implements the same `Engine` interface: a word-level tokenizer with a Llama-3-like chat
template, KV slots that account prefix reuse exactly like the real ones, and replies written by
a `responder(prompt_text) -> reply` function instead of a model.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from mlxmem.defaults import CHAT_SLOT
from mlxmem.engine import Engine, Message, StopGeneration
from mlxmem.engine.base import Request
from mlxmem.engine.slots import common_prefix_len
from mlxmem.text import check_text

SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_TOKEN_RE = re.compile(r"\s+|\w+|[^\w\s]")


@dataclass
class FakeCall:
    slot: str
    prompt: str
    prompt_tokens: int
    cached_tokens: int
    max_tokens: int


def echo_responder(prompt: str) -> str:
    return "I hear you."


class FakeEngine(Engine):
    """`delay_s` per generated token slows it down, to hold race windows open in tests."""

    def __init__(
        self,
        responder: Callable[[str], str] = echo_responder,
        model_id: str = "fake",
        delay_s: float = 0.0,
    ):
        self.responder = responder
        self.delay_s = delay_s
        self.model_id = model_id
        self.special_tokens = SPECIALS
        self._vocab: dict[str, int] = {s: i for i, s in enumerate(SPECIALS)}
        self._words: list[str] = list(SPECIALS)
        self.slots: dict[str, list[int]] = {}
        self.calls: list[FakeCall] = []

    def _id(self, piece: str) -> int:
        if piece not in self._vocab:
            self._vocab[piece] = len(self._words)
            self._words.append(piece)
        return self._vocab[piece]

    def encode_text(self, text: str) -> list[int]:
        check_text(text)
        # Specials typed by a user are text: the regex splits them into ordinary pieces.
        return [self._id(p) for p in _TOKEN_RE.findall(text)]

    def encode_chat_blocks(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[list[int]]:
        bos, start, end, eot = range(4)
        blocks = []
        for i, m in enumerate(messages):
            opening = [start, *self.encode_text(m.role), end, self._id("\n\n")]
            content = m.tokens if m.tokens is not None else self.encode_text(m.content.strip())
            blocks.append([*([eot] if i else [bos]), *opening, *content])
        tail = [eot] if messages else [bos]
        if add_generation_prompt:
            tail += [start, self._id("assistant"), end, self._id("\n\n")]
        return [*blocks, tail]

    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(self._words[t] for t in tokens)

    def _decoding(self, request: Request) -> _FakeDecoding:
        prompt, slot = request.prompt, request.slot
        cached = min(common_prefix_len(self.slots.get(slot, []), prompt), len(prompt) - 1)
        text = self.decode(prompt)
        self.calls.append(FakeCall(slot, text, len(prompt), cached, request.max_tokens))
        return _FakeDecoding(self, cached, text, request)

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        prompt = list(prompt)
        cached = min(common_prefix_len(self.slots.get(slot, []), prompt), len(prompt) - 1)
        self.slots[slot] = prompt
        return len(prompt) - cached

    def drop_slot(self, slot: str) -> None:
        self.slots.pop(slot, None)


class _FakeDecoding:
    """A reply written by the responder, its end of turn the template's <|eot_id|>."""

    def __init__(self, engine: FakeEngine, cached: int, prompt: str, request: Request):
        self.cached = cached
        self._engine, self._prompt, self._slot = engine, prompt, request.slot
        self._ignore_eos, self._should_stop = request.sampling.ignore_eos, request.should_stop
        self._ids, self._prefilled = request.prompt, False

    def tokens(self) -> Iterator[int]:
        if self._should_stop is not None and self._should_stop():  # the prefill is one batch
            raise StopGeneration
        self._engine.slots[self._slot], self._prefilled = list(self._ids), True
        reply = self._engine.encode_text(self._engine.responder(self._prompt))
        eot = SPECIALS.index("<|eot_id|>")
        # With ignore_eos no end of turn: the reply again and again, up to max_tokens.
        tokens = itertools.cycle(reply or [self._engine._id(".")]) if self._ignore_eos else None
        for token in tokens or [*reply, eot]:
            if token != eot:
                time.sleep(self._engine.delay_s)
            yield token

    def is_end(self, token: int) -> bool:
        return token == SPECIALS.index("<|eot_id|>")

    def text(self, token: int | None) -> str:
        return "" if token is None else self._engine.decode([token])

    def peak_memory_gb(self) -> float:
        return 0.0

    def close(self, tokens: list[int]) -> None:
        if self._prefilled:  # a stop before the prefill leaves the slot as it was
            self._engine.slots[self._slot] = tokens
