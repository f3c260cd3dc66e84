"""LoCoMo's conversations (CC BY-NC) are read from ../shared for tests and benchmarks, never
copied into the repository: no tracked file holds seven words in a row of a conversation's
turns, photo captions, questions, answers or observations (its gold facts)."""

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCOMO = ROOT.parent / "shared" / "corpora" / "locomo"
SPAN = 7  # words in a row; six already match everyday phrases ("how are you feeling about it")
_WORD_RE = re.compile(r"[a-z0-9']+")
# The converter's wording around a photo's caption (mlxmem.eval.locomo), not the people's.
_PHOTO_RE = re.compile(r"\[shares a photo: (a photo of )?")


def spans(text: str) -> set[str]:
    words = _WORD_RE.findall(text.lower().replace("\u2019", "'"))
    return {" ".join(words[i : i + SPAN]) for i in range(len(words) - SPAN + 1)}


def corpus_spans() -> set[str]:
    found: set[str] = set()
    for path in LOCOMO.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            turn = json.loads(line)
            found |= spans(_PHOTO_RE.sub(" ", turn["text"]))
    for path in (LOCOMO / "qa").glob("*.qa.json"):
        qa = json.loads(path.read_text())
        for q in qa["qa"]:
            found |= spans(q["question"]) | spans(str(q.get("answer", "")))
        for by_speaker in qa.get("observation", {}).values():  # its gold facts
            for items in by_speaker.values():
                for item in items:
                    found |= spans(item[0])
    return found


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / name for name in listed.split("\0") if name]


def quoting(paths: list[Path], corpus: set[str]) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # a binary file (a plot), or a deletion not yet committed
        if shared := spans(text) & corpus:
            found[str(path)] = sorted(shared)[:3]
    return found


needs_corpus = pytest.mark.skipif(not LOCOMO.is_dir(), reason="LoCoMo data not present")


@needs_corpus
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_tracked_file_quotes_the_corpus():
    corpus = corpus_spans()
    assert len(corpus) > 100_000  # the ten conversations were read
    assert not quoting(tracked_files(), corpus)


@needs_corpus
def test_the_check_finds_a_quoted_turn_in_other_words(tmp_path):
    first = json.loads((LOCOMO / "conv-26.jsonl").read_text().splitlines()[2])["text"]
    quoted = tmp_path / "quoted.py"
    quoted.write_text(f"CHAT = [{first.upper()!r}]  # case and punctuation do not hide it\n")
    clean = tmp_path / "clean.md"
    clean.write_text("one two three four five six seven eight nine ten\n")
    assert list(quoting([quoted, clean, tmp_path], corpus_spans())) == [str(quoted)]
