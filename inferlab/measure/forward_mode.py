"""Every forward of the model, observed from inside it: did it run under torch.inference_mode(), with the model
not training?

The protocol requires model.eval() and torch.inference_mode() for every computation. The library functions set
both, but only an observation shows that they held: a forward pre-hook on the model (ForwardWatch), registered
once when the session loads the model, counts every forward and keeps each one that broke a control. A test
that runs forwards opens a window on the watch before its first forward and records what the window saw
(ForwardWindow.summary(), a record's `forward_mode` field); a violation fails that test with the evidence.

The hook is one Python call per forward, also inside the timed region, identical for both cache paths.
"""

from __future__ import annotations

from typing import Optional

import torch

HOW = ("a forward pre-hook on the model, registered when the session loaded it, read torch.is_inference_mode_enabled() "
       "and model.training at the start of every forward")
KEPT_VIOLATIONS = 20  # per window; the count says how many there were in all


class ForwardWatch:
    """Counts the model's forwards, and keeps each that ran outside inference mode or in training mode."""

    def __init__(self, model: torch.nn.Module):
        self.forwards = 0
        self.violations: list[dict] = []
        self._handle = model.register_forward_pre_hook(self._observe)

    def _observe(self, module: torch.nn.Module, args) -> None:
        self.forwards += 1
        inference, training = torch.is_inference_mode_enabled(), module.training
        if not inference or training:
            self.violations.append({"forward": self.forwards, "inference_mode": inference, "training": training,
                                    "grad_enabled": torch.is_grad_enabled()})

    def window(self) -> "ForwardWindow":
        """A window that sees the forwards from now on."""
        return ForwardWindow(self, self.forwards, len(self.violations))

    def remove(self) -> None:
        """Stop watching (the hook is removed)."""
        self._handle.remove()


class ForwardWindow:
    """The forwards a watch saw since the window was opened."""

    def __init__(self, watch: ForwardWatch, first_forward: int, first_violation: int):
        self.watch = watch
        self.first_forward = first_forward
        self.first_violation = first_violation

    def summary(self) -> dict:
        """The `forward_mode` field: {forwards, all_inference_mode, none_training, violation_count, violations, how}."""
        violations = self.watch.violations[self.first_violation:]
        return {
            "forwards": self.watch.forwards - self.first_forward,
            "all_inference_mode": all(v["inference_mode"] for v in violations),
            "none_training": not any(v["training"] for v in violations),
            "violation_count": len(violations),
            "violations": violations[:KEPT_VIOLATIONS],
            "how": HOW,
        }


def violation_message(summary: Optional[dict]) -> Optional[str]:
    """What a failing check says of a window's violations, or None when every forward kept the controls."""
    if not summary or not summary.get("violation_count"):
        return None
    first = summary["violations"][0]
    return (f"{summary['violation_count']} of {summary['forwards']} forwards broke the controls (expected "
            f"torch.inference_mode() on and model.training False); the first, forward {first['forward']} of the "
            f"session: inference_mode {first['inference_mode']}, training {first['training']}")
