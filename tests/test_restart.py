"""After a restart, a stored KV prefix is loaded or recomputed, whichever this machine does
faster for this model: measured from the engine's own work (the fastest of a few samples),
then kept."""

import json
import stat

import pytest

from mlxmem.engine import Message, MLXEngine, Sampling
from mlxmem.models.tiny import make_tiny
from mlxmem.restart import PROFILE_FILENAME, SAMPLES, RestartPolicy, RestartProfile


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=3)


def chat(n: int) -> list[Message]:
    msgs = [Message("system", "You are a companion who remembers.")]
    for i in range(n):
        msgs += [
            Message("user", f"Day {i}: I planted {i} tomatoes and a fig tree."),
            Message("assistant", f"{i} tomatoes, noted."),
        ]
    return msgs


def test_the_decision_compares_read_bandwidth_with_prefill_speed():
    assert RestartProfile().loads  # nothing measured yet: load
    # 100 KB per token: recomputing runs at 1,000 tokens/s = 100 MB/s of KV.
    slow_disk = RestartProfile(50e6, 100e3, 1000.0)
    fast_disk = RestartProfile(400e6, 100e3, 1000.0)
    assert slow_disk.load_over_recompute == pytest.approx(0.5) and not slow_disk.loads
    assert fast_disk.load_over_recompute == pytest.approx(4.0) and fast_disk.loads


def test_forced_policies_and_a_damaged_profile(tmp_path):
    path = tmp_path / PROFILE_FILENAME
    path.write_text("{not json")
    policy = RestartPolicy(path, "m")
    assert policy.profile == RestartProfile() and policy.should_load()
    assert RestartPolicy(path, "m", "recompute").should_load() is False
    with pytest.raises(ValueError):
        RestartPolicy(path, "m", "sometimes")
    policy.record_prefill(100, 1.0)  # too short to say anything
    assert policy.profile.prefill_tokens_per_s is None
    policy.record_prefill(1000, 2.0)
    assert json.loads(path.read_text())["m"]["prefill_tokens_per_s"] == 500.0


def test_the_fastest_of_a_few_samples_decides_and_one_slow_read_does_not(tmp_path):
    """A busy machine or a cold disk only slows a sample down: the first read, slow, must not
    make the engine recompute for good, since it then loads nothing more to measure."""
    path = tmp_path / PROFILE_FILENAME
    policy = RestartPolicy(path, "m")
    policy.record_prefill(1000, 1.0)  # 1,000 tokens/s at 1 KB a token: 1 MB/s to beat
    policy.record_load(100_000, 100, 1.0)  # 0.1 MB/s: slower than recomputing
    assert policy.profile.loads_measured == 1 and not policy.profile.loads
    assert policy.should_load()  # one sample of each: keep loading, keep measuring
    policy.record_prefill(1000, 2.0)  # slower prefills: the fastest stays
    policy.record_prefill(1000, 4.0)
    policy.record_load(100_000, 100, 0.05)  # 2 MB/s: the disk when the machine is quiet
    policy.record_load(100_000, 100, 0.5)
    policy.record_load(100_000, 100, 0.001)  # past the samples: not recorded
    again = RestartPolicy(path, "m")  # as the next process reads it
    assert (again.profile.loads_measured, again.profile.prefills_measured) == (SAMPLES, SAMPLES)
    assert again.profile.read_bytes_per_s == pytest.approx(2e6)
    assert again.profile.prefill_tokens_per_s == pytest.approx(1000.0)
    assert again.profile.load_over_recompute == pytest.approx(2.0) and again.should_load()

    # The same samples the other way round: the disk is slower at its best, so recompute.
    slow = RestartPolicy(tmp_path / "slow.json", "m")
    for _ in range(SAMPLES):
        slow.record_prefill(1000, 1.0)
        slow.record_load(100_000, 100, 1.0)
    assert slow.profile.measured and not slow.should_load()


def test_a_profile_from_before_the_sample_counts_and_a_damaged_entry(tmp_path):
    path = tmp_path / PROFILE_FILENAME
    old = {"read_bytes_per_s": 1.0, "kv_bytes_per_token": 1e3, "prefill_tokens_per_s": 1e3}
    counted = {"loads_measured": SAMPLES, "prefills_measured": SAMPLES}
    bad = {
        "words": {**old, "loads_measured": "three"},
        "zero": {**old, **counted, "kv_bytes_per_token": 0},
        "nan": {**old, **counted, "read_bytes_per_s": float("nan")},
        "empty": {**old, **counted, "read_bytes_per_s": ""},
        "bool": {**old, "prefills_measured": True},
        "negative": {**old, "loads_measured": -1},
    }
    path.write_text(json.dumps({"m": old, **bad}))
    policy = RestartPolicy(path, "m")  # one sample of each, not yet enough to recompute
    assert (policy.profile.loads_measured, policy.profile.prefills_measured) == (1, 1)
    assert not policy.profile.loads and policy.should_load()
    for name in bad:  # each read as nothing measured: load, and measure again
        damaged = RestartPolicy(path, name)
        assert damaged.profile == RestartProfile() and damaged.should_load()


@pytest.mark.e2e
def test_measured_then_a_slower_disk_recomputes_with_the_same_output(tiny, tmp_path):
    kv = tmp_path / "kv"
    first = MLXEngine(tiny, cache_dir=kv)
    prompt = first.encode_chat(chat(20))
    assert len(prompt) >= 256
    first.generate(prompt, Sampling(max_tokens=4), slot="c")
    first.save_slots()
    profile_path = tmp_path / PROFILE_FILENAME
    stored = json.loads(profile_path.read_text())[first.model_id]
    assert stored["prefill_tokens_per_s"] > 0 and stored["read_bytes_per_s"] is None
    assert stat.S_IMODE(profile_path.stat().st_mode) & 0o077 == 0

    longer = first.encode_chat(chat(20) + [Message("user", "What did I plant?")])
    loaded = MLXEngine(tiny, cache_dir=kv).generate(longer, Sampling(max_tokens=8), slot="c")
    assert loaded.stats.cached_tokens > 0.9 * len(prompt)
    measured = RestartPolicy(profile_path, first.model_id).profile
    assert measured.loads_measured == 1 and measured.kv_bytes_per_token > 0

    # The same files on a machine whose disk is slower than its prefill: recompute.
    entry = {
        **stored,
        "read_bytes_per_s": 1.0,
        "kv_bytes_per_token": measured.kv_bytes_per_token,
        "loads_measured": SAMPLES,
        "prefills_measured": SAMPLES,
    }
    profile_path.write_text(json.dumps({first.model_id: entry}))
    recomputed = MLXEngine(tiny, cache_dir=kv).generate(longer, Sampling(max_tokens=8), slot="c")
    assert recomputed.stats.cached_tokens == 0
    assert recomputed.tokens == loaded.tokens
    # Every sample in: the forced entry was not overwritten by later work.
    assert json.loads(profile_path.read_text())[first.model_id]["read_bytes_per_s"] == 1.0
