"""A deterministic stand-in for the MLX engine, for logic tests and dry runs.

It implements the same `Engine` interface: a word-level tokenizer with a Llama-3-like chat
template, KV slots that account prefix reuse exactly like the real ones, and replies written by
a `responder(prompt_text) -> reply` function instead of a model.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

from mlxmem.defaults import CHAT_SLOT
from mlxmem.engine import Chunk, Engine, GenerationStats, Message, StopGeneration
from mlxmem.engine.slots import common_prefix_len
from mlxmem.errors import InputError
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

    def stream(
        self,
        prompt: Sequence[int],
        *,
        slot: str = CHAT_SLOT,
        max_tokens: int = 256,
        temp: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        ignore_eos: bool = False,
        should_stop: Callable[[], bool] | None = None,
        prefill_batch: int | None = None,
    ) -> Generator[Chunk, None, None]:
        if max_tokens < 1:
            raise InputError("max_tokens must be at least 1")
        prompt = list(prompt)
        cached = min(common_prefix_len(self.slots.get(slot, []), prompt), len(prompt) - 1)
        text = self.decode(prompt)
        self.calls.append(FakeCall(slot, text, len(prompt), cached, max_tokens))
        if should_stop is not None and should_stop():  # the prefill is one batch here
            yield Chunk("", None, self._stats(prompt, cached, [], "interrupted"))
            return
        reply = self.encode_text(self.responder(text))
        if ignore_eos:  # no end of turn: repeat the reply up to exactly max_tokens
            reply = (reply or [self._id(".")]) * (max_tokens // max(1, len(reply)) + 1)
        finish = "stop" if len(reply) < max_tokens else "length"
        out = reply[:max_tokens] if finish == "length" else reply + [SPECIALS.index("<|eot_id|>")]
        self.slots[slot] = prompt + out
        shown = 0
        try:
            for token in reply[:max_tokens]:
                shown += 1
                time.sleep(self.delay_s)
                yield Chunk(self._words[token], token)
        except StopGeneration:
            finish, out = "interrupted", out[:shown]
            self.slots[slot] = prompt + out
        yield Chunk("", None, self._stats(prompt, cached, out, finish))

    @staticmethod
    def _stats(prompt: list[int], cached: int, out: list[int], finish: str) -> GenerationStats:
        return GenerationStats(
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            prefilled_tokens=len(prompt) - cached,
            generated_tokens=len(out),
            ttft_s=0.0,
            prefill_tps=0.0,
            decode_tps=0.0,
            peak_memory_gb=0.0,
            finish_reason=finish,
        )

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        prompt = list(prompt)
        cached = min(common_prefix_len(self.slots.get(slot, []), prompt), len(prompt) - 1)
        self.slots[slot] = prompt
        return len(prompt) - cached

    def drop_slot(self, slot: str) -> None:
        self.slots.pop(slot, None)
