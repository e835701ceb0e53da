"""How closely a claimed run must agree with trusted outputs (a reference, a replay, the course's run), and how the
first difference is named: one rule for every caller.

A run's conditions are what decides its rounding: the torch version, the CPU architecture and model, the kernel set
torch dispatches to, every kernel setting of inferlab.host.environment.KERNEL_ENV_VARS (MKL's and oneDNN's too),
whether MKL and oneDNN are used, and the torch thread counts. Two runs whose conditions are the same compute every
saved tensor bit for bit the same (docs/trust.md says what was measured), so their comparison is exact: any
difference is a contradiction. Where a condition differs (or a side did not record it), the comparison is within the
declared tolerance, and the lines of `differing` name each condition that differed, for the grade's not_checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy

from inferlab.host.environment import KERNEL_ENV_VARS


def conditions(manifest: dict) -> dict:
    """{condition: value} of a run's manifest (None where it recorded nothing)."""
    manifest = manifest if isinstance(manifest, dict) else {}
    build = manifest.get("torch_build") if isinstance(manifest.get("torch_build"), dict) else {}
    kernels = build.get("cpu_kernels") if isinstance(build.get("cpu_kernels"), dict) else {}
    platform = manifest.get("platform") if isinstance(manifest.get("platform"), dict) else {}
    threads = (manifest.get("torch_threads") or {}).get("effective") if isinstance(
        manifest.get("torch_threads"), dict) else None
    found = {"torch": build.get("version"), "architecture": platform.get("machine"),
             "CPU model": platform.get("cpu_model"), "kernel set": kernels.get("capability"),
             **{name: kernels.get("env_" + name, "not recorded" if kernels else None) for name in KERNEL_ENV_VARS},
             "MKL": kernels.get("mkl_available"), "oneDNN": kernels.get("mkldnn_enabled"),
             "threads": threads if isinstance(threads, dict) else None}
    return found


def this_process() -> dict:
    """This process's conditions as a manifest holds them (torch imported: its kernels are asked of it)."""
    from inferlab.host import environment

    return {"torch_build": environment.torch_build(), "platform": environment.platform_record(),
            "torch_threads": environment.torch_threads(None)}


def kernel_settings(manifest: dict) -> dict:
    """{variable: value or None (unset)} of the kernel settings a run recorded, to make it again under them (a
    variable it did not record is absent)."""
    found = conditions(manifest)
    return {name: found[name] for name in KERNEL_ENV_VARS if found[name] != "not recorded" and
            (found["kernel set"] is not None or found[name] is not None)}


@dataclass
class Allowance:
    """Exact (atol = rtol = 0) when every condition matched, else the declared tolerance; differing names each
    condition that did not match: 'kernel set: AVX512 in the run, DEFAULT in the course's run'."""

    atol: float
    rtol: float
    differing: list = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.atol == 0 and self.rtol == 0

    def describe(self, trusted: str = "the trusted value") -> str:
        return "bit for bit" if self.exact else f"|a-b| <= {self.atol:g} + {self.rtol:g}*|b| (b = {trusted})"

    def not_checked(self, claimed: str, trusted: str) -> Optional[str]:
        """The line for the grade's not_checked when the comparison could not be exact, else None."""
        if self.exact:
            return None
        return (f"bit-for-bit agreement of {claimed} with {trusted}: the conditions differ ("
                + "; ".join(self.differing) + f"), so it was compared within {self.describe(trusted)}")


def allowance(claimed: dict, trusted: dict, atol: float, rtol: float, names=("the run", "the trusted run")) -> Allowance:
    """The allowance for comparing a run made under `claimed` conditions with one made under `trusted` (both of
    conditions()): exact when all are recorded and equal, else (atol, rtol) with what differed."""
    def unknown(name, value):  # an unset kernel variable is a condition; a value not recorded is not
        return value == "not recorded" or (value is None and name not in KERNEL_ENV_VARS)

    differing = [f"{name}: not recorded" if claimed.get(name) == trusted.get(name) else
                 f"{name}: {claimed.get(name)!r} in {names[0]}, {trusted.get(name)!r} in {names[1]}"
                 for name in trusted if claimed.get(name) != trusted.get(name) or unknown(name, trusted.get(name))]
    return Allowance(0.0, 0.0) if not differing else Allowance(float(atol), float(rtol), differing)


def array_difference(claimed, trusted, rule: Allowance) -> Optional[str]:
    """None when the arrays agree under the rule, else the first element that does not, with both values (and the
    largest difference): 'shape [3] against [4]' or 'element [17]: 1.2345678 against 1.2345679 (max |a-b| 1e-07)'.
    Exactly means the same bits (so -0.0 is not 0.0 and a NaN agrees only with the same NaN); within a tolerance,
    equal infinities agree, a finite value never agrees with an infinite one (rtol*|inf| would allow anything), and a
    NaN agrees only with a NaN."""
    a, b = numpy.asarray(claimed), numpy.asarray(trusted)
    scalar = a.ndim == 0 and b.ndim == 0
    a, b = numpy.atleast_1d(a), numpy.atleast_1d(b)
    if a.shape != b.shape:
        return f"shape {list(a.shape)} against {list(b.shape)}"
    a64, b64 = a.astype(numpy.float64), b.astype(numpy.float64)  # new contiguous copies
    if rule.exact:  # float32 widens to float64 exactly: the same bits there are the same bits
        bad = a64.view(numpy.uint64) != b64.view(numpy.uint64)
    else:
        with numpy.errstate(invalid="ignore"):  # an infinite b allows no room: only the same infinity agrees
            bad = ~((a64 == b64) | (numpy.isnan(a64) & numpy.isnan(b64)) |
                    (numpy.isfinite(b64) & (numpy.abs(a64 - b64) <= rule.atol + rule.rtol * numpy.abs(b64))))
    if not bool(bad.any()):
        return None
    where = tuple(int(i) for i in numpy.argwhere(bad)[0])
    with numpy.errstate(invalid="ignore"):  # a NaN's gap is not a number: left out of the largest
        gaps = numpy.where(a64 == b64, 0.0, numpy.abs(a64 - b64))
    largest = float(numpy.max(gaps[~numpy.isnan(gaps)], initial=0.0))
    return (("value" if scalar else f"element {list(where)}") + f": {float(a[where]):.9g} against {float(b[where]):.9g} "
            f"({int(bad.sum())} element(s) differ, max |a-b| {largest:.3g}; allowed: {rule.describe()})")


def nucleus_edge(claimed, trusted, trusted_logits, temperature: float, top_p: float, rule: Allowance) -> tuple:
    """Processed first-step scores of two runs under other conditions, made comparable where a top-p filter draws
    its line (it sets what it drops to -inf), judged by the trusted run's own raw logits (vocab,). The filter drops
    a token when the probability at or below it, softmax(logits / temperature), is at most 1 - top_p; within the
    tolerance every scaled logit moves by at most d, so that probability moves by at most expm1(2d). A token kept
    on one side only is an honest move of the line when its probability at or below lies that close to 1 - top_p:
    where the claimed run kept it, the trusted side is given the value the trusted logits give a kept token (so the
    claimed value is still compared), where it dropped it, both are -inf. Any other token kept on one side only (the
    top token dropped, a nucleus widened, flattened or cut inside) is left as it is, for array_difference to name.
    (claimed, trusted, how many tokens moved) as float64 copies; nothing moves under an exact rule, without a
    filter (top_p 1) or without the trusted logits."""
    a, b = (numpy.array(x, dtype=numpy.float64) for x in (claimed, trusted))
    if rule.exact or top_p >= 1 or trusted_logits is None or a.shape != b.shape:
        return a, b, 0
    scaled = numpy.asarray(trusted_logits, dtype=numpy.float64).reshape(-1) / temperature  # (vocab,)
    one_side = ((a == -numpy.inf) != (b == -numpy.inf)).reshape(-1)
    if scaled.shape != one_side.shape or not one_side.any():
        return a, b, 0
    probabilities = numpy.exp(scaled - scaled.max())
    probabilities /= probabilities.sum()
    order = numpy.argsort(-scaled, kind="stable")
    above = numpy.empty_like(probabilities)
    above[order] = numpy.cumsum(probabilities[order]) - probabilities[order]  # the mass of every higher token
    moves = numpy.expm1(2 * (rule.atol + rule.rtol * float(numpy.abs(scaled).max())))
    if not bool((numpy.abs((1.0 - above[one_side]) - (1.0 - top_p)) <= moves).all()):
        return a, b, 0
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    kept_by_claimed = one_side & (flat_a != -numpy.inf)
    flat_b[kept_by_claimed] = scaled[kept_by_claimed]
    flat_b[one_side & ~kept_by_claimed] = -numpy.inf
    return a, b, int(one_side.sum())
