"""`builtin:demo`: an offline prompt set the project generates itself, for the local presets and tests.

Prompts come from small hand-written templates crossed with value lists (no dataset is copied), so the set is
deterministic, needs no network, and still varies the kind of work a drafter sees: step-by-step reasoning, math
word problems, code, summarising, explanation, rewriting, and multi-turn conversations whose assistant turns the
target regenerates. Rows are in the `messages` format with the final assistant turn left for the target.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

SYSTEMS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer briefly.",
    "You are a patient tutor who explains each step.",
]

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Farah", "Goran", "Hana"]
ITEMS = [("apples", 3), ("pencils", 2), ("books", 12), ("stickers", 1), ("tickets", 15), ("cookies", 4)]


def _math() -> Iterator[list[dict[str, str]]]:
    for i, (name, (item, price)) in enumerate(itertools.product(NAMES, ITEMS)):
        count = 3 + (i * 7) % 11
        spent = 2 + i % 5
        yield [{"role": "user", "content":
                f"{name} buys {count} {item} at {price} dollars each and then spends {spent} more dollars on a "
                f"bag. How much did {name} spend in total? Show your work."}]
    for a, b in itertools.product([12, 35, 48, 90], [3, 4, 7]):
        yield [{"role": "user", "content":
                f"A train travels {a * b} kilometres in {b} hours at a constant speed. What is its speed, and "
                f"how far does it travel in {b + 2} hours?"}]
    for price, pct in itertools.product([40, 75, 120, 250, 980], [10, 15, 20, 25, 30, 50]):
        yield [{"role": "user", "content":
                f"A jacket costs {price} dollars and is on sale for {pct}% off. What is the sale price? "
                f"Explain how you calculated it."}]


def _reasoning() -> Iterator[list[dict[str, str]]]:
    animals = ["cats", "birds", "fish", "dogs", "rabbits"]
    traits = ["can fly", "have fur", "live in water", "are mammals", "lay eggs"]
    for a, t in itertools.product(animals, traits):
        yield [{"role": "user", "content":
                f"Is the statement 'all {a} {t}' true, false, or partly true? Reason step by step before "
                f"giving a one-word verdict."}]
    for n, k in itertools.product([5, 6, 8], [2, 3]):
        yield [{"role": "user", "content":
                f"There are {n} people in a room and each shakes hands with {k} others chosen so that no pair "
                f"shakes twice. Is that possible? Explain your reasoning."}]


CODE_TASKS = [
    "reverses a string",
    "checks whether a number is prime",
    "returns the n-th Fibonacci number",
    "counts the vowels in a sentence",
    "merges two sorted lists",
    "removes duplicate items from a list while keeping order",
    "computes the factorial of n iteratively",
    "parses a comma-separated line into fields",
    "finds the largest element of a list without using max",
    "converts Celsius to Fahrenheit",
]
LANGUAGES = ["Python", "JavaScript", "Go", "Rust"]


def _code() -> Iterator[list[dict[str, str]]]:
    for task, lang in itertools.product(CODE_TASKS, LANGUAGES):
        yield [{"role": "user", "content": f"Write a short {lang} function that {task}. Add one comment."}]
    for task in CODE_TASKS[:6]:
        yield [{"role": "system", "content": SYSTEMS[1]},
               {"role": "user", "content": f"What is the time complexity of a function that {task}? Why?"}]


PASSAGES = [
    "The city council met on Tuesday to discuss the new bicycle lanes. Residents praised the safer streets, but "
    "shop owners worried about losing parking spaces. The council agreed to review the plan in six months.",
    "Honeybees communicate the location of flowers through a waggle dance. The angle of the dance shows the "
    "direction relative to the sun, and its length tells the distance to the food source.",
    "A small bakery started selling bread online during the winter. Orders grew quickly, so the owners hired two "
    "drivers and rented a second oven. By spring the online shop made half of their income.",
    "Volcanoes form where magma rises through the crust. Some erupt explosively because their magma is thick and "
    "full of gas, while others release runny lava that flows for kilometres.",
    "The library extended its opening hours after students asked for a quiet place to study in the evening. "
    "Visits rose by a third, and the library added more desks near the windows.",
    "Tides are caused mainly by the moon's gravity pulling on the oceans. When the sun and moon line up, the "
    "tides are higher than usual; these are called spring tides.",
]
SUMMARY_STYLES = ["in one sentence", "in three bullet points", "for a ten-year-old", "as a headline",
                  "in exactly twenty words"]


def _summaries() -> Iterator[list[dict[str, str]]]:
    for passage, style in itertools.product(PASSAGES, SUMMARY_STYLES):
        yield [{"role": "user", "content": f"Summarise the following text {style}:\n\n{passage}"}]


TOPICS = ["photosynthesis", "compound interest", "how vaccines work", "the water cycle", "recursion",
          "supply and demand", "why the sky is blue", "how a hash table works", "plate tectonics", "gravity"]
AUDIENCES = ["a child", "a high-school student", "an expert"]


def _explain() -> Iterator[list[dict[str, str]]]:
    for i, (topic, audience) in enumerate(itertools.product(TOPICS, AUDIENCES)):
        msgs = [{"role": "user", "content": f"Explain {topic} to {audience}."}]
        yield ([{"role": "system", "content": SYSTEMS[i % len(SYSTEMS)]}] + msgs) if i % 2 else msgs


REWRITES = ["more formal", "more friendly", "shorter", "in the passive voice", "as a question"]
SENTENCES = ["we need the report by friday or the client will be upset",
             "the team fixed the bug after a long night",
             "please send me the slides before the meeting",
             "our new product is faster and cheaper than the old one",
             "the museum will close early because of the storm",
             "i think the budget numbers are wrong in the second table",
             "the garden looks great now that the roses are blooming"]


def _rewrite() -> Iterator[list[dict[str, str]]]:
    for sentence, how in itertools.product(SENTENCES, REWRITES):
        yield [{"role": "user", "content": f"Rewrite this sentence to be {how}: \"{sentence}\""}]


FOLLOW_UPS = ["Can you give a concrete example?", "Now explain it in one sentence.",
              "What is a common misconception about it?"]


def _multi_turn() -> Iterator[list[dict[str, str]]]:
    # Assistant turns are placeholders: the target writes them itself, turn by turn.
    for i, (topic, follow) in enumerate(itertools.product(TOPICS, FOLLOW_UPS)):
        msgs = [{"role": "user", "content": f"What is {topic}?"},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": follow}]
        if i % 3 == 0:
            msgs = [{"role": "system", "content": SYSTEMS[0]}] + msgs
        yield msgs
    for task, lang in itertools.product(CODE_TASKS[:5], LANGUAGES[:2]):
        yield [{"role": "user", "content": f"Write a {lang} function that {task}."},
               {"role": "assistant", "content": ""},
               {"role": "user", "content": "Add a test for it."},
               {"role": "assistant", "content": ""},
               {"role": "user", "content": "Explain the test in two sentences."}]


GENERATORS = {"math": _math, "reasoning": _reasoning, "code": _code, "summarise": _summaries,
              "explain": _explain, "rewrite": _rewrite, "multi_turn": _multi_turn}


def demo_rows() -> list[dict]:
    """Every demo row as `{"messages": [...], "category": ...}`, interleaved across categories so any prefix of
    the list (e.g. `max_rows`) is still varied."""
    per_category = [[{"messages": m, "category": name} for m in gen()] for name, gen in GENERATORS.items()]
    rows: list[dict] = []
    for group in itertools.zip_longest(*per_category):
        rows.extend(r for r in group if r is not None)
    return rows
