"""DATPO: difficulty-adaptive tree rollouts, sentence-entropy forking, block advantages, sibling diversity (docs/datpo.md).

Pure functions (no trainer state): :func:`adaptive_budget` (budget.py), :func:`token_char_offsets`,
:func:`sentence_spans`, :func:`select_forks` (forks.py), :func:`node_values`, :func:`block_advantages` (tree.py),
:func:`sibling_diversity`, :func:`diversity_bonus`, :func:`annealed_alpha` (diversity.py).
The trees of a generation batch as data: :class:`~.forest.Block`, :class:`~.forest.Forest`,
:class:`~.forest.TreeBatch` (forest.py); micro-batches that drop no row: :func:`split_rows` (the core's, trl_credit/core/row_count.py).
Trainer glue: :class:`DATPOConfig` (config.py), :class:`DATPOTrainer` (trainer.py: a preset of the credit core) and
its parts :class:`~.parts.Trees` (the rollout) and :class:`~.parts.BlockCredit` (the credit) in parts.py, with their
steps in branches.py (phase-2 generation and rewards), credit.py (block credit), rows.py (training rows) and
tree_metrics.py.
"""

from .budget import adaptive_budget, root_success_rate
from .config import DATPOConfig
from .diversity import annealed_alpha, diversity_bonus, sibling_diversity
from .forks import FORK_METHODS, FORK_POSITIONS, select_forks, sentence_spans, token_char_offsets
from trl_credit.core.row_count import split_rows  # the core's split (trl_credit/core/row_count.py), kept in DATPO's public names
from .batching import sort_rows_by_length
from .trainer import DATPOTrainer
from .tree import VALUE_ESTIMATES, block_advantages, leaf_rewards, node_values

__all__ = [
    "DATPOConfig",
    "DATPOTrainer",
    "adaptive_budget",
    "token_char_offsets",
    "sentence_spans",
    "select_forks",
    "FORK_METHODS",
    "FORK_POSITIONS",
    "node_values",
    "block_advantages",
    "leaf_rewards",
    "root_success_rate",
    "VALUE_ESTIMATES",
    "sibling_diversity",
    "diversity_bonus",
    "annealed_alpha",
    "split_rows",
    "sort_rows_by_length",
]
