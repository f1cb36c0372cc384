"""ULP error against the baseline, as the fused chunk pass needs it.

The libm convention: error = |b - a| / ulp(a), with ulp(a) = 2^(max(e, e_min) - m) the spacing
of the *less precise* input dtype's floats at the baseline value a (e: a's binary exponent,
e_min: that dtype's smallest normal exponent, m: its mantissa bits). It equals the number of
representable values between a and b when both lie in one binade (b - a is then exact), is within
a factor 2 of that count when b is in a neighbouring binade, and grows without bound as a nears
zero (a = 0 counts in units of the smallest denormal: b = 1e-3 against a = 0 is ~1e42 float32
ulps), so a huge max ULP error with a small max |b - a| points at baseline values near zero.
bf16 vs float32 is counted in bf16 ulps, float16 denormals in float16's denormal spacing.

The exponent is read from a's bit pattern in the work dtype: `bits & exponent_mask`, clamped to
e_min and viewed back as a float is exactly 2^e; two integer ops, a division and a max per chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_EXPONENT = {
    torch.float32: (torch.int32, 0x7F800000),
    torch.float64: (torch.int64, 0x7FF0000000000000),
}


@dataclass(frozen=True)
class UlpScale:
    """How to turn |b - a| into ulps of `ulp_dtype` for values held in `value_dtype`."""

    value_dtype: torch.dtype
    int_dtype: torch.dtype
    exponent_mask: int
    min_bits: int
    """Bit pattern (in value_dtype) of ulp_dtype's smallest normal, 2^e_min."""
    per_binade: float
    """2^m: ulps in one 2^e step."""


def ulp_dtype(a: torch.dtype, b: torch.dtype) -> torch.dtype | None:
    """The less precise of two floating dtypes (None unless both are real floating point)."""
    if not (a.is_floating_point and b.is_floating_point):
        return None
    return max((a, b), key=lambda d: torch.finfo(d).eps)


def ulp_scale(value_dtype: torch.dtype, of: torch.dtype) -> UlpScale:
    """Scale for values held in `value_dtype` (float32 or float64), counted in ulps of `of`."""
    int_dtype, mask = _EXPONENT[value_dtype]
    info = torch.finfo(of)
    min_bits = int(torch.tensor(info.tiny, dtype=value_dtype).view(int_dtype))
    return UlpScale(value_dtype, int_dtype, mask, min_bits, 2.0 ** round(-math.log2(info.eps)))


def max_ulp(
    abs_diff: torch.Tensor,
    a: torch.Tensor,
    scale: UlpScale,
    bits: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> float:
    """max |b - a| / ulp(a) over one chunk; `abs_diff` = |b - a| (inf where they disagree on a
    non-finite value), `a` the baseline, both in `scale.value_dtype`. `bits` (int) and `out`
    (float) are optional scratch buffers of the chunk's size."""
    exponent = torch.bitwise_and(a.view(scale.int_dtype), scale.exponent_mask, out=bits)
    exponent.clamp_(min=scale.min_bits)
    ratio = torch.div(abs_diff, exponent.view(scale.value_dtype), out=out)
    return float(ratio.max()) * scale.per_binade
