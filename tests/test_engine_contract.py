"""The contract every engine shares, written once in `Engine.stream`: the checks before a
call, the finish loop (stop, length, interrupted) and `close()`. Run on the fake engine, and on
llama.cpp's tiny random GGUF where the binding is installed."""

import os

import pytest

from mlxmem.engine import Engine, Message, Sampling, StopGeneration
from mlxmem.errors import InputError
from mlxmem.testing import FakeEngine


def fake() -> Engine:
    return FakeEngine(lambda prompt: "one two three four")


def llamacpp(tmp_path) -> Engine:
    if not os.environ.get("MLXMEM_REQUIRE_LLAMACPP"):
        pytest.importorskip("llama_cpp")
    from mlxmem.engine.llamacpp import LlamaCppEngine
    from mlxmem.models.tiny import make_tiny_gguf

    return LlamaCppEngine(make_tiny_gguf(tmp_path / "tiny.gguf", hidden=64), context_tokens=256)


@pytest.fixture(params=["fake", "llamacpp"])
def engine(request, tmp_path) -> Engine:
    return fake() if request.param == "fake" else llamacpp(tmp_path)


def prompt(engine: Engine) -> list[int]:
    return engine.encode_chat([Message("user", "the cat")])


def test_bad_calls_are_refused_before_any_work(engine):
    with pytest.raises(InputError, match="empty prompt"):
        engine.generate([], Sampling(max_tokens=4))
    with pytest.raises(InputError, match="max_tokens"):
        engine.generate(prompt(engine), Sampling(max_tokens=0))


def test_ignore_eos_decodes_exactly_max_tokens_and_the_stats_say_length(engine):
    done = engine.generate(prompt(engine), Sampling(max_tokens=7, ignore_eos=True), slot="s")
    assert len(done.tokens) == 7 and done.stats.generated_tokens == 7
    assert done.stats.finish_reason == "length"
    assert done.stats.prefilled_tokens == len(prompt(engine))


def test_a_stop_thrown_in_ends_the_stream_with_interrupted_stats(engine):
    stream = engine.stream(prompt(engine), Sampling(max_tokens=20, ignore_eos=True), slot="s")
    first = next(stream)
    assert first.token is not None and first.stats is None
    last = stream.throw(StopGeneration())
    assert last.stats is not None and last.stats.finish_reason == "interrupted"
    assert last.stats.generated_tokens == 1
    stream.close()


def test_a_closed_engine_refuses_to_generate(engine):
    engine.close()
    with pytest.raises(InputError, match="closed"):
        engine.generate(prompt(engine) if isinstance(engine, FakeEngine) else [1, 2], Sampling())
