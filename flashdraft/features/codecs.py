"""Feature codecs: how one sample's hidden states [T, n, H] (bfloat16) become bytes and back.

* ``bf16``      raw little-endian bfloat16; the reference (lossless).
* ``bf16-zstd`` lossless: a high-byte plane (sign, exponent, top mantissa bit: very repetitive) and a low-byte
  plane (nearly random), then zstd; splitting lets zstd see the redundancy that interleaving hides.
* ``fp8``       float8 e4m3 with bfloat16 scales per token and layer (``scale=token``: the first token's massive
  activation would ruin every other token under a per-tensor scale) or per 64 channels (``scale=block64``),
  rounded up so no value saturates.
* ``fp8-zstd``  fp8, then zstd over the fp8 bytes and the scales.
* ``q4``        4-bit codes with block scales, outliers kept in bf16, an optional Hadamard rotation; decodes on
  the CPU (numpy) or a GPU (torch) to the same bits.
Names, parameters, the lossless flag and byte accounting live in `flashdraft.config.codecs` (no torch there); error and
size figures: docs/shard-format.md. Decoding is vectorised and returns a bfloat16 tensor [T, n*H], the layers
concatenated in increasing id order (the drafter's fc input layout).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from flashdraft.config.codecs import CodecParams, CodecSpecError

FP8_MAX = 448.0
BLOCK = 64
_SCALE_HEADROOM = 1.0 + 2.0**-7  # > bf16 rounding error (2^-9), so x / scale never exceeds FP8_MAX


class CodecError(CodecSpecError):
    """Encoded bytes that do not fit the codec's description (truncated, wrong shape, unknown codec)."""


@dataclass(frozen=True)
class Codec(CodecParams):
    """A codec and its parameters (flashdraft.config.codecs) with its encoder and decoders."""

    _zstd: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except CodecSpecError as exc:
            raise CodecError(str(exc)) from None

    @classmethod
    def from_params(cls, params: dict) -> Codec:
        try:
            return cls.from_dict(params)
        except CodecSpecError as exc:
            raise CodecError(str(exc)) from None

    def params(self) -> dict:
        return self.as_dict()

    @property
    def decodes_on_device(self) -> bool:
        """Whether `decode(..., device)` runs on that device (q4's torch path) rather than on the CPU and moves
        the bf16 output: only then is deferring the decode to the trainer's GPU worth it."""
        return self.spec.family == "q4"

    # zstd contexts are not thread-safe: one pair per thread that uses this codec.
    def _ctx(self):
        key = threading.get_ident()
        if key not in self._zstd:
            self._zstd[key] = (zstandard.ZstdCompressor(level=self.zstd_level), zstandard.ZstdDecompressor())
        return self._zstd[key]

    # -- encode ---------------------------------------------------------------------------------------------
    def encode(self, feats: torch.Tensor) -> bytes:
        """feats: [T, n, H] (any float dtype, any device) -> bytes."""
        if feats.dim() != 3:
            raise CodecError(f"features must be [T, n, H], got shape {tuple(feats.shape)}")
        try:
            self.check_geometry(feats.shape[-1])
        except CodecSpecError as exc:
            raise CodecError(str(exc)) from None
        family = self.spec.family
        if family == "bf16":
            raw = _u16(feats.to(torch.bfloat16)).numpy()
            if not self.spec.entropy_coded:
                return raw.tobytes()
            planes = raw.view(np.uint8).reshape(-1, 2).T  # [2, N]: low bytes, high bytes
            return self._ctx()[0].compress(np.ascontiguousarray(planes[::-1]).tobytes())
        if family == "q4":
            return encode_q4(feats, self)
        q, scales = quantize_fp8(feats, self.fp8_scale)
        payload = scales.numpy().tobytes() + q.numpy().tobytes()
        return self._ctx()[0].compress(payload) if self.spec.entropy_coded else payload

    # -- decode ---------------------------------------------------------------------------------------------
    def decode(self, data: bytes | memoryview, num_tokens: int, num_layers: int, hidden: int,
               device: str | torch.device | None = None) -> torch.Tensor:
        """bytes -> bfloat16 [T, n*H] on `device` (default CPU). q4 decodes on the device itself (torch ops:
        the compressed bytes travel, not the bf16 output); the other codecs decode on the CPU and are moved."""
        t, n, h = num_tokens, num_layers, hidden
        if self.spec.entropy_coded:
            try:
                data = self._ctx()[1].decompress(data)
            except zstandard.ZstdError as exc:
                raise CodecError(f"{self.name}: corrupt zstd frame: {exc}") from None
        expected = self.encoded_raw_size(t, n, h)
        if len(data) != expected:
            raise CodecError(f"{self.name}: expected {expected} bytes for [{t}, {n}, {h}], got {len(data)}")
        buf = np.frombuffer(data, dtype=np.uint8)
        family = self.spec.family
        if family == "q4":
            return decode_q4(buf, t, n, h, self, device)
        if self.name == "bf16":
            out = torch.from_numpy(buf.view(np.int16).copy()).view(torch.bfloat16).reshape(t, n * h)
        elif family == "bf16":  # (high << 8) | low: two vectorised passes, ~4x a strided byte interleave
            high, low = buf.reshape(2, -1)
            bits = high.astype(np.uint16)
            bits <<= 8
            bits |= low
            out = torch.from_numpy(bits.view(np.int16).reshape(t, n * h)).view(torch.bfloat16)
        else:
            nscale = self._num_scales(t, n, h)
            scales = torch.from_numpy(buf[: 2 * nscale].view(np.int16).copy()).view(torch.bfloat16)
            out = dequantize_fp8(buf[2 * nscale:].reshape(t, n, h), scales).reshape(t, n * h)
        return out if device is None else out.to(device)

    def _num_scales(self, t: int, n: int, h: int) -> int:
        return t * n if self.fp8_scale == "token" else t * n * (h // BLOCK)

    def encoded_raw_size(self, t: int, n: int, h: int) -> int:
        """Bytes before zstd (what a zstd frame must decompress to): the registry's own accounting."""
        try:
            return t * self.raw_bytes_per_token(h, n)
        except CodecSpecError as exc:
            raise CodecError(str(exc)) from None


def _u16(x: torch.Tensor) -> torch.Tensor:
    return x.detach().contiguous().view(torch.int16).cpu()


def quantize_fp8(feats: torch.Tensor, scale: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    """[T, n, H] -> (uint8 fp8 bits [T, n, H] on CPU, bf16 scales bits as int16 [T, n] or [T, n, H/64])."""
    t, n, h = feats.shape
    x = feats.float()
    if scale == "block64":
        if h % BLOCK:
            raise CodecError(f"fp8 block64 scales need hidden size divisible by {BLOCK}, got {h}")
        x = x.reshape(t, n, h // BLOCK, BLOCK)
    amax = x.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax > 0, amax * (_SCALE_HEADROOM / FP8_MAX), torch.ones_like(amax)).to(torch.bfloat16)
    q = (x / s.float()).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(t, n, h)
    return _u8(q), _u16(s.squeeze(-1))


def _u8(q: torch.Tensor) -> torch.Tensor:
    return q.contiguous().view(torch.uint8).cpu()


# fp8 e4m3 bit pattern -> the bits of the same value in bfloat16 (exact: e4m3's 3 mantissa bits and its whole
# exponent range fit in bf16). A numpy gather through this 256-entry table is ~5x faster than torch's float8
# conversion on CPU and writes 2 bytes per element, not float32's 4.
_FP8_TO_BF16 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.bfloat16).view(
    torch.int16).numpy()


def dequantize_fp8(q: np.ndarray, scales: torch.Tensor) -> torch.Tensor:
    """(fp8 bits uint8 [T, n, H], bf16 scales [T, n] or [T, n, H/64]) -> bf16 [T, n, H].

    Two passes: a table gather to bf16, then one in-place bf16 multiply by the broadcast scales. fp8 (4
    significant bits) x bf16 scale (8) is exact in float32, so torch's bf16 multiply (float32 product, one
    rounding) gives the correctly rounded result; tests pin it bit for bit against float32 math."""
    t, n, h = q.shape
    values = torch.from_numpy(_FP8_TO_BF16.take(q)).view(torch.bfloat16)
    per_row = scales.numel() // (t * n)  # 1 (token scales) or H/64 (block64)
    values.view(t, n, per_row, h // per_row).mul_(scales.reshape(t, n, per_row, 1))
    return values


def relative_error_per_layer(ref: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """Median over tokens of ||got - ref|| / ||ref|| per layer; ref/got [T, n, H] -> [n] float32."""
    ref, got = ref.float(), got.float()
    num = (got - ref).norm(dim=-1)
    den = ref.norm(dim=-1).clamp_min(1e-12)
    return (num / den).median(dim=0).values


# -- q4: 4-bit codes with block scales ----------------------------------------------------------------------
# Each (token, layer) row of H values is cut into blocks of `q4_block`; a block stores one scale and a 4-bit code
# per value, the code standing for one of 16 values (`q4_values`):
#   e2m1  the FP4 values +-{0, .5, 1, 1.5, 2, 3, 4, 6} (NVFP4 / MXFP4 elements); code = sign << 3 | magnitude
#   int4  the integers -8..7 (symmetric use: -7..7)
#   nf4   QLoRA's 16 normal quantiles in [-1, 1] (rounded to bf16: the table is the definition)
# Scales (`q4_scale`): bf16; e8m0 (a power of two, MXFP4); e4m3 under a bf16 scale per row (NVFP4's two levels,
# with the per-tensor level made per row so one token's outlier does not cost the others their range).
# Scales are chosen so no value clips (e8m0 rounds its exponent up). `q4_outliers=k` keeps each row's k largest
# magnitudes exactly (bf16 + channel) and quantises the row without them; `q4_rotate=R` multiplies each R-wide
# slice by the orthonormal Hadamard matrix before quantising (spreading an outlier over R channels) and again on
# decode (it is its own inverse).
#
# Payload, all little-endian, 2-byte arrays first: row scales bf16 [T, n] (e4m3 only) | block scales bf16
# [T, n, H/B] (bf16 only) | outlier channels uint16 [T, n, k] | outlier values bf16 [T, n, k] | block scales uint8
# [T, n, H/B] (e4m3 / e8m0) | codes uint8 [T, n, H/2] (low nibble = even channel).
#
# Decode is one gather through a 256-entry table (a byte -> the bf16 bits of both its values, 4 output bytes per
# input byte), one bf16 multiply by the block scales (a table value x a bf16 scale is exact in float32, so the
# product is correctly rounded, identical on CPU and GPU), then the optional rotation and outlier scatter.

_NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
        -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
        0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
Q4_TABLES = {"e2m1": torch.tensor(_E2M1 + tuple(-v for v in _E2M1)),
             "int4": torch.arange(-8, 8, dtype=torch.float32),
             "nf4": torch.tensor(_NF4).to(torch.bfloat16).float()}
Q4_MAX = {"e2m1": 6.0, "int4": 7.0, "nf4": 1.0}  # the largest magnitude a scale maps a block's max onto


def _pair_table(values: torch.Tensor) -> np.ndarray:
    """byte -> uint32 holding the bf16 bits of (low nibble's value, high nibble's value), little-endian."""
    bits = values.to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16).astype(np.uint32)
    b = np.arange(256)
    return (bits[b & 15] | (bits[b >> 4] << 16)).astype(np.uint32)


_Q4_PAIRS = {k: _pair_table(v) for k, v in Q4_TABLES.items()}
_FP8_TO_F32 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def hadamard(size: int, device=None) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix [size, size] (float32, symmetric: its own inverse)."""
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(size)).to(device)


@dataclass
class Q4Parts:
    """The arrays of one q4 payload (CPU or device tensors)."""

    codes: torch.Tensor                  # uint8 [T, n, H/2]
    scale_codes: torch.Tensor            # uint8 [T, n, H/B] (e4m3 / e8m0 bits) or bf16 [T, n, H/B]
    row_scales: torch.Tensor | None      # bf16 [T, n] (e4m3 only)
    outlier_idx: torch.Tensor | None     # int16 (uint16 channel) [T, n, k]
    outlier_val: torch.Tensor | None     # bf16 [T, n, k]


def q4_block_scales(p: CodecParams, parts: Q4Parts) -> torch.Tensor:
    """Effective bf16 scale of every block, computed the same way by the encoder and every decoder."""
    if p.q4_scale == "bf16":
        return parts.scale_codes
    if p.q4_scale == "e8m0":  # 2^(e - 127) is bf16 with exponent field e and no mantissa
        return (parts.scale_codes.to(torch.int16) << 7).view(torch.bfloat16)
    table = _FP8_TO_F32.to(parts.scale_codes.device)
    return (table[parts.scale_codes.long()] * parts.row_scales.float()[..., None]).to(torch.bfloat16)


def quantize_q4(feats: torch.Tensor, p: CodecParams) -> Q4Parts:
    """[T, n, H] (any float dtype, any device) -> the q4 arrays on the same device."""
    t, n, h = feats.shape
    x = feats.float()
    idx = val = None
    if p.q4_outliers:
        idx = x.abs().topk(p.q4_outliers, dim=-1).indices
        val = x.gather(-1, idx).to(torch.bfloat16)
        x = x.scatter(-1, idx, 0.0)
        idx = idx.to(torch.int32).to(torch.int16)  # channel < 65536, stored as uint16 bits
    if p.q4_rotate:
        r = p.q4_rotate
        x = (x.reshape(t, n, h // r, r) @ hadamard(r, x.device)).reshape(t, n, h)
    blocks = x.reshape(t, n, h // p.q4_block, p.q4_block)
    qmax = Q4_MAX[p.q4_values]
    amax = blocks.abs().amax(-1)
    row = None
    if p.q4_scale == "bf16":
        codes = (amax / qmax).to(torch.bfloat16)
    elif p.q4_scale == "e8m0":
        exp = torch.ceil(torch.log2((amax / qmax).clamp_min(2.0**-126)))
        codes = (exp + 127).clamp(1, 254).to(torch.uint8)
    else:
        rmax = amax.amax(-1)
        row = torch.where(rmax > 0, rmax * (_SCALE_HEADROOM / (qmax * FP8_MAX)), torch.ones_like(rmax))
        row = row.to(torch.bfloat16)
        ratio = (amax / qmax / row.float()[..., None]).clamp(max=FP8_MAX)
        # round the block scale up to the next e4m3 value so no code clips
        codes = ratio.to(torch.float8_e4m3fn)
        below = codes.float() < ratio
        codes = codes.view(torch.uint8) + below.to(torch.uint8)
    parts = Q4Parts(codes=torch.empty(0), scale_codes=codes, row_scales=row, outlier_idx=idx, outlier_val=val)
    scale = q4_block_scales(p, parts).float()[..., None]
    table = Q4_TABLES[p.q4_values].to(x.device)
    order = table.argsort()
    ordered = table[order]
    v = torch.where(scale > 0, blocks / scale, torch.zeros_like(blocks))
    nearest = torch.bucketize(v, (ordered[1:] + ordered[:-1]) / 2)
    q = order[nearest].to(torch.uint8).reshape(t, n, h)
    parts.codes = q[..., 0::2] | (q[..., 1::2] << 4)
    return parts


def encode_q4(feats: torch.Tensor, p: CodecParams) -> bytes:
    parts = quantize_q4(feats, p)
    arrays = [parts.row_scales, parts.scale_codes if p.q4_scale == "bf16" else None, parts.outlier_idx,
              parts.outlier_val, parts.scale_codes if p.q4_scale != "bf16" else None, parts.codes]
    return b"".join(_bytes(a) for a in arrays if a is not None)


def _bytes(a: torch.Tensor) -> bytes:
    a = a.detach().contiguous().cpu()
    return a.view(torch.int16 if a.element_size() == 2 else torch.uint8).numpy().tobytes()


def split_q4(buf: np.ndarray, t: int, n: int, h: int, p: CodecParams, device=None) -> Q4Parts:
    """A q4 payload's arrays as tensors on `device` (one host -> device copy of the whole payload)."""
    data = torch.from_numpy(buf.copy())
    if device is not None:
        data = data.to(device, non_blocking=True)
    rows, blocks, k = t * n, t * n * (h // p.q4_block), p.q4_outliers
    off = 0

    def take(count: int, two_bytes: bool, shape) -> torch.Tensor:
        nonlocal off
        size = count * (2 if two_bytes else 1)
        out = data[off: off + size]
        off += size
        return (out.view(torch.bfloat16) if two_bytes else out).reshape(shape)

    row = take(rows, True, (t, n)) if p.q4_scale == "e4m3" else None
    scales = take(blocks, True, (t, n, -1)) if p.q4_scale == "bf16" else None
    idx = take(rows * k, True, (t, n, k)).view(torch.int16) if k else None
    val = take(rows * k, True, (t, n, k)) if k else None
    if scales is None:
        scales = take(blocks, False, (t, n, -1))
    codes = take(t * n * h // 2, False, (t, n, h // 2))
    return Q4Parts(codes, scales, row, idx, val)


def decode_q4(buf: np.ndarray, t: int, n: int, h: int, p: CodecParams, device=None,
              torch_gather: bool | None = None) -> torch.Tensor:
    """q4 payload -> bf16 [T, n*H] on `device`. The table gather runs in numpy on the CPU (uint8 indices: no int64
    index tensor 8x the payload) and in torch elsewhere (`torch_gather` forces either; the results are equal)."""
    if torch_gather is None:
        torch_gather = device is not None and torch.device(device).type != "cpu"
    parts = split_q4(buf, t, n, h, p, device)
    if not torch_gather:
        pairs = _Q4_PAIRS[p.q4_values].take(parts.codes.numpy())
        out = torch.from_numpy(pairs.view(np.int16)).view(torch.bfloat16)
    else:
        table = torch.from_numpy(_Q4_PAIRS[p.q4_values].view(np.int32)).to(parts.codes.device)
        out = table[parts.codes.long()].view(torch.bfloat16)
    out = out.reshape(t, n, h // p.q4_block, p.q4_block)
    out.mul_(q4_block_scales(p, parts)[..., None])
    out = out.reshape(t, n, h)
    if p.q4_rotate:
        r = p.q4_rotate
        out = (out.reshape(t, n, h // r, r).float() @ hadamard(r, out.device)).to(torch.bfloat16).reshape(t, n, h)
    if p.q4_outliers:  # one flat index_put: torch's bf16 scatter_ on CPU cost more than the whole table gather
        rows = torch.arange(0, t * n * h, h, device=out.device).view(t, n, 1)
        out.view(-1)[(rows + (parts.outlier_idx.long() & 0xFFFF)).view(-1)] = parts.outlier_val.reshape(-1)
    return out.reshape(t, n * h)
