"""The interface the memory layers talk to, and what a generation returns.

`Engine` is implemented by `MLXEngine` (mlxmem.engine.mlx: MLX and mlx-lm, the engine on Apple
silicon), `LlamaCppEngine` (mlxmem.engine.llamacpp: llama.cpp, wherever MLX has no fast path)
and `mlxmem.testing.FakeEngine` (logic tests). Nothing above this package knows which runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol

from mlxmem.defaults import CHAT_SLOT
from mlxmem.errors import InputError

if TYPE_CHECKING:
    from mlxmem.restart import RestartPolicy

# Tokens a prefill batch for memory work that gives way to a waiting message (a fold, a look
# for a fact), on an engine that hears a stop only between batches (MLX): it is heard within
# 64 tokens' time, for a prefill up to 1.5x as long as in full batches (measured on llama.cpp,
# 2 cores, before it stopped inside a batch). Only that work pays it: a reply prefills in the
# engine's own batches.
YIELD_BATCH = 64


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    # The ids this content was sampled as, when the engine's model wrote it: used instead of
    # re-tokenizing, so the prompt matches what the model (and its KV cache) saw.
    tokens: tuple[int, ...] | None = None


@dataclass
class GenerationStats:
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    generated_tokens: int
    ttft_s: float
    prefill_tps: float
    decode_tps: float
    peak_memory_gb: float
    finish_reason: str  # "stop" (end of turn), "length" (max tokens) or "interrupted"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def timed(
        cls,
        prompt: Sequence[int],
        cached: int,
        out: Sequence[int],
        start: float,
        first: float | None,
        finish: str,
        peak_memory_gb: float = 0.0,
    ) -> GenerationStats:
        """The stats of a call that started at `start` (perf_counter), reused `cached` tokens
        of `prompt`, gave its first token at `first` (None: none) and `out` by now."""
        end = time.perf_counter()
        first = first or end
        return cls(
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            prefilled_tokens=len(prompt) - cached,
            generated_tokens=len(out),
            ttft_s=first - start,
            prefill_tps=(len(prompt) - cached) / max(first - start, 1e-9),
            decode_tps=(len(out) - 1) / (end - first) if len(out) > 1 else 0.0,
            peak_memory_gb=peak_memory_gb,
            finish_reason=finish,
        )

    @classmethod
    def interrupted(cls, prompt_tokens: int, generated_tokens: int) -> GenerationStats:
        """What is known of a stream the caller stopped before its final chunk: the sizes,
        not the timings or the cache split (zero)."""
        return cls(prompt_tokens, 0, 0, generated_tokens, 0.0, 0.0, 0.0, 0.0, "interrupted")


class StopGeneration(Exception):
    """Thrown into a stream (`stream.throw(StopGeneration())`) to stop it early: the stream
    then yields its final chunk, whose stats say `interrupted`."""


@dataclass
class Chunk:
    """A piece of streamed text; the last chunk of a call carries the stats."""

    text: str
    token: int | None = None
    stats: GenerationStats | None = None


@dataclass
class Generation:
    text: str
    tokens: list[int]
    stats: GenerationStats


@dataclass(frozen=True)
class Sampling:
    """How a reply is sampled. With `ignore_eos` the end-of-turn token does not stop it:
    exactly `max_tokens` are generated (as llama.cpp's --ignore-eos and vLLM's
    SamplingParams.ignore_eos: a decode of known length). `temp` 0 is greedy; `seed` fixes a
    sampled reply."""

    max_tokens: int = 256
    temp: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False


GREEDY = Sampling()


@dataclass(frozen=True)
class Request:
    """One `stream` call, as an engine's `_decoding` gets it (see `Engine.stream`)."""

    prompt: list[int]
    sampling: Sampling
    slot: str
    should_stop: Callable[[], bool] | None = None
    prefill_batch: int | None = None

    @property
    def max_tokens(self) -> int:
        return self.sampling.max_tokens


class Decoding(Protocol):
    """One call's generation on an engine, driven by `Engine.stream`."""

    cached: int  # prompt tokens reused from the slot

    def tokens(self) -> Iterator[int]:
        """Prefill the rest of the prompt (raising StopGeneration if asked to stop there),
        then each sampled token; the next one is computed only when asked for."""
        ...

    def is_end(self, token: int) -> bool:
        """Whether `token` ends the turn."""
        ...

    def text(self, token: int | None) -> str:
        """The text `token` adds (None: what is left once the call ends)."""
        ...

    def peak_memory_gb(self) -> float: ...

    def close(self, tokens: list[int]) -> None:
        """After the call: the slot holds `tokens` (the prompt and what was sampled), or as
        much of them as the engine kept."""
        ...


class Engine:
    """What the memory layers need from a model. Subclasses implement the tokenizer's
    methods, `_decoding` (one call's generation), `prefill`, and the slots'."""

    model_id: str = ""
    special_tokens: Sequence[str] = ()  # control-token strings of the chat template
    # Told (tokens read, tokens to read) as a long prompt is read in, by stream and prefill:
    # a front end shows progress when that takes more than a moment (a conversation read into
    # a model that has not cached it). None: nobody listens.
    on_prefill: Callable[[int, int], None] | None = None
    # Told how long each prefill took (mlxmem.restart), where the engine keeps stored prefixes.
    restart: RestartPolicy | None = None
    _closed = False

    def encode_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of `messages` rendered by the chat template; message contents are encoded
        as plain text, so special-token strings in them never become control tokens, and a
        message with `tokens` keeps them."""
        return [
            t for block in self.encode_chat_blocks(messages, add_generation_prompt) for t in block
        ]

    def encode_chat_blocks(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[list[int]]:
        """`encode_chat`'s ids cut by message: one block per message (the template's text
        before its content, then the content), then one more, the template's text after the
        last content. Joined, they are `encode_chat`'s ids, exactly."""
        raise NotImplementedError

    def chat_tail(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        """The last block of `encode_chat_blocks(messages, add_generation_prompt)`: what the
        template writes after the last message (without encoding the messages, where it can)."""
        return self.encode_chat_blocks(messages, add_generation_prompt)[-1]

    def encode_text(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens parsed, none added)."""
        raise NotImplementedError

    def decode(self, tokens: Sequence[int]) -> str:
        raise NotImplementedError

    def stream(
        self,
        prompt: Sequence[int],
        sampling: Sampling = GREEDY,
        *,
        slot: str = CHAT_SLOT,
        should_stop: Callable[[], bool] | None = None,
        prefill_batch: int | None = None,
    ) -> Generator[Chunk, None, None]:
        """Generate from `prompt` on the KV slot `slot`, reusing its longest cached prefix.
        The last chunk carries the call's stats, also after `stream.throw(StopGeneration())`
        stopped it early. `should_stop()` is also asked during the prompt's prefill (between
        two batches, or inside one where the engine can): once true, the stream ends there
        with no token, its stats `interrupted`, and the slot keeps what was prefilled (a later
        call reuses it). A long prefill is the one wait a caller could not cut short
        otherwise. `prefill_batch`: tokens a batch (None: the engine's own, the fastest), so
        that work which must give way quickly hears `should_stop` sooner, at some cost in
        speed; an engine that hears it inside a batch (llama.cpp) needs no smaller ones and
        ignores it."""
        if not prompt:
            raise InputError("empty prompt")
        if sampling.max_tokens < 1:
            raise InputError("max_tokens must be at least 1")
        self._check_open()
        prompt = list(prompt)
        run = self._decoding(Request(prompt, sampling, slot, should_stop, prefill_batch))
        start = time.perf_counter()  # the slot is ready: its lookup is not the engine's time
        out: list[int] = []
        first = None
        finish = "interrupted"
        try:
            try:
                for token in run.tokens():
                    if first is None:
                        first = time.perf_counter()
                        self._record_prefill(len(prompt) - run.cached, first - start)
                    out.append(token)
                    if run.is_end(token) and not sampling.ignore_eos:
                        finish = "stop"
                        break
                    yield Chunk(run.text(token), token)
                    if len(out) == sampling.max_tokens:
                        finish = "length"
                        break
            except StopGeneration:
                finish = "interrupted"
            peak = run.peak_memory_gb()
            stats = GenerationStats.timed(prompt, run.cached, out, start, first, finish, peak)
            yield Chunk(run.text(None), None, stats)
        finally:
            run.close(prompt + out)

    def _decoding(self, request: Request) -> Decoding:
        """One call's generation: the slot's prefix already reused, nothing computed yet."""
        raise NotImplementedError

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        """Bring `slot` up to `prompt` without generating (warming the cache while the person
        reads); return how many tokens were prefilled."""
        raise NotImplementedError

    def save_slots(self, names: Sequence[str] | None = None) -> None:
        """Persist slots (all held in memory by default; no-op without a disk cache)."""

    def drop_slot(self, slot: str) -> None:
        """Forget a slot in memory and on disk."""

    def close(self) -> None:
        """Let go of the model and its caches now; the engine cannot be used after."""
        self._closed = True

    def _record_prefill(self, tokens: int, seconds: float) -> None:
        """Tell the restart policy, where the engine has one, how long `tokens` took to prefill."""
        if self.restart is not None:
            self.restart.record_prefill(tokens, seconds)

    def _check_open(self) -> None:
        if self._closed:
            raise InputError("this engine was closed")

    def count_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> int:
        return len(self.encode_chat(messages, add_generation_prompt))

    def count_text(self, text: str) -> int:
        return len(self.encode_text(text))

    def generate(
        self,
        prompt: Sequence[int],
        sampling: Sampling = GREEDY,
        *,
        slot: str = CHAT_SLOT,
        should_stop: Callable[[], bool] | None = None,
        prefill_batch: int | None = None,
    ) -> Generation:
        """Collect a whole `stream` call; if `should_stop()` turns true between two batches of
        the prefill or two tokens, the stream is stopped there and its stats say
        `interrupted`."""
        parts: list[str] = []
        tokens: list[int] = []
        stats = None
        stream = self.stream(
            prompt, sampling, slot=slot, should_stop=should_stop, prefill_batch=prefill_batch
        )
        for chunk in stream:
            parts.append(chunk.text)
            if chunk.token is not None:
                tokens.append(chunk.token)
            stats = chunk.stats or stats
            if stats is None and should_stop is not None and should_stop():
                try:
                    stats = stream.throw(StopGeneration()).stats
                except (StopGeneration, StopIteration):
                    pass
                finally:
                    stream.close()
                if stats is None:
                    stats = GenerationStats.interrupted(len(prompt), len(tokens))
                break
        assert stats is not None
        return Generation("".join(parts), tokens, stats)
