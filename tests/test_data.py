"""The built-in arithmetic task (trl_credit/tasks/data.py)."""

import re

import pytest

from trl_credit.tasks.data import ARITHMETIC_INSTRUCTION, load_task_dataset, make_arithmetic_dataset, make_arithmetic_problems


def evaluate_expression(question):
    """Independent evaluator (no eval): '*' binds tighter than '+'/'-', which go left to right."""
    tokens = question.split()
    numbers = [int(tokens[0])]
    signs = []
    for op, token in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            numbers[-1] *= int(token)
        else:
            signs.append(op)
            numbers.append(int(token))
    total = numbers[0]
    for sign, number in zip(signs, numbers[1:]):
        total = total + number if sign == "+" else total - number
    return total


def test_independent_evaluator_itself():
    assert evaluate_expression("2 + 3 * 4") == 14
    assert evaluate_expression("9 - 2 - 3") == 4
    assert evaluate_expression("2 * 3 - 4 * 5") == -14


def test_answers_are_correct():
    for operators in ("+", "-", "*", "+-*"):
        for question, answer in make_arithmetic_problems(50, digits=2, num_operands=3, operators=operators, seed=3):
            assert answer == str(evaluate_expression(question)), question


def test_seeded_determinism():
    assert make_arithmetic_problems(20, seed=5) == make_arithmetic_problems(20, seed=5)
    assert make_arithmetic_problems(20, seed=5) != make_arithmetic_problems(20, seed=6)
    first = make_arithmetic_dataset(num_train=16, num_test=8, seed=1)
    second = make_arithmetic_dataset(num_train=16, num_test=8, seed=1)
    assert first["train"].to_list() == second["train"].to_list()
    assert first["test"].to_list() == second["test"].to_list()


def test_test_split_prefix_does_not_depend_on_sizes():
    # Evaluation of the first m test problems sees the same problems as a training run's larger test split.
    small = make_arithmetic_dataset(num_train=0, num_test=5, seed=0)["test"]["question"]
    large = make_arithmetic_dataset(num_train=50, num_test=40, seed=0)["test"]["question"]
    assert large[:5] == small


def test_splits_are_disjoint_and_distinct():
    data = make_arithmetic_dataset(num_train=60, num_test=30, seed=0)  # 90 of the 100 one-digit sums
    train, test = data["train"]["question"], data["test"]["question"]
    assert len(train) == 60 and len(test) == 30
    assert len(set(train)) == 60 and len(set(test)) == 30
    assert not set(train) & set(test)


def test_all_distinct_problems_can_be_drawn():
    problems = make_arithmetic_problems(100, digits=1, num_operands=2, operators="+")  # 10 * 10 sums exist
    assert len({q for q, _ in problems}) == 100


def test_difficulty_dial():
    for question, _ in make_arithmetic_problems(40, digits=1, num_operands=2, seed=0):
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        assert len(numbers) == 2 and all(0 <= n <= 9 for n in numbers)
    for question, _ in make_arithmetic_problems(40, digits=3, num_operands=4, seed=0):
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        assert len(numbers) == 4 and all(100 <= n <= 999 for n in numbers)
    mixed = make_arithmetic_problems(60, operators="+-*", num_operands=3)
    used = {op for question, _ in mixed for op in re.findall(r"[+*-]", question)}
    assert used == {"+", "-", "*"}
    only_products = make_arithmetic_problems(20, operators="*")
    assert all(re.fullmatch(r"\d \* \d", q) for q, _ in only_products)


def test_rows_are_chat_prompts_with_answers():
    data = make_arithmetic_dataset(num_train=4, num_test=2, seed=0)
    row = data["train"][0]
    assert set(data["train"].column_names) == {"prompt", "answer", "question"}
    assert row["prompt"] == [{"role": "user", "content": ARITHMETIC_INSTRUCTION.format(question=row["question"])}]
    assert "\\boxed{}" in row["prompt"][0]["content"] and row["question"] in row["prompt"][0]["content"]
    assert row["answer"] == str(evaluate_expression(row["question"]))
    with_system = make_arithmetic_dataset(
        num_train=2, num_test=1, system_prompt="Be brief.", instruction="Q: {question}"
    )
    assert with_system["train"][0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"Q: {with_system['train'][0]['question']}"},
    ]


def test_load_task_dataset_builtin():
    data = load_task_dataset("arithmetic", num_train=3, num_test=2, seed=4)
    assert data["train"].to_list() == make_arithmetic_dataset(num_train=3, num_test=2, seed=4)["train"].to_list()
    assert len(load_task_dataset(None, num_train=2, num_test=1)["train"]) == 2


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(num_problems=1, digits=0), "digits must be >= 1"),
        (dict(num_problems=1, num_operands=1), "num_operands >= 2"),
        (dict(num_problems=1, operators="/"), "operators must be"),
        (dict(num_problems=1, operators=""), "operators must be"),
        (dict(num_problems=101), "only 100 exist"),
        (dict(num_problems=-1), "num_problems must be"),
        (dict(num_problems=2.5), "num_problems must be"),
    ],
)
def test_problem_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_arithmetic_problems(**kwargs)


def test_dataset_errors():
    with pytest.raises(ValueError, match="only 40 exist"):  # the test split takes 60 of the 100 sums
        make_arithmetic_dataset(num_train=50, num_test=60)
    with pytest.raises(ValueError, match="placeholder"):
        make_arithmetic_dataset(num_train=1, num_test=1, instruction="no placeholder")


def test_defaults_build_and_use_the_whole_default_pool():
    # Default difficulty (1 digit, 2 operands, '+') has 10 * 10 = 100 distinct problems: 80 train + 20 test.
    data = make_arithmetic_dataset()
    assert len(data["train"]) == 80 and len(data["test"]) == 20
    assert len(set(data["train"]["question"]) | set(data["test"]["question"])) == 100
