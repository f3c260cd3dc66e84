"""Files of the data directory turned into the wrong kind of file, a full disk while saving
a KV cache, and CLI numbers out of range (issue 23, Medium 6): a clear error or a recovery,
never a traceback, and nothing partial left behind."""

import os
import warnings

import mlx.core as mx
import pytest
from conftest import cli

from mlxmem.engine import Message, MLXEngine, Sampling
from mlxmem.engine.slots import KV_BLOCK_TOKENS, SUFFIX, CacheWarning
from mlxmem.memory.store import Store
from mlxmem.models.tiny import make_tiny

PROMPT = [Message("user", "Tell me about the blue door and the garden behind it. " * 8)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=3)


def saved(tiny, kv):
    """An engine whose slot "c" was generated and saved in `kv`, and the prompt and tokens."""
    engine = MLXEngine(tiny, cache_dir=kv)
    prompt = engine.encode_chat(PROMPT)
    tokens = engine.generate(prompt, Sampling(max_tokens=4), slot="c").tokens
    engine.save_slots()
    return engine, prompt, tokens


def again(tiny, kv, prompt):
    """A new process's view: a fresh engine on `kv`, the same prompt, warnings caught."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = MLXEngine(tiny, cache_dir=kv)
        result = engine.generate(prompt, Sampling(max_tokens=4), slot="c")
        engine.save_slots()
    return result, [w for w in caught if issubclass(w.category, CacheWarning)]


def leftovers(kv):
    return sorted(p.name for p in kv.rglob("*.tmp*"))


def replace_with(target, kind):
    """Put a folder, a file or a named pipe where `target` (a file or a folder) was."""
    if target.is_dir():
        for p in target.iterdir():
            p.unlink()
        target.rmdir()
    else:
        target.unlink()
    if kind == "folder":
        target.mkdir()
    elif kind == "file":
        target.write_text("not a cache")
    else:
        os.mkfifo(target)


@pytest.mark.parametrize(
    "part, kind",
    [(part, kind) for part in ("slot", "digest") for kind in ("folder", "fifo")]
    + [("blocks", "file"), ("blocks", "fifo")],
)
def test_a_slot_file_of_the_wrong_kind_is_ignored_removed_and_rebuilt(tiny, tmp_path, part, kind):
    kv = tmp_path / "kv"
    engine, prompt, tokens = saved(tiny, kv)
    assert len(prompt) > KV_BLOCK_TOKENS  # so that the slot has a block
    slot = engine.slots.path("c")
    stem = slot.name[: -len(SUFFIX)]
    target = {"slot": slot, "digest": kv / f"{stem}.sum", "blocks": kv / f"{stem}.blocks"}[part]
    replace_with(target, kind)
    result, caught = again(tiny, kv, prompt)
    assert result.tokens == tokens  # the cache is only an optimization
    assert result.stats.cached_tokens == 0 and len(caught) == 1
    # Rebuilt: the next process reuses the slot saved over what was there, without a warning.
    reused, caught = again(tiny, kv, prompt)
    assert reused.tokens == tokens and reused.stats.cached_tokens > 0
    assert caught == []


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_a_kv_folder_that_is_not_a_folder_costs_the_cache_not_the_reply(tiny, tmp_path, kind):
    kv = tmp_path / "kv"
    if kind == "file":
        kv.write_text("not a folder")
    else:
        kv.symlink_to(tmp_path / "nowhere")
    engine = MLXEngine(tiny, cache_dir=kv)
    with pytest.warns(CacheWarning, match="could not save KV cache"):
        engine.generate(engine.encode_chat(PROMPT), Sampling(max_tokens=4), slot="c")
        engine.save_slots()
    assert kv.is_symlink() or kv.read_text() == "not a folder"  # not ours to remove


def test_a_kv_file_in_the_data_directory_does_not_stop_chat(tiny, mlxmem_home):
    mlxmem_home.mkdir(parents=True)
    (mlxmem_home / "kv").write_text("not a folder")
    result = cli("chat", "--model", str(tiny), "-m", "hello", "--max-tokens", "3")
    assert "could not save KV cache" in result.output
    assert [t.role for t in Store().turns("default")] == ["user", "assistant"]


@pytest.mark.parametrize("blocks", [True, False])
def test_a_full_disk_while_saving_a_cache_leaves_no_partial_file(
    tiny, tmp_path, monkeypatch, blocks
):
    kv = tmp_path / "kv"
    engine = MLXEngine(tiny, cache_dir=kv)
    prompt = engine.encode_chat(PROMPT if blocks else [Message("user", "hi")])
    engine.generate(prompt, Sampling(max_tokens=4), slot="c")
    real = mx.save_safetensors

    def full_disk(path, arrays, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")  # what a write cut short by ENOSPC leaves
        raise RuntimeError(f"[save_safetensors] Failed to write to {path}: No space left")

    monkeypatch.setattr(mx, "save_safetensors", full_disk)
    with pytest.warns(CacheWarning, match="No space left"):
        engine.save_slots()
    assert leftovers(kv) == []
    assert not engine.slots.path("c").exists()
    monkeypatch.setattr(mx, "save_safetensors", real)
    engine.save_slots()  # room again: the next save works
    assert engine.slots.path("c").exists() and leftovers(kv) == []


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_lock_file_of_the_wrong_kind_is_a_clear_error(mlxmem_home, kind):
    cli("memory", "add", "Likes tea")
    lock = mlxmem_home / "mlxmem.duckdb.lock"
    lock.unlink()
    lock.mkdir() if kind == "folder" else os.mkfifo(lock)
    result = cli("memory", "list", code=1)
    assert result.output.startswith("Error: ") and "lock file" in result.output
    assert "Traceback" not in result.output
    lock.rmdir() if kind == "folder" else lock.unlink()
    assert "Likes tea" in cli("memory", "list").output


@pytest.mark.parametrize("seed", ["-1", str(2**64), str(10**30)])
def test_a_bad_seed_is_refused_before_the_message_is_logged(tiny, mlxmem_home, seed):
    result = cli("chat", "--model", str(tiny), "-m", "hello", "--seed", seed, code=2)
    assert "--seed" in result.output
    assert not (mlxmem_home / "mlxmem.duckdb").exists() or Store().conversations() == []


def test_the_largest_seed_works(tiny, mlxmem_home):
    cli("chat", "--model", str(tiny), "-m", "hello", "--max-tokens", "2", "--seed", str(2**64 - 1))


@pytest.mark.parametrize("limit", [str(2**63), str(10**30), "0"])
def test_a_search_limit_out_of_range_is_a_clear_error(mlxmem_home, limit):
    result = cli("history", "search", "tea", "--limit", limit, code=2)
    assert "--limit" in result.output and "Traceback" not in result.output
