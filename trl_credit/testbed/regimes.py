"""The tiny testbed's regimes (docs/testbed.md#the-tiny-testbed): one task (running sums mod 10), models built by
different recipes.

- ``tiny``: the first build. Its errors are random slips the greedy path never takes (greedy accuracy 0.996), so
  what a method gains at temperature 1 is sharpening.
- ``trap``: the supervised solutions get one step type wrong most of the time, always the same way (adding an 8 or
  a 9 writes a result one too high, 80% of the time), so greedy decoding repeats the error on every problem that
  adds an 8 or a 9, while sampling writes the right step a fifth of the time: headroom that sharpening cannot
  reach and credit assignment can (docs/testbed.md#the-trap-regime).
- ``tools``: another task and model (docs/testbed.md#the-tool-regime): a tiny Qwen3 that follows a chain of keys
  through TRL's tool loop (``environment_factory``, :mod:`trl_credit.tasks.keychain`) in 4-7 tool calls, and copies
  a trap key's 8 as a 9 80% of the time. Its recipe is a :class:`~trl_credit.testbed.tool_regime.ToolRecipe`; the
  sums runner (:func:`trl_credit.testbed.runner.run`) does not train it.
"""

from __future__ import annotations

from trl_credit.testbed.model import Recipe
from trl_credit.testbed.tool_regime import ToolRecipe

__all__ = ["REGIMES", "SUMS_REGIMES", "regime_recipe"]

REGIMES = {
    "tiny": Recipe(),
    "trap": Recipe(trap_digits="89", trap_error_rate=0.8, slip_rate=0.1),
    "tools": ToolRecipe(),
}
#: The regimes whose model the sums runner builds and trains (the others have their own task and model).
SUMS_REGIMES = ("tiny", "trap")


def regime_recipe(name: str) -> Recipe | ToolRecipe:
    """The build recipe of a regime of :data:`REGIMES`."""
    if name not in REGIMES:
        raise ValueError(f"unknown testbed regime {name!r}; choose from {sorted(REGIMES)}")
    return REGIMES[name]
