"""benchmarks/tiny/base_decodings.py and tiny_report.wider_baseline: the sharpening baseline as the best of a wider
set of decodings of the untrained model, hand-worked."""

import pytest

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
import base_decodings
import tiny_report
from trl_credit.tasks import sums


def test_answer_key_is_the_answer_line_the_reward_reads():
    for text in ("1+2=3\nA3\n", "1+2=3\n  A7 \nA3", "1+2=3\n", "A33\nA4"):
        key = base_decodings.answer_key(text)
        # the key is correct exactly when the task's reward says so, for every reference digit
        for truth in range(10):
            assert (key == str(truth)) == (sums.accuracy_reward([text], [truth])[0] == 1.0)
    assert base_decodings.answer_key("1+2=3\n  A7 \nA3") == "7"
    assert base_decodings.answer_key("A33\nA4") == "4"
    assert base_decodings.answer_key("1+2=3\n") is None


def test_majority_accuracy_votes_and_splits_ties():
    # problem 1 (answer 3): votes 3, 3, 5, None -> 3 wins: 1.0. Problem 2 (answer 2): votes 2, 4, 4, 2 -> a tie of two
    # answers, one correct: 1/2. Problem 3 (answer 0): no vote -> 0. Mean (1 + 0.5 + 0) / 3 = 0.5
    keys = [["3", "3", "5", None], ["2", "4", "4", "2"], [None, None, None, None]]
    assert base_decodings.majority_accuracy(keys, ["3", "2", "0"]) == pytest.approx(0.5)


def test_wider_baseline_is_the_best_option_and_keeps_the_temperature_one():
    profile = {"temperature": "0.7", "accuracy": 0.388}
    decodings = dict(samples=8, decodings=[dict(decoding="T=1", accuracy=0.336, maj=0.398),
                                           dict(decoding="T=1, min-p 0.1", accuracy=0.414, maj=0.402)])
    wide = tiny_report.wider_baseline(profile, decodings)
    assert wide["decoding"] == "T=1, min-p 0.1 (sampled)" and wide["accuracy"] == 0.414
    assert wide["best_temperature"] == profile and len(wide["decodings"]) == 5  # the profile's + 2 x (sampled, maj)
    # a profile baseline better than every decoding stays the baseline
    assert tiny_report.wider_baseline({"temperature": "greedy", "accuracy": 0.5}, decodings)["decoding"] == \
        "greedy (profile)"
