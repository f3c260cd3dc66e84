"""Can the 1.5B tell an update from a look-alike at all? The replacement check's question
("is the old fact still true?", mlxmem.memory.extraction) asked of every fact the store holds in
each labelled LoCoMo pair of `mlxmem eval facts --updates` (benchmarks/scenarios/
locomo-updates.json), scored by the model's margin rather than its greedy word: log P(NO) -
log P(YES) of the answer's first token (for the second wording, which asks the opposite way,
log P(YES) - log P(NO)). If some threshold on the margin separated the earlier fact of an
update from every other held fact, the check could be kept with it; the area under the ROC
curve says how far any threshold can get.

    python benchmarks/fact_replacement_margins.py OUT.jsonl [--model qwen2.5-coder-1.5b]
    python benchmarks/fact_replacement_margins.py OUT.jsonl --score

llama.cpp only: it reads the logits of the prompt's last position through the engine's
context (the product needs no such call). One row per (pair, held fact, wording), ids and
margins only, no corpus text; a rerun skips the rows written.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from mlxmem.defaults import FACTS_SLOT
from mlxmem.engine import Message, load_engine
from mlxmem.eval import facts as fe
from mlxmem.eval.locomo import default_data_dir
from mlxmem.memory import extraction as ex

# The product's wording, and one that asks the other way round (YES: the new fact makes the
# old one out of date), so that a bias toward one word shows.
WORDINGS = {
    "still_true": (ex.REPLACE_INSTRUCTIONS, ex.replace_question, "NO"),
    "out_of_date": (
        "You keep a list of facts about the user. You are shown an old fact and a new fact "
        "about the user. Answer YES only if the new fact makes the old fact no longer true: "
        "the same thing has changed (a plan that is now done, a move, a new job, something "
        "ended). Answer NO if the facts are about different things, or both can be true. "
        "Answer with one word: YES or NO.",
        lambda new, old: (
            f"Old fact: {old}\nNew fact: {new}\nDoes the new fact make the old fact no longer true?"
        ),
        "YES",
    ),
}


def first_tokens(engine, word: str) -> list[int]:
    return sorted({engine.encode_text(w)[0] for w in (word, " " + word, word.capitalize())})


def margin(engine, tokens: list[int], replace_word: str) -> float:
    import llama_cpp as lc

    held = engine._slot(FACTS_SLOT, len(tokens) + 1)
    cached = held.reuse_prefix(tokens)
    engine._decode(held, tokens[cached:])
    n_vocab = lc.llama_vocab_n_tokens(engine._vocab)
    logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(engine._ctx, -1), shape=(n_vocab,))
    logits = logits.astype(np.float64)
    top = logits.max()
    norm = top + math.log(np.exp(logits - top).sum())
    yes = float(np.logaddexp.reduce(logits[first_tokens(engine, "YES")]) - norm)
    no = float(np.logaddexp.reduce(logits[first_tokens(engine, "NO")]) - norm)
    return no - yes if replace_word == "NO" else yes - no


def measure(out: Path, model: str, data: Path) -> None:
    pairs = fe.load_update_pairs(fe.UPDATES_FILE)
    done = set()
    if out.exists():
        done = {(r["wording"], r["pair"], r["held"]) for r in map(json.loads, out.open())}
    engine, _ = load_engine(model, cache_dir=None, engine="llamacpp")
    users: dict[str, tuple] = {}
    with out.open("a") as f:
        for i, pair in enumerate(pairs):
            if pair.conversation not in users:
                users[pair.conversation] = fe.user_observations(data, pair.conversation)
            name, texts = users[pair.conversation]
            held = fe.held_before(pair, list(texts), pairs)
            existing = [(j, fe.as_fact(texts[o], name)) for j, o in enumerate(held, 1)]
            new = fe.as_fact(texts[pair.later], name)
            gated = {j for j, _ in ex.replacement_candidates(new, existing)}
            for wording, (instructions, question, replace_word) in WORDINGS.items():
                for j, old in existing:
                    if (wording, i, j) in done:
                        continue
                    tokens = engine.encode_chat(
                        [Message("system", instructions), Message("user", question(new, old))]
                    )
                    row = {
                        "wording": wording,
                        "pair": i,
                        "held": j,
                        "conversation": pair.conversation,
                        "update": pair.update,
                        "earlier": held[j - 1] == pair.earlier,
                        "gated": j in gated,
                        "margin": margin(engine, tokens, replace_word),
                    }
                    f.write(json.dumps(row) + "\n")
                    f.flush()
            print(f"pair {i + 1}/{len(pairs)}", file=sys.stderr, flush=True)


def auc(positive: list[float], negative: list[float]) -> float | None:
    """The share of (positive, negative) pairs a threshold orders right (ties half)."""
    if not positive or not negative:
        return None
    won = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return won / (len(positive) * len(negative))


def score(out: Path) -> dict:
    rows = [json.loads(line) for line in out.open()]
    result = {}
    for wording in WORDINGS:
        mine = [r for r in rows if r["wording"] == wording]
        target = [r["margin"] for r in mine if r["update"] and r["earlier"]]
        gated = [r["margin"] for r in mine if r["gated"] and not (r["update"] and r["earlier"])]
        controls = [r["margin"] for r in mine if not r["update"] and r["earlier"]]
        result[wording] = {
            "pairs": len({r["pair"] for r in mine}),
            "updates": len(target),
            "auc_against_gated_others": auc(target, gated),
            "auc_against_control_earlier": auc(target, controls),
            "greedy_says_replace": {
                "update_earlier": sum(m > 0 for m in target),
                "gated_others": f"{sum(m > 0 for m in gated)} of {len(gated)}",
            },
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--score", action="store_true", help="score the rows written")
    args = parser.parse_args()
    if not args.score:
        measure(args.out, args.model, args.data or default_data_dir())
    print(json.dumps(score(args.out), indent=1))


if __name__ == "__main__":
    main()
