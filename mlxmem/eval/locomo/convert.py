"""LoCoMo's published file into the layout `mlxmem eval locomo` reads.

LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents", 2024)
publishes its ten conversations as one file, `data/locomo10.json` in
github.com/snap-research/locomo, under CC BY-NC 4.0 (non-commercial use). Each item has a
`sample_id`, a `conversation` (speaker_a, speaker_b, session_N lists of turns with their
session_N_date_time) and its `qa`. The eval reads one `conv-N.jsonl` per conversation (a turn
per line: role, text, session, session_time, id) and `qa/conv-N.qa.json` (user, assistant, qa,
observation): speaker_a is the user, speaker_b the assistant, and an image turn carries its
caption as `[shares a photo: ...]`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mlxmem.errors import InputError

SESSION_KEY = re.compile(r"^session_(\d+)$")


def convert_locomo(source: Path, out: Path) -> list[str]:
    """Write each conversation of LoCoMo's `locomo10.json` into `out`; return their ids."""
    samples = _read(source)
    (out / "qa").mkdir(parents=True, exist_ok=True)
    try:
        for sample in samples:
            _write(sample, out)
    except (KeyError, TypeError) as exc:
        raise InputError(f"{source}: not LoCoMo's layout (missing or odd field {exc})") from None
    return [sample["sample_id"] for sample in samples]


def _write(sample: dict[str, Any], out: Path) -> None:
    cid, conv = sample["sample_id"], sample["conversation"]
    lines = [json.dumps(turn, ensure_ascii=False) for turn in transcript(conv)]
    (out / f"{cid}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    qa = {
        "user": conv["speaker_a"],
        "assistant": conv["speaker_b"],
        "qa": sample.get("qa", []),
        "observation": sample.get("observation", {}),
    }
    (out / "qa" / f"{cid}.qa.json").write_text(json.dumps(qa, ensure_ascii=False), "utf-8")


def transcript(conv: dict[str, Any]) -> list[dict[str, Any]]:
    """One conversation's turns, session by session, as the eval's turn records."""
    sessions = sorted(int(m.group(1)) for key in conv if (m := SESSION_KEY.match(key)))
    turns = []
    for n in sessions:
        when = conv.get(f"session_{n}_date_time", "")
        for t in conv[f"session_{n}"]:
            text = t.get("text", "")
            if t.get("blip_caption"):
                text = f"{text} [shares a photo: {t['blip_caption']}]".strip()
            role = "user" if t["speaker"] == conv["speaker_a"] else "assistant"
            turns.append(
                {"role": role, "text": text, "session": n, "session_time": when, "id": t["dia_id"]}
            )
    return turns


def _read(source: Path) -> list[dict[str, Any]]:
    try:
        samples = json.loads(Path(source).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {source}: {exc}") from None
    ok = isinstance(samples, list) and all(
        isinstance(s, dict) and "sample_id" in s and isinstance(s.get("conversation"), dict)
        for s in samples
    )
    if not ok or not samples:
        raise InputError(
            f"{source} is not LoCoMo's locomo10.json (a list of items with sample_id and "
            "conversation)"
        )
    return samples
