"""Judge prompt and JSON parsing (UARL / CR-JP, paper Appendix B; docs/cue_grpo.md#partition-sources) on hand-written judge outputs."""

from trl_credit.cue_grpo import JUDGE_SYSTEM_PROMPT, judge_messages, judge_partition, parse_judge_groups, truncate_for_judge


def test_truncation_keeps_200_head_and_500_tail_characters():
    exact = "a" * 700
    assert truncate_for_judge(exact) == exact
    text = "h" * 200 + "m" + "t" * 500  # 701 characters: the middle "m" goes
    assert truncate_for_judge(text) == "h" * 200 + " [...] " + "t" * 500


def test_messages_use_the_uarl_system_prompt_and_number_solutions_from_one():
    messages = judge_messages("What is 2+2?", ["four", "x" * 800])
    assert messages[0] == {"role": "system", "content": JUDGE_SYSTEM_PROMPT}
    assert "HIGH-LEVEL MATHEMATICAL STRATEGY" in JUDGE_SYSTEM_PROMPT and '"groups"' in JUDGE_SYSTEM_PROMPT
    user = messages[1]["content"]
    assert user.startswith("Problem:\nWhat is 2+2?")
    assert "Solution 1:\nfour" in user and "Solution 2:\n" + "x" * 200 + " [...] " in user
    assert "Solution 3" not in user


def test_parse_plain_fenced_and_prose_wrapped_json():
    plain = '{"groups": [{"strategy": "algebra", "members": [1, 3]}, {"strategy": "guess", "members": [2]}]}'
    assert parse_judge_groups(plain, 3) == [0, 1, 0]
    fenced = "Here is my grouping:\n```json\n" + plain + "\n```\nHope this helps."
    assert parse_judge_groups(fenced, 3) == [0, 1, 0]


def test_parse_failures_return_none():
    assert parse_judge_groups("I cannot do that.", 3) is None
    assert parse_judge_groups('{"groups": [{"strategy": "a", "members": [1, 2]', 3) is None  # truncated JSON
    assert parse_judge_groups('{"clusters": [[1, 2]]}', 3) is None  # wrong key
    assert parse_judge_groups('{"groups": [{"strategy": "a", "members": [7, 9]}]}', 3) is None  # no valid member
    assert parse_judge_groups("", 2) is None


def test_parse_lenient_details():
    # string members accepted, out-of-range and non-integer members ignored, first group wins for duplicates,
    # unlisted solutions are None; an earlier object without "groups" is skipped
    text = '{"note": 1} {"groups": [{"members": ["2", 0, 1.5, "x"]}, {"members": [2, 1]}, "junk"]}'
    assert parse_judge_groups(text, 4) == [1, 0, None, None]


def test_judge_partition_maps_positive_solution_numbers():
    labels = [0, 1, 0, None, 1]
    # positives are solutions 1, 3, 4, 5: 1 and 3 share group 0, 5 is in group 1, 4 is unlisted (own cluster)
    assert judge_partition(labels, [1, 3, 4, 5]) == [0, 0, 1, 2]
    assert judge_partition(None, [2, 4, 5]) == [0, 0, 0]  # parse failure -> one group
