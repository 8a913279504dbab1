"""Training data without regeneration, measured on SmolLM2 (issue 49; docs/training.md "Measured on SmolLM2"):
held-out tau on the target's own replies to held-out prompts, the same prompts and steps, for a drafter trained on
(a) the target's replies, (b) the dataset's replies (`data.responses=dataset`, no generate task) and (c) (b)
trained on from (`drafter.init: pretrained`) on a quarter of the prompts with the target's replies.

The dataset's replies are real and not the target's: HumanEval's 164 problems as chat requests (the request
evaluate's humaneval suite sends), each answered by its canonical solution (the function's helpers, its `def` line
and the reference body, in one code block). Each run is the documented `flashdraft run-local` command, timed as a
subprocess; every run decodes the full block (`eval.num_draft_tokens=7`) so the taus compare drafters, not the
draft lengths a timing picked. The three runs hold out the same 16 prompts (checked).

    python benchmarks/bench_responses.py [--steps 1200] [--work DIR] [--out table.md]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

from local_runs import RunFigures, flashdraft, host_line, run_figures, stage_figures

from flashdraft.components.evaluate.suites import HUMANEVAL_REQUEST, humaneval_rows

PRESET = "smollm2-local"
NUM_EVAL = 16
# The dataset's replies run to 281 tokens (median ~65): (b) keeps every row; the target's replies stay the preset's.
DATASET_MAX_REPLY = 512


def reference_reply(row: dict) -> str:
    """HumanEval's canonical solution as a chat reply: the prompt's code up to the entry point's `def` line (imports,
    helpers), then the reference body, in one Python code block (the entry point's docstring is the request's)."""
    lines = row["prompt"].splitlines()
    entry = next(i for i, line in enumerate(lines) if line.startswith(f"def {row['entry_point']}("))
    return "```python\n" + "\n".join(lines[: entry + 1]) + "\n" + row["canonical_solution"].rstrip() + "\n```"


def write_conversations(path: Path) -> int:
    """HumanEval as OpenAI-style conversations with their reference replies; the number of rows."""
    rows = humaneval_rows()
    with path.open("w") as f:
        for row in rows:
            messages = [{"role": "user", "content": HUMANEVAL_REQUEST.format(prompt=row["prompt"])},
                        {"role": "assistant", "content": reference_reply(row)}]
            f.write(json.dumps({"id": row["task_id"], "messages": messages}) + "\n")
    return len(rows)


def run(work: Path, run_id: str, sets: dict[str, str]) -> tuple[RunFigures, float]:
    args = ["run-local", "--preset", PRESET, "--set", f"run_id={run_id}"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    wall = flashdraft(args, work)
    return run_figures(work / "runs", run_id), wall


def held_out_rows(work: Path, run_id: str) -> list[int]:
    """The source rows a run held out (sample ids differ between the modes: a dataset row's id covers its reply)."""
    import pyarrow.parquet as pq

    table = pq.read_table(work / "runs" / run_id / "prompts" / "eval.parquet", columns=["source_row"])
    return table.column("source_row").to_pylist()


def table(rows: list[tuple[str, str, RunFigures, float]], steps: int, prep: dict[str, float]) -> str:
    lines = ["| run | replies | steps | held-out tau (full block) | speedup | lossless | wall s | generation s |"
             " extract s | train s |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for label, replies, fig, wall in rows:
        lines.append(f"| {label} | {replies} | {steps_of(label, steps)} | {fig.tau:.3f} | "
                     f"{fig.speedup or 0:.2f}x | {'yes' if fig.lossless else 'NO'} | {wall:.0f} | "
                     f"{fig.seconds('generate'):.0f} | {fig.seconds('extract'):.0f} | {fig.seconds('train'):.0f} |")
    lines.append(f"\nHumanEval requests: {prep['prompts_kept']:.0f} kept ({prep['quarantined']:.0f} quarantined "
                 f"over data.max_prompt_tokens), {prep['prompts_train']:.0f} trained on, {prep['prompts_eval']:.0f} "
                 f"held out; (c) trains on a quarter of the trained-on prompts. `{PRESET}` otherwise. "
                 f"Host: {host_line()}.")
    return "\n".join(lines)


def steps_of(label: str, steps: int) -> str:
    return f"{steps} + {steps // 4}" if label.startswith("(c)") else str(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1200, help="training steps of (a) and (b); (c) trains a quarter")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-responses-"))
    work.mkdir(parents=True, exist_ok=True)
    samples = write_conversations(work / "conversations.jsonl")
    common = {"data.sources": f"[{{uri: {work.resolve()}/conversations.jsonl}}]", "data.max_samples": str(samples),
              "data.eval_count": str(NUM_EVAL), "eval.num_prompts": str(NUM_EVAL), "eval.suites": "[heldout]",
              "eval.num_draft_tokens": "7", "training.max_steps": str(args.steps)}
    rows = []
    fig, wall = run(work, "tau-a", common)
    rows.append(("(a)", "target", fig, wall))
    prep = stage_figures(work / "runs", "tau-a", "prep")  # prompts kept, quarantined, train, eval
    quarter = NUM_EVAL + math.ceil(prep["prompts_train"] / 4)
    fig, wall = run(work, "tau-b", {**common, "data.responses": "dataset",
                                    "data.max_response_tokens": str(DATASET_MAX_REPLY)})
    rows.append(("(b)", "dataset", fig, wall))
    fig, wall = run(work, "tau-c", {**common, "data.max_samples": str(quarter), "drafter.init": "pretrained",
                                    "drafter.init_from": f"{work.resolve()}/exports/tau-b/zlab",
                                    "training.max_steps": str(args.steps // 4)})
    rows.append(("(c)", "(b), then a quarter regenerated by the target", fig, wall))
    held_out = {run_id: held_out_rows(work, run_id) for run_id in ("tau-a", "tau-b", "tau-c")}
    if len({tuple(ids) for ids in held_out.values()}) != 1:
        raise SystemExit(f"the runs held out different prompts: {held_out}")
    text = table(rows, args.steps, prep)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
