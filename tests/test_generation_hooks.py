"""trl_credit.generation.hooks: transformers-only generation internals, usable without TRL."""

import json
import subprocess
import sys
import textwrap

# Runs in a fresh interpreter in which `import trl` fails. A duck-typed trainer (what the hooks read of TRL's) drives
# HF generate with two copies of one prompt (shared prefill), per-row budgets 2 and 6 and a GenerationRecorder.
_SCRIPT = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class BlockTRL(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "trl" or name.startswith("trl."):
                raise ImportError(f"{name} is blocked in this test")

    sys.meta_path.insert(0, BlockTRL())
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from trl_credit.generation.hooks import GenerationRecorder, hf_generate_hooks

    path = sys.argv[1]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    trainer = SimpleNamespace(
        use_vllm=False, use_transformers_continuous_batching=False, _tokenizer=tokenizer, eos_token_ids=[-1],
        model=model, model_wrapped=model,
        accelerator=SimpleNamespace(unwrap_model=lambda m: m, num_processes=1, state=SimpleNamespace()),
    )
    prompt = tokenizer("Consider the equation 2x + 3 = 11.", return_tensors="pt")
    config = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=None)
    recorder = GenerationRecorder(1.0, logps=True)
    with torch.no_grad(), hf_generate_hooks(trainer, [2, 6]), recorder.attached(trainer):
        out = model.generate(input_ids=prompt["input_ids"].repeat(2, 1),
                             attention_mask=prompt["attention_mask"].repeat(2, 1), generation_config=config)
    start = prompt["input_ids"].size(1)
    rows = [out[0, start : start + 2].tolist(), out[1, start:].tolist()]
    with torch.no_grad():  # the reference: plain generate of one row, and a forward pass over it
        alone = model.generate(**prompt, generation_config=config)[0, start:].tolist()
        logits = model(input_ids=torch.tensor([prompt["input_ids"][0].tolist() + alone])).logits[0, start - 1 : -1]
    reference = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(alone)[:, None]).squeeze(1).tolist()
    print(json.dumps({"rows": rows, "padding": out[0, start + 2 :].tolist(), "alone": alone,
                      "recorded": recorder.logps(rows), "reference": reference,
                      "trl_loaded": any(name == "trl" or name.startswith("trl.") for name in sys.modules)}))
    """
)


def test_generation_hooks_work_without_trl(tiny_model_path, tmp_path):
    script = tmp_path / "no_trl.py"
    script.write_text(_SCRIPT)
    done = subprocess.run([sys.executable, str(script), tiny_model_path], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["trl_loaded"]
    assert len(result["alone"]) == 6
    assert result["rows"] == [result["alone"][:2], result["alone"]]  # each row stopped at its own budget
    assert set(result["padding"]) == {result["padding"][0]} and len(result["padding"]) == 4
    # The recorder skipped the shared prefill's forward: its log-probs line up with the tokens, as a forward gives.
    recorded = result["recorded"]
    assert recorded is not None and [len(r) for r in recorded] == [2, 6]
    for got, want in zip(recorded[1], result["reference"]):
        assert abs(got - want) < 1e-4
    for got, want in zip(recorded[0], result["reference"][:2]):
        assert abs(got - want) < 1e-4
