"""SRPOTrainer: GRPOTrainer with SRPO / RRPO reset-and-resample rollouts (docs/srpo.md, paper §4, Algorithm 2).

How it hooks into TRL 1.16.0's GRPOTrainer (everything else - tokenizing, reward calls, log-prob passes, loss,
vLLM / DeepSpeed / PEFT handling - is TRL's):

- Rollouts: the trainer installs its own rollout function on TRL's ``rollout_func`` hook (users cannot pass one).
  TRL's ``_generate`` calls it with this process's prompt rows; it returns, for every prompt (``num_generations``
  consecutive rows, all on this process), the base rows then the shared-prefix rows, and an ``env_mask`` (TRL's
  ``tool_mask``) that is 0 on each shared-prefix row's prefix and on fallback rows. TRL then decodes, scores,
  computes log-probs and masks the loss with it. Every generation goes through ``generate_from_prefixes``
  (``_generate_single_turn``), so HF generate and vLLM both work; every call is collective and made the same
  number of times on every process.
- Rewards: ``_calculate_rewards`` is wrapped to capture the global rewards of the batch; seed candidates are scored
  through TRL's ``_calculate_rewards`` too (padded to the same row count on every process, because it ends with a
  ``gather``), with reward-function side logs discarded.
- Advantages: ``_generate_and_score_completions`` is wrapped: after ``super()``, ``output["advantages"]`` is
  replaced by group-relative advantages within each sub-group (base group, each shared-prefix group; docs/srpo.md#advantages).
- Evaluation (``model.eval()``): plain iid generation from the wrapped prompts and TRL's GRPO advantages.
"""

from __future__ import annotations

import math
import random
import textwrap
from collections import defaultdict
from typing import Any

import torch
from trl import GRPOTrainer

from trl_credit._trl import (
    bind_success,
    check_single_turn,
    gather_counts,
    generate_from_prefixes,
    log_metric,
    nonfinite_reward_groups,
    refuse_empty_completions,
    resolve_method_args,
    rewards_of_extra_rows,
    rollout_success,
    warn_once,
)
from trl_credit.model_card import MethodModelCardMixin
from trl_credit.srpo.advantages import grouped_advantages, normalize_then_sum_advantages, srpo_group_ids
from trl_credit.srpo.config import SRPOConfig
from trl_credit.srpo.prompts import (
    localization_prompt,
    parse_reset_step,
    question_of,
    resolve_rollout_template,
    stop_strings,
    wrap_prompt,
)
from trl_credit.srpo.resets import (
    ROW_BASE,
    ROW_FALLBACK,
    ROW_SUFFIX,
    choose_reset_step,
    incorrect_indices,
    prompt_rows,
    random_reset_step,
)
from trl_credit.srpo.thoughts import reset_prefix_length, split_thoughts, thought_texts
from trl_credit.success import total_rewards, unscorable_rows

__all__ = ["SRPOTrainer"]


class SRPOTrainer(MethodModelCardMixin, GRPOTrainer):
    """Self-Reset (``reset="self"``) and Random-Reset (``reset="random"``) Policy Optimization on top of GRPOTrainer.

    Per prompt and training step (paper §4.2, Algorithm 2): a base group of iid rollouts; seed candidates sampled
    in rounds until the prompt has ``reset_groups`` incorrect rollouts (never part of the base group); for each
    seed a reset thought h* (SRPO: the policy's own localization of the first erroneous thought, greedy;
    RRPO: uniform); ``suffixes_per_reset`` suffixes resampled from the reset state ``question + thoughts
    1..h*-1``, trained with the prefix masked out. Without an incorrect seed the reset group falls back to GRPO on
    the base group (its rows get zero advantage and zero loss mask).

    Metrics (``srpo/``, every step; pass rates leave out unscorable rows):

    - ``fallback_rate``: reset groups without an incorrect seed (trained as GRPO on the base group).
    - ``reset_position``: mean ``(h* - 1) / H_s``, the fraction of the seed's thoughts kept as the reset prefix: 0 is
      a reset at the question (h* = 1, no prefix), ``(H_s - 1) / H_s`` a reset at the last thought.
    - ``reset_at_question_rate``: resets with h* = 1 (no prefix: the suffixes are iid rollouts of the question).
    - ``single_thought_rate``: seeds with one thought (H_s = 1), which can only reset at the question; with a model
      that never writes ``thought_delimiter`` it is 1 and SRPO degenerates to GRPO on two groups (warned once).
    - ``localization_parse_rate``: SRPO localization answers that named a step as ``\\boxed{N}`` (or a bare
      integer ending with EOS); the rest reset uniformly at random (warned once when under half parse).
    - ``correction_rate`` (shared-prefix rows the verifier calls correct), ``base_pass_rate`` (base rows).
    - ``tokens_vs_grpo``: every generated token (base + seed candidates + localization + suffixes) over a GRPO
      step of the same budget (``num_generations`` iid rollouts of this step's mean iid rollout length);
      ``paper_tokens_vs_grpo``: base + suffix tokens only, over the same (the paper's accounting);
      ``tokens_vs_base``: every generated token over the base group's.
    - ``seed_rounds``, ``thoughts_per_seed``.

    Note: TRL's own ``reward``/``completions/*`` metrics average over all rows, shared-prefix rows included
    (their completion length counts suffix tokens only; fallback rows count 0).
    """

    _tag_names = ["trl", "srpo", "rrpo", "trl_credit"]
    _name = "SRPO"
    _paper = {
        "title": "Credit Assignment with Resets in Language Model Reasoning",
        "id": "2605.25507",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{samanta2026credit,
                title        = {{Credit Assignment with Resets in Language Model Reasoning}},
                author       = {Ankur Samanta and Akshayaa Magesh and Ayush Jain and Youliang Yu and Daniel Jiang and Kavosh Asadi and Kaveh Hassani and Paul Sajda and Jalaj Bhandari and Yonathan Efroni},
                year         = 2026,
                eprint       = {arXiv:2605.25507},
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: SRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        **kwargs,
    ):
        args = resolve_method_args(args, SRPOConfig, model, "SRPOTrainer", "SRPO")
        if kwargs.get("environment_factory") is not None:
            raise ValueError("SRPOTrainer does not support `environment_factory`.")
        if reward_funcs is None:
            # TRL's wording, so scripts and tests that match it keep working.
            raise ValueError(
                "No reward source provided. Pass `reward_funcs`: SRPOTrainer's seeds are the rollouts the "
                "`success_reward` function scores as incorrect."
            )
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            **kwargs,
        )
        check_single_turn(self, "SRPOTrainer")
        bind_success(self)
        per_process = args.per_device_train_batch_size * args.steps_per_generation
        if per_process % self.num_generations != 0:
            raise ValueError(
                f"SRPOTrainer needs whole prompt groups on each process: per_device_train_batch_size * "
                f"steps_per_generation ({per_process}) must be a multiple of num_generations ({self.num_generations})."
            )
        self._rollout_template = resolve_rollout_template(args.rollout_template)
        _check_prompt_format(train_dataset, self._rollout_template)
        seed = args.seed if args.reset_seed is None else args.reset_seed
        # One generator per process (different streams), deterministic in the seed.
        self._reset_rng = random.Random(1_000_003 * int(seed) + self.accelerator.process_index)
        self._srpo_inputs: list[dict] | None = None
        self._srpo_row_kinds: list[int] | None = None
        self._srpo_rewards_per_func: torch.Tensor | None = None
        # TRL's custom-rollout hook: GRPOTrainer._generate calls it and handles everything downstream.
        self.rollout_func = self._srpo_rollout

    # ------------------------------------------------------------------ checkpoints (MethodRNGStateMixin)

    def _method_rng_state(self) -> dict:
        version, internal, gauss_next = self._reset_rng.getstate()
        return {"reset_rng": [version, list(internal), gauss_next]}

    def _set_method_rng_state(self, state: dict) -> None:
        version, internal, gauss_next = state["reset_rng"]
        self._reset_rng.setstate((version, tuple(internal), gauss_next))

    # ------------------------------------------------------------------ TRL hooks

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._srpo_rewards_per_func = rewards_per_func  # global (all processes), for the sub-group advantages
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._srpo_inputs = inputs
        self._srpo_row_kinds = None
        self._srpo_rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        if self._srpo_row_kinds is not None:  # training step with SRPO rollouts
            output["advantages"] = self._srpo_advantages(output["advantages"])
        self._srpo_inputs = None
        self._log_credit(output)  # suffix rows show their shared prefix struck (tool_mask 0)
        return output

    # ------------------------------------------------------------------ rollouts

    def _srpo_rollout(self, prompts: list, trainer=None) -> dict[str, Any]:
        wrapped = [wrap_prompt(prompt, self._rollout_template) for prompt in prompts]
        if not self.model.training:
            # Evaluation: iid rollouts from the thought-MDP prompt, as GRPO would sample them.
            prompt_ids = [list(ids) for ids in self._tokenize_prompts(wrapped)[0]]
            completion_ids, logprobs = self._generate_single_turn(prompt_ids, None, {}, self.num_generations_eval)
            return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}
        return self._reset_and_resample(prompts, wrapped)

    def _reset_and_resample(self, prompts: list, wrapped: list) -> dict[str, Any]:
        args: SRPOConfig = self.args
        size = self.num_generations
        base_size, num_resets, num_suffixes = args.num_base_generations, args.reset_groups, args.suffixes_per_reset
        from_base = args.seed_source == "base"
        per_round = 0 if from_base else args.seed_candidates_per_round
        if len(prompts) % size != 0:
            raise RuntimeError(f"SRPOTrainer got {len(prompts)} prompt rows, not a multiple of num_generations={size}.")
        num_groups = len(prompts) // size
        for group in range(num_groups):
            block = prompts[group * size : (group + 1) * size]
            if any(prompt != block[0] for prompt in block):
                raise RuntimeError(
                    "SRPOTrainer needs the num_generations rows of a prompt consecutive on one process (TRL's "
                    "RepeatSampler layout); this batch mixes prompts inside a group."
                )
        group_prompts = [prompts[g * size] for g in range(num_groups)]
        group_inputs = [self._srpo_inputs[g * size] for g in range(num_groups)]
        tokenized = self._tokenize_prompts([wrapped[g * size] for g in range(num_groups)])[0]
        prompt_ids = [list(map(int, ids)) for ids in tokenized]

        # Round 1: the base group and the first seed candidates, in one generation call.
        rows = []
        for g in range(num_groups):
            rows += [prompt_ids[g]] * (base_size + per_round)
        completions, logprobs = generate_from_prefixes(self, rows)
        has_logprobs = logprobs is not None
        base: list[list[tuple[list[int], list[float] | None]]] = []
        candidates: list[list[tuple[list[int], list[float] | None]]] = []
        for g in range(num_groups):
            start = g * (base_size + per_round)
            rollouts = [
                (completions[i], logprobs[i] if has_logprobs else None)
                for i in range(start, start + base_size + per_round)
            ]
            base.append(rollouts[:base_size])
            candidates.append(rollouts[base_size:])
        # A real row for padding collective reward calls.
        self._srpo_dummy = (0, (base[0] if from_base else candidates[0])[0][0])

        # Seeds: the first `num_resets` incorrect rollouts per prompt, in sampling order (paper §4.2): fresh
        # candidates, or (seed_source="base", Appendix D) the base group's own rollouts, with no extra generation.
        seeds: list[list[tuple[list[int], list[float] | None]]] = [[] for _ in range(num_groups)]
        first_round = [(g, c) for g in range(num_groups) for c in (base[g] if from_base else candidates[g])]
        empty_candidates = self._collect_seeds(first_round, group_prompts, group_inputs, prompt_ids, seeds, num_resets)
        scored_candidates = len(first_round)
        rounds = 0 if from_base else 1
        while not from_base and rounds < args.max_seed_rounds:
            needy = [g for g in range(num_groups) if len(seeds[g]) < num_resets]
            if sum(gather_counts(self, len(needy))) == 0:
                break  # every process is done: all stop together
            rows = [prompt_ids[g] for g in needy for _ in range(per_round)]
            new_completions, new_logprobs = generate_from_prefixes(self, rows)
            new_rollouts = []
            for i, g in enumerate(g for g in needy for _ in range(per_round)):
                rollout = (new_completions[i], new_logprobs[i] if new_logprobs is not None else None)
                candidates[g].append(rollout)
                new_rollouts.append((g, rollout))
            empty_candidates += self._collect_seeds(
                new_rollouts, group_prompts, group_inputs, prompt_ids, seeds, num_resets
            )
            scored_candidates += len(new_rollouts)
            rounds += 1

        # Reset thought per seed: SRPO asks the policy (one greedy call for every process), RRPO draws uniformly.
        tokenizer = self._tokenizer
        resets = []  # (group, seed ids, seed logprobs, thought ends, h*)
        localization_rows, localization_owner = [], []
        for g in range(num_groups):
            for seed_ids, seed_logprobs in seeds[g]:
                ends = split_thoughts(seed_ids, tokenizer, args.thought_delimiter)
                resets.append([g, seed_ids, seed_logprobs, ends, None])
        localization_tokens = localization_attempts = localization_parsed = 0
        single_thought = sum(len(ends) == 1 for _, _, _, ends, _ in resets)
        if args.reset == "self":
            for index, (g, seed_ids, _, ends, _) in enumerate(resets):
                if len(ends) == 1:
                    resets[index][4] = 1  # one thought: the only reset state is the question
                    continue
                texts = thought_texts(seed_ids, ends, tokenizer, args.thought_delimiter)
                text = localization_prompt(question_of(group_prompts[g]), texts, args.localization_template)
                is_text = isinstance(group_prompts[g], str)
                localization_rows.append(text if is_text else [{"role": "user", "content": text}])
                localization_owner.append(index)
            localization_ids = []
            if localization_rows:
                localization_ids = [list(map(int, ids)) for ids in self._tokenize_prompts(localization_rows)[0]]
            # Stop right after "\boxed{N}" (the answer the prompt asks for); the same strings on every process.
            most_steps = max(gather_counts(self, max((len(resets[i][3]) for i in localization_owner), default=0)))
            answers, _ = generate_from_prefixes(
                self,
                localization_ids,
                greedy=True,
                max_new_tokens=args.localization_max_tokens,
                stop_strings=stop_strings(most_steps) if most_steps else None,
            )
            eos_ids = set(self.eos_token_ids)
            for index, answer_ids in zip(localization_owner, answers):
                num_steps = len(resets[index][3])
                answer = tokenizer.decode(answer_ids, skip_special_tokens=True)
                ended_with_eos = bool(answer_ids) and int(answer_ids[-1]) in eos_ids
                parsed_step = parse_reset_step(answer, num_steps, ended_with_eos=ended_with_eos)
                step, localized = choose_reset_step(parsed_step, num_steps, self._reset_rng)
                resets[index][4] = step
                localization_tokens += len(answer_ids)
                localization_attempts += 1
                localization_parsed += int(localized)
        else:
            for reset in resets:
                reset[4] = random_reset_step(len(reset[3]), self._reset_rng)

        # Suffixes: `num_suffixes` iid continuations of every reset state x* = question + thoughts 1..h*-1.
        # Each suffix gets the budget max_completion_length minus its prefix, so prefix + suffix fits the row.
        suffix_rows, suffix_budgets, prefixes = [], [], []
        max_length = args.max_completion_length
        for g, seed_ids, seed_logprobs, ends, step in resets:
            keep = reset_prefix_length(ends, step)
            prefixes.append((seed_ids[:keep], seed_logprobs[:keep] if seed_logprobs is not None else None))
            suffix_rows += [prompt_ids[g] + seed_ids[:keep]] * num_suffixes
            suffix_budgets += [max(1, max_length - keep) if max_length is not None else None] * num_suffixes
        suffixes, suffix_logprobs = generate_from_prefixes(
            self, suffix_rows, max_new_tokens=suffix_budgets if max_length is not None else None
        )
        refuse_empty_completions(self, suffixes, "the generation of suffixes")  # training rows, as TRL's own

        # Assemble the rows TRL trains on: per prompt, base rows then each reset group's rows.
        out_prompt_ids, out_completions, out_masks, out_logprobs, kinds = [], [], [], [], []
        reset_cursor = 0
        for g in range(num_groups):
            slots = []
            for slot in range(num_resets):
                if slot >= len(seeds[g]):
                    slots.append(None)  # no incorrect seed: fallback rows
                    continue
                first_row = reset_cursor * num_suffixes
                suffix_rollouts = [
                    (suffixes[row], suffix_logprobs[row] if suffix_logprobs is not None else None)
                    for row in range(first_row, first_row + num_suffixes)
                ]
                slots.append((*prefixes[reset_cursor], suffix_rollouts))
                reset_cursor += 1
            # The fallback filler is a rollout already sampled with no incorrect verdict (the last non-empty
            # candidate).
            filler = next((c for c in reversed(candidates[g]) if c[0]), None) or base[g][-1]
            for completion, mask, lps, kind in prompt_rows(base[g], slots, num_suffixes, filler, max_length):
                out_prompt_ids.append(prompt_ids[g])
                out_completions.append(completion)
                out_masks.append(mask)
                out_logprobs.append(lps)
                kinds.append(kind)
        self._srpo_row_kinds = kinds

        # Metrics, summed over processes (one gather, made by every process).
        base_tokens = sum(len(ids) for g in range(num_groups) for ids, _ in base[g])
        suffix_tokens = sum(len(ids) for ids in suffixes)
        stats = [
            num_groups * num_resets,  # reset groups
            num_groups * num_resets - len(resets),  # fallbacks
            len(resets),  # seeds
            sum((step - 1) / len(ends) for _, _, _, ends, step in resets),  # kept fraction of the seed's thoughts
            sum(step == 1 for _, _, _, _, step in resets),  # resets at the question
            single_thought,
            sum(len(ends) for _, _, _, ends, _ in resets),
            localization_attempts,
            localization_parsed,
            base_tokens,
            sum(len(ids) for g in range(num_groups) for ids, _ in candidates[g]),  # seed-candidate tokens
            localization_tokens,
            suffix_tokens,
            sum(len(base[g]) + len(candidates[g]) for g in range(num_groups)),  # iid rollouts
            num_groups,
            empty_candidates,
            scored_candidates,
        ]
        totals = self.accelerator.gather(torch.tensor(stats, dtype=torch.float64, device=self.accelerator.device))
        (reset_groups, fallbacks, num_seeds, position_sum, at_question, single, thoughts_sum, attempts, parsed,
         base_tokens, seed_tokens, loc_tokens, suffix_tokens, iid_rollouts, prompts_total, empty, scored) = (
            totals.view(-1, len(stats)).sum(dim=0).tolist()
        )
        log_metric(self, "srpo/fallback_rate", fallbacks / reset_groups)
        log_metric(self, "srpo/seed_rounds", rounds)
        log_metric(self, "srpo/empty_candidate_rate", empty / scored if scored else 0.0)
        if empty:
            warn_once(
                self,
                "srpo/empty_candidate",
                f"SRPOTrainer: {empty:.0f} of {scored:.0f} seed candidates were empty (0 tokens), so they have no "
                "thought to reset from and were not taken as seeds (srpo/empty_candidate_rate). HF generate and vLLM "
                "return the EOS token when the model stops at once; check a custom generation.",
            )
        if fallbacks == reset_groups:
            trained_as = "as GRPO on the base groups" if base_size else "nothing (this split has no base group)"
            warn_once(
                self,
                "srpo/no_seed",
                f"SRPOTrainer found no incorrect seed for any prompt of a step, so it trained {trained_as} "
                f"(srpo/fallback_rate = 1). A seed is a rollout whose `success_reward` function (reward "
                f"function {self.reward_func_names[self._success_index]!r}) scores below success_threshold="
                f"{args.success_threshold}: check that this is the verifier (accuracy), not a format reward.",
            )
        if fallbacks and not base_size:
            # No base group to fall back to: a prompt without an incorrect seed has only masked rows.
            warn_once(
                self,
                "srpo/no_base_group_fallback",
                f"SRPOTrainer: {fallbacks:.0f} of {reset_groups:.0f} reset groups found no incorrect seed "
                f"(srpo/fallback_rate), and the split num_generations={size} = reset_groups x suffixes_per_reset "
                f"({num_resets} x {num_suffixes}) has no base group to fall back to, so those prompts add nothing to "
                "the loss (their rows are masked). Fix: num_generations >= 4 (the default split then keeps a base "
                "group of ceil(num_generations / 2)) or an explicit split with a base group; or more seed rounds "
                "(max_seed_rounds) if the verifier does fail sometimes.",
            )
        if num_seeds:
            log_metric(self, "srpo/reset_position", position_sum / num_seeds)
            log_metric(self, "srpo/reset_at_question_rate", at_question / num_seeds)
            log_metric(self, "srpo/single_thought_rate", single / num_seeds)
            log_metric(self, "srpo/thoughts_per_seed", thoughts_sum / num_seeds)
            if single / num_seeds > 0.5:
                warn_once(
                    self,
                    "srpo/single_thought",
                    f"SRPOTrainer: {single:.0f} of {num_seeds:.0f} seeds have a single thought "
                    f"(srpo/single_thought_rate), so they can only reset at the question and SRPO degenerates to "
                    f"GRPO on two groups. Cause: the model does not write thought_delimiter={args.thought_delimiter!r}. "
                    "Fix: set `thought_delimiter` to what the model writes between steps (e.g. '\\n' with "
                    "rollout_template='lines' for small models), or a `rollout_template` the model follows.",
                )
        if attempts:
            log_metric(self, "srpo/localization_parse_rate", parsed / attempts)
            if parsed / attempts < 0.5:
                warn_once(
                    self,
                    "srpo/localization_unparsed",
                    f"SRPOTrainer: {attempts - parsed:.0f} of {attempts:.0f} localization answers did not name a "
                    "step as \\boxed{N} (srpo/localization_parse_rate), so those resets were drawn uniformly at "
                    "random (RRPO). Fix: a `localization_template` the model follows, a larger "
                    "`localization_max_tokens`, or reset='random' if the model cannot localize.",
                )
        generated = base_tokens + seed_tokens + loc_tokens + suffix_tokens
        if base_tokens:
            log_metric(self, "srpo/tokens_vs_base", generated / base_tokens)
        iid_tokens = base_tokens + seed_tokens
        if iid_tokens:
            grpo_tokens = prompts_total * size * iid_tokens / iid_rollouts  # a GRPO step with the same budget
            log_metric(self, "srpo/tokens_vs_grpo", generated / grpo_tokens)
            log_metric(self, "srpo/paper_tokens_vs_grpo", (base_tokens + suffix_tokens) / grpo_tokens)

        return {
            "prompt_ids": out_prompt_ids,
            "completion_ids": out_completions,
            "logprobs": out_logprobs if has_logprobs else None,
            "env_mask": out_masks,
        }

    def _collect_seeds(self, rollouts, group_prompts, group_inputs, prompt_ids, seeds, num_resets) -> int:
        """Score ``rollouts`` (``[(group, (ids, logprobs))]``, in sampling order) and append each group's incorrect
        ones to ``seeds[group]`` until it holds ``num_resets``. An empty rollout (0 tokens) has no thought to reset
        from: never a seed. Returns the number of empty rollouts. Collective (reward call)."""
        verifier = self._verifier_rewards(
            [g for g, _ in rollouts], [r[0] for _, r in rollouts], group_prompts, group_inputs, prompt_ids
        )
        empty = [index for index, (_, (ids, _)) in enumerate(rollouts) if len(ids) == 0]
        for index in empty:
            verifier[index] = math.nan  # neither correct nor incorrect: never a seed
        by_group: dict[int, list[int]] = defaultdict(list)
        for index, (g, _) in enumerate(rollouts):
            by_group[g].append(index)
        for g, indices in by_group.items():
            room = num_resets - len(seeds[g])
            if room <= 0:
                continue
            for position in incorrect_indices([verifier[i] for i in indices], self.args.success_threshold, room):
                seeds[g].append(rollouts[indices[position]][1])
        return len(empty)

    def _verifier_rewards(self, row_groups, completion_ids, group_prompts, group_inputs, prompt_ids) -> list[float]:
        """Raw reward of the ``success_reward`` function (NaN when it returned None) for this process's seed
        candidates, through TRL's reward path (``rewards_of_extra_rows``, a collective call padded with a real
        rollout), so every reward function runs with its kwargs as for the batch."""
        dummy_group, dummy_ids = self._srpo_dummy
        per_process = rewards_of_extra_rows(
            self,
            [group_inputs[g] for g in row_groups],
            [group_prompts[g] for g in row_groups],
            [prompt_ids[g] for g in row_groups],
            completion_ids,
            filler=(group_inputs[dummy_group], group_prompts[dummy_group], prompt_ids[dummy_group], dummy_ids),
        )
        mine = per_process[self.accelerator.process_index]
        return mine[:, self._success_index].tolist()

    # ------------------------------------------------------------------ advantages

    def _srpo_advantages(self, trl_advantages: torch.Tensor) -> torch.Tensor:
        """Group-relative advantages within each sub-group (paper §4.3) from the captured global rewards: of TRL's
        weighted total reward (``sum_then_normalize``), or of each reward function, then summed
        (``normalize_then_sum``); fallback and unscorable rows get 0 and stay out of every statistic. Also logs the
        verifier's pass rates and fixes TRL's logged advantages."""
        device = trl_advantages.device
        rewards_per_func = self._srpo_rewards_per_func
        rewards = total_rewards(rewards_per_func, self.reward_weights)  # NaN when unscorable
        local_kinds = torch.tensor(self._srpo_row_kinds, dtype=torch.long, device=device)
        kinds = self.accelerator.gather(local_kinds)
        if kinds.numel() != rewards.numel():
            raise RuntimeError(f"SRPOTrainer: {kinds.numel()} row kinds for {rewards.numel()} rewards.")
        args: SRPOConfig = self.args
        num_prompts = rewards.numel() // self.num_generations
        group_ids = srpo_group_ids(num_prompts, args.num_base_generations, args.reset_groups, args.suffixes_per_reset)
        valid = (kinds != ROW_FALLBACK).cpu()  # fallback rows: zero advantage, outside every group's statistics
        # a sub-group with a ±inf reward gets 0 (as TRL's GRPO; grouped_advantages): say so
        nonfinite_reward_groups(self, rewards_per_func[valid.to(rewards_per_func.device)],
                                torch.tensor(group_ids)[valid], "srpo/nonfinite_reward_rate")
        if args.multi_objective_aggregation == "normalize_then_sum":
            # Each reward function z-scored within each sub-group, weighted sum, one batch-wide rescale (TRL's GDPO).
            advantages = normalize_then_sum_advantages(rewards_per_func, group_ids, self.reward_weights, valid=valid)
        else:
            advantages = grouped_advantages(rewards, group_ids, scale=self.scale_rewards, valid=valid)
        advantages = advantages.to(device)

        # Pass rates: what the verifier says (success_reward), over the scorable rows of each kind.
        kinds_cpu = kinds.cpu()
        correct = rollout_success(self, rewards_per_func).cpu()
        scorable = ~unscorable_rows(rewards_per_func).cpu()
        suffix_rows = (kinds_cpu == ROW_SUFFIX) & scorable
        if suffix_rows.any():
            log_metric(self, "srpo/correction_rate", correct[suffix_rows].float().mean().item())
        base_rows = (kinds_cpu == ROW_BASE) & scorable
        if base_rows.any():
            log_metric(self, "srpo/base_pass_rate", correct[base_rows].float().mean().item())

        logged = self._logs["advantages"]
        if len(logged) >= advantages.numel():
            for _ in range(advantages.numel()):
                logged.pop()
            logged.extend(advantages.tolist())

        local = len(self._srpo_row_kinds)
        start = self.accelerator.process_index * local
        return advantages[start : start + local].to(trl_advantages.dtype)


def _check_prompt_format(dataset, template: str | None) -> None:
    """Fail at construction, not mid-training, on prompts SRPO cannot wrap or localize (first row checked)."""
    if dataset is None or not hasattr(dataset, "column_names") or isinstance(dataset, dict):
        return
    if dataset.column_names is None:  # an IterableDataset with unknown features: checked at the first batch
        return
    if "prompt" not in dataset.column_names:
        raise ValueError("SRPOTrainer needs a `prompt` column in train_dataset (chat messages or text).")
    images = [name for name in ("image", "images") if name in dataset.column_names]
    if images:
        raise ValueError(
            f"SRPOTrainer needs text-only prompts, but train_dataset has an {images[0]!r} column: its seeds, "
            "self-localization prompts and reset states are built from text, so images would be dropped. Remove "
            "the column or train this dataset with GRPOTrainer."
        )
    if not hasattr(dataset, "__len__") or len(dataset) == 0:  # streaming datasets: not read ahead of training
        return
    first = dataset[0]
    question_of(first["prompt"])  # raises a clear error on non-text or user-less prompts
    wrap_prompt(first["prompt"], template)
