"""After a restart, load a stored KV prefix or recompute it: decided per machine and model.

Loading a saved slot costs its bytes over the read bandwidth; recomputing it costs its tokens
over the prefill speed. Both grow with the slot's length, so the choice is one comparison per
machine and model: load when the disk delivers a token's KV bytes faster than the model prefills
a token, that is when `read_bytes_per_s >= kv_bytes_per_token * prefill_tokens_per_s`. (Prefill
slows down as a prompt grows, so at long lengths loading only gains.) On a laptop SSD with a
3B model loading wins; on a datacenter GPU prefilling 3,000 tokens in a second, it can lose.

The numbers come from the engine's own work (the first SAMPLES stored slots it loads, the first
SAMPLES prefills of at least MIN_PREFILL_TOKENS), each the fastest of its samples: another job
on the machine, a cold disk or a process's first call only ever slow a sample down, and one slow
read must not make a machine recompute for good (once it recomputes, it loads nothing more to
measure). They are kept in `restart-profile.json` beside the cache folder, per model. Until
every sample is in, stored slots are loaded. Delete the file to measure again, or set the
model's `restart` in models.toml to "load" or "recompute". It holds speeds only, nothing from a
conversation.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from mlxmem.paths import make_private

PROFILE_FILENAME = "restart-profile.json"
MIN_PREFILL_TOKENS = 256  # a shorter prefill says little about the model's speed
SAMPLES = 3  # of each speed, the fastest kept
POLICIES = ("auto", "load", "recompute")


@dataclass
class RestartProfile:
    read_bytes_per_s: float | None = None  # loading a stored slot: digest check, read, eval
    kv_bytes_per_token: float | None = None
    prefill_tokens_per_s: float | None = None
    loads_measured: int = 0  # samples behind read_bytes_per_s
    prefills_measured: int = 0  # samples behind prefill_tokens_per_s

    @property
    def measured(self) -> bool:
        """Every sample of both speeds is in."""
        return min(self.loads_measured, self.prefills_measured) >= SAMPLES

    @property
    def load_over_recompute(self) -> float | None:
        """How many times faster loading a stored prefix is than recomputing it (< 1: slower)."""
        read, kv, prefill = (
            self.read_bytes_per_s,
            self.kv_bytes_per_token,
            self.prefill_tokens_per_s,
        )
        if read is None or kv is None or prefill is None:  # a speed not measured yet
            return None
        return read / (kv * prefill)

    @property
    def loads(self) -> bool:
        """Whether the speeds known so far favour loading (RestartPolicy.should_load also waits
        for every sample)."""
        ratio = self.load_over_recompute
        return ratio is None or ratio >= 1.0


class RestartPolicy:
    """The load-or-recompute decision of one model on this machine, under `policy`: "auto"
    (measure, then decide), "load" or "recompute" (forced: by benchmarks, or by the model's
    `restart` in models.toml)."""

    def __init__(self, path: Path | None, model_id: str, policy: str = "auto"):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        self.path = path
        self.model_id = model_id
        self.policy = policy
        self.profile = self._read()

    def should_load(self) -> bool:
        if self.policy != "auto":
            return self.policy == "load"
        return not self.profile.measured or self.profile.loads

    def record_load(self, nbytes: int, tokens: int, seconds: float) -> None:
        p = self.profile
        if p.loads_measured < SAMPLES and tokens and nbytes and seconds > 0:
            if nbytes / seconds > (p.read_bytes_per_s or 0.0):  # both from the fastest sample
                p.read_bytes_per_s, p.kv_bytes_per_token = nbytes / seconds, nbytes / tokens
            p.loads_measured += 1
            self._write()

    def record_prefill(self, tokens: int, seconds: float) -> None:
        p = self.profile
        if p.prefills_measured < SAMPLES and tokens >= MIN_PREFILL_TOKENS and seconds > 0:
            p.prefill_tokens_per_s = max(p.prefill_tokens_per_s or 0.0, tokens / seconds)
            p.prefills_measured += 1
            self._write()

    def _read(self) -> RestartProfile:
        if self.path is None or not self.path.exists():
            return RestartProfile()
        try:
            entry = json.loads(self.path.read_text()).get(self.model_id, {})
            fields = RestartProfile.__dataclass_fields__
            profile = RestartProfile(**{k: entry[k] for k in fields if entry.get(k) is not None})
            if not _valid(profile):
                raise ValueError("not a speed")
        except (OSError, ValueError, TypeError, AttributeError):
            return RestartProfile()  # unreadable or edited by hand: measure again
        # A profile written before the counts (one sample of each): keep sampling.
        if profile.read_bytes_per_s is not None and not profile.loads_measured:
            profile.loads_measured = 1
        if profile.prefill_tokens_per_s is not None and not profile.prefills_measured:
            profile.prefills_measured = 1
        return profile

    def _write(self) -> None:
        if self.path is None or not self.path.parent.exists():
            return
        try:
            profiles = json.loads(self.path.read_text()) if self.path.exists() else {}
            if not isinstance(profiles, dict):
                profiles = {}
        except (OSError, ValueError):
            profiles = {}
        profiles[self.model_id] = asdict(self.profile)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(profiles, indent=1, sort_keys=True))
            make_private(tmp)
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)  # a speed hint is not worth an error


def _valid(profile: RestartProfile) -> bool:
    """Speeds are finite positive numbers, counts non-negative integers (a JSON file may say
    NaN, 0 or "fast", and one of them would divide by zero or stick for good)."""
    speeds = (profile.read_bytes_per_s, profile.kv_bytes_per_token, profile.prefill_tokens_per_s)
    counts = (profile.loads_measured, profile.prefills_measured)
    return all(
        s is None or (type(s) in (int, float) and math.isfinite(s) and s > 0) for s in speeds
    ) and all(type(c) is int and c >= 0 for c in counts)
