"""The built-in multi-step task and its step checker (trl_credit/tasks/chain.py). Expected values are worked by hand."""

import pytest

from trl_credit.tasks.chain import (
    CHAIN_INSTRUCTION,
    chain_solutions,
    chain_format_reward,
    check_steps,
    first_wrong_step,
    make_chain_dataset,
    make_chain_problems,
    parse_question,
    solution_text,
)
from trl_credit.tasks.data import load_task_dataset
from trl_credit.tasks.rewards import accuracy_reward

# 6*3 + 6*5 = 48; 48 - 7 = 41; 41 + 4 = 45; 45 * 2 = 90.
DIST = "6 * 3 + 6 * 5, then subtract 7, then add 4, then multiply by 2"
TERM = "6 * 3 = 18\n6 * 5 = 30\n18 + 30 = 48\n48 - 7 = 41\n41 + 4 = 45\n45 * 2 = 90\n\\boxed{90}"
FACTORED = "3 + 5 = 8\n6 * 8 = 48\n48 - 7 = 41\n41 + 4 = 45\n45 * 2 = 90\n\\boxed{90}"
# 12 - 3 = 9; 9 + 7 = 16; 16 * 2 = 32; 32 - 5 = 27.
PLAIN = "12 - 3, then add 7, then multiply by 2, then subtract 5"
PLAIN_SOLUTION = "12 - 3 = 9\n9 + 7 = 16\n16 * 2 = 32\n32 - 5 = 27\n\\boxed{27}"


def evaluate_question(question):
    """Independent evaluator of a question string: the core with standard precedence, then the clauses in order."""
    core, *clauses = question.split(", then ")
    value = eval(core)  # noqa: S307 - digits, spaces and +-* only, written by the test's own generator
    for clause in clauses:
        verb, number = clause.rsplit(" ", 1)
        value = {"add": value + int(number), "subtract": value - int(number), "multiply by": value * int(number)}[verb]
    return value


def test_hand_written_problems_and_both_structures():
    assert evaluate_question(DIST) == 90 and evaluate_question(PLAIN) == 27
    assert parse_question(DIST).answer == 90 and parse_question(DIST).distributive
    assert solution_text(parse_question(DIST), "term") == TERM
    assert solution_text(parse_question(DIST), "factored") == FACTORED
    assert solution_text(parse_question(PLAIN)) == PLAIN_SOLUTION
    minus = parse_question("7 * 9 - 7 * 4, then add 5")  # 63 - 28 = 35 = 7 * (9 - 4); + 5 = 40
    assert [s[3] for s in chain_solutions(minus)[1]] == [5, 35, 40]


@pytest.mark.parametrize("completion", [TERM, FACTORED])
def test_correct_chains_of_both_structures_pass(completion):
    assert first_wrong_step(DIST, completion) is None
    assert accuracy_reward([completion], ["90"]) == [1.0]


def test_accepted_variants_of_a_correct_chain():
    swapped = "6 * 5 = 30\n3 * 6 = 18\n30 + 18 = 48\n48 - 7 = 41\n4 + 41 = 45\n2 * 45 = 90\n\\boxed{90}."
    assert first_wrong_step(DIST, swapped) is None  # products in either order, + and * operands either way
    spaced = "\n  12-3=9.\n\n9 + 7 = 16\n16 * 2 = 32\n32 - 5 = 27\nThe answer is \\boxed{27}\n"
    assert first_wrong_step(PLAIN, spaced) is None
    chat = [{"role": "assistant", "content": PLAIN_SOLUTION}]
    assert first_wrong_step(PLAIN, chat) is None


@pytest.mark.parametrize(
    "completion, step, reason",
    [
        # wrong arithmetic mid-chain (48 - 7 = 42): step 4
        (TERM.replace("48 - 7 = 41\n41 + 4 = 45\n45 * 2 = 90", "48 - 7 = 42\n42 + 4 = 46\n46 * 2 = 92")
         .replace("{90}", "{92}"), 4, "arithmetic"),
        # factored structure, wrong sum in the first step
        ("3 + 5 = 9\n6 * 9 = 54\n\\boxed{54}", 1, "arithmetic"),
        # a true equation with a number from nowhere (11)
        ("6 * 3 = 18\n6 * 5 = 30\n18 + 30 = 48\n48 - 11 = 37\n\\boxed{37}", 4, "unknown number"),
        # true and from available numbers, but multiplies 6 * 3 * 5 instead of 6 * (3 + 5)
        ("6 * 3 = 18\n18 * 5 = 90\n\\boxed{90}", 2, "off path"),
        # skips "subtract 7" (every step is true arithmetic)
        ("3 + 5 = 8\n6 * 8 = 48\n48 + 4 = 52\n52 * 2 = 104\n\\boxed{104}", 3, "off path"),
        # operations out of the stated order
        ("3 + 5 = 8\n6 * 8 = 48\n48 + 4 = 52\n52 - 7 = 45\n45 * 2 = 90\n\\boxed{90}", 3, "off path"),
        # a repeated step
        ("3 + 5 = 8\n3 + 5 = 8\n6 * 8 = 48\n\\boxed{48}", 2, "off path"),
        # garbage line
        ("3 + 5 = 8\nNow multiply.\n6 * 8 = 48\n\\boxed{90}", 2, "unparseable"),
        ("Step 1: 3 + 5 = 8\n\\boxed{90}", 1, "unparseable"),
        # missing lines: stops early and boxes the last result -> the answer line (5) is the wrong step
        ("3 + 5 = 8\n6 * 8 = 48\n48 - 7 = 41\n41 + 4 = 45\n\\boxed{45}", 5, "wrong answer"),
        # all steps right, final answer mismatch
        (FACTORED.replace("\\boxed{90}", "\\boxed{91}"), 6, "wrong answer"),
        (FACTORED.replace("\\boxed{90}", "\\boxed{ninety}"), 6, "wrong answer"),
        # the last operation done without its line, the boxed answer right: nothing is wrong
        (FACTORED.replace("45 * 2 = 90\n", ""), None, None),
        # no answer line (truncated): the missing step after the last line
        ("3 + 5 = 8\n6 * 8 = 48\n48 - 7 = 41", 4, "no answer"),
        ("", 1, "no answer"),
        # text after the answer line (accuracy_reward reads the last box)
        (FACTORED + "\n\\boxed{91}", 7, "text after answer"),
    ],
)
def test_first_wrong_step_on_hand_written_wrong_chains(completion, step, reason):
    verdict = check_steps(DIST, completion)
    assert (verdict.step, verdict.reason) == (step, reason)
    assert first_wrong_step(DIST, completion) == step


def test_wrong_step_in_plain_chain_and_step_counts():
    assert check_steps(PLAIN, PLAIN_SOLUTION).num_steps == 4
    assert first_wrong_step(PLAIN, PLAIN_SOLUTION.replace("16 * 2 = 32", "16 * 2 = 34")) == 3
    assert first_wrong_step(PLAIN, "3 - 12 = -9\n\\boxed{27}") == 1  # '-' does not commute: off path
    assert check_steps(PLAIN, "3 - 12 = -9\n\\boxed{27}").reason == "off path"


def test_none_means_the_boxed_answer_is_right():
    problems = make_chain_problems(200, seed=4)
    for problem in problems:
        for structure in ("term", "factored"):
            text = solution_text(problem, structure)
            assert first_wrong_step(problem.question, text) is None
            assert accuracy_reward([text], [str(problem.answer)]) == [1.0]
            assert evaluate_question(problem.question) == problem.answer
            # dropping any step line but the last makes the chain wrong (without the last one, a right boxed
            # answer is still right: the answer line is checked against the answer only)
            lines = text.splitlines()
            for drop in range(len(lines) - 2):
                if lines[drop] == lines[drop + 1]:  # "0 * 2 = 0" twice (a chain at 0): dropping one changes nothing
                    continue
                broken = "\n".join(lines[:drop] + lines[drop + 1 :])
                assert first_wrong_step(problem.question, broken) is not None


def test_generator_ranges_structures_and_step_counts():
    problems = make_chain_problems(500, seed=0)
    assert len({p.question for p in problems}) == 500
    distributive = [p for p in problems if p.distributive]
    assert 0.35 < len(distributive) / len(problems) < 0.65
    for problem in problems:
        assert parse_question(problem.question) == problem
        assert 2 <= len(problem.ops) <= 3
        assert all(2 <= y <= 9 if op in "+-" else y in (2, 3) for op, y in problem.ops)
        for steps in chain_solutions(problem):
            assert all(0 <= z <= 60 for *_, z in steps)
            assert 3 <= len(steps) <= 6
        if problem.distributive:  # two structures, same answer
            term, factored = chain_solutions(problem)
            assert len(term) == len(factored) + 1 and term[-1][3] == factored[-1][3]


def test_factor_friendly_cores_make_the_factored_structure_the_easy_one():
    # the default draws are those of every earlier run (golden, from the generator before the option existed)
    assert [p.question for p in make_chain_problems(3, seed=0, distributive_fraction=1.0)] == [
        "4 * 7 - 4 * 6, then add 4, then add 6",
        "4 * 4 - 4 * 3, then multiply by 3, then add 6, then subtract 2",
        "4 * 5 + 4 * 6, then subtract 3, then subtract 3",
    ]
    problems = make_chain_problems(300, seed=0, factor_friendly=True)
    distributive = [p for p in problems if p.distributive]
    assert 0.35 < len(distributive) / len(problems) < 0.65
    assert {p.core[1] for p in distributive} == {"+", "-"}
    for problem in distributive:
        a, op, b, c = problem.core
        assert (b + c == 10 and b != c) if op == "+" else b - c in (1, 2)
        term, factored = chain_solutions(problem)
        assert factored[0][3] in (1, 2, 10) and term[-1][3] == factored[-1][3] <= 60
    # plain problems are drawn as before, with the same odds; train and test stay disjoint
    assert sum(not p.distributive for p in problems) > 100
    splits = make_chain_dataset(num_train=40, num_test=20, seed=0, factor_friendly=True)
    assert not set(splits["train"]["question"]) & set(splits["test"]["question"])
    assert load_task_dataset("chain", num_train=40, num_test=20, seed=0, factor_friendly=True)["test"].to_list() == \
        splits["test"].to_list()
    with pytest.raises(ValueError, match="factor_friendly needs max_operand >= 6"):
        make_chain_problems(3, max_operand=5, factor_friendly=True)


def test_dataset_is_seeded_disjoint_and_prompts_state_the_format():
    first = load_task_dataset("chain", num_train=50, num_test=20, seed=3)
    assert first["train"].to_list() == make_chain_dataset(num_train=50, num_test=20, seed=3)["train"].to_list()
    assert first["test"]["question"] != make_chain_dataset(num_train=50, num_test=20, seed=4)["test"]["question"]
    assert not set(first["train"]["question"]) & set(first["test"]["question"])
    # the first m test problems do not depend on the split sizes (evaluation on a prefix sees the same problems)
    assert make_chain_dataset(num_train=0, num_test=5, seed=3)["test"]["question"] == first["test"]["question"][:5]
    row = first["test"][0]
    assert row["prompt"] == [{"role": "user", "content": CHAIN_INSTRUCTION.format(question=row["question"])}]
    assert "one step per line as `x op y = z`" in row["prompt"][0]["content"]
    assert "\\boxed{N}" in row["prompt"][0]["content"]
    assert row["answer"] == str(evaluate_question(row["question"]))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="min_ops"):
        make_chain_problems(3, min_ops=4, max_ops=2)
    with pytest.raises(ValueError, match="num_problems"):
        make_chain_problems(-1)
    with pytest.raises(ValueError, match="max_value"):
        make_chain_problems(3, max_value=20)
    with pytest.raises(ValueError, match="not a chain problem"):
        first_wrong_step("2 + 3 * 4", "2 + 3 = 5")
    with pytest.raises(ValueError, match="placeholder"):
        make_chain_dataset(instruction="no placeholder")


@pytest.mark.parametrize("completion", [TERM, FACTORED, PLAIN_SOLUTION])
def test_each_step_line_is_one_srpo_thought_and_one_datpo_sentence(tiny_tokenizer, completion):
    # Step k of the checker is thought k of SRPO (thought_delimiter="\n") and sentence k of DATPO's forks.
    from trl_credit.datpo.forks import sentence_spans, token_char_offsets
    from trl_credit.core.steps import split_thoughts, thought_texts

    lines = completion.splitlines()
    ids = tiny_tokenizer(completion, add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    ends = split_thoughts(ids, tiny_tokenizer, "\n")
    assert thought_texts(ids, ends, tiny_tokenizer, "\n") == lines
    text, offsets = token_char_offsets(tiny_tokenizer, ids)
    spans = sentence_spans(text, offsets)
    assert [tiny_tokenizer.decode(ids[s:e], skip_special_tokens=True).strip() for s, e in spans] == lines


# --------------------------------------------------------------------------------------------------------------
# chain_format_reward: the step grammar and one answer line, not the arithmetic
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        (TERM, 1.0),
        (FACTORED, 1.0),
        (PLAIN_SOLUTION, 1.0),
        ("12 - 3 = 9\n\n  9 + 7 = 16.  \n\\boxed{16}\n\n", 1.0),  # blank lines, spaces, a period: as the checker
        ("12 - 3 = 10\n10 + 7 = 17\n\\boxed{17}", 1.0),  # wrong arithmetic, right format: accuracy's job
        ([{"role": "assistant", "content": PLAIN_SOLUTION}], 1.0),  # chat completion
        ("\\boxed{27}", 0.0),  # no step line
        ("12 - 3 = 9\n9 + 7 = 16", 0.0),  # no answer line
        ("12 - 3 = 9\nThen add 7: 9 + 7 = 16\n\\boxed{16}", 0.0),  # prose before the answer
        ("Step 1: 12 - 3 = 9\n\\boxed{9}", 0.0),
        ("12 - 3 = 9\n\\boxed{9}\n\\boxed{9}", 0.0),  # two answer lines
        ("12 - 3 = 9\n\\boxed{9}\nDone.", 0.0),  # text after the answer
        ("12 - 3 = 9\nThe answer is \\boxed{9}", 0.0),  # answer line is not \boxed{N} alone
        ("12 - 3 = 9\n\\boxed{nine}", 0.0),
        ("12 / 3 = 4\n\\boxed{4}", 0.0),  # op not one of + - *
        ("", 0.0),
        (None, 0.0),
    ],
)
def test_chain_format_reward_on_hand_written_chains(completion, expected):
    assert chain_format_reward([completion]) == [expected]


def test_chain_format_reward_scores_a_batch_in_order():
    assert chain_format_reward([TERM, "garbage", PLAIN_SOLUTION], answer=["90", "1", "27"]) == [1.0, 0.0, 1.0]
