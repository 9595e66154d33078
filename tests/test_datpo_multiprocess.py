"""DATPOTrainer in 2 CPU processes: trees of different sizes per process must not hang, and the advantages must
equal a 1-process run on the same (deterministic) generations, also when a group spans both processes."""

import json

import pytest

from tests.mp import run_torchrun


def _reports(out_dir):
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _rows_by_key(reports, run, step, field=0):
    """(prompt, loss tokens) -> the row's advantages (``field`` 0), or old (1) / reference (2) log-probs."""
    table = {}
    for report in reports:
        for prompt, completion, *values in report[run]["rows"][step]:
            key = (tuple(prompt), tuple(completion))
            assert key not in table, "a row appears twice across processes"
            table[key] = values[field]
    return table


@pytest.fixture(scope="module")
def two_process_reports(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("datpo_two")
    run_torchrun("tests/mp_scripts/datpo_two_processes.py", tiny_model_path, str(out), nproc=2)
    return _reports(out)


@pytest.mark.multiprocess
def test_two_processes_match_one_process(tiny_model_path, tmp_path, two_process_reports):
    two = two_process_reports
    # the 1-process reference runs in this process (same script functions, world size 1)
    from tests.mp_scripts.datpo_two_processes import run

    one = [{
        "rank": 0,
        "one_sided": run("one_sided", tiny_model_path, str(tmp_path / "one"), 8, 2, 2, 1),
        "spanning": run("spanning", tiny_model_path, str(tmp_path / "one"), 4, 1, 1, 1),
    }]
    assert sorted(r["rank"] for r in two) == [0, 1] and len(one) == 1

    # one_sided: each step, one process grew branches and the other none, and both finished 2 steps
    assert all(r["one_sided"]["steps"] == 2 for r in two)
    for step in range(2):
        counts = sorted(r["one_sided"]["branch_counts"][step] for r in two)
        assert counts[0] == 0 and counts[1] > 0
    assert one[0]["one_sided"]["branch_counts"] == [
        sum(r["one_sided"]["branch_counts"][s] for r in two) for s in range(2)
    ]

    # same rows and the same advantages (diversity included) whatever the number of processes
    for run_name, steps in (("one_sided", 2), ("spanning", 1)):
        for step in range(steps):
            expected = _rows_by_key(one, run_name, step)
            got = _rows_by_key(two, run_name, step)
            assert got.keys() == expected.keys()
            for key, advantages in expected.items():
                assert got[key] == pytest.approx(advantages, abs=1e-4)
            assert any(a != 0 for adv in expected.values() for a in adv)
    # branch generation is shared out: each process generated about half of the branches (whole forks of B̂ rows),
    # although one process owns them all
    for step in range(2):
        generated = [r["one_sided"]["generated"][step] for r in two]
        total = sum(r["one_sided"]["branch_counts"][step] for r in two)
        assert sum(generated) == total and min(generated) > 0 and abs(generated[0] - generated[1]) <= 4
    # spanning: both processes hold half of the group and grew branches from their own base rollouts
    assert all(r["spanning"]["branch_counts"][0] > 0 for r in two)


@pytest.mark.multiprocess
def test_two_processes_weigh_rows_as_one_process_for_every_loss_type(tiny_model_path, tmp_path, two_process_reports):
    # One process holds the tree (4 base rows + branches), the other 4 base rows + empty filler rows that even out
    # the row counts. Filler rows and uneven micro-batches must not reweigh the real rows: the loss and the
    # (all-reduced) gradient equal the 1-process run's, for every loss type. Row-averaging losses (grpo, sapo,
    # luspo, dr_grpo) used to divide by the filler-padded row count of each micro-batch.
    from tests.mp_scripts.datpo_two_processes import LOSS_RUNS, run_loss_types

    two = two_process_reports
    one = run_loss_types(tiny_model_path, str(tmp_path / "one"), 1)
    for loss_type, _, _ in LOSS_RUNS:
        for report in two:
            got = report["loss_types"][loss_type]
            assert got["loss"] == pytest.approx(one[loss_type]["loss"], rel=1e-3, abs=1e-6), loss_type
            assert got["grad_norm"] == pytest.approx(one[loss_type]["grad_norm"], rel=1e-3), loss_type
        assert one[loss_type]["grad_norm"] > 0


@pytest.mark.multiprocess
def test_two_processes_mask_truncated_completions_as_one_process(
    tiny_model_path, tiny_tokenizer, tmp_path, two_process_reports
):
    # A group spanning both processes, with truncated base rollouts and branches: which blocks keep their loss
    # depends on leaves of the other process, and the kept blocks' old/reference log-probs are rescored in
    # collective passes. Rows (their loss tokens), advantages and log-probs must equal the 1-process run's.
    from tests.mp_scripts.datpo_two_processes import run_truncated

    one = [{"truncated": run_truncated(tiny_model_path, str(tmp_path / "one"), 1)}]
    two = two_process_reports
    assert all(r["truncated"]["branch_counts"][0] > 0 for r in two)
    for field in (0, 1, 2):
        expected = _rows_by_key(one, "truncated", 0, field)
        got = _rows_by_key(two, "truncated", 0, field)
        assert got.keys() == expected.keys()
        for key, values in expected.items():
            assert got[key] == pytest.approx(values, abs=1e-4)
    # some truncated base rollout (prompt = the bare question) kept its leading blocks: loss tokens without EOS
    question = min(len(prompt) for prompt, _ in expected)
    assert any(len(p) == question and c[-1] != tiny_tokenizer.eos_token_id for p, c in expected)
