"""Golden values of credit="implicit_prm" (PRIME): two fixed-seed steps on the tiny model, full weights with the
``grpo`` loss and LoRA with the ``dapo`` loss, and full weights with the paper's prompt filter (float32), pinned in tests/golden/prime.json: the generated token ids
exactly, the advantages reaching TRL's loss, the prime/ metrics, the losses and a checksum of the PRM's weights
within rtol 1e-6 (as tests/test_golden.py, on the recording machine's kind of CPU). A refactor changes none of them;
a change meant to move them re-records, saying which moved and why:

    python -m tests.test_prime_golden     # rewrites tests/golden/prime.json (~20 s)

Kept apart from tests/golden/{one,two}_process(es).json so that recording PRIME's values touches no other
method's file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "prime.json")
RTOL, ATOL = 1e-6, 1e-7
SCENARIOS = {
    "full/grpo": dict(loss_type="grpo"),
    "lora/dapo": dict(loss_type="dapo", learning_rate=1e-3, prime_learning_rate=1e-3),
    # the paper's prompt filter (on by default; tiny_args turns it off for the scenarios above, recorded before it
    # existed): the accuracy bounds only, since the tiny model truncates most rows at 10 tokens
    "full/grpo/filter": dict(loss_type="grpo", prime_prompt_filter=True, prime_filter_truncated=False),
}


def run_scenario(name: str, model_dir: str, output_dir: str) -> dict:
    import torch

    from tests.test_prime_trainer import accuracy_reward, format_reward, tiny_args
    from tests.tiny import recorded
    from trl_credit.core.trainer import CreditTrainer
    from trl_credit.tasks.data import make_arithmetic_dataset

    kwargs = {}
    if name.startswith("lora"):
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    args = tiny_args(output_dir, max_steps=2, bf16=False, **SCENARIOS[name])
    trainer = CreditTrainer(model_dir, [accuracy_reward, format_reward], args=args,
                            train_dataset=make_arithmetic_dataset(num_train=8, num_test=4, seed=0)["train"],
                            **kwargs)
    batches, _ = recorded(trainer)
    trainer.train()
    prm = trainer.credit.prm
    checksum = float(sum(p.double().abs().sum() for p in prm.parameters))
    logs = [{k: v for k, v in entry.items() if k.startswith("prime/") or k == "loss"}
            for entry in trainer.state.log_history if "prime/prm_loss" in entry]
    return {
        "completion_ids": [b["completion_ids"].tolist() for b in batches],
        "advantages": [[[round(x, 9) for x in row] for row in b["advantages"].to(torch.float64).tolist()]
                       for b in batches],
        "logs": logs,
        "prm_checksum": checksum,
    }


def record(model_dir: str) -> dict:
    with tempfile.TemporaryDirectory() as work:
        return {name: run_scenario(name, model_dir, os.path.join(work, name.replace("/", "_"))) for name in SCENARIOS}


def _close(golden, fresh, where: str) -> list[str]:
    if isinstance(golden, dict):
        if set(golden) != set(fresh):
            return [f"{where}: keys {sorted(golden)} != {sorted(fresh)}"]
        return [d for k in golden for d in _close(golden[k], fresh[k], f"{where}.{k}")]
    if isinstance(golden, list):
        if len(golden) != len(fresh):
            return [f"{where}: length {len(golden)} != {len(fresh)}"]
        return [d for i, (g, f) in enumerate(zip(golden, fresh)) for d in _close(g, f, f"{where}[{i}]")]
    if isinstance(golden, int) and not isinstance(golden, bool):
        return [] if golden == fresh else [f"{where}: {golden} != {fresh}"]
    if isinstance(golden, float):
        return [] if abs(golden - fresh) <= ATOL + RTOL * abs(golden) else [f"{where}: {golden} != {fresh}"]
    return [] if golden == fresh else [f"{where}: {golden!r} != {fresh!r}"]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_prime_reproduces_its_golden_values(name, tiny_model_path, tmp_path):
    with open(GOLDEN) as handle:
        golden = json.load(handle)[name]
    fresh = json.loads(json.dumps(run_scenario(name, tiny_model_path, str(tmp_path))))
    assert any(abs(x) > 0.1 for batch in golden["advantages"] for row in batch for x in row)
    differences = _close(golden, fresh, name)
    assert not differences, "\n".join(differences[:20])


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.tiny import build_tiny_model

    model = build_tiny_model(tempfile.mkdtemp(prefix="prime_golden_model_"))
    values = record(model)
    with open(GOLDEN, "w") as handle:
        json.dump(values, handle, indent=1)
    print(f"wrote {GOLDEN}: {', '.join(values)}")
