"""The tiny testbed's regimes (docs/testbed.md#the-tiny-testbed): one task (running sums mod 10), models built by
different recipes.

- ``tiny``: the first build. Its errors are random slips the greedy path never takes (greedy accuracy 0.996), so
  what a method gains at temperature 1 is sharpening.
- ``trap``: the supervised solutions get one step type wrong most of the time, always the same way (adding an 8 or
  a 9 writes a result one too high, 80% of the time), so greedy decoding repeats the error on every problem that
  adds an 8 or a 9, while sampling writes the right step a fifth of the time: headroom that sharpening cannot
  reach and credit assignment can (docs/testbed.md#the-trap-regime).
"""

from __future__ import annotations

from trl_credit.testbed.model import Recipe

__all__ = ["REGIMES", "regime_recipe"]

REGIMES = {
    "tiny": Recipe(),
    "trap": Recipe(trap_digits="89", trap_error_rate=0.8, slip_rate=0.1),
}


def regime_recipe(name: str) -> Recipe:
    """The build recipe of a regime of :data:`REGIMES`."""
    if name not in REGIMES:
        raise ValueError(f"unknown testbed regime {name!r}; choose from {sorted(REGIMES)}")
    return REGIMES[name]
