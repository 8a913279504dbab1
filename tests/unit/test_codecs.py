"""Codec round trips: lossless codecs are bit-exact; fp8 error is bounded; corrupt bytes fail clearly."""

from __future__ import annotations

import pytest
import torch

from flashdraft.features.codecs import Codec, CodecError, relative_error_per_layer


def _features(t=33, n=3, h=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, n, h, generator=g) * torch.linspace(0.05, 4.0, h)
    x[0, 1:] *= 300.0  # massive-activation outlier on the first token of the middle layers
    x[5, 0, :7] = 0.0
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("name", ["bf16", "bf16-zstd"])
def test_lossless_round_trip_is_bit_exact(name):
    x = _features()
    codec = Codec(name)
    out = codec.decode(codec.encode(x), *x.shape)
    assert out.dtype == torch.bfloat16 and out.shape == (33, 3 * 128)
    assert torch.equal(out.view(torch.int16), x.reshape(33, -1).view(torch.int16))


def test_bf16_zstd_is_smaller_than_raw():
    x = _features(t=256)
    assert len(Codec("bf16-zstd").encode(x)) < 0.9 * len(Codec("bf16").encode(x))


@pytest.mark.parametrize("name", ["fp8", "fp8-zstd"])
@pytest.mark.parametrize("scale", ["token", "block64"])
def test_fp8_error_is_bounded_and_outlier_does_not_spread(name, scale):
    x = _features()
    codec = Codec(name, fp8_scale=scale)
    out = codec.decode(codec.encode(x), *x.shape).reshape(x.shape)
    err = relative_error_per_layer(x, out)
    assert err.max() < 0.05  # e4m3 has 3 mantissa bits: ~2-3% relative error per token
    # Every token, including those next to the 300x outlier, keeps its own resolution.
    per_token = ((out.float() - x.float()).norm(dim=-1) / x.float().norm(dim=-1)).max()
    assert per_token < 0.08
    assert torch.equal(out[5, 0, :7], torch.zeros(7, dtype=torch.bfloat16))


def test_block64_scales_reduce_error():
    x = _features(t=64, h=256)
    errs = {s: relative_error_per_layer(x, Codec("fp8", fp8_scale=s).decode(
        Codec("fp8", fp8_scale=s).encode(x), *x.shape).reshape(x.shape)).mean() for s in ("token", "block64")}
    assert errs["block64"] < errs["token"]


def test_decode_rejects_wrong_sizes_and_corrupt_frames():
    x = _features()
    for name in ("bf16", "fp8"):
        with pytest.raises(CodecError, match="expected"):
            Codec(name).decode(Codec(name).encode(x)[:-1], *x.shape)
    blob = bytearray(Codec("bf16-zstd").encode(x))
    blob[len(blob) // 2] ^= 0xFF
    with pytest.raises(CodecError):
        Codec("bf16-zstd").decode(bytes(blob[:-3]), *x.shape)
    with pytest.raises(CodecError, match="unknown codec"):
        Codec("int4")


@pytest.mark.parametrize("scale", ["token", "block64"])
def test_fp8_decode_is_the_correctly_rounded_float32_product(scale):
    from flashdraft.features.codecs import dequantize_fp8, quantize_fp8

    x = _features(t=40, h=256)
    q, s = quantize_fp8(x, scale)
    got = dequantize_fp8(q.numpy(), s.view(torch.bfloat16))
    vals = q.view(torch.float8_e4m3fn).float().reshape(40, 3, -1, 64 if scale == "block64" else 256)
    ref = (vals * s.view(torch.bfloat16).float().reshape(40, 3, -1, 1)).reshape(x.shape).to(torch.bfloat16)
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


Q4_VARIANTS = [{"q4_values": v, "q4_block": b, "q4_scale": s} for v in ("e2m1", "int4", "nf4")
               for b, s in ((16, "e4m3"), (32, "e8m0"), (64, "bf16"))] + [
    {"q4_outliers": 0}, {"q4_rotate": 64, "q4_outliers": 0}, {"q4_rotate": 128, "q4_outliers": 2}]


@pytest.mark.parametrize("params", Q4_VARIANTS, ids=lambda p: "-".join(map(str, p.values())))
def test_q4_round_trip_error_is_bounded_and_outlier_does_not_spread(params):
    x = _features()
    codec = Codec("q4", **params)
    data = codec.encode(x)
    assert len(data) == codec.encoded_raw_size(*x.shape) == 33 * codec.raw_bytes_per_token(128, 3)
    out = codec.decode(data, *x.shape).reshape(x.shape)
    assert out.dtype == torch.bfloat16
    err = relative_error_per_layer(x, out)
    assert err.max() < 0.2 and err.min() > 0.01  # 4 bits: ~8-13% per token; lossy, so never 0
    per_token = ((out.float() - x.float()).norm(dim=-1) / x.float().norm(dim=-1))
    assert per_token.max() < 0.25  # the 300x first token keeps its own scales, and so do its neighbours
    if not params.get("q4_rotate"):  # a rotation mixes the zeros with their block: they come back near zero
        assert torch.equal(out[5, 0, :7].float(), torch.zeros(7))


def test_q4_outliers_are_kept_exactly_and_help():
    x = _features(t=48, h=256)
    x[:, :, 3] = 5000.0  # a massive-activation channel, above the first token's 300x outliers
    plain, kept = Codec("q4", q4_outliers=0), Codec("q4", q4_outliers=2)
    out = kept.decode(kept.encode(x), *x.shape).reshape(x.shape)
    assert torch.equal(out[:, :, 3], x[:, :, 3])
    base = plain.decode(plain.encode(x), *x.shape).reshape(x.shape)
    assert relative_error_per_layer(x, out).mean() < relative_error_per_layer(x, base).mean()


@pytest.mark.parametrize("params", Q4_VARIANTS, ids=lambda p: "-".join(map(str, p.values())))
def test_q4_torch_decode_equals_the_numpy_decode_bit_for_bit(params):
    """The GPU path (torch ops only) run on the CPU: same bits as the numpy table path."""
    import numpy as np

    from flashdraft.features.codecs import decode_q4

    x = _features(t=20, h=256)
    codec = Codec("q4", **params)
    buf = np.frombuffer(codec.encode(x), dtype=np.uint8)
    a = decode_q4(buf, 20, 3, 256, codec, torch_gather=False)
    b = decode_q4(buf, 20, 3, 256, codec, device="cpu", torch_gather=True)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_q4_scales_never_clip_and_decode_is_the_rounded_product():
    """Every block's largest value maps inside the code range (e8m0 and e4m3 scales round up), and a decoded value
    is the bf16-rounded product of its table value and its block scale."""
    from flashdraft.features.codecs import Q4_MAX, Q4_TABLES, q4_block_scales, quantize_q4

    x = _features(t=16, h=128).float() * 1.37
    for scale in ("e4m3", "e8m0", "bf16"):
        p = Codec("q4", q4_values="e2m1", q4_scale=scale, q4_block=16, q4_outliers=0)
        parts = quantize_q4(x, p)
        s = q4_block_scales(p, parts).float()
        amax = x.reshape(16, 3, 8, 16).abs().amax(-1)
        assert (amax <= Q4_MAX["e2m1"] * s * (1 + 2**-8)).all(), scale  # bf16 rounding of the scale at most
        codes = torch.stack([parts.codes & 15, parts.codes >> 4], -1).reshape(16, 3, 8, 16).long()
        ref = (Q4_TABLES["e2m1"][codes] * s[..., None]).to(torch.bfloat16).reshape(16, 3 * 128)
        got = p.decode(p.encode(x), 16, 3, 128)
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


def test_q4_parameters_are_recorded_validated_and_versioned():
    assert Codec("fp8-zstd").params() == {"name": "fp8-zstd", "fp8_scale": "token", "zstd_level": 1}  # unchanged
    p = Codec("q4", q4_values="nf4", q4_block=64, q4_scale="bf16", q4_outliers=2).params()
    assert p == {"name": "q4", "version": 1, "q4_values": "nf4", "q4_block": 64, "q4_scale": "bf16",
                 "q4_outliers": 2, "q4_rotate": 0}
    assert Codec.from_params(p) == Codec("q4", q4_values="nf4", q4_block=64, q4_scale="bf16", q4_outliers=2)
    with pytest.raises(CodecError, match="version 2 is not readable"):
        Codec.from_params({**p, "version": 2})
    with pytest.raises(CodecError, match=r"unknown parameters \['q4_gamma'\]"):
        Codec.from_params({**p, "q4_gamma": 1})
    with pytest.raises(CodecError, match="q4_block"):
        Codec("q4", q4_block=48)
    with pytest.raises(CodecError, match="q4_rotate=128 needs hidden size divisible"):
        Codec("q4", q4_rotate=128).encode(torch.zeros(2, 1, 192))
    with pytest.raises(CodecError, match="expected"):
        Codec("q4").decode(Codec("q4").encode(_features())[:-1], *_features().shape)


def test_gpu_decode_check_runs_on_cpu_and_compares_with_the_cpu_decode():
    """benchmarks/bench_codecs.py's `gpu_decode_check` (what `make gpu-check` calls on CUDA), device side on CPU:
    the torch decode path of every candidate, timed, and compared value by value with the numpy decode."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_codecs.py"
    spec = importlib.util.spec_from_file_location("bench_codecs", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.gpu_decode_check("cpu", tokens=8, layers=2, hidden=128)
    assert {r["codec"] for r in rows} == set(bench.CANDIDATES) | {"fp8"}
    assert all(r["gbs"] > 0 and r["cpu_gbs"] > 0 for r in rows)
    assert all(r["mismatches"] == 0 for r in rows if r["exact_expected"])
    assert all(r["max_rel_diff"] < 1e-2 for r in rows)
