"""Cue-GRPO's positive set P = {correct and A_i > 0 and in the loss} and the checks on a user partition_fn."""

import pytest
import torch

TWO_GROUPS = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}  # TRL's layout: two groups of 4 consecutive rows

from trl_credit.cue_grpo.trainer import checked_partition_labels, positive_sets


def test_positive_set_needs_the_verifier_and_the_loss():
    # Two groups of 4 (TRL's global row order). Group 0: rows 0, 1 have A > 0; row 1 is a well-formatted wrong
    # answer (not correct) -> P = {0}. Group 1: rows 4, 5, 6 have A > 0 and are correct, row 5 was truncated and its
    # loss masked -> P = {4, 6}. Candidates (A > 0 in varied groups) 5, kept 3 -> excluded 2/5.
    advantages = torch.tensor([1.2, 0.3, -0.7, -0.8, 0.5, 0.5, 0.5, -1.5], dtype=torch.float64)
    correct = torch.tensor([True, False, False, False, True, True, True, False])
    in_loss = torch.tensor([True, True, True, True, True, False, True, True])
    positives, excluded = positive_sets(advantages, correct, in_loss, {0: True, 1: True}, TWO_GROUPS)
    assert positives == {0: [0], 1: [4, 6]}
    assert excluded == pytest.approx(2 / 5)


def test_positive_sets_follow_any_groups_of_the_batch_record():
    # Sub-groups of unequal size and rows in no group (SRPO: base group {0, 1, 2}, reset group {3, 4}, fallback
    # rows 5, 6 in none). Group 7: rows 0, 2 correct with A > 0 -> P = {0, 2}; group 9: row 4 -> P = {4}; the
    # fallback rows' A > 0 never counts.
    advantages = torch.tensor([0.4, -0.8, 0.4, -1.0, 1.0, 0.7, 0.7], dtype=torch.float64)
    correct = torch.tensor([True, False, True, False, True, True, True])
    in_loss = torch.ones(7, dtype=torch.bool)
    groups = {7: [0, 1, 2], 9: [3, 4]}
    positives, excluded = positive_sets(advantages, correct, in_loss, {7: True, 9: True}, groups)
    assert positives == {7: [0, 2], 9: [4]} and excluded == 0.0


def test_groups_without_reward_variance_or_correct_positives_are_left_alone():
    advantages = torch.tensor([1e-9, -1e-9, 0.0, 0.0, 0.9, -0.3, -0.3, -0.3], dtype=torch.float64)
    correct = torch.tensor([True, True, True, True, False, False, False, False])
    in_loss = torch.ones(8, dtype=torch.bool)
    positives, excluded = positive_sets(advantages, correct, in_loss, {0: False, 1: True}, TWO_GROUPS)
    assert positives == {} and excluded == 1.0  # group 0: no variance; group 1: its A > 0 row is wrong
    assert positive_sets(advantages, correct, in_loss, {0: False, 1: False}, TWO_GROUPS) == ({}, 0.0)


def by_length(completions, prompt):
    return [len(c) for c in completions]


@pytest.mark.parametrize(
    "labels, message",
    [
        (None, "returned None"),
        ([0, 1], "returned 2 labels"),
        ([[0], [1], [0]], "label 0 is a list"),
        ("abc", "returned str"),
        (7, "returned int"),
    ],
)
def test_bad_partition_labels_name_the_function(labels, message):
    with pytest.raises(ValueError, match=r"partition_fn=by_length\) must return one hashable") as error:
        checked_partition_labels(by_length, labels, 3)
    assert message in str(error.value)


def test_good_partition_labels_pass_as_a_list():
    assert checked_partition_labels(by_length, (x for x in ["a", ("b", 1), 3]), 3) == ["a", ("b", 1), 3]
