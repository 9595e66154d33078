"""Cue-GRPO: rarity-aware credit redistribution with Strategy-Cue partitions (docs/cue_grpo.md).

Pure functions (no trainer state): the cue catalog (:mod:`.catalog`), cue extraction (:mod:`.cues`), partitions
(:mod:`.partition`), rarity weights and the mass diagnostic (:mod:`.weights`), judge prompts/parsing
(:mod:`.judge`). Trainer glue: :class:`CueGRPOTrainer` + :class:`CueGRPOConfig` (imported lazily: TRL is heavy).
"""

from __future__ import annotations

import importlib

from .catalog import CUE_CATALOG, CUE_INDEX, CUE_NAMES, NUM_CUES, Cue, Trigger
from .cues import extract_cues, extract_cues_batch, label_step, merge_and_filter, split_steps
from .judge import JUDGE_SYSTEM_PROMPT, judge_messages, judge_partition, parse_judge_groups, truncate_for_judge
from .partition import (
    canonical_cluster_ids,
    cluster_cue_vectors,
    cue_count_vectors,
    cue_partition,
    partition_skeletons,
    random_partition,
    suppress_group_cues,
)
from .weights import (
    DEFAULT_ALPHA,
    WEIGHTING_MODES,
    RarityWeights,
    cluster_mass_slope,
    cluster_masses,
    compute_rarity_weights,
    get_weighting,
    rarity_weights,
    register_weighting,
)

__all__ = [
    "CueGRPOTrainer",
    "CueGRPOConfig",
    "CUE_CATALOG",
    "CUE_INDEX",
    "CUE_NAMES",
    "NUM_CUES",
    "Cue",
    "Trigger",
    "extract_cues",
    "extract_cues_batch",
    "label_step",
    "merge_and_filter",
    "split_steps",
    "JUDGE_SYSTEM_PROMPT",
    "judge_messages",
    "judge_partition",
    "parse_judge_groups",
    "truncate_for_judge",
    "canonical_cluster_ids",
    "cluster_cue_vectors",
    "cue_count_vectors",
    "cue_partition",
    "partition_skeletons",
    "random_partition",
    "suppress_group_cues",
    "DEFAULT_ALPHA",
    "WEIGHTING_MODES",
    "RarityWeights",
    "cluster_mass_slope",
    "cluster_masses",
    "compute_rarity_weights",
    "get_weighting",
    "rarity_weights",
    "register_weighting",
]

_LAZY = {"CueGRPOTrainer": ".trainer", "CueGRPOConfig": ".config"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
