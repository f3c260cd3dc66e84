import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlxmem.cli.main import app
from mlxmem.engine import Message

os.environ.setdefault("HF_HUB_OFFLINE", "1")

runner = CliRunner()


@pytest.fixture(autouse=True)
def mlxmem_home(tmp_path, monkeypatch):
    """Every test gets its own data directory."""
    home = tmp_path / "mlxmem-home"
    monkeypatch.setenv("MLXMEM_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The tests name their engine: MLX unless a test says llama.cpp (tests/test_llamacpp.py).
    monkeypatch.setenv("MLXMEM_ENGINE", "mlx")
    return home


def cli(*args: str, code: int = 0):
    """Run `mlxmem ARGS...` in this process and check its exit code."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def on(home: Path, *args: str, code: int = 0):
    """Run `mlxmem ARGS...` with `home` as the data directory (one device of a sync test)."""
    os.environ["MLXMEM_HOME"] = str(home)
    return cli(*args, code=code)


@pytest.fixture
def devices(tmp_path):
    """Two data directories and the folder they share."""
    folder = tmp_path / "shared"
    folder.mkdir()
    return tmp_path / "A", tmp_path / "B", folder


FACT = "The user has a cat called Miso."


def scripted(prompt: str) -> str:
    """A fake model for a chat about a cat: a summary, a fact, or a reply."""
    if "updated summary" in prompt:
        return "They talked about Miso the cat, sardines and naps. Open question: the vet."
    if "durable facts" in prompt:
        return FACT
    return "That sounds lovely. Tell me more about your afternoon and the sardines."


def user_text(i: int) -> str:
    return f"Turn {i}: my cat Miso ate {i} sardines, then slept in the sun for a long while."


def files_containing(root: Path, marker: str) -> list[Path]:
    """Every file under `root` whose bytes contain `marker`."""
    needle = marker.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def check_chat_blocks(engine, messages, hostile: int) -> None:
    """The per-message blocks of `engine.encode_chat_blocks` against the template: joined they
    are `encode_chat`'s ids, and, for messages of plain text, the ids of the chat template
    rendered by the tokenizer itself; each block ends with its content's ids; the blocks of a
    conversation are the ids of every shorter one (so a prompt's blocks can be extended); and
    message `hostile`, whose text holds special-token strings, has no more control tokens
    than a plain message of its role (invariant 6). `messages[0]` is a system message."""
    specials = {engine.hf.convert_tokens_to_ids(s) for s in engine.special_tokens}
    plain = [m for i, m in enumerate(messages) if i != hostile]
    for generation_prompt in (True, False):
        blocks = engine.encode_chat_blocks(messages, generation_prompt)
        assert len(blocks) == len(messages) + 1
        joined = [t for b in blocks for t in b]
        assert joined == engine.encode_chat(messages, generation_prompt)
        assert blocks[-1] == engine.chat_tail(messages, generation_prompt)
        for i, m in enumerate(messages):
            content = list(m.tokens) if m.tokens else engine.encode_text(m.content.strip())
            assert blocks[i][len(blocks[i]) - len(content) :] == content
            shorter = [t for b in blocks[: i + 1] for t in b]
            tail = engine.chat_tail(messages[: i + 1], generation_prompt)
            assert shorter + tail == engine.encode_chat(messages[: i + 1], generation_prompt)
        rendered = engine.hf.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in plain],
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )
        reference = engine.hf.encode(rendered, add_special_tokens=False)
        assert engine.encode_chat(plain, generation_prompt) == reference
        role = messages[hostile].role
        same_role = next(i for i, m in enumerate(messages) if m.role == role and i != hostile)
        control = lambda ids: [t for t in ids if t in specials]  # noqa: E731
        assert control(blocks[hostile]) == control(blocks[same_role])
        assert messages[hostile].content in engine.decode(blocks[hostile])
    # Conversations of every length up to 48 messages: by then the engine has learned to put
    # a new shape of conversation together without rendering the template (MLXEngine.
    # _composed), and the ids still are those of the template the tokenizer renders.
    said = ["Tell me about Paris.", "Paris is the capital of France.", "And Lyon?", "A city."]
    for opening in ([messages[0]], []):
        for n in range(1, 49):
            chat = opening + [
                Message(("user", "assistant")[i % 2], f"{said[i % 4]} ({i})") for i in range(n)
            ]
            for generation_prompt in (True, False):
                rendered = engine.hf.apply_chat_template(
                    [{"role": m.role, "content": m.content} for m in chat],
                    tokenize=False,
                    add_generation_prompt=generation_prompt,
                )
                reference = engine.hf.encode(rendered, add_special_tokens=False)
                assert engine.encode_chat(chat, generation_prompt) == reference, (n, opening)


def pytest_terminal_summary(terminalreporter):
    """How much of the store model ran (tests/test_store_model.py), when it ran."""
    model = sys.modules.get("test_store_model")
    if model is not None and model.RAN["examples"]:
        ran = model.RAN
        terminalreporter.write_line(
            f"store model: {ran['examples']} histories, {ran['steps']} steps"
            f" (up to {model.STEPS} steps each; MLXMEM_MODEL_EXAMPLES/MLXMEM_MODEL_STEPS for more)"
        )
