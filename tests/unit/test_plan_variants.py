"""The plan prices variants (issue 50, `plan.train_variants`): offline rows pay generation and extraction once and
training N times; streaming rows extract N times; `plan --compare` shows offline against streaming as N grows.

Rates and prices are fixed (as in tests/unit/test_plan_compare.py), so each expected figure is arithmetic here."""

import json

from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.plan.compare import StageHours, schedule

FIXED = ["plan.measured_tokens_per_s.generate=1000", "plan.measured_tokens_per_s.extract=4000",
         "plan.measured_tokens_per_s.train=5000", "plan.inference_gpus=4",
         "pools.inference.usd_per_gpu_hour=1", "pools.trainer.usd_per_gpu_hour=5"]


def plan_json(*sets: str) -> dict:
    args = ["plan", "--preset", "qwen3.6-27b", "--compare", "--json"]
    for s in (*FIXED, *sets):
        args += ["--set", s]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output[-2000:]
    return json.loads(out.output)["comparison"]


def test_three_variants_triple_the_trainer_hours_of_offline_rows_and_keep_their_inference_hours():
    one, three = plan_json(), plan_json("plan.train_variants=3")
    assert three["train_variants"] == 3 and one["train_variants"] == 1
    rows1, rows3 = ({r["key"]: r for r in c["rows"]} for c in (one, three))
    offline = [k for k, r in rows1.items() if r["mode"] == "offline"]
    assert offline and set(rows1) == set(rows3)
    for key in offline:
        (inf1, train1), (inf3, train3) = rows1[key]["pools"], rows3[key]["pools"]
        assert inf3["gpu_hours"] == inf1["gpu_hours"], key
        assert abs(train3["gpu_hours"] - 3 * train1["gpu_hours"]) <= 0.15, key  # each rounded to 0.1 h
        assert rows3[key]["storage_bytes"] == rows1[key]["storage_bytes"], "the features are stored once"
        assert rows3[key]["storage_cost_usd"] > rows1[key]["storage_cost_usd"], "held for the whole sweep"
    for key in (k for k, r in rows1.items() if r["mode"] == "streaming"):
        # streaming extracts beside every training: generation (G h) once, the concurrent phase (c h of wall
        # clock) per variant: inference G + N c I GPU-hours, trainer N c T
        (inf1, train1), (inf3, train3) = rows1[key]["pools"], rows3[key]["pools"]
        assert abs(train3["gpu_hours"] - 3 * train1["gpu_hours"]) <= 0.15, key
        extra = (inf3["gpu_hours"] - inf1["gpu_hours"]) / 2 / inf1["gpus"]
        assert abs(extra - train1["gpu_hours"] / train1["gpus"]) <= 0.1, key


def test_the_schedule_of_n_variants_written_out():
    h = StageHours(generate=100.0, extract=40.0, train=60.0)
    off = schedule(h, "offline", 4, 8, variants=3)
    assert (off.inference_billed, off.train_billed) == (140.0, 180.0)
    assert off.hours == 140.0 / 4 + 180.0 / 8
    st = schedule(h, "streaming", 4, 8, variants=3)
    concurrent = max(40.0 / 4, 60.0 / 8)  # 10 h a variant, the extraction the slower side
    assert st.hours == 100.0 / 4 + 3 * concurrent
    assert (st.inference_billed, st.train_billed) == (100.0 + 3 * concurrent * 4, 3 * concurrent * 8)
    assert schedule(h, "offline", None, 8, variants=2).train_billed == 120.0, "colocated: N trainings too"


def test_compare_shows_offline_against_streaming_at_1_3_and_10_variants_and_where_offline_wins():
    cmp = plan_json("plan.train_variants=5")
    assert [b["variants"] for b in cmp["balance"]] == [1, 3, 5, 10]
    for b in cmp["balance"]:
        assert b["offline"].replace("/offline/", "/streaming/") == b["streaming"], "the configured pair"
    tip = cmp["offline_cheaper_from"]
    cheaper = {b["variants"]: b["offline_usd"] <= b["streaming_usd"] for b in cmp["balance"]}
    assert all(ok == (tip is not None and n >= tip) for n, ok in cheaper.items()), (tip, cheaper)
    text = CliRunner().invoke(app, ["plan", "--preset", "qwen3.6-27b", "--compare",
                                    *[a for s in FIXED for a in ("--set", s)]]).output
    assert "Variants: trainings of the same features" in text


def test_the_default_plan_table_trains_every_variant_and_generates_and_extracts_once():
    from flashdraft.components.plan.planner import make_plan, plan_markdown
    from flashdraft.config import load_config

    one = make_plan(load_config(preset="qwen3.6-27b", overrides=FIXED))
    three = make_plan(load_config(preset="qwen3.6-27b", overrides=[*FIXED, "plan.train_variants=3"]))
    for stage in ("generate", "extract"):
        assert three.gpu_hours[stage] == one.gpu_hours[stage], stage
    assert three.gpu_hours["train"].tokens == 3 * one.gpu_hours["train"].tokens
    assert abs(three.gpu_hours["train"].gpu_hours - 3 * one.gpu_hours["train"].gpu_hours) <= 0.15
    assert "| train (3 variants, plan.train_variants) |" in plan_markdown(three)
    assert "| train |" in plan_markdown(one)
    # --compare prices from one training's tokens: the same rows as before, N applied once
    assert three.comparison.train_variants == 3
