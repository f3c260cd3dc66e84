"""The generation engine: exact token counts on the chat template, and streaming generation
that reuses the longest cached prefix of each prompt.

`Engine` is the interface the memory layers talk to; `MLXEngine` runs a real model through
MLX and mlx-lm; `mlxmem.testing.FakeEngine` implements the same interface for logic tests.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from mlxmem.defaults import CHAT_SLOT, DEFAULT_SLOT_MEMORY_BYTES
from mlxmem.errors import InputError, ModelLoadError
from mlxmem.text import check_text

PREFILL_STEP = 512
# Encodings remembered per engine: every turn re-assembles the same facts, summary and window,
# and the tokenizer's Python wrapper costs ~0.1 ms a call (a few hundred calls a prompt).
ENCODING_MEMO_ENTRIES = 4096
# Chat templates rendered and cut per shape of conversation (its roles): a window's shapes
# recur from one fold to the next, with and without the generation prompt.
LAYOUT_MEMO_ENTRIES = 512
# A template is probed once a day with conversations of up to this many messages, and one of
# PROBE_LONG, to find whether it writes every message alike wherever it stands (see
# MLXEngine._learn_parts).
PROBE_MESSAGES = 6
PROBE_LONG = 24
# The probe costs a few dozen renders (14 ms for SmolLM2's template, 70 ms for Qwen2.5's on
# this CPU): only a process that has rendered this many shapes (a conversation going on, not
# a one-shot call) pays it.
RENDERS_BEFORE_PROBING = 4


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


class Engine:
    """What the memory layers need from a model. Subclasses implement the four methods."""

    model_id: str = ""
    special_tokens: Sequence[str] = ()  # control-token strings of the chat template
    # Told (tokens read, tokens to read) as a long prompt is read in, by stream and prefill:
    # a front end shows progress when that takes more than a moment (a conversation read into
    # a model that has not cached it). None: nobody listens.
    on_prefill: Callable[[int, int], None] | None = None

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
        *,
        slot: str = CHAT_SLOT,
        max_tokens: int = 256,
        temp: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> Generator[Chunk, None, None]:
        """Generate from `prompt` on the KV slot `slot`, reusing its longest cached prefix.
        The last chunk carries the call's stats, also after `stream.throw(StopGeneration())`
        stopped it early. With `ignore_eos` the end-of-turn token does not stop generation:
        exactly `max_tokens` are generated (as llama.cpp's --ignore-eos and vLLM's
        SamplingParams.ignore_eos: a decode of known length)."""
        raise NotImplementedError

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        """Bring `slot` up to `prompt` without generating (warming the cache while the person
        reads); return how many tokens were prefilled."""
        raise NotImplementedError

    def save_slots(self, names: Sequence[str] | None = None) -> None:
        """Persist slots (all held in memory by default; no-op without a disk cache)."""

    def drop_slot(self, slot: str) -> None:
        """Forget a slot in memory and on disk."""

    def count_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> int:
        return len(self.encode_chat(messages, add_generation_prompt))

    def count_text(self, text: str) -> int:
        return len(self.encode_text(text))

    def generate(
        self,
        prompt: Sequence[int],
        *,
        should_stop: Callable[[], bool] | None = None,
        **kwargs,
    ) -> Generation:
        """Collect a whole `stream` call; if `should_stop()` turns true between two tokens,
        the stream is stopped there and its stats say `interrupted`."""
        parts: list[str] = []
        tokens: list[int] = []
        stats = None
        stream = self.stream(prompt, **kwargs)
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


# Placeholders for message contents while the template renders: private-use characters that
# no template touches, so the rendered text splits cleanly into template parts and contents.
_PLACEHOLDER = "\ue000mlxmem{}\ue001"
_PLACEHOLDER_RE = re.compile("\ue000mlxmem(\\d+)\ue001")


class MLXEngine(Engine):
    """A real model through MLX, with named KV slots persisted under `cache_dir`."""

    def __init__(
        self,
        model_path: Path,
        model_id: str | None = None,
        cache_dir: Path | None = None,
        max_slot_bytes: int = DEFAULT_SLOT_MEMORY_BYTES,
        restart_policy: str = "auto",
    ):
        from mlx_lm import load
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.utils import maybe_set_recommended_wired_limit

        from mlxmem.kvslots import SlotPool
        from mlxmem.restart import PROFILE_FILENAME, RestartPolicy

        try:
            # Two items: the model and its tokenizer (a third, the config, only if asked).
            self.model, self.tokenizer = load(str(model_path))[:2]
        except Exception as exc:  # noqa: BLE001 - loader failures are many and untyped
            raise ModelLoadError(f"cannot load model from {model_path}: {exc}") from exc
        # Without a GPU, float32 through a BLAS beats MLX's quantized CPU kernels (see mlxmem.cpu).
        from mlxmem.cpu import dequantize_for_cpu

        self.dequantized = dequantize_for_cpu(self.model)
        self.hf = self.tokenizer._tokenizer
        self.special_tokens = sorted(
            {str(t) for t in self.hf.all_special_tokens}
            | {t.content for t in self.hf.added_tokens_decoder.values() if t.special}
        )
        self._system_role = self._supports_system_role()
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids)
        # On Apple silicon keep the weights wired for the process's lifetime, as mlx-lm's
        # stream_generate does per call (a no-op elsewhere).
        maybe_set_recommended_wired_limit()
        self.model_path = Path(model_path)
        self.model_id = model_id or model_identity(self.model_path)
        if self.dequantized and model_id is None:  # its KV caches are float32, not float16
            self.model_id += "-f32"
        # Whether a stored prefix is loaded after a restart or recomputed (see mlxmem.restart).
        profile = cache_dir.parent / PROFILE_FILENAME if cache_dir is not None else None
        self.restart = RestartPolicy(profile, self.model_id, restart_policy)
        self.slots = SlotPool(
            lambda: make_prompt_cache(self.model),
            self.model_id,
            cache_dir,
            max_slot_bytes,
            self.restart,
        )
        self._encodings: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        # Encoding text may come from another thread than the model's (a message logged while
        # the model works): the fast tokenizer switches its special-token splitting per call,
        # which is not atomic, and the memo is shared, so one encoding runs at a time.
        self._encoding = threading.Lock()
        self._renders: OrderedDict[tuple, tuple] = OrderedDict()
        self._parts: dict[tuple[bool, str], tuple[dict, dict, dict] | None] = {}
        self._shapes_rendered = 0

    # -- tokens ---------------------------------------------------------------------------

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
        bos = self.hf.bos_token
        head = (
            (self.hf.bos_token_id,)
            if bos and not rendered.startswith(bos) and self._adds_bos()
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

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as exc:  # noqa: BLE001 - templates raise whatever they like
            raise InputError(f"the model's chat template refused the conversation: {exc}") from None

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
                ids = tuple(
                    self.hf.encode(text, add_special_tokens=False, split_special_tokens=plain)
                )
                self._encodings[key] = ids
                if len(self._encodings) > ENCODING_MEMO_ENTRIES:
                    self._encodings.popitem(last=False)
            else:
                self._encodings.move_to_end(key)
        return list(ids)

    def _adds_bos(self) -> bool:
        probe = self.hf.encode("a", add_special_tokens=True)
        return bool(probe) and probe[0] == self.hf.bos_token_id

    def decode(self, tokens: Sequence[int]) -> str:
        return self.hf.decode(list(tokens))

    # -- generation -------------------------------------------------------------------------

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
    ) -> Generator[Chunk, None, None]:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.sample_utils import make_sampler

        if not prompt:
            raise InputError("empty prompt")
        if max_tokens < 1:
            raise InputError("max_tokens must be at least 1")
        prompt = list(prompt)
        kv = self.slots.get(slot)
        mx.reset_peak_memory()
        start = time.perf_counter()
        cached = kv.reuse_prefix(prompt)
        if seed is not None:
            mx.random.seed(seed)
        if self.on_prefill is not None:
            self.on_prefill(0, len(prompt) - cached)  # mlx-lm tells the rest
        # mlx-lm annotates each step as (mx.array, mx.array), but the token it yields is
        # `y.item()`, an int.
        steps = cast(
            "Generator[tuple[int, mx.array], None, None]",
            generate_step(
                mx.array(prompt[cached:]),
                self.model,
                max_tokens=max_tokens,
                sampler=make_sampler(temp=temp, top_p=top_p if temp > 0 else 0.0),
                prompt_cache=kv.cache,
                prompt_progress_callback=self.on_prefill,
            ),
        )
        detokenizer = self.tokenizer.detokenizer
        detokenizer.reset()
        out: list[int] = []
        first = None
        finish = "interrupted"
        try:
            try:
                for token, _ in steps:
                    if first is None:
                        first = time.perf_counter()
                        self.restart.record_prefill(len(prompt) - cached, first - start)
                    out.append(token)
                    if token in self.eos_token_ids and not ignore_eos:
                        finish = "stop"
                        break
                    detokenizer.add_token(token)
                    yield Chunk(detokenizer.last_segment, token)
                    if len(out) == max_tokens:
                        finish = "length"
                        break
            except StopGeneration:
                finish = "interrupted"
            detokenizer.finalize()
            stats = self._stats(prompt, cached, out, start, first, finish)
            yield Chunk(detokenizer.last_segment, None, stats)
        finally:
            steps.close()
            kv.sync_tokens(prompt + out)
            self.slots.enforce_cap(keep=slot)

    @staticmethod
    def _stats(prompt, cached, out, start, first, finish) -> GenerationStats:
        import mlx.core as mx

        end = time.perf_counter()
        first = first or end
        return GenerationStats(
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            prefilled_tokens=len(prompt) - cached,
            generated_tokens=len(out),
            ttft_s=first - start,
            prefill_tps=(len(prompt) - cached) / max(first - start, 1e-9),
            decode_tps=(len(out) - 1) / (end - first) if len(out) > 1 else 0.0,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
            finish_reason=finish,
        )

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        import mlx.core as mx

        prompt = list(prompt)
        kv = self.slots.get(slot)
        cached = kv.reuse_prefix(prompt)
        start = time.perf_counter()
        if self.on_prefill is not None:
            self.on_prefill(0, len(prompt) - cached)
        try:
            for i in range(cached, len(prompt), PREFILL_STEP):
                self.model(mx.array(prompt[i : i + PREFILL_STEP])[None], cache=kv.cache)
                mx.eval([c.state for c in kv.cache])
                if self.on_prefill is not None:
                    done = min(i + PREFILL_STEP, len(prompt)) - cached
                    self.on_prefill(done, len(prompt) - cached)
            self.restart.record_prefill(len(prompt) - cached, time.perf_counter() - start)
        finally:
            kv.sync_tokens(prompt)
            self.slots.enforce_cap(keep=slot)
        return len(prompt) - cached

    def save_slots(self, names: Sequence[str] | None = None) -> None:
        for name in names if names is not None else self.slots.names():
            self.slots.save(name)

    def drop_slot(self, slot: str) -> None:
        self.slots.drop(slot)


def _without_system(messages: Sequence[Message]) -> list[Message]:
    """For templates with no system role: the system text opens the first user message."""
    if not messages or messages[0].role != "system":
        return list(messages)
    system, rest = messages[0], list(messages[1:])
    if rest and rest[0].role == "user":
        rest[0] = Message("user", f"{system.content.strip()}\n\n{rest[0].content.strip()}")
        return rest
    return [Message("user", system.content), *rest]


def load_engine(model: str, cache_dir: Path | None = None):
    """Resolve a registry alias or a path, fetch it if needed, and load it.
    Returns the engine and the model's registry entry."""
    from mlxmem.models import ensure_local, resolve

    spec = resolve(model)
    return MLXEngine(ensure_local(spec), cache_dir=cache_dir, restart_policy=spec.restart), spec


def model_identity(path: Path) -> str:
    """A fingerprint of a model directory: its config and a full hash of every weight file, so
    that a model differing in any tensor never reuses another's cache. Hashes are remembered by
    file path, size and mtime, so a gigabyte model is read once, not at every start."""
    import hashlib

    h = hashlib.sha256()
    config = path / "config.json"
    if config.exists():
        h.update(config.read_bytes())
    known = _load_weight_hashes()
    for weights in sorted(path.glob("*.safetensors")):
        h.update(f"{weights.name}:{_weight_hash(weights, known)}".encode())
    return f"{path.name}-{h.hexdigest()[:16]}"


_WEIGHT_HASHES = "weight-hashes.json"


def _weight_hash(weights: Path, known: dict[str, str]) -> str:
    import hashlib

    info = weights.stat()
    key = f"{weights.resolve()}:{info.st_size}:{info.st_mtime_ns}"
    if key not in known:
        digest = hashlib.sha256()
        with open(weights, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
        known[key] = digest.hexdigest()
        _save_weight_hashes(known)
    return known[key]


def _load_weight_hashes() -> dict[str, str]:
    import json

    from mlxmem import paths

    try:
        return json.loads((paths.data_dir() / _WEIGHT_HASHES).read_text())
    except (OSError, ValueError):
        return {}


def _save_weight_hashes(known: dict[str, str]) -> None:
    import json
    import os

    from mlxmem import paths

    target = paths.data_dir() / _WEIGHT_HASHES
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(known))
        paths.make_private(tmp)
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)  # only a speed-up: hash again next time
