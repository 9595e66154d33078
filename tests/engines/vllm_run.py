"""One trainer, two steps, on a colocated vLLM engine (vLLM's CPU build), recording what reached vLLM.

Run by tests/engines/test_vllm_colocate.py, one fresh process per case (each builds its own engine, as a user's run
does): ``python tests/engines/vllm_run.py CASE MODEL_DIR OUT_JSON``. It writes what the test asserts:

- ``calls``: every ``LLM.generate`` call, with each row's sampling parameters as vLLM received them (temperature,
  max_tokens, stop strings, logprobs) and the number of tokens vLLM generated for the row;
- ``pushes``: after each weight push, whether vLLM holds the policy's weights: every parameter vLLM keeps readable
  (embeddings, head, norms) equal to the policy's in vLLM's dtype, and vLLM's log-probs of a fixed probe sequence
  (which go through the repacked linear layers) against the policy's now and at the start;
- ``batches``: per generation batch, how far vLLM's sampling log-probs are from the trainer's own (``old``) ones on
  the completion tokens, and whether every completion token has one.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: tiny.py's helpers

PROBE = list(range(5, 37))  # token ids of the probe sequence (the tiny vocabulary has 448)


def accuracy_like(completions, **kwargs):  # "accuracy" first: variance on random text (parity of the length)
    return [float(len(c[0]["content"]) % 2) for c in completions]


def format_like(completions, **kwargs):  # "format" second
    return [0.5 * float(len(c[0]["content"]) < 20) for c in completions]


def step_parity(prompt, completion, steps, **row):  # process credit's step rewards: signal on random text
    return [float(len(step) % 2) for step in steps]


def build(case: str, model: str, output_dir: str):
    import trl_credit
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from trl_credit.tasks.data import make_arithmetic_dataset
    from trl_credit.trl_bridge.vllm_push import fix_colocate_push

    dataset = make_arithmetic_dataset(num_train=8, num_test=2, seed=0)["train"]
    common = dict(
        output_dir=output_dir, report_to="none", use_cpu=True, bf16=False, seed=0, max_steps=2, logging_steps=1,
        save_strategy="no", per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
        learning_rate=5e-2, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=2048,
        vllm_gpu_memory_utilization=0.05,
    )
    # thoughts split at spaces: the random tiny model writes no newlines, and a one-thought seed needs no localization
    srpo = dict(num_generations=8, thought_delimiter=" ", localization_max_tokens=6)
    peft_config = None
    if case in ("grpo", "grpo_trl_push"):  # TRL's own trainer: with the bridge's push fix (the control), or without
        trainer = GRPOTrainer(model=model, reward_funcs=[accuracy_like, format_like], args=GRPOConfig(**common),
                              train_dataset=dataset)
        assert case == "grpo_trl_push" or fix_colocate_push(trainer)
        return trainer
    if case in ("srpo_generate_lora", "prime_lora"):
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    # PRIME: the paper's prompt filter without its truncation test (the tiny model truncates most rows at 12 tokens);
    # with LoRA the PRM is a second adapter, which must never reach vLLM (the push checks vLLM holds the policy's)
    prime = dict(credit="implicit_prm", prime_learning_rate=1e-2, prime_filter_truncated=False)
    trainer_name, config_name, fields = {
        "cue_grpo": ("CueGRPOTrainer", "CueGRPOConfig", {}),
        "oppo": ("OPPOTrainer", "OPPOConfig", {}),
        "datpo": ("DATPOTrainer", "DATPOConfig", {}),
        "srpo_scored": ("SRPOTrainer", "SRPOConfig", dict(srpo, localization="scored")),
        "srpo_generate_lora": ("SRPOTrainer", "SRPOConfig", dict(srpo, localization="generate")),
        "resets_oppo": ("CreditTrainer", "CreditConfig", dict(srpo, rollout="resets", credit="oppo")),
        "process": ("CreditTrainer", "CreditConfig",
                    dict(credit="process", process_step_reward="engines_step_parity", process_thought_delimiter=" ")),
        "prime": ("CreditTrainer", "CreditConfig", prime),
        "prime_lora": ("CreditTrainer", "CreditConfig", prime),
    }[case]
    if case == "process":
        from trl_credit.process import register_step_reward

        register_step_reward("engines_step_parity", step_parity)
    args = getattr(trl_credit, config_name)(**{**common, **fields})
    return getattr(trl_credit, trainer_name)(model=model, reward_funcs=[accuracy_like, format_like], args=args,
                                             train_dataset=dataset, peft_config=peft_config)


def params_of(sampling_params) -> dict:
    return {"temperature": sampling_params.temperature, "max_tokens": sampling_params.max_tokens,
            "stop": list(sampling_params.stop or []), "logprobs": sampling_params.logprobs, "n": sampling_params.n}


def policy_probe_logps(trainer) -> torch.Tensor:
    model = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        logits = model(torch.tensor([PROBE])).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(PROBE[1:])[:, None])[:, 0]


def main(case: str, model_dir: str, out_path: str) -> None:
    from vllm import SamplingParams

    trainer = build(case, model_dir, os.path.join(os.path.dirname(out_path), f"out_{case}"))
    vllm_generation = trainer.vllm_generation
    llm = vllm_generation.llm
    engine_generate = llm.generate
    push_name = getattr(vllm_generation.sync_weights, "__func__", vllm_generation.sync_weights).__name__
    report = {"calls": [], "pushes": [], "batches": [], "push": push_name}

    def recording_generate(prompts, sampling_params=None, *args, **kwargs):
        outputs = engine_generate(prompts, sampling_params, *args, **kwargs)
        rows = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        report["calls"].append({
            "step": trainer.state.global_step,
            "rows": [params_of(p) for p in rows],
            "generated": [len(o.outputs[0].token_ids) for o in outputs],
            "logprobs_back": all(o.outputs[0].logprobs is not None and len(o.outputs[0].logprobs) ==
                                 len(o.outputs[0].token_ids) for o in outputs),
        })
        return outputs

    llm.generate = recording_generate
    initial = policy_probe_logps(trainer)
    push = vllm_generation.sync_weights

    def checked_push():
        push()
        readable, equal = 0, 0
        engine = dict(llm.llm_engine.model_executor.driver_worker.model_runner.model.named_parameters())
        for name, tensor in vllm_generation._iter_named_params():  # the names and (merged) weights TRL pushes
            held = engine.get(name)
            if held is None or held.numel() == 0 or held.shape != tensor.shape:
                continue  # repacked (CPU linear layers) or fused (qkv, gate_up): checked through the probe
            readable += 1
            equal += int(torch.equal(held, tensor.to(held.dtype)))
        probe = engine_generate([{"prompt_token_ids": PROBE}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                                use_tqdm=False)[0]
        engine_logps = torch.tensor([next(iter(d.values())).logprob if len(d) == 1 else d[t].logprob
                                     for d, t in zip(probe.prompt_logprobs[1:], PROBE[1:])])
        now = policy_probe_logps(trainer)
        report["pushes"].append({
            "step": trainer.state.global_step, "readable": readable, "equal": equal,
            "probe_vs_policy": float((engine_logps - now).abs().max()),
            "probe_vs_initial": float((engine_logps - initial).abs().max()),
            "policy_moved": float((now - initial).abs().max()),
        })

    vllm_generation.sync_weights = checked_push
    trl_method = trainer._generate_and_score_completions

    def recording_batch(inputs):
        output = trl_method(inputs)
        mask = output["completion_mask"].bool()
        sampling = output.get("sampling_per_token_logps")
        old = output.get("old_per_token_logps")
        entry = {"step": trainer.state.global_step, "rows": int(mask.size(0)), "has_sampling": sampling is not None}
        if sampling is not None:
            entry["sampling_finite"] = bool(torch.isfinite(sampling[mask]).all())
            if old is not None:
                entry["sampling_vs_old_mean"] = float((sampling[mask] - old[mask]).abs().mean())
        report["batches"].append(entry)
        return output

    trainer._generate_and_score_completions = recording_batch
    trainer.train()
    report["global_step"] = trainer.state.global_step
    report["logged"] = sorted({key for log in trainer.state.log_history for key in log})
    with open(out_path, "w") as handle:
        json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
