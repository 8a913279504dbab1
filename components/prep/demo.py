"""`builtin:demo`: an offline prompt set the project generates itself, for the local presets and tests.

Prompts come from small hand-written templates crossed with value lists (no dataset is copied), so the set is
deterministic, needs no network, and still varies the kind of work a drafter sees: step-by-step reasoning, math
word problems, code, summarising, explanation, rewriting, and multi-turn conversations whose assistant turns the
target regenerates. Rows are in the `messages` format with the final assistant turn left for the target.
"""

from __future__ import annotations

import itertools
import re
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


# `builtin:demo-code`: Python functions to complete from their signature and docstring, the shape of a code
# benchmark's request (HumanEval's among them): the reply repeats the stub and adds the body, so a drafter trained
# on these learns to copy the prompt's code, which most of such a reply is. Written for this project.
STUBS = [
    ("running_max", "values: list[int]", "list[int]", "Return the largest value seen so far at each position.",
     "running_max([1, 3, 2, 5]) == [1, 3, 3, 5]"),
    ("count_words", "text: str", "dict[str, int]", "Count how often each lower-cased word occurs in text.",
     "count_words('a b A') == {'a': 2, 'b': 1}"),
    ("is_palindrome", "text: str", "bool", "Check whether text reads the same backwards, ignoring case and spaces.",
     "is_palindrome('Never odd or even') is True"),
    ("chunk", "items: list, size: int", "list[list]", "Split items into consecutive chunks of at most size items.",
     "chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]"),
    ("flatten", "nested: list[list[int]]", "list[int]", "Flatten a list of lists into one list, keeping order.",
     "flatten([[1, 2], [], [3]]) == [1, 2, 3]"),
    ("second_largest", "numbers: list[int]", "int | None",
     "Return the second largest distinct number, or None when there is none.", "second_largest([4, 1, 4, 3]) == 3"),
    ("caesar_shift", "text: str, shift: int", "str",
     "Shift every lower-case letter of text by shift places in the alphabet, wrapping around.",
     "caesar_shift('xyz', 2) == 'zab'"),
    ("digit_sum", "n: int", "int", "Return the sum of the decimal digits of a non-negative integer.",
     "digit_sum(4096) == 19"),
    ("merge_intervals", "intervals: list[tuple[int, int]]", "list[tuple[int, int]]",
     "Merge overlapping closed intervals and return them sorted by start.",
     "merge_intervals([(1, 3), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]"),
    ("rotate_left", "items: list, k: int", "list", "Rotate items k places to the left.",
     "rotate_left([1, 2, 3, 4], 1) == [2, 3, 4, 1]"),
    ("common_prefix", "words: list[str]", "str", "Return the longest prefix shared by every word.",
     "common_prefix(['flow', 'flower', 'flight']) == 'fl'"),
    ("count_vowels", "text: str", "int", "Count the vowels (a, e, i, o, u) in text, ignoring case.",
     "count_vowels('Banana') == 3"),
    ("pairs_with_sum", "numbers: list[int], target: int", "list[tuple[int, int]]",
     "Return every pair (i, j) with i < j whose numbers add up to target.",
     "pairs_with_sum([1, 2, 3, 4], 5) == [(0, 3), (1, 2)]"),
    ("to_snake_case", "name: str", "str", "Convert a CamelCase name to snake_case.",
     "to_snake_case('HttpRequestCount') == 'http_request_count'"),
    ("balanced", "text: str", "bool", "Check that the brackets (), [] and {} in text are balanced.",
     "balanced('(a[b]{c})') is True"),
    ("moving_average", "values: list[float], window: int", "list[float]",
     "Return the mean of every window of consecutive values.", "moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]"),
    ("gcd_all", "numbers: list[int]", "int", "Return the greatest common divisor of all the numbers.",
     "gcd_all([12, 18, 30]) == 6"),
    ("dedupe_sorted", "items: list[int]", "list[int]", "Remove repeated items from a sorted list.",
     "dedupe_sorted([1, 1, 2, 3, 3]) == [1, 2, 3]"),
    ("histogram", "values: list[int]", "str", "Draw one line of '*' per value, as many stars as the value.",
     "histogram([2, 1]) == '**\\n*'"),
    ("binary_search", "items: list[int], target: int", "int",
     "Return the index of target in the sorted list items, or -1 when it is absent.",
     "binary_search([1, 3, 5, 7], 5) == 2"),
]
COMPLETION_REQUESTS = [
    "Complete this Python function. Reply with the whole function in one code block.\n\n{stub}",
    "Finish the implementation below and return the complete function.\n\n{stub}",
    "Write the body of this function. Show the full function in a Python code block.\n\n{stub}",
]


def code_completion_rows() -> list[dict]:
    """Every `builtin:demo-code` row: each stub once per request wording, typed or untyped in turn."""
    rows = []
    for i, ((name, args, returns, doc, example), request) in enumerate(
            itertools.product(STUBS, COMPLETION_REQUESTS)):
        typed = i % 2 == 0
        names = ", ".join(re.findall(r"(\w+):", args))
        signature = f"def {name}({args}) -> {returns}:" if typed else f"def {name}({names}):"
        stub = f'{signature}\n    """{doc}\n\n    >>> {example}\n    """\n'
        rows.append({"messages": [{"role": "user", "content": request.format(stub=stub)}],
                     "category": "code_completion"})
    return rows
