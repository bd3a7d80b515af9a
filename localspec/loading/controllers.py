"""The one way a k controller is made for a session: its bound on k, its warm start, and, for the
long-lived callers (the chat, the server), one controller per drafter and temperature band.

`generate` and `bench` make theirs with `make` (one per run, one per bench variant); the chat and
the server keep a `Controllers`. What is kept between runs and how is `warmstart`'s.
"""

from __future__ import annotations

from localspec.config import DecodeConfig
from localspec.decoding.controller import KController

from . import warmstart


def k_max_for(k: int | None, k_max: int | None = None) -> int:
    """The largest k the controller considers: `k_max` (default DecodeConfig.k_max), raised to a
    fixed `k` so that a fixed k above it still gets its statistics kept by position."""
    return max(DecodeConfig.k_max if k_max is None else k_max, k or 0)


def make(session, drafter, temperature: float, k: int | None = None, k_max: int | None = None,
         warm: bool = True) -> tuple[KController, bool]:
    """A controller for `drafter` (None: plain decoding) on `session` at `temperature`, and
    whether it was warm-started from the saved record (`warm`: read it at all; a fixed `k` or no
    drafter never is)."""
    controller = KController(k_max_for(k, k_max), fixed_k=k,
                             draft_cost_free=bool(drafter and drafter.draft_cost_free))
    warmed = warm and drafter is not None and warmstart.load_into(controller, session, drafter.name, temperature)
    return controller, bool(warmed)


class Controllers:
    """One controller per (drafter, temperature band) for a session that outlives its runs:
    learned costs and acceptance carry over from one run to the next, a lookup's never mix with
    the draft model's, and greedy rates never mix with sampled ones (each band has its own record
    to warm-start from and save into)."""

    def __init__(self, session, k: int | None = None, k_max: int | None = None, warm: bool = True):
        self.session = session
        self.k, self.k_max, self.warm = k, k_max, warm
        # (drafter name, band): its controller, and a temperature of that band to save it under
        self._kept: dict[tuple[str, str], tuple[KController, float]] = {}

    @staticmethod
    def _key(drafter, temperature: float) -> tuple[str, str]:
        return (drafter.name if drafter is not None else "none", warmstart.band(temperature))

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, drafter, temperature: float) -> KController:
        """The controller for `drafter` at `temperature`: made and warm-started on first use."""
        key = self._key(drafter, temperature)
        if key not in self._kept:
            controller, _ = make(self.session, drafter, temperature, self.k, self.k_max, self.warm)
            self._kept[key] = (controller, temperature)
        return self._kept[key][0]

    def save(self, drafter, temperature: float) -> None:
        """Save what the controller for `drafter` at `temperature` learned (if warm start is on)."""
        key = self._key(drafter, temperature)
        if self.warm and drafter is not None and key in self._kept:
            warmstart.save(self._kept[key][0], self.session, key[0], temperature)

    def save_all(self) -> None:
        """Save every controller's learning into its drafter's and band's record; plain decoding
        has none."""
        if not self.warm:
            return
        for (name, _), (controller, temperature) in self._kept.items():
            if name != "none":
                warmstart.save(controller, self.session, name, temperature)
