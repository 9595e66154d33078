"""One trainer, two steps, on a colocated vLLM engine (vLLM's CPU build), recording what reached vLLM.

Run by tests/engines/test_vllm_colocate.py, one fresh process per case (each builds its own engine, as a user's run
does): ``python tests/engines/vllm_run.py CASE MODEL_DIR OUT_JSON``. It writes what the test asserts:

- ``calls``: every ``LLM.generate`` call, with each row's sampling parameters as vLLM received them (temperature,
  max_tokens, stop strings, logprobs) and the number of tokens vLLM generated for the row;
- ``pushes``: after each weight push, whether vLLM holds the policy's weights: every parameter vLLM keeps readable
  (embeddings, head, norms) equal to the policy's in vLLM's dtype, and vLLM's log-probs of a fixed probe sequence
  (which go through the repacked linear layers) against the policy's now and at the start;
- ``batches``: per generation batch, how far vLLM's sampling log-probs are from the trainer's own (``old``) ones on
  the completion tokens (the model's: not on a tool result), and whether every one has one;
  with tools, each row's tool-result text and model text, and the per-token advantages on each
  (``model_mask_is_tool_mask``: our trainers' record marks the model's tokens as TRL's ``tool_mask`` does).

CASE is a trainer of tests/engine_trainers_common.py (built with this suite's ``ENGINE``), ``grpo_trl_push`` (TRL's
push, without the bridge's fix), or ``tools_NAME``: trainer NAME with TRL's ``tools=[multiply]`` on the tool-calling
tiny model (MODEL_DIR: tests/tiny_tools.py's ``build_tool_calling_model``); a trainer that refuses tools writes
``{"refused": message}``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: tiny.py's helpers

from tests.engine_trainers_common import Engine  # noqa: E402
from tests.engine_trainers_common import build as build_trainer  # noqa: E402

PROBE = list(range(5, 37))  # token ids of the probe sequence (the tiny vocabulary has 448)
#: The tools cases' probe: a tool call as the tool-calling model writes it. Its log-probs are near 0 where the random
#: probe's are large and negative, which vLLM's bf16 rounds by 0.056 on that sharper model.
TOOL_PROBE_TEXT = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'


def accuracy_like(completions, **kwargs):  # "accuracy" first: variance on random text (parity of the length)
    return [float(len(c[0]["content"]) % 2) for c in completions]


def format_like(completions, **kwargs):  # "format" second
    return [0.5 * float(len(c[0]["content"]) < 20) for c in completions]


def step_parity(prompt, completion, steps, **row):  # process credit's step rewards: signal on random text
    return [float(len(step) % 2) for step in steps]


def token_parity(completion_ids, **kwargs):  # the tools cases' "accuracy": variance whatever the model answers
    return [float(sum(ids) % 2) for ids in completion_ids]


def tool_answered(completions, **kwargs):  # the tools cases' "format": the row called the tool and got its result
    return [float(any(m["role"] == "tool" for m in c)) for c in completions]


#: The vLLM suite's engine settings (tests/engine_trainers_common.py builds every trainer from them): 2 prompts x 4
#: generations a step, a large learning rate (the weight pushes must move vLLM visibly), vLLM colocated.
COMMON = dict(
    report_to="none", use_cpu=True, bf16=False, seed=0, max_steps=2, logging_steps=1, save_strategy="no",
    per_device_train_batch_size=8, num_generations=4, max_completion_length=12, learning_rate=5e-2, use_vllm=True,
    vllm_mode="colocate", vllm_max_model_length=2048, vllm_gpu_memory_utilization=0.05,
)
ENGINE = Engine(
    args=COMMON,
    rewards=[accuracy_like, format_like],
    # thoughts split at spaces: the random tiny model writes no newlines, and a one-thought seed needs no localization
    srpo=dict(num_generations=8, thought_delimiter=" ", localization_max_tokens=6),
    lora=dict(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    step_reward=step_parity,
    overrides={"process": dict(process_thought_delimiter=" ")},
)
#: The tools cases (``tools_NAME``): the tool-calling tiny model (tests/tiny_tools.py) on "What is A times B?" with
#: TRL's ``tools=[multiply]``: a call (~30 tokens), its result, the answer fit in TOOLS_CAP. A 100x smaller learning
#: rate: at 5e-2 (or 5e-3) one step wipes out the warm start and the second step's rollouts call no tool.
TOOLS_CAP = 96
#: SRPO's resets roll out the chat prompt as it is (rollout_template "none"): the warm start taught tool calls after
#: the chat prompt, not after SRPO's paper template.
TOOLS_ENGINE = replace(ENGINE, args={**COMMON, "max_completion_length": TOOLS_CAP, "learning_rate": 5e-4},
                       rewards=[token_parity, tool_answered], srpo={**ENGINE.srpo, "rollout_template": "none"})


def build(case: str, model: str, output_dir: str):
    from trl_credit.trl_bridge.vllm_push import fix_colocate_push

    if case.startswith("tools_"):
        from tiny_tools import multiply, multiply_dataset

        name = case[len("tools_"):]
        trainer = build_trainer(name, model, output_dir, TOOLS_ENGINE, train_dataset=multiply_dataset(8, seed=0),
                                tools=[multiply])
    else:  # grpo_trl_push: TRL's own trainer without the bridge's push fix (grpo: with it, the control)
        name = case
        trainer = build_trainer("grpo" if case == "grpo_trl_push" else case, model, output_dir, ENGINE)
    if name == "grpo":  # our trainers install the fix themselves
        assert fix_colocate_push(trainer)
    return trainer


def params_of(sampling_params) -> dict:
    return {"temperature": sampling_params.temperature, "max_tokens": sampling_params.max_tokens,
            "stop": list(sampling_params.stop or []), "logprobs": sampling_params.logprobs, "n": sampling_params.n}


def policy_probe_logps(trainer, probe: list[int]) -> torch.Tensor:
    model = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        logits = model(torch.tensor([probe])).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(probe[1:])[:, None])[:, 0]


def tool_entry(trainer, output) -> dict:
    """A multi-turn batch: per row, the text of its tool results (the completion's ``tool_mask`` = 0 tokens) and of
    the model's tokens; with per-token advantages, the largest one on the tool results and on the model's tokens (a
    per-sequence advantage is kept off the tool results by ``tool_mask`` in TRL's loss)."""
    tokenizer = trainer.processing_class
    completion, model = output["completion_mask"].bool(), output["tool_mask"].bool()
    tools = completion & ~model
    entry = {
        "tool_spans": [tokenizer.decode(ids[row].tolist()) for ids, row in zip(output["completion_ids"], tools)],
        "model_texts": [tokenizer.decode(ids[row].tolist())
                        for ids, row in zip(output["completion_ids"], completion & model)],
        "per_token": output["advantages"].dim() == 2,
    }
    if entry["per_token"]:
        advantages = output["advantages"].abs()
        entry["max_advantage_on_tools"] = float(advantages[tools].max()) if tools.any() else 0.0
        entry["max_advantage_on_model"] = float(advantages[completion & model].max())
    return entry


def main(case: str, model_dir: str, out_path: str) -> None:
    from vllm import SamplingParams

    # A trainer that refuses tools: the test checks what it said. One a process: TRL's __init__ started the engine
    # before the refusal, and a second engine in the same process finds no memory left for its cache.
    try:
        trainer = build(case, model_dir, os.path.join(os.path.dirname(out_path), f"out_{case}"))
    except ValueError as error:
        if not case.startswith("tools_"):
            raise
        with open(out_path, "w") as handle:
            json.dump({"refused": str(error)}, handle)
        return
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
    probe_ids = PROBE
    if case.startswith("tools_"):
        probe_ids = trainer.processing_class.encode(TOOL_PROBE_TEXT, add_special_tokens=False)
    initial = policy_probe_logps(trainer, probe_ids)
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
        probe = engine_generate([{"prompt_token_ids": probe_ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                                use_tqdm=False)[0]
        engine_logps = torch.tensor([next(iter(d.values())).logprob if len(d) == 1 else d[t].logprob
                                     for d, t in zip(probe.prompt_logprobs[1:], probe_ids[1:])])
        now = policy_probe_logps(trainer, probe_ids)
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
        entry = {"step": trainer.state.global_step, "rows": int(mask.size(0))}
        if "tool_mask" in output:  # vLLM sampled the model's tokens only: a tool result has no sampling log-prob
            entry.update(tool_entry(trainer, output))
            mask = mask & output["tool_mask"].bool()
        sampling = output.get("sampling_per_token_logps")
        old = output.get("old_per_token_logps")
        entry["has_sampling"] = sampling is not None
        if sampling is not None:
            entry["sampling_finite"] = bool(torch.isfinite(sampling[mask]).all())
            if old is not None:
                entry["sampling_vs_old_mean"] = float((sampling[mask] - old[mask]).abs().mean())
        report["batches"].append(entry)
        return output

    trainer._generate_and_score_completions = recording_batch
    if hasattr(trainer, "add_credit_callback"):  # our trainers: the record's model mask, as the credit read it
        def record_model_mask(step):
            if step.record is not None and "tool_mask" in step.output:
                # the record's rows are the first of the training rows (DATPO's trees: its base rows, then the
                # branches, padded to their own width); rows past the record carry TRL's tool_mask of the resumed loop
                model_mask, tool_mask = step.record.model_mask.bool(), step.output["tool_mask"].bool()
                rows, width = model_mask.size(0), min(model_mask.size(1), tool_mask.size(1))
                model_mask = model_mask[:, :width]
                base_tool_mask = tool_mask[:rows, :width]
                report["model_mask_is_tool_mask"].append(bool(torch.equal(model_mask, base_tool_mask)))
                # a reset row's tool_mask (its loss mask) also hides its prefix: the model's tokens, not trained
                report["model_mask_covers_tool_mask"].append(bool((model_mask | ~base_tool_mask).all()))
                results = step.output["completion_mask"].bool() & ~tool_mask  # the tool results, and only those
                results[:rows, :width] = step.output["completion_mask"][:rows, :width].bool() & ~model_mask
                advantages = step.output["advantages"]
                if advantages.dim() == 2:
                    report["max_advantage_on_tool_results"].append(
                        float(advantages.abs()[results].max()) if results.any() else 0.0)

        report["model_mask_is_tool_mask"], report["model_mask_covers_tool_mask"] = [], []
        report["max_advantage_on_tool_results"] = []
        trainer.add_credit_callback(record_model_mask)
    trainer.train()
    report["global_step"] = trainer.state.global_step
    report["logged"] = sorted({key for log in trainer.state.log_history for key in log})
    with open(out_path, "w") as handle:
        json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
