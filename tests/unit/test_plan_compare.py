"""`flashdraft plan --compare` (issue 41): every topology priced in money and days, the gate on cost and deadline.

The hand-computed rows fix every rate (plan.measured_tokens_per_s on the configured pools) and every price, so each
figure below is arithmetic written out here, not read back from the code under test."""

import json
import re

import pytest
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.plan.compare import HOURS_PER_MONTH, StageHours, rate_letter, schedule
from flashdraft.components.plan.gpus import GPUS
from flashdraft.components.plan.planner import PlanGateError, comparison_of, make_plan, run_plan
from flashdraft.config import ConfigError, load_config
from flashdraft.config.pipeline import DEFAULT_GPU_USD_PER_HOUR
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

SAMPLES, TOKENS_PER_SAMPLE = 913_786, 800          # the seed's dataset (qwen3.6-27b preset)
TOKENS = SAMPLES * TOKENS_PER_SAMPLE                # 731,028,800 extracted
GEN_TOKENS = int(TOKENS * 0.75)                     # plan.response_fraction
TRAIN_TOKENS = TOKENS * 6                           # training.epochs
GEN, EXT, TRAIN = 1000.0, 4000.0, 5000.0            # tokens/s a GPU, as measured (plan.measured_tokens_per_s)
INF_GPUS, TRAINERS = 4, 8
INF_PRICE, TRAIN_PRICE, STORAGE_PRICE, TRANSFER_PRICE = 1.0, 5.0, 20.0, 0.01
FIXED = {"plan.measured_tokens_per_s.generate": GEN, "plan.measured_tokens_per_s.extract": EXT,
         "plan.measured_tokens_per_s.train": TRAIN, "plan.inference_gpus": INF_GPUS,
         "pools.inference.usd_per_gpu_hour": INF_PRICE, "pools.trainer.usd_per_gpu_hour": TRAIN_PRICE,
         "plan.prices.storage_usd_per_tb_month": STORAGE_PRICE, "plan.prices.transfer_usd_per_gb": TRANSFER_PRICE}


def _plan_json(cfg) -> dict:
    """The plan as `plan --json` prints it and metrics/plan.json holds it: the figures checked by hand below."""
    return make_plan(cfg).dump()


def _rows(plan):
    return {r["key"]: r for r in plan["comparison"]["rows"]}


@pytest.fixture(scope="module")
def fixed_plan():
    return _plan_json(load_config(preset="qwen3.6-27b", overrides=FIXED))


def test_the_seeds_figures_hold_in_the_comparison(fixed_plan):
    """37.4 TB naive at 51,200 B/token for 913,786 samples x 800 tokens; every row trains the same tokens."""
    assert fixed_plan["bytes_per_token"] == 51_200 and fixed_plan["total_tokens"] == TOKENS == 731_028_800
    assert round(TOKENS * (51_200 + 5) / 1e12, 1) == 37.4 == round(fixed_plan["codecs"]["bf16"]["total_tb"], 1)
    cmp = fixed_plan["comparison"]
    assert cmp["train_tokens"] == TRAIN_TOKENS
    # 6 GPU types x bf16/fp8 x offline/streaming x fp8-zstd, bf16-zstd, q4; colocated x bf16/fp8, offline only
    assert len(cmp["rows"]) == 6 * 2 * 2 * 3 + 2 * 3 == 78
    assert not [r for r in cmp["rows"] if r["inference"] == "colocated" and r["mode"] == "streaming"]
    assert {r["codec"] for r in cmp["rows"]} == {"fp8-zstd", "bf16-zstd", "q4"}
    assert {r["inference"] for r in cmp["rows"]} == {"colocated", "a100", "b200", "h100", "h200", "l40s",
                                                     "rtx-pro-6000"}
    costs = [r["total_cost_usd"] for r in cmp["rows"]]
    assert costs == sorted(costs)


def test_configured_offline_row_by_hand(fixed_plan):
    row = _rows(fixed_plan)["rtx-pro-6000/bf16/offline/fp8-zstd"]
    assert row["configured"] and fixed_plan["comparison"]["configured"] == row["key"]
    gen_h = GEN_TOKENS / GEN / 3600                      # 152.30 GPU-hours
    ext_h = TOKENS / EXT / 3600                          # 50.77
    train_h = TRAIN_TOKENS / TRAIN / 3600                # 243.68
    hours = (gen_h + ext_h) / INF_GPUS + train_h / TRAINERS   # in sequence: 81.23 h
    stored = TOKENS * (0.86 * (5 * 5120 + 5 * 2) + 5)    # fp8-zstd: fp8 + a bf16 scale a layer, x0.86 zstd, + ids
    storage = stored / 1e12 * STORAGE_PRICE * hours / HOURS_PER_MONTH
    transfer = stored / 1e9 * TRANSFER_PRICE
    inference, trainer = row["pools"]
    assert inference["gpu_hours"] == pytest.approx(gen_h + ext_h, abs=0.05) == 203.1
    assert inference["cost_usd"] == pytest.approx((gen_h + ext_h) * INF_PRICE, abs=0.01)
    assert trainer["gpu_hours"] == pytest.approx(train_h, abs=0.05) and trainer["gpus"] == TRAINERS
    assert trainer["cost_usd"] == pytest.approx(train_h * TRAIN_PRICE, abs=0.01) == 1218.38
    assert row["storage_bytes"] == pytest.approx(stored, rel=1e-6)
    assert row["storage_cost_usd"] == pytest.approx(storage, abs=0.01) == 35.84
    assert row["transfer_cost_usd"] == pytest.approx(transfer, abs=0.01) == 161.04
    assert row["days"] == round(hours / 24, 2) == 3.38
    assert row["total_cost_usd"] == pytest.approx(
        (gen_h + ext_h) * INF_PRICE + train_h * TRAIN_PRICE + storage + transfer, abs=0.01) == 1618.33
    assert row["bandwidth_bytes_per_s"] == pytest.approx(stored / (ext_h / INF_GPUS * 3600), rel=1e-6)
    assert row["rates"] == "M/M/M" and row["fits"]


def test_streaming_row_by_hand_bills_both_pools_while_the_slower_runs(fixed_plan):
    row = _rows(fixed_plan)["rtx-pro-6000/bf16/streaming/fp8-zstd"]
    gen_h, ext_h, train_h = GEN_TOKENS / GEN / 3600, TOKENS / EXT / 3600, TRAIN_TOKENS / TRAIN / 3600
    concurrent = max(ext_h / INF_GPUS, train_h / TRAINERS)   # the trainer is the slower side: 30.46 h
    assert concurrent == train_h / TRAINERS
    hours = gen_h / INF_GPUS + concurrent
    inference, trainer = row["pools"]
    assert inference["gpu_hours"] == pytest.approx(gen_h + concurrent * INF_GPUS, abs=0.05) == 274.1
    assert trainer["gpu_hours"] == pytest.approx(concurrent * TRAINERS, abs=0.05)
    window = 2 * 2**40                                       # mode.window_bytes of the preset
    assert row["storage_bytes"] == window
    storage = window / 1e12 * STORAGE_PRICE * hours / HOURS_PER_MONTH
    transfer = TOKENS * (0.86 * 25_610 + 5) / 1e9 * TRANSFER_PRICE  # every feature crosses once
    assert row["days"] == round(hours / 24, 2) == 2.86
    assert row["total_cost_usd"] == pytest.approx(
        (gen_h + concurrent * INF_GPUS) * INF_PRICE + concurrent * TRAINERS * TRAIN_PRICE + storage + transfer,
        abs=0.01) == 1657.69


def test_colocated_row_by_hand_runs_the_model_rates_on_the_trainers_gpus(fixed_plan):
    """The measured inference rates were taken on the configured RTX PRO 6000s, so they do not apply to the
    B200s: the model does (decode: batch x efficiency x bandwidth / bf16 weights; prefill: efficiency x peak / 2 x
    params x deepest layer / layers). Stages in sequence on the 8 trainer GPUs, no transfer."""
    row = _rows(fixed_plan)["colocated/bf16/offline/q4"]
    gen_rate = 64 * 0.5 * 8000e9 / (2 * 27e9)                 # 4,740.7 tokens/s a B200
    ext_rate = 0.4 * 2250e12 / (2 * 27e9 * 62 / 64)           # 17,204.3 (deepest layer 61 of 64)
    gen_h, ext_h, train_h = GEN_TOKENS / gen_rate / 3600, TOKENS / ext_rate / 3600, TRAIN_TOKENS / TRAIN / 3600
    hours = (gen_h + ext_h + train_h) / TRAINERS
    stored = TOKENS * (5 * (5120 // 2 + 2 * 5120 // 64 + 8 * 4) + 5)   # q4: 13,760 B/token + ids
    inference, trainer = row["pools"]
    assert inference["gpu"] == trainer["gpu"] == "b200" and inference["pool"] == trainer["pool"] == "trainer"
    assert inference["gpu_hours"] == pytest.approx(gen_h + ext_h, abs=0.05)
    assert row["transfer_bytes"] == 0 and row["storage_bytes"] == stored
    assert row["days"] == round(hours / 24, 2)
    assert row["total_cost_usd"] == pytest.approx(
        (gen_h + ext_h + train_h) * TRAIN_PRICE + stored / 1e12 * STORAGE_PRICE * hours / HOURS_PER_MONTH, abs=0.01)
    assert row["rates"] == "A/A/M"


def test_fp8_target_halves_the_weights_and_doubles_the_assumed_rates():
    plan = _plan_json(load_config(preset="qwen3.6-27b"))
    bf16, fp8 = plan["comparison"]["precision"]
    assert (bf16["precision"], fp8["precision"], fp8["gpu"]) == ("bf16", "fp8", "rtx-pro-6000")
    assert bf16["weights_bytes_per_gpu"] == 2 * 27e9 and fp8["weights_bytes_per_gpu"] == 27e9
    assert fp8["kv_room_bytes_per_gpu"] == bf16["kv_room_bytes_per_gpu"] + 27e9
    # 64 K/V bytes a token x 4,096 + 78 MB of recurrent state a sequence
    assert fp8["sequences"] == int(fp8["kv_room_bytes_per_gpu"] // (4096 * 65536 + 7.8e7))
    assert fp8["generate_tokens_per_s"] == pytest.approx(2 * bf16["generate_tokens_per_s"], rel=1e-3)
    assert fp8["extract_tokens_per_s"] == pytest.approx(2 * bf16["extract_tokens_per_s"], rel=1e-3)
    assert "FP8 weights assumed" in fp8["rate_sources"]["generate"]
    rows = _rows(plan)
    # an A100 has no FP8 tensor cores: weight-only FP8 halves decode's bytes, prefill stays at the BF16 peak
    a100_bf16, a100_fp8 = rows["a100/bf16/offline/q4"]["pools"][0], rows["a100/fp8/offline/q4"]["pools"][0]
    assert a100_fp8["peak_bytes_per_gpu"] < a100_bf16["peak_bytes_per_gpu"]
    assert all(r["rates"] == "A/A/A" for r in plan["comparison"]["rows"] if r["precision"] == "fp8")
    assert "served" in plan["comparison"]["caveat"]
    configured_fp8 = _plan_json(load_config(preset="qwen3.6-27b", overrides={"plan.target_precision": "fp8"}))
    assert configured_fp8["memory"]["inference"]["parts"]["target weights (fp8)"] == 27e9
    assert configured_fp8["comparison"]["configured"] == "rtx-pro-6000/fp8/offline/fp8-zstd"


def test_deadline_marks_the_cheapest_row_that_meets_it(fixed_plan):
    cfg = load_config(preset="qwen3.6-27b", overrides={**FIXED, "plan.deadline_days": 2})
    cmp = comparison_of(make_plan(cfg))
    best = cmp.row(cmp.cheapest_in_deadline)
    assert best.days <= 2 and best.fits and best.cheapest_in_deadline
    cheaper = [r for r in cmp.rows if r.total_cost_usd < best.total_cost_usd and r.fits]
    assert all(r.days > 2 for r in cheaper)
    assert sum(r.cheapest_in_deadline for r in cmp.rows) == 1 and sum(r.configured for r in cmp.rows) == 1


def test_gate_stops_on_max_cost_naming_a_cheaper_row(tmp_path):
    # an object store, as in production: 16 TB planned would not fit a test's disk (the free-space gate)
    cfg = load_config(preset="qwen3.6-27b", overrides={"storage.root": f"memory://{tmp_path.name}"})
    configured = comparison_of(make_plan(cfg))
    row = configured.row(configured.configured)
    limit = row.total_cost_usd - 1
    with pytest.raises(PlanGateError) as exc:
        run_plan(cfg.with_overrides({"plan.max_cost_usd": limit}))
    msg = str(exc.value)
    assert f"{row.key} (${row.total_cost_usd:,.0f}" in msg and "plan.max_cost_usd" in msg
    named = re.findall(r"([\w.-]+/(?:bf16|fp8)/\w+/[\w-]+) \(\$([\d,]+)", msg.split("Cheaper rows")[1])
    assert named, msg
    for key, cost in named:
        r = configured.row(key)
        assert r.fits and r.total_cost_usd <= limit and int(cost.replace(",", "")) == round(r.total_cost_usd)
    # the three cheapest serve an FP8 target; the cheapest that keeps the configured bf16 weights is named too
    assert [configured.row(k).precision for k, _ in named] == ["fp8", "fp8", "fp8", "bf16"]
    assert open_store(cfg.storage, cfg.run_id).is_committed(layout.metrics_key("plan"))
    # a limit above the configured cost passes
    assert run_plan(cfg.with_overrides({"plan.max_cost_usd": row.total_cost_usd + 1})).gate is None


def test_gate_stops_on_the_deadline_naming_faster_rows(tmp_path):
    cfg = load_config(preset="qwen3.6-27b", overrides={"storage.root": f"memory://{tmp_path.name}"})
    cmp = comparison_of(make_plan(cfg))
    row = cmp.row(cmp.configured)
    deadline = round(row.days - 0.5, 1)
    with pytest.raises(PlanGateError) as exc:
        run_plan(cfg.with_overrides({"plan.deadline_days": deadline}))
    faster = str(exc.value).split("Faster rows")[1]
    keys = re.findall(r"([\w.-]+/(?:bf16|fp8)/\w+/[\w-]+) \(", faster)
    assert keys and all(cmp.row(k).days <= deadline for k in keys)


def test_prices_are_config_with_clear_errors():
    cheap_b200 = _plan_json(load_config(preset="qwen3.6-27b", overrides={"pools.trainer.usd_per_gpu_hour": 1.0}))
    default = _plan_json(load_config(preset="qwen3.6-27b"))
    row, base = (_rows(p)["rtx-pro-6000/bf16/offline/fp8-zstd"] for p in (cheap_b200, default))
    assert row["pools"][1]["cost_usd"] == pytest.approx(base["pools"][1]["cost_usd"] / 5.99, rel=1e-3)
    with pytest.raises(ConfigError, match=r"plan.prices.gpu_usd_per_hour: unknown GPU types \['tpu'\]"):
        make_plan(load_config(preset="qwen3.6-27b", overrides={"plan.prices.gpu_usd_per_hour.tpu": 1.0}))
    one = load_config(preset="qwen3.6-27b", overrides={"plan.prices.gpu_usd_per_hour.rtx-pro-6000": 0.66})
    assert one.plan.prices.gpu_usd_per_hour == {**DEFAULT_GPU_USD_PER_HOUR, "rtx-pro-6000": 0.66}, "others kept"
    assert set(DEFAULT_GPU_USD_PER_HOUR) == set(GPUS), "every planner GPU has a default price"
    with pytest.raises(ConfigError, match=r"plan.prices.gpu_usd_per_hour: prices must be > 0, got h100=0.0"):
        load_config(preset="qwen3.6-27b", overrides={"plan.prices.gpu_usd_per_hour.h100": 0})
    with pytest.raises(ConfigError, match="need GPU pools"):
        make_plan(load_config(preset="tiny", overrides={"plan.max_cost_usd": 10}))
    assert make_plan(load_config(preset="tiny")).comparison is None


def test_a_colocated_config_is_its_own_row_and_colocated_streaming_is_refused_a_price():
    """generate and extract on the trainer pool (a partial pools.stage_pool: the rest keep their declared pools)."""
    colocated = {"pools.stage_pool.generate": "trainer", "pools.stage_pool.extract": "trainer"}
    plan = _plan_json(load_config(preset="qwen3.6-27b", overrides=colocated))
    assert list(plan["memory"]) == ["trainer"]
    row = _rows(plan)["colocated/bf16/offline/fp8-zstd"]
    assert row["configured"] and plan["comparison"]["configured"] == row["key"]
    streaming = load_config(preset="qwen3.6-27b", overrides={**colocated, "mode.kind": "streaming",
                                                             "plan.max_cost_usd": 10})
    with pytest.raises(ConfigError, match="colocated/bf16/streaming/fp8-zstd is not priced"):
        make_plan(streaming)


def test_schedule_when_extraction_is_the_slower_side():
    """Streaming with too few inference GPUs: the trainers wait for extraction and are billed for it."""
    work = StageHours(generate=10.0, extract=100.0, train=40.0)          # GPU-hours
    s = schedule(work, "streaming", inference_gpus=2, trainers=8)
    assert (s.hours, s.inference_billed, s.train_billed) == (10 / 2 + 100 / 2, 10 + 100, 100 / 2 * 8)
    s = schedule(work, "offline", inference_gpus=2, trainers=8)
    assert (s.hours, s.inference_billed, s.train_billed) == (110 / 2 + 40 / 8, 110, 40)
    s = schedule(work, "offline", inference_gpus=None, trainers=8)       # colocated
    assert (s.hours, s.inference_billed, s.train_billed, s.extract_seconds) == (150 / 8, 110, 40, 100 / 8 * 3600)


def test_rate_letters():
    assert rate_letter("plan.measured_tokens_per_s") == "M"
    assert rate_letter("measured on H200 (2026-12-04)") == "M"
    assert rate_letter("measured 900 tokens/s on x: 40% of the bf16 peak, carried to this shape on B200") == "C"
    assert rate_letter("assumed (model)") == "A" and rate_letter("assumed (model); FP8 weights assumed") == "A"


def test_cli_compare_table_json_and_default_line():
    runner = CliRunner()
    res = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b", "--compare"])
    assert res.exit_code == 0, res.output
    assert "Topologies by total cost (78 rows" in res.output
    assert re.search(r"cfg +rtx-pro-6000 +bf16 +offline +fp8-zstd \(lossy\)", res.output)
    assert re.search(r"best +\S+", res.output) and "features must come from the precision" in res.output
    first = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b", "--json"]).output
    again = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b", "--compare", "--json"]).output
    assert first == again  # stable: the same rows in the same order, --compare or not
    cmp = json.loads(first)["comparison"]
    assert len(cmp["rows"]) == 78
    assert list(cmp["rows"][0]) == [
        "key", "inference", "precision", "mode", "codec", "lossless", "pools", "storage_bytes", "storage_cost_usd",
        "transfer_bytes", "transfer_cost_usd", "bandwidth_bytes_per_s", "days", "total_cost_usd", "fits", "rates",
        "configured", "cheapest_in_deadline"]
    assert list(cmp["rows"][0]["pools"][0]) == [
        "pool", "stages", "gpu", "gpus", "gpu_hours", "usd_per_gpu_hour", "cost_usd", "peak_bytes_per_gpu",
        "usable_bytes_per_gpu", "fits", "rate_sources"]
    default = runner.invoke(app, ["plan", "--preset", "qwen3.6-27b"]).output
    assert re.search(r"cost: \$[\d,]+ in [\d.]+ days \(rtx-pro-6000/bf16/offline/fp8-zstd, rates A/A/A\); "
                     r"cheapest alternative: \$[\d,]+ in [\d.]+ days", " ".join(default.split()))
