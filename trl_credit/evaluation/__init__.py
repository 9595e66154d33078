"""Evaluation and what a user sees: repeated-sampling evaluation and its metrics, comparisons against the
base model, credit visualization, health ranges.
"""
