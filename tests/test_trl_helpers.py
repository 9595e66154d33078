"""The shared TRL helpers: generation through TRL's path with per-call overrides, scoring, padding."""

import pytest
import torch
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from trl_credit.core.generation import generate_from_prefixes, sampling_overrides
from trl_credit.core.scoring import pad_rows, score_completions


def _zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def _trainer(tiny_model_path, tiny_dataset, tmp_path, **overrides):
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        report_to="none",
        use_cpu=True,
        temperature=1.0,
        **overrides,
    )
    return GRPOTrainer(model=tiny_model_path, reward_funcs=_zero_reward, args=args, train_dataset=tiny_dataset)


def _greedy_reference(model_path, tokenizer, prefixes, max_new_tokens):
    """Independent reference: greedy decoding with plain transformers, one row at a time (no padding), cut after
    the first EOS as TRL cuts completions."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    outputs = []
    for prefix in prefixes:
        out = model.generate(
            torch.tensor([prefix]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id
        )[0, len(prefix) :].tolist()
        if tokenizer.eos_token_id in out:
            out = out[: out.index(tokenizer.eos_token_id) + 1]
        outputs.append(out)
    return outputs


def test_greedy_override_matches_model_generate_and_is_restored(tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    prefixes = [tiny_tokenizer("What is 3 + 4?")["input_ids"], tiny_tokenizer("Step 1:")["input_ids"]]
    completions, logprobs = generate_from_prefixes(trainer, prefixes, greedy=True, max_new_tokens=9)
    assert logprobs is None  # HF generate path returns no sampling log-probs
    assert completions == _greedy_reference(tiny_model_path, tiny_tokenizer, prefixes, max_new_tokens=9)
    # The override is gone afterwards: sampling is back on, with the configured length.
    assert trainer.generation_config.do_sample is True
    assert trainer.generation_config.max_new_tokens == 6
    assert trainer.generation_kwargs["max_new_tokens"] == 6


def test_chunked_generation_keeps_row_order_and_count(tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    prefixes = [tiny_tokenizer(f"What is {i} + {i}?")["input_ids"] for i in range(5)]
    whole, _ = generate_from_prefixes(trainer, prefixes, greedy=True, max_new_tokens=5)
    chunked, _ = generate_from_prefixes(trainer, prefixes, greedy=True, max_new_tokens=5, chunk_size=2)
    assert len(whole) == 5 and chunked == whole
    assert all(1 <= len(c) <= 5 for c in whole)
    assert generate_from_prefixes(trainer, [], greedy=True) == ([], None)


def test_sampling_override_sets_temperature_and_length(tiny_model_path, tiny_dataset, tmp_path):
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    with sampling_overrides(trainer, max_new_tokens=3, temperature=0.5, top_p=0.9):
        assert trainer.generation_config.max_new_tokens == 3
        assert trainer.generation_config.temperature == 0.5
        assert trainer.generation_config.top_p == 0.9
        assert trainer.generation_kwargs["temperature"] == 0.5
    assert trainer.generation_config.temperature == 1.0


@pytest.mark.trl_smoke
def test_score_completions_matches_manual_log_softmax(tiny_model_path, tiny_dataset, tmp_path):
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    prompts, completions = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    p, pm, c, cm = pad_rows(prompts, completions, pad_token_id=0, device="cpu")
    assert p.tolist() == [[5, 6, 7], [0, 8, 9]] and cm.tolist() == [[1, 1, 0], [1, 1, 1]]
    logps, entropies = score_completions(trainer, trainer.model, p, pm, c, cm, compute_entropy=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids = torch.tensor([prompt + completion])
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
        torch.testing.assert_close(logps[row, : len(completion)], expected, atol=1e-5, rtol=1e-4)
        probs = torch.softmax(logits, -1)
        torch.testing.assert_close(entropies[row, : len(completion)], -(probs * probs.log()).sum(-1), atol=1e-4, rtol=1e-4)


def test_overrides_reach_vllm_attributes_and_are_restored(tiny_model_path, tiny_dataset, tmp_path):
    # vLLM reads temperature / max_completion_length from trainer.vllm_generation at each call (server and colocate).
    from types import SimpleNamespace

    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    trainer.use_vllm = True
    trainer.vllm_generation = SimpleNamespace(temperature=1.0, top_p=1.0, max_completion_length=6)
    seen = {}

    def fake_generate(prompt_ids, images, multimodal_fields, num_generations):
        seen.update(vars(trainer.vllm_generation), num_generations=num_generations)
        return [[7] for _ in prompt_ids], [[-0.5] for _ in prompt_ids]

    trainer._generate_single_turn = fake_generate
    completions, logprobs = generate_from_prefixes(trainer, [[1, 2], [3]], greedy=True, max_new_tokens=3)
    assert seen == {"temperature": 0.0, "top_p": 1.0, "max_completion_length": 3, "num_generations": 1}
    assert completions == [[7], [7]] and logprobs == [[-0.5], [-0.5]]
    assert vars(trainer.vllm_generation) == {"temperature": 1.0, "top_p": 1.0, "max_completion_length": 6}


def test_every_call_has_the_same_row_count_on_every_process(tiny_model_path, tiny_dataset, tmp_path, monkeypatch):
    # vLLM server mode slices its answer by process_index * len(prompts): a process with fewer rows (here 1 of the
    # 3 the other process has) must pad every call to the common size and drop the filler outputs.
    import trl_credit.core.generation as generation

    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    monkeypatch.setattr(generation, "gather_counts", lambda trainer, count: [3, count])
    call_sizes = []

    def fake_generate(prompt_ids, images, multimodal_fields, num_generations):
        call_sizes.append(len(prompt_ids))
        return [list(ids) + [99] for ids in prompt_ids], None

    trainer._generate_single_turn = fake_generate
    completions, _ = generate_from_prefixes(trainer, [[5, 6]], chunk_size=2)
    # 3 rows on the busiest process in chunks of 2 -> 2 calls of 2 rows each, also here where only 1 row is real
    assert call_sizes == [2, 2]
    assert completions == [[5, 6, 99]]
    call_sizes.clear()
    assert generate_from_prefixes(trainer, [], chunk_size=2) == ([], None)  # nothing here: still joins both calls
    assert call_sizes == [2, 2]


def test_outside_zero3_init_unregisters_and_restores_the_deepspeed_config():
    # Under ZeRO-3, transformers partitions models created while a DeepSpeed config is registered; frozen helper
    # models must load whole. Simulated with a stand-in config object (DeepSpeed itself is not installed on CI).
    from transformers.integrations import deepspeed as hf_deepspeed

    from trl_credit.core.setup import outside_zero3_init

    class FakeZero3Config:
        def is_zero3(self):
            return True

    config = FakeZero3Config()
    hf_deepspeed.set_hf_deepspeed_config(config)
    try:
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
        with outside_zero3_init():
            assert not hf_deepspeed.is_deepspeed_zero3_enabled()
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
    finally:
        hf_deepspeed.unset_hf_deepspeed_config()
    with outside_zero3_init():  # no DeepSpeed config registered: a no-op
        assert not hf_deepspeed.is_deepspeed_zero3_enabled()


def _prefill_spy(trainer):
    """Batch shapes of every forward of the trainer's causal LM (the shared prefill's included)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    shapes = []
    handle = model.register_forward_hook(
        lambda module, args, kwargs, output: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes, handle


def test_shared_prefill_prefills_each_distinct_prompt_once_and_generates_the_same_tokens(
    tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path
):
    # The B̂ branches of a fork (or the suffixes of a reset state) are repeated rows: HF generate would prefill each
    # copy. With the shared prefill, the distinct rows are prefilled once (all but their last token) and every copy
    # continues from that cache; greedy tokens equal plain transformers decoding each prefix alone (no padding).
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    a = tiny_tokenizer("What is 3 + 4? First, we add the numbers.")["input_ids"]
    b = tiny_tokenizer("Step 1:")["input_ids"]
    c = a[:1]  # a one-token prefix: all of its prefill is padding
    prefixes = [a, a, a, b, b, c, c]
    shapes, handle = _prefill_spy(trainer)
    completions, _ = generate_from_prefixes(trainer, prefixes, greedy=True, max_new_tokens=7)
    handle.remove()
    # first forward: the 3 distinct rows, all but the last column of the left-padded batch; then one row-count of 7
    assert shapes[0] == (3, len(a) - 1)
    assert all(rows == 7 for rows, _ in shapes[1:]) and all(length == 1 for _, length in shapes[1:])
    assert completions == _greedy_reference(tiny_model_path, tiny_tokenizer, prefixes, max_new_tokens=7)


def test_shared_prefill_samples_the_same_tokens_as_separate_prefills(tiny_model_path, tiny_dataset, tiny_tokenizer,
                                                                     tmp_path):
    # Sampling draws happen after the prefill, so with the same seed the shared and unshared calls sample the same
    # tokens (the cache differs only by float rounding).
    from trl_credit.generation.hooks import hf_generate_hooks

    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    a = tiny_tokenizer("Consider the equation 2x + 3 = 11.")["input_ids"]
    b = tiny_tokenizer("Let x = 2.")["input_ids"]
    rows = [a] * 4 + [b] * 4
    results = []
    for share in (False, True):
        torch.manual_seed(11)
        with hf_generate_hooks(trainer, share_prefill=share), sampling_overrides(trainer, max_new_tokens=8):
            completions, _ = trainer._generate_single_turn(rows, None, {}, 4)
        results.append(completions)
    assert results[0] == results[1]
    assert len({tuple(c) for c in results[1][:4]}) > 1  # the copies are sampled independently, not copied


def test_shared_prefill_is_off_where_a_forward_may_be_collective(tiny_model_path, tiny_dataset, tiny_tokenizer,
                                                                   tmp_path, monkeypatch):
    # ZeRO-3 / FSDP with several processes: a forward can all-gather parameters, and only processes with repeated
    # rows would make the prefill forward, so sharing is off there. Simulated while the hooks are installed (where
    # the decision is made): 2 processes, ZeRO stage 3; then generation runs on the real single process.
    from types import SimpleNamespace

    from trl_credit.generation.hooks import hf_generate_hooks

    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    a = tiny_tokenizer("Step 1:")["input_ids"]
    shapes, handle = _prefill_spy(trainer)
    accelerator_class = type(trainer.accelerator)
    with monkeypatch.context() as patch:
        patch.setattr(accelerator_class, "num_processes", property(lambda self: 2))
        patch.setattr(trainer.accelerator, "state", SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3)))
        hooks = hf_generate_hooks(trainer)
        hooks.__enter__()
    try:
        with sampling_overrides(trainer, max_new_tokens=3):
            trainer._generate_single_turn([a, a], None, {}, 2)
    finally:
        hooks.__exit__(None, None, None)
        handle.remove()
    assert shapes[0] == (2, len(a))  # generate's own prefill of both rows, no shared one


def _enable_dropout(trainer):
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.train()
    model.lm_head = torch.nn.Sequential(torch.nn.Dropout(0.1), model.lm_head)


def _model_cache_implementation(trainer):
    trainer.accelerator.unwrap_model(trainer.model).generation_config.cache_implementation = "dynamic"


def _chunked_prefill(trainer):
    trainer.generation_config.prefill_chunk_size = 4


@pytest.mark.parametrize("setup", [_enable_dropout, _model_cache_implementation, _chunked_prefill],
                         ids=["dropout-in-train-mode", "model-cache-implementation", "chunked-prefill"])
def test_shared_prefill_stands_aside_where_a_ready_cache_would_change_generation(
    tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path, setup
):
    # Dropout active: the copies would share one dropout draw for their prompt. A cache implementation: generate
    # refuses a cache next to one. Chunked prefill: some transformers versions restart it at position 0. In each
    # case generate runs its own prefill of every row (and does not raise).
    from trl_credit.generation.hooks import hf_generate_hooks

    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    setup(trainer)
    a = tiny_tokenizer("Step 1:")["input_ids"]
    shapes, handle = _prefill_spy(trainer)
    try:
        with hf_generate_hooks(trainer), sampling_overrides(trainer, max_new_tokens=3):
            completions, _ = trainer._generate_single_turn([a, a], None, {}, 2)
    finally:
        handle.remove()
    assert len(completions) == 2
    assert shapes[0][0] == 2  # both rows prefilled by generate itself


def _compacting_greedy(trainer, prefixes, budgets, max_new_tokens):
    """Greedy generation through TRL's path with per-row budgets and row compaction; the completions and the batch
    shapes of every forward."""
    from trl_credit.generation.hooks import hf_generate_hooks

    shapes, handle = _prefill_spy(trainer)
    try:
        with hf_generate_hooks(trainer, budgets, compact_rows=True), sampling_overrides(
            trainer, max_new_tokens=max_new_tokens, greedy=True
        ):
            completions, _ = trainer._generate_single_turn(prefixes, None, {}, 1)
    finally:
        handle.remove()
    return completions, shapes


def test_row_compaction_continues_the_running_rows_and_generates_the_same_tokens(
    tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path
):
    # compact_rows: once fewer than half of a call's rows are running, generate continues only those, from their
    # rows of the cache. Rows here stop at their own budgets (2, 3, 3, 12, 12 new tokens): after the 3rd token 2 of
    # 5 rows are running, so the call goes on with 2 rows. Greedy tokens equal plain transformers decoding each
    # prefix alone (no padding, no cache copying), each cut to its budget.
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    prefixes = [tiny_tokenizer(text)["input_ids"] for text in
                ("What is 3 + 4?", "Step 1:", "Let x = 2. Then", "Consider 2x + 3 = 11.", "Add 5 and 6.")]
    budgets = [2, 3, 3, 12, 12]
    completions, shapes = _compacting_greedy(trainer, prefixes, budgets, max_new_tokens=12)
    reference = _greedy_reference(tiny_model_path, tiny_tokenizer, prefixes, max_new_tokens=12)
    assert [c[:b] for c, b in zip(completions, budgets)] == [r[:b] for r, b in zip(reference, budgets)]
    assert all(len(c) >= min(b, len(r)) for c, b, r in zip(completions, budgets, reference))
    rows_per_forward = [rows for rows, _ in shapes]
    # 5 rows for the prefill and the first 2 decode steps, then 2 rows to the end (12 forwards in all)
    assert rows_per_forward == [5, 5, 5] + [2] * 9


def test_row_compaction_counts_rows_ended_by_eos_as_finished(tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path):
    # Rows that end with EOS count as finished. With EOS = a token the tiny model's greedy decoding emits first in 3
    # of these 5 rows (asserted below from the independent reference), 2 rows run on after the first token and the
    # call continues with those 2; every row equals its independent greedy decoding, cut after its first EOS as TRL
    # cuts completions.
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    texts = ["Step 1:", "Consider 2x + 3 = 11.", "Add 5 and 6.", "Compute 7 - 2.", "What is 3 + 4?"]
    prefixes = [tiny_tokenizer(text)["input_ids"] for text in texts]
    free = _greedy_reference(tiny_model_path, tiny_tokenizer, prefixes, max_new_tokens=10)
    eos = free[1][0]
    ends = [row.index(eos) if eos in row else None for row in free]
    assert ends[1:4] == [0, 0, 0] and ends[0] not in (None, 0) and ends[4] is None, (eos, free)  # the premise
    trainer.eos_token_ids = [eos]
    trainer.generation_config.eos_token_id = eos
    completions, shapes = _compacting_greedy(trainer, prefixes, [None] * 5, max_new_tokens=10)
    assert completions == [row if end is None else row[: end + 1] for row, end in zip(free, ends)]
    assert [rows for rows, _ in shapes] == [5] + [2] * 9


def test_row_compaction_after_a_shared_prefill(tiny_model_path, tiny_dataset, tiny_tokenizer, tmp_path):
    # DATPO's branch calls: the B̂ copies of a fork share one prefill, then rows of different budgets finish at
    # different steps and the call goes on with the running ones (from the shared prefill's copied cache rows).
    trainer = _trainer(tiny_model_path, tiny_dataset, tmp_path)
    a = tiny_tokenizer("What is 3 + 4? First, we add the numbers.")["input_ids"]
    b = tiny_tokenizer("Step 1:")["input_ids"]
    prefixes, budgets = [a, a, a, b, b], [2, 2, 2, 11, 11]
    completions, shapes = _compacting_greedy(trainer, prefixes, budgets, max_new_tokens=11)
    reference = _greedy_reference(tiny_model_path, tiny_tokenizer, prefixes, max_new_tokens=11)
    assert [c[:n] for c, n in zip(completions, budgets)] == [r[:n] for r, n in zip(reference, budgets)]
    # the shared prefill (2 distinct rows, all but the last column), 2 steps of 5 rows, then 2 rows to the 11th token
    assert shapes[0] == (2, len(a) - 1)
    assert [rows for rows, _ in shapes[1:]] == [5, 5] + [2] * 9


def test_method_rng_state_round_trips_per_process_and_warns_when_missing(tmp_path):
    from types import SimpleNamespace

    from trl_credit.core.mixins import MethodRNGStateMixin

    class FakeTrainer:  # the Trainer's own generators: record the calls
        def __init__(self, process_index):
            self.args = SimpleNamespace(process_index=process_index)
            self.accelerator = SimpleNamespace(is_main_process=process_index == 0)
            self.calls, self.counter = [], 0

        def _save_rng_state(self, output_dir):
            self.calls.append(("save", output_dir))

        def _load_rng_state(self, checkpoint):
            self.calls.append(("load", checkpoint))

    class Counting(MethodRNGStateMixin, FakeTrainer):
        def _method_rng_state(self):
            return {"counter": self.counter}

        def _set_method_rng_state(self, state):
            self.counter = state["counter"]

    for index in (0, 1):
        saved = Counting(index)
        saved.counter = 7 + index
        saved._save_rng_state(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trl_credit_rng_state_0.json", "trl_credit_rng_state_1.json"]
    restored = Counting(1)
    restored._load_rng_state(str(tmp_path))
    assert restored.counter == 8 and restored.calls == [("load", str(tmp_path))]
    restored._load_rng_state(None)  # a fresh run: nothing to restore
    assert restored.counter == 8
    with pytest.warns(UserWarning, match="trl_credit_rng_state_0.json"):
        Counting(0)._load_rng_state(str(tmp_path / "missing"))


def test_filler_rows_local_rows_and_logged_advantages():
    from collections import deque
    from types import SimpleNamespace

    from trl_credit.core.collectives import fill_rows, local_rows
    from trl_credit.core.logs import replace_logged_advantages

    assert fill_rows([[5, 6]], 3, [0]) == [[5, 6], [0], [0]]
    assert fill_rows([1, 2], 2, 9) == [1, 2]
    # process 2 of TRL's global batch with 4 rows per process holds rows 8..11
    trainer = SimpleNamespace(accelerator=SimpleNamespace(process_index=2))
    assert list(range(16))[local_rows(trainer, 4)] == [8, 9, 10, 11]
    # TRL's table keeps generation_batch_size entries: the newest rows' values land on its last entries
    trainer._logs = {"advantages": deque([0.0, 0.0, 1.0, 2.0, 3.0], maxlen=5)}
    replace_logged_advantages(trainer, [-1.0, -2.0, -3.0])
    assert list(trainer._logs["advantages"]) == [0.0, 0.0, -1.0, -2.0, -3.0]
    trainer._logs = {"advantages": deque([1.0, 2.0], maxlen=2)}  # an evaluation batch longer than the table
    replace_logged_advantages(trainer, [-1.0, -2.0, -3.0])
    assert list(trainer._logs["advantages"]) == [-2.0, -3.0]
