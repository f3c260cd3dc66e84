"""Synthetic conversations for `mlxmem bench turns`, written as JSON lines with `role` and
`text` (plus `session` and `id`), the format of the LoCoMo transcripts. Every word is made up
here from a seed: the same seed writes the same files.

    python -m mlxmem.bench.synth                # all scenarios into ./benchmarks/scenarios/
    python -m mlxmem.bench.synth journal --turns 50 --out /tmp/journal.jsonl

The benchmarks draw their synthetic chats (`bench turns` without a transcript, `bench restart`,
`bench speed`'s prompts) from here too.

Scenarios:
  journal        a year of evening check-ins: events, people, plans and feelings, 1-5 sentences
                 a message, a few durable facts (names, allergies, routines) along the way
  short-chat     many one-line exchanges: the window holds a lot of turns
  long-messages  every fifth message is a long letter (about 3,000 words), longer than a
                 4,096-token window allows: it must be shortened and still fit
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

SCENARIOS_DIR = Path("benchmarks") / "scenarios"

PEOPLE = ["Anna", "Ben", "Clara", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Leo"]
RELATIONS = ["sister", "brother", "friend", "colleague", "neighbor", "cousin", "boss"]
PLACES = [
    "the park",
    "the library",
    "the bakery on the corner",
    "the office",
    "the lake",
    "my parents' house",
    "the gym",
    "the market",
    "the train station",
    "the museum",
]
ACTIVITIES = [
    "went for a long walk",
    "cooked dinner",
    "read a few chapters",
    "had a difficult meeting",
    "played the piano",
    "cleaned the whole flat",
    "tried a new recipe",
    "went swimming",
    "worked late",
    "called my mom",
    "planted tomatoes",
    "fixed my bike",
]
FEELINGS = ["calm", "tired", "happy", "anxious", "proud", "restless", "grateful", "a bit lonely"]
PLANS = [
    "start running again",
    "visit my grandmother",
    "finish the report",
    "learn to bake bread",
    "save money for a trip",
    "sleep earlier",
    "write in this journal every day",
]
FACTS = [
    "By the way, I am allergic to peanuts.",
    "I work as a nurse at the city hospital.",
    "My sister {p} lives in Lisbon.",
    "I have a cat called Pixel.",
    "I am vegetarian.",
    "I go to yoga every Tuesday evening.",
    "My best friend is {p}.",
    "My birthday is on the 4th of March.",
]
REPLIES = [
    "That sounds like quite a day. What part of it stayed with you most?",
    "Thank you for sharing that. How are you feeling about it now?",
    "It is good that you noticed that. What would make tomorrow a little easier?",
    "I remember you mentioned {p} before. How are things between you two?",
    "That is a lovely plan. What is the first small step?",
    "It makes sense to feel {f} after that. Do you want to talk it through?",
]


def sentence(rng: random.Random) -> str:
    p, r = rng.choice(PEOPLE), rng.choice(RELATIONS)
    return rng.choice(
        [
            f"Today I {rng.choice(ACTIVITIES)} at {rng.choice(PLACES)}.",
            f"My {r} {p} and I {rng.choice(ACTIVITIES)} together.",
            f"I felt {rng.choice(FEELINGS)} most of the afternoon.",
            f"Tomorrow I want to {rng.choice(PLANS)}.",
            f"{p} told me about {rng.choice(PLACES)} and it made me {rng.choice(FEELINGS)}.",
            f"I keep thinking about how to {rng.choice(PLANS)}.",
        ]
    )


def reply(rng: random.Random) -> str:
    return rng.choice(REPLIES).format(p=rng.choice(PEOPLE), f=rng.choice(FEELINGS))


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


def scenario_rng(name: str, seed: int) -> random.Random:
    return random.Random(f"{name}:{seed}")


def journal(turns: int, rng: random.Random) -> Iterator[tuple[int, str, str]]:
    for i in range(turns):
        text = " ".join(sentence(rng) for _ in range(rng.randint(1, 5)))
        if rng.random() < 0.08:
            text += " " + rng.choice(FACTS).format(p=rng.choice(PEOPLE))
        yield i // 12 + 1, text, reply(rng)


def short_chat(turns: int, rng: random.Random) -> Iterator[tuple[int, str, str]]:
    for i in range(turns):
        yield i // 30 + 1, sentence(rng), rng.choice(["I see.", "Tell me more.", "Nice!", "Oh no."])


def long_messages(turns: int, rng: random.Random) -> Iterator[tuple[int, str, str]]:
    for i in range(turns):
        count = 300 if i % 5 == 4 else rng.randint(1, 4)
        yield i // 10 + 1, " ".join(sentence(rng) for _ in range(count)), reply(rng)


SCENARIOS: dict[str, tuple[Callable, int]] = {
    "journal": (journal, 300),
    "short-chat": (short_chat, 400),
    "long-messages": (long_messages, 60),
}


def write(name: str, out: Path, turns: int | None = None, seed: int = 0) -> Path:
    """Write scenario `name` to `out` as JSON lines; return the path."""
    make, default_turns = SCENARIOS[name]
    rng = scenario_rng(name, seed)
    lines = []
    for i, (session, user, assistant) in enumerate(make(turns or default_turns, rng)):
        for j, (role, text) in enumerate((("user", user), ("assistant", assistant))):
            item = {"role": role, "text": text, "session": session, "id": f"S{session}:{2 * i + j}"}
            lines.append(json.dumps(item, ensure_ascii=False))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", choices=sorted(SCENARIOS), help="default: all")
    parser.add_argument("--turns", type=int, help="exchanges (default: the scenario's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output file (one scenario) or folder")
    args = parser.parse_args()
    names = [args.scenario] if args.scenario else sorted(SCENARIOS)
    for name in names:
        if args.out and args.scenario:
            out = args.out
        else:
            out = (args.out or SCENARIOS_DIR) / f"{name}.jsonl"
        print(write(name, out, args.turns, args.seed))


if __name__ == "__main__":
    main()
