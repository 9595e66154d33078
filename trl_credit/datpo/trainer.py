"""DATPOTrainer: GRPOTrainer with DATPO's difficulty-adaptive tree rollouts (docs/datpo.md, paper Alg. 3).

What changes relative to GRPOTrainer (trl 1.16.0), and nothing else:

- ``_generate_and_score_completions`` (training only; evaluation stays GRPO on the base rollouts):
  1. phase 1 = ``super()._generate_and_score_completions``: TRL generates the N base rollouts per prompt, scores
     them with the reward functions, computes old/ref log-probs and vLLM importance ratios, logs its metrics.
     ``_generate`` and ``_calculate_rewards`` are wrapped only to keep their outputs (token ids, global rewards).
  2. V_root = the fraction of the prompt's scorable base rollouts the verifier calls correct (``success_reward``
     >= ``success_threshold``) and (K̂, B̂) per prompt (``budget.adaptive_budget``), token entropies of the base
     rollouts (recorded while HF generate sampled them; else one no-grad pass), forks (``forks.select_forks``:
     prefix lengths; by default the prefix ends with the selected sentence's first token, paper Alg. 1/3;
     ``datpo/no_fork_rate`` reports rollouts left without a fork). Unscorable rollouts do not fork.
  3. phase 2: the forks of every process, shared out evenly across processes, through TRL's
     ``_generate_single_turn`` (HF generate, vLLM server/colocate) with the B̂ branches of a fork as consecutive
     rows of one call (``num_generations=B̂``), in ``branch_chunk_size`` chunks, each branch within its fork's
     ``branch_budget``; branch rewards through TRL's ``_calculate_rewards`` on prefix + branch.
  4. the tree of every prompt is gathered on every process and its block advantages computed by the pure
     functions of ``tree`` and ``diversity``; each process keeps its own rows: one per base rollout (advantage per
     token = its block's) and one per branch (prompt = prompt + prefix, completion = branch), so no token is
     trained twice. Advantages are (B, T), which TRL's ``_compute_loss`` takes as they are.
- ``_prepare_inputs``: splits the variable number of rows into ``steps_per_generation`` micro-batches without
  dropping any (TRL's split floor-divides). ``num_items_in_batch`` counts the loss tokens of all rows of all
  processes, so ``loss_type="dapo"`` (the default) averages over every token of the generation batch.
- ``compute_loss`` / ``_compute_loss``: forwards of at most ``rows_per_forward`` rows; advantages = A_base +
  α_t·bonus with α_t of the optimizer step being trained; the row-averaging loss types (and ``bnpo``) are
  renormalized to the whole generation batch, so micro-batch sizes, filler rows and the number of processes do
  not change any row's weight.

Groups may span processes: trees are assembled from gathered per-row records, so advantages do not depend on how
rows are distributed. Every collective call (generation, scoring passes, reward gather, object gathers) is made by
every process the same number of times, also when a process has no branches.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence

import torch
from trl import GRPOTrainer

from trl_credit.trl_compat import shuffle_sequence_dict, use_adapter

from .._trl import (
    GenerationRecorder,
    bind_success,
    check_single_turn,
    gather_counts,
    gather_rows,
    hf_generate_hooks,
    log_metric,
    nonfinite_reward_groups,
    outside_zero3_init,
    pad_rows,
    rewards_of_extra_rows,
    resolve_method_args,
    rollout_success,
    sampling_overrides,
    score_completions,
    warn_once,
)
from ..success import unscorable_rows
from ..model_card import MethodModelCardMixin
from .budget import adaptive_budget, root_success_rate
from .config import DATPOConfig
from .diversity import POSITIVE_TOLERANCE, annealed_alpha, bonus_gate, sibling_diversity
from .forks import select_forks, sentence_spans, token_char_offsets
from .tree import ROOT, block_advantages, leaf_rewards, node_values

__all__ = ["DATPOTrainer"]

# Per-token tensors of the training batch, aligned with the completion (right-padded).
_COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "advantages",
    "datpo_base_advantages",
    "datpo_diversity_bonus",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)


# Loss types whose TRL loss is a mean over the rows of the micro-batch (dr_grpo: over rows × max_completion_length).
_ROW_AVERAGED_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")


class DATPOTrainer(MethodModelCardMixin, GRPOTrainer):
    """Drop-in GRPOTrainer for DATPO (Yu et al., 2026). Takes a :class:`DATPOConfig`; ``embedder`` optionally gives
    a sentence-transformers model instance (anything with ``encode(texts, batch_size=, convert_to_tensor=)``) for the
    sibling-diversity embeddings instead of ``args.embedding_model``."""

    _tag_names = ["trl", "grpo", "datpo", "trl_credit"]
    _name = "DATPO"
    _paper = {
        "title": "Difficulty-Adaptive Tree-Structured Policy Optimization for Expanding Reasoning Coverage in RLVR",
        "id": "2609.08650",
        "citation": "@article{yu2026datpo, title={Difficulty-Adaptive Tree-Structured Policy Optimization for "
        "Expanding Reasoning Coverage in RLVR}, author={Yu, Youngjun and Jang, Sanghwan and Yu, Hwanjo}, "
        "journal={arXiv preprint arXiv:2609.08650}, year={2026}}",
    }

    def __init__(self, model, reward_funcs=None, args: DATPOConfig | None = None, *pargs, embedder=None, **kwargs):
        args = resolve_method_args(args, DATPOConfig, model, "DATPOTrainer", "DATPO")
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        check_single_turn(self, "DATPOTrainer")
        bind_success(self)
        if self._is_vlm:
            raise ValueError("DATPOTrainer supports text-only models: branch prompts are token prefixes of the response.")
        if self._entropy_bonus_enabled:
            # TRL adds the entropy bonus per micro-batch inside its loss; DATPO rescales that loss to the generation
            # batch per micro-batch and per forward piece (see `_compute_loss`), which would rescale the bonus too.
            raise ValueError(
                "DATPOTrainer does not support the entropy bonus (`entropy_coef` != 0 or `use_adaptive_entropy=True`): "
                "its micro-batches vary in size and their loss is renormalized to the generation batch, which would "
                "change the bonus's weight. Set entropy_coef=0.0 and use_adaptive_entropy=False."
            )
        if self.aux_loss_enabled:
            warn_once(
                self, "datpo_router_aux_loss",
                "DATPO: the MoE router auxiliary loss is added inside TRL's loss, which DATPO renormalizes to the "
                "generation batch and evaluates in forwards of at most `rows_per_forward` rows, so the auxiliary "
                "term's weight is not TRL's (it scales with the micro-batch and the number of forward pieces); set "
                "router_aux_loss_coef=0.0 to train without it.",
            )
        self._datpo_recording = False
        self._datpo_branching = False  # True while the branches of phase 2 are generated
        self._datpo_phase1 = None
        self._datpo_rewards_per_func = None
        self._datpo_sampled_entropies = None  # entropies recorded while HF generate sampled the base rollouts
        self.embedder = None
        if args.use_diversity:
            self.embedder = embedder if embedder is not None else self._load_embedder(args)
            if not hasattr(self.embedder, "encode"):
                raise TypeError("`embedder` must have an `encode(texts, ...)` method (a sentence-transformers model)")
        elif embedder is not None:
            raise ValueError("An `embedder` was passed but `use_diversity=False`; drop one of them.")

    def _load_embedder(self, args: DATPOConfig):
        from ..models import DEFAULT_EMBEDDER, load_default_embedder

        device = str(self.accelerator.device)
        with outside_zero3_init():  # a whole frozen copy per process, not ZeRO-3 shards
            if args.embedding_model in (None, "", DEFAULT_EMBEDDER):
                return load_default_embedder(device=device)
            from sentence_transformers import SentenceTransformer

            return SentenceTransformer(
                args.embedding_model, device=device, trust_remote_code=args.embedding_trust_remote_code
            )

    # ------------------------------------------------------------------ capture of TRL's phase-1 outputs
    def _generate(self, prompts: list):
        result = super()._generate(prompts)
        if self._datpo_recording:
            self._datpo_phase1 = result
        return result

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation; for the phase-1 base rollouts under HF ``generate``, the entropies of the distributions
        the tokens were sampled from are recorded on the way (:class:`~trl_credit._trl.GenerationRecorder`), so
        forking needs no extra forward pass."""
        if not self._datpo_recording or self._datpo_branching or not GenerationRecorder.available(self):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        recorder = GenerationRecorder(self.temperature, logps=False, entropies=True)
        with recorder.attached(self):
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        self._datpo_sampled_entropies = recorder.entropies(completion_ids)
        return completion_ids, logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._datpo_recording:
            self._datpo_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _leaf_rewards(self, base_rewards_per_func, branch_rewards_per_func, branch_groups):
        """Leaf rewards r (NaN: unscorable) of the global base rollouts and branches, per ``leaf_rewards``."""
        N = self.num_generations
        trees = [row // N for row in range(base_rewards_per_func.size(0))] + list(branch_groups)
        matrix = torch.cat([base_rewards_per_func, branch_rewards_per_func.to(base_rewards_per_func.device)])
        nonfinite_reward_groups(self, matrix, trees, "datpo/nonfinite_reward_rate")  # block_advantages gives them 0
        rewards = leaf_rewards(matrix.cpu(), trees, self.reward_weights.cpu(), self.args.multi_objective_aggregation)
        rewards = rewards.tolist()
        return rewards[: base_rewards_per_func.size(0)], rewards[base_rewards_per_func.size(0) :]

    # ------------------------------------------------------------------ batching
    def _prepare_inputs(self, generation_batch):
        # Follows GRPOTrainer._prepare_inputs (trl 1.16.0), with the split replaced: the row count varies with the
        # trees, and TRL's split_tensor_dict floor-divides it and drops the remainder.
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            batch = shuffle_sequence_dict(batch)
            self._buffered_inputs = split_rows(batch, self.args.steps_per_generation, self.pad_to_multiple_of)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    # ------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The micro-batch's loss, computed in forwards of at most ``rows_per_forward`` rows (default
        ``per_device_train_batch_size``): DATPO's micro-batches hold a variable number of rows (a whole tree's worth
        can land in one), so all but the last piece are back-propagated here, outside DDP's gradient sync, and the
        returned loss (which the Trainer back-propagates) carries the others' values for logging. Each piece's loss
        is normalized against the whole generation batch (`_compute_loss`), so the pieces add up to exactly the
        loss of the micro-batch in one forward."""
        if return_outputs or not self.model.training or "datpo_base_advantages" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        num_rows = inputs["completion_ids"].size(0)
        cap = self.args.rows_per_forward or self.args.per_device_train_batch_size
        if num_rows <= cap:
            return self._compute_loss(model, inputs)
        if self.is_deepspeed_enabled:
            # DeepSpeed's engine counts backward calls for its own gradient accumulation: one backward per
            # micro-batch only.
            warn_once(
                self, "datpo_rows_per_forward_deepspeed",
                f"DATPO: a micro-batch of {num_rows} rows runs in one forward under DeepSpeed (rows_per_forward="
                f"{cap} applies only without DeepSpeed); lower per_device_train_batch_size or raise "
                "steps_per_generation if it does not fit in memory.",
            )
            return self._compute_loss(model, inputs)
        # rows of similar length share a forward (less padding); the loss does not depend on the order of rows
        pieces = split_rows(sort_rows_by_length(inputs), math.ceil(num_rows / cap), self.pad_to_multiple_of)
        earlier = 0.0
        for piece in pieces[:-1]:
            with self.accelerator.no_sync(model):
                loss = self._compute_loss(model, piece)
                self.accelerator.backward(loss)
            earlier = earlier + loss.detach()
        return self._compute_loss(model, pieces[-1]) + earlier

    def _compute_loss(self, model, inputs):
        if not self.model.training or "datpo_base_advantages" not in inputs:
            return super()._compute_loss(model, inputs)
        # α of the optimizer step being trained (paper §4.4: annealed over optimizer steps)
        alpha = self._diversity_alpha()
        inputs = dict(inputs)
        inputs["advantages"] = inputs["datpo_base_advantages"] + alpha * inputs["datpo_diversity_bonus"]
        log_metric(self, "datpo/alpha", alpha)
        loss = super()._compute_loss(model, inputs)
        # TRL's row-averaging loss types divide by the rows (bnpo: the tokens) of the micro-batch. DATPO's
        # micro-batches differ in size and hold empty filler rows (row counts are evened out across processes), so
        # that would weight a row by the size of the micro-batch it landed in. Renormalize to the whole generation
        # batch instead, the way dapo's `num_items_in_batch` does: every row (token, for bnpo) then weighs the same
        # whatever the split, the number of processes or the fillers, and equal micro-batches give TRL's value.
        per_generation = self.accelerator.num_processes * self.args.steps_per_generation
        if self.loss_type in _ROW_AVERAGED_LOSSES:
            rows = inputs["completion_ids"].size(0)
            loss = loss * (rows * per_generation / inputs["datpo_num_rows"].clamp(min=1))
        elif self.loss_type == "bnpo":
            tokens = inputs["completion_mask"].sum().clamp(min=1)
            loss = loss * (tokens * per_generation / inputs["num_items_in_batch"].clamp(min=1))
        return loss

    # ------------------------------------------------------------------ rollouts
    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        if "image" in inputs[0] or "images" in inputs[0]:
            raise ValueError("DATPOTrainer does not support image inputs.")
        self._datpo_recording = True
        self._datpo_sampled_entropies = None
        try:
            base = super()._generate_and_score_completions(inputs)
        finally:
            self._datpo_recording = False
        phase1, rewards_per_func = self._datpo_phase1, self._datpo_rewards_per_func
        self._datpo_phase1 = self._datpo_rewards_per_func = None
        prompt_ids_list, completion_ids_list = [list(p) for p in phase1[0]], [list(c) for c in phase1[1]]
        prompts = [x["prompt"] for x in inputs]
        return self._grow_trees(inputs, prompts, base, prompt_ids_list, completion_ids_list, rewards_per_func)

    def _grow_trees(self, inputs, prompts, base, prompt_ids_list, completion_ids_list, rewards_per_func):
        args: DATPOConfig = self.args
        device = self.accelerator.device
        n_local = len(prompt_ids_list)
        process = self.accelerator.process_index
        N = self.num_generations
        first_row = process * n_local  # TRL's process_slice convention: equal base rows per process
        # All global, process order. Leaf values use TRL's weighted total reward (NaN: unscorable); correct/wrong
        # (pass rate, V_root) is the verifier's verdict (`success_reward` >= `success_threshold`).
        base_unscorable = unscorable_rows(rewards_per_func).tolist()
        base_success = rollout_success(self, rewards_per_func).tolist()
        num_groups = len(base_unscorable) // N

        # Phase 1 → budgets (Eq. 1-2), from the global verdicts, so every process agrees. A prompt none of whose base
        # rollouts could be scored has no V_root and does not branch (nothing under it could be scored either).
        v_root = [
            root_success_rate(base_success[g * N : (g + 1) * N], base_unscorable[g * N : (g + 1) * N])
            for g in range(num_groups)
        ]
        if args.difficulty_adaptive:
            budgets = [(0, 0) if math.isnan(v) else adaptive_budget(v, args.max_forks, args.max_branches) for v in v_root]
        else:
            budgets = [(0, 0) if math.isnan(v) else (args.max_forks, args.max_branches) for v in v_root]

        # Entropies of the base rollouts: recorded by the sampler (HF generate), else one no-grad forward pass. The
        # pass is collective (ZeRO-3 gathers parameters in it), so all processes take the same path.
        need_entropy = args.fork_method in ("sent_entropy", "tok_entropy") and any(k > 0 for k, _ in budgets)
        entropies = None
        if need_entropy:
            sampled = self._datpo_sampled_entropies
            lines_up = sampled is not None and [len(e) for e in sampled] == [len(c) for c in completion_ids_list]
            from_sampler = all(gather_rows(self, [lines_up]))
            log_metric(self, "datpo/entropy_from_sampler", float(from_sampler))
            if from_sampler:
                entropies = torch.zeros(n_local, max([1] + [len(e) for e in sampled]))
                for i, row in enumerate(sampled):
                    entropies[i, : len(row)] = torch.tensor(row)
            else:
                p_ids, p_mask, c_ids, c_mask = pad_rows(
                    prompt_ids_list, completion_ids_list, self._tokenizer.pad_token_id, device
                )
                _, entropies = score_completions(self, self.model, p_ids, p_mask, c_ids, c_mask, compute_entropy=True)
                entropies = entropies.float().cpu()
        self._datpo_sampled_entropies = None

        # Forks per local base rollout. An unscorable rollout does not fork: its tokens keep advantage 0.
        local_forks: list[list[int]] = []
        should_fork = [False] * n_local  # scorable, with K̂ > 0: the method wants to branch from it
        used_fallback = [False] * n_local
        for i in range(n_local):
            g_row = first_row + i
            k_hat, _ = budgets[g_row // N]
            length = len(completion_ids_list[i])
            should_fork[i] = k_hat > 0 and not base_unscorable[g_row]
            if not should_fork[i] or length < 2:
                local_forks.append([])
                continue
            spans = None
            if args.fork_method == "sent_entropy":
                text, offsets = token_char_offsets(self._tokenizer, completion_ids_list[i])
                spans = sentence_spans(text, offsets)
            rng = random.Random(f"{args.seed}-{self.state.global_step}-{g_row}")
            row_entropies = entropies[i, :length] if entropies is not None else None
            forks = select_forks(
                row_entropies, spans, k_hat, args.fork_method, num_tokens=length, min_gap=args.fork_min_gap, rng=rng,
                position=args.fork_position,
            )
            if not forks and args.fork_method == "sent_entropy" and args.fork_fallback == "tok_entropy":
                # Only with fork_position="before_token": one sentence, which starts at token 0 (a fork before it
                # would be a fresh rollout, not a branch). Fall back to the top-K̂ tokens by entropy.
                forks = select_forks(row_entropies, None, k_hat, "tok_entropy", num_tokens=length,
                                     position=args.fork_position)
                used_fallback[i] = bool(forks)
            local_forks.append(forks)
        fork_counts = gather_rows(
            self, [(should_fork[i], bool(local_forks[i]), used_fallback[i]) for i in range(n_local)]
        )
        self._log_fork_coverage(fork_counts)

        # Phase 2: B̂ branches from every fork (`_generate_branches`: the forks of all processes, shared out evenly).
        branch_meta: list[tuple[int, int]] = []  # (local base row, fork index)
        branch_prefixes: list[list[int]] = []
        fork_requests: list[tuple[list[int], int, int]] = []  # (prompt + prefix, B̂, new-token budget) per fork
        max_length = self.max_completion_length
        for i, forks in enumerate(local_forks):
            _, b_hat = budgets[(first_row + i) // N]
            for j, fork in enumerate(forks):
                prefix = prompt_ids_list[i] + completion_ids_list[i][:fork]
                # "remaining": the leaf (prefix + branch) is a response of at most max_completion_length tokens
                new_tokens = max(1, max_length - fork) if args.branch_budget == "remaining" else max_length
                fork_requests.append((prefix, b_hat, new_tokens))
                for _ in range(b_hat):
                    branch_meta.append((i, j))
                    branch_prefixes.append(prefix)
        self._datpo_branching = True
        try:
            branch_ids, branch_logprobs = self._generate_branches(fork_requests)
        finally:
            self._datpo_branching = False
        branch_ids = [list(ids) for ids in branch_ids]
        # response = base prefix + branch (docs/datpo.md#branches: branch rewards are on the whole response)
        branch_responses = [
            completion_ids_list[i][: local_forks[i][j]] + ids for (i, j), ids in zip(branch_meta, branch_ids)
        ]
        branch_counts = gather_counts(self, len(branch_ids))
        branch_rewards_per_func = self._branch_rewards(
            inputs, prompts, prompt_ids_list, completion_ids_list, branch_meta, branch_responses, branch_counts
        )
        branch_groups = gather_rows(self, [(first_row + i) // N for i, _ in branch_meta])
        base_rewards, branch_rewards_global = self._leaf_rewards(rewards_per_func, branch_rewards_per_func, branch_groups)
        branch_success = rollout_success(self, branch_rewards_per_func).tolist()

        # Gather the tree skeletons (small: forks and lengths per row) so every process builds every tree.
        records = gather_rows(
            self,
            [
                (first_row + i, local_forks[i], len(completion_ids_list[i]))
                for i in range(n_local)
            ],
        )
        branch_lengths = gather_rows(self, [len(ids) for ids in branch_ids])
        blocks = _build_blocks(records, branch_counts, branch_lengths, budgets, base_rewards, branch_rewards_global, N)

        # Block advantages (Eq. 3) per tree.
        base_adv = torch.zeros(len(blocks["start"]), dtype=torch.float64)
        for g, members in blocks["by_group"].items():
            idx = torch.tensor(members)
            base_adv[idx] = block_advantages(
                [blocks["start"][b] for b in members],
                [blocks["end"][b] for b in members],
                [blocks["reward"][b] for b in members],
                value_estimate=args.value_estimate,
                block_rollout=[blocks["rollout"][b] for b in members],
            )

        # Sibling diversity (Eq. 4, 8). The bonus per block is kept apart from A_base: α is applied per optimizer
        # step in `_compute_loss` (the schedule runs over optimizer steps, also when a generation batch serves
        # several of them: num_iterations > 1 or steps_per_generation > gradient_accumulation_steps).
        unscorable_block = [r is not None and math.isnan(r) for r in blocks["reward"]]
        diversity = torch.zeros_like(base_adv)
        has_siblings = torch.zeros(len(base_adv), dtype=torch.bool)
        if args.use_diversity:
            diversity, has_siblings = self._sibling_diversity(
                blocks, prompt_ids_list, completion_ids_list, branch_ids, branch_meta, local_forks, process,
                unscorable_block,
            )
        scale = max([1.0] + [abs(r) for r in base_rewards + branch_rewards_global if math.isfinite(r)])
        gate = bonus_gate(base_adv, on_all_blocks=args.diversity_on_all_blocks, tolerance=POSITIVE_TOLERANCE * scale)
        # An unscorable block keeps advantage 0, and so does every block of a tree with a ±inf leaf reward.
        infinite = {g for g, r in zip(blocks["group"], blocks["reward"]) if r is not None and math.isinf(r)}
        no_bonus = [u or g in infinite for u, g in zip(unscorable_block, blocks["group"])]
        gate[torch.tensor(no_bonus, dtype=torch.bool)] = 0.0
        bonus = gate * diversity
        alpha = self._diversity_alpha()
        advantages = base_adv + alpha * bonus

        grounded = None
        if self.mask_truncated_completions:
            grounded = self._grounded_forks(blocks, completion_ids_list, branch_ids, branch_counts)

        self._log_table_advantages(blocks, advantages, records)
        batch = self._training_rows(
            base, prompt_ids_list, completion_ids_list, branch_prefixes, branch_ids, branch_logprobs, blocks,
            base_adv, bonus, alpha, process, local_forks, grounded,
        )
        self._log_tree_metrics(
            budgets, v_root, blocks, base_unscorable, base_success, branch_success, records, branch_lengths,
            branch_rewards_global, diversity, has_siblings,
        )
        # Base rows are cut into blocks at their forks (a block id per token: forks passed so far); a branch row is
        # one block.
        width = batch["completion_ids"].size(1)
        block_ids = [[bisect.bisect_right(forks, t) for t in range(width)] for forks in local_forks]
        self._log_credit(batch, block_ids=block_ids)
        return batch

    def _grounded_forks(self, blocks, completion_ids_list, branch_ids, branch_counts) -> set:
        """With ``mask_truncated_completions``: the forks whose value V (``value_estimate``) averages over at least
        one finished (not truncated) scorable leaf. A block ending at any other fork would learn only from
        truncated leaves. A collective call (the truncation flags of every process's leaves are gathered)."""
        eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        base_truncated = gather_rows(self, [_truncated(ids, eos_and_pad) for ids in completion_ids_list])
        branch_truncated = gather_rows(self, [_truncated(ids, eos_and_pad) for ids in branch_ids])
        offsets = [sum(branch_counts[:q]) for q in range(len(branch_counts))]
        # V of these leaf values is the share of finished leaves among those V averages over (unscorable leaves
        # stay NaN: they count in no value), so a fork is grounded when it is > 0
        finished = []
        for reward, rollout in zip(blocks["reward"], blocks["rollout"]):
            if reward is None or math.isnan(reward):
                finished.append(reward)
                continue
            if rollout[0] == "base":
                truncated = base_truncated[rollout[1]]
            else:
                truncated = branch_truncated[offsets[rollout[1]] + rollout[2]]
            finished.append(0.0 if truncated else 1.0)
        grounded = set()
        for members in blocks["by_group"].values():
            share = node_values(
                [blocks["start"][b] for b in members],
                [blocks["end"][b] for b in members],
                [finished[b] for b in members],
                value_estimate=self.args.value_estimate,
                block_rollout=[blocks["rollout"][b] for b in members],
            )
            grounded.update(node for node, value in share.items() if node != ROOT and value > 0)
        return grounded

    def _diversity_alpha(self) -> float:
        """α_t at the current optimizer step (0-based ``global_step`` of a ``max_steps`` run)."""
        args: DATPOConfig = self.args
        return annealed_alpha(
            self.state.global_step,
            max(int(self.state.max_steps or 1), 1),
            args.diversity_alpha,
            args.diversity_alpha_final,
            args.diversity_alpha_schedule,
        )

    def _log_fork_coverage(self, fork_counts):
        """``datpo/no_fork_rate``: base rollouts the method wants to branch from (scorable, K̂ > 0) that got no
        fork; ``datpo/fork_fallback_rate``: those whose forks came from the token-entropy fallback."""
        args: DATPOConfig = self.args
        wanted = [(has, fallback) for should, has, fallback in fork_counts if should]
        if not wanted:
            return
        no_fork = sum(1 for has, _ in wanted if not has) / len(wanted)
        fallback = sum(1 for _, fb in wanted if fb) / len(wanted)
        log_metric(self, "datpo/no_fork_rate", no_fork)
        log_metric(self, "datpo/fork_fallback_rate", fallback)
        if no_fork > 0:
            one_sentence = args.fork_method == "sent_entropy" and args.fork_position == "before_token"
            if one_sentence and args.fork_fallback == "none":
                fix = ("with fork_position='before_token' rollouts with a single sentence have no sentence start "
                       "after token 0; set fork_position='after_token' (the paper: fork after the first token) or "
                       "fork_fallback='tok_entropy' (fork them at their highest-entropy tokens)")
            else:
                fix = "rollouts shorter than 2 tokens cannot fork; check max_completion_length and the prompt format"
            warn_once(
                self, "datpo_no_fork",
                f"DATPO: {no_fork:.0%} of the base rollouts that should branch (unsolved prompt, scorable) got no "
                f"fork, so their prompt grows no tree from them (logged every step as datpo/no_fork_rate): {fix}.",
            )

    # ------------------------------------------------------------------ branch generation
    def _generate_branches(self, fork_requests: list[tuple[list[int], int, int]]):
        """B̂ continuations of every local fork ``(prompt + prefix ids, B̂, new-token budget)``, in fork order; returns
        ``(completion ids, sampling log-probs or None)`` with B̂ consecutive rows per fork, each at most its fork's
        budget long.

        A collective call. The forks of all processes are gathered and shared out across processes, so the process
        that holds an unsolved prompt's tree does not generate all of it while the others wait; the results go back
        to the process that owns the fork (it trains those rows). The B̂ branches of one fork are consecutive rows of
        one ``_generate_single_turn(..., num_generations=B̂)`` call, as TRL lays out its N rollouts per prompt: vLLM
        server mode then samples them as ``n = B̂`` of one prompt and vLLM's prefix cache reuses the fork's prefill.
        Every process makes the same calls with the same row count (vLLM server mode slices its answer by process),
        padding with one-token filler forks.

        Budgets: one generation call takes one ``max_new_tokens``. The forks of each B̂ are sorted by budget and dealt
        out round-robin, in bands where the budget at most halves (one or more calls per band), so the forks of one
        call (on every process) have neighbouring budgets; the call runs with the largest of them (the same on every
        process, as vLLM server mode needs one sampling setting per call) and each branch is cut to its own fork's
        budget afterwards. With HF ``generate`` each row also stops at its own budget, the B̂ copies of a fork are
        prefilled once and finished rows are dropped from the call once fewer than half are running
        (``hf_generate_hooks``), so nothing is generated past a budget, a fork's prefix is read once, as vLLM's
        prefix cache reads it, and a call's tail does not compute rows that ended long before, as vLLM's scheduler
        does not.
        """
        num_processes, process = self.accelerator.num_processes, self.accelerator.process_index
        counts = gather_counts(self, len(fork_requests))
        if sum(counts) == 0:
            return [], None
        all_forks = gather_rows(
            self, [(list(map(int, prefix)), int(b_hat), int(budget)) for prefix, b_hat, budget in fork_requests]
        )
        chunk = self.args.branch_chunk_size
        done: list[tuple[int, list[int], list | None]] = []  # (global fork index, B̂ completions, log-probs)
        any_logprobs = True
        generated = kept = 0  # tokens this process generated for real forks, and kept after the cut to their budget
        groups = []  # (B̂, forks of one budget band, longest budget first)
        for b_hat in sorted({b for _, b, _ in all_forks}):
            # longest budget first; ties keep fork order
            ordered = sorted((k for k, (_, b, _) in enumerate(all_forks) if b == b_hat), key=lambda k: -all_forks[k][2])
            # bands where the budget at most halves: a call runs as many steps as its longest budget, so forks of
            # very different budgets in one call would generate (and, with HF generate, compute) far past the short
            # ones' budgets; at most log2(max_completion_length) bands
            band = [ordered[0]]
            for k in ordered[1:]:
                if 2 * all_forks[k][2] < all_forks[band[0]][2]:
                    groups.append((b_hat, band))
                    band = []
                band.append(k)
            groups.append((b_hat, band))
        dealt = 0  # forks dealt so far: each group's deal starts at the next process, so the odd ones even out
        # HF generate pads the rows that stopped at their own budget to the call's length (TRL cuts only after an
        # EOS): that padding was never generated. vLLM and continuous batching return only sampled tokens.
        pads_rows = not (self.use_vllm or getattr(self, "use_transformers_continuous_batching", False))
        pad_id = self._tokenizer.pad_token_id
        for b_hat, forks in groups:
            mine = forks[(process - dealt) % num_processes :: num_processes]
            dealt += len(forks)
            most = math.ceil(len(forks) / num_processes)
            per_call = most if not chunk else max(1, min(most, chunk // b_hat))
            filler = all_forks[forks[0]][0][:1]
            for call in range(math.ceil(most / per_call)):
                call_forks = mine[call * per_call : (call + 1) * per_call]
                # the call's forks on all processes are forks[call·per_call·P : (call+1)·per_call·P] (the first
                # exists: it is the call's first fork on the process the deal started at) and the first has the
                # largest budget
                call_budget = all_forks[forks[call * per_call * num_processes]][2]
                rows = [all_forks[k][0] for k in call_forks for _ in range(b_hat)]
                rows += [filler] * ((per_call - len(call_forks)) * b_hat)
                # HF generate: each row stops at its own fork's budget (filler rows after one token), the B̂
                # copies of a fork share one prefill, and once fewer than half of the rows are running the call goes
                # on with those alone (branches end with EOS anywhere in their budget)
                row_budgets = [all_forks[k][2] for k in call_forks for _ in range(b_hat)]
                row_budgets += [1] * (len(rows) - len(row_budgets))
                with (
                    sampling_overrides(self, max_new_tokens=call_budget),
                    hf_generate_hooks(self, row_budgets, compact_rows=True),
                ):
                    completion_ids, logprobs = self._generate_single_turn(rows, None, {}, b_hat)
                any_logprobs = any_logprobs and logprobs is not None
                for n, k in enumerate(call_forks):
                    piece = slice(n * b_hat, (n + 1) * b_hat)
                    budget = all_forks[k][2]
                    generated += sum(_sampled_length(ids, budget, pad_id if pads_rows else None)
                                     for ids in completion_ids[piece])
                    kept += sum(min(len(ids), budget) for ids in completion_ids[piece])
                    done.append((
                        k,
                        [list(map(int, ids))[:budget] for ids in completion_ids[piece]],
                        [list(lp)[:budget] for lp in logprobs[piece]] if logprobs is not None else None,
                    ))
        # generated past a fork's budget because a call runs with the largest budget of its forks (waste)
        log_metric(self, "datpo/branch_tokens_past_budget", (generated - kept) / max(generated, 1))
        results = {k: (ids, lps) for k, ids, lps in gather_rows(self, done)}
        first = sum(counts[:process])
        branch_ids: list[list[int]] = []
        branch_logprobs: list[list[float]] | None = [] if any_logprobs else None
        for k in range(first, first + counts[process]):
            ids, lps = results[k]
            branch_ids.extend(ids)
            if branch_logprobs is not None:
                if lps is None:
                    branch_logprobs = None
                else:
                    branch_logprobs.extend(lps)
        return branch_ids, branch_logprobs

    # ------------------------------------------------------------------ rewards of branches
    def _branch_rewards(
        self, inputs, prompts, prompt_ids_list, completion_ids_list, branch_meta, branch_responses, branch_counts
    ) -> torch.Tensor:
        """``rewards_per_func`` of every branch of every process (process order), scored on prompt + prefix +
        branch by TRL's reward path (``rewards_of_extra_rows``; a process without branches pads with its first base
        row)."""
        if max(branch_counts) == 0:
            return torch.zeros(0, len(self.reward_funcs), device=self.accelerator.device)
        per_process = rewards_of_extra_rows(
            self,
            [inputs[i] for i, _ in branch_meta],
            [prompts[i] for i, _ in branch_meta],
            [prompt_ids_list[i] for i, _ in branch_meta],
            branch_responses,
            filler=(inputs[0], prompts[0], prompt_ids_list[0], completion_ids_list[0]),
            counts=branch_counts,
        )
        return torch.cat(per_process)

    # ------------------------------------------------------------------ diversity
    def _sibling_diversity(
        self, blocks, prompt_ids_list, completion_ids_list, branch_ids, branch_meta, local_forks, process,
        unscorable_block,
    ):
        """Embed this process's blocks that have structural siblings, gather the embeddings, compute Div.
        Unscorable blocks are no one's siblings (they are left out of every statistic)."""
        args: DATPOConfig = self.args
        keys = [None if unscorable_block[b] else key for b, key in enumerate(blocks["sibling_key"])]
        if not args.diversity_root_siblings:
            keys = [None if blocks["start"][b] == ROOT else key for b, key in enumerate(keys)]
        sizes: dict = {}
        for key in keys:
            if key is not None:
                sizes[key] = sizes.get(key, 0) + 1
        local = [b for b in blocks["by_process"][process] if keys[b] is not None and sizes[keys[b]] > 1]
        texts = []
        for b in local:
            kind, row, start, end = blocks["source"][b]
            tokens = completion_ids_list[row][start:end] if kind == "base" else branch_ids[row][start:end]
            texts.append(self._tokenizer.decode(tokens, skip_special_tokens=True))
        keep = [b for b, text in zip(local, texts) if text.strip()]
        keep_texts = [text for text in texts if text.strip()]
        local_embeddings = []
        if keep_texts:
            with torch.no_grad():
                encoded = self.embedder.encode(
                    keep_texts, batch_size=self.args.embedding_batch_size, convert_to_tensor=True,
                    show_progress_bar=False,
                )
            encoded = torch.as_tensor(encoded).float().cpu()
            local_embeddings = [(b, encoded[n].tolist()) for n, b in enumerate(keep)]
        gathered = gather_rows(self, local_embeddings)
        if not gathered:
            return torch.zeros(len(keys), dtype=torch.float64), torch.zeros(len(keys), dtype=torch.bool)
        dim = len(gathered[0][1])
        embeddings = torch.zeros(len(keys), dim, dtype=torch.float64)
        embedded = torch.zeros(len(keys), dtype=torch.bool)
        for b, vector in gathered:
            embeddings[b] = torch.tensor(vector, dtype=torch.float64)
            embedded[b] = True
        # blocks without text (or not embedded) neither get nor give diversity
        final_keys = [key if embedded[b] else None for b, key in enumerate(keys)]
        diversity = sibling_diversity(embeddings, final_keys)
        counts: dict = {}
        for key in final_keys:
            if key is not None:
                counts[key] = counts.get(key, 0) + 1
        has_siblings = torch.tensor([key is not None and counts[key] > 1 for key in final_keys], dtype=torch.bool)
        return diversity, has_siblings

    # ------------------------------------------------------------------ training rows
    def _training_rows(
        self, base, prompt_ids_list, completion_ids_list, branch_prefixes, branch_ids, branch_logprobs, blocks,
        base_advantages, bonus, alpha, process, local_forks, grounded,
    ):
        device = self.accelerator.device
        n_base, n_branch = len(completion_ids_list), len(branch_ids)
        # TRL's _compute_loss gathers per-row tensors (clip-ratio metrics), so every process needs the same row
        # count: processes with fewer rows append empty rows (a one-token prompt, so attention stays finite, and
        # one completion token outside the loss mask). They add nothing to the loss (see `_compute_loss` for the
        # loss types that average over rows) or to num_items_in_batch.
        row_counts = gather_counts(self, n_base + n_branch)
        n_rows = max(row_counts)
        n_empty = n_rows - n_base - n_branch
        pad_id = self._tokenizer.pad_token_id
        prompt_rows = prompt_ids_list + branch_prefixes + [[pad_id]] * n_empty
        completion_rows = completion_ids_list + branch_ids + [[pad_id]] * n_empty
        p_ids, p_mask, c_ids, c_mask = pad_rows(prompt_rows, completion_rows, pad_id, device, self.pad_to_multiple_of)
        if n_empty:
            c_mask[n_base + n_branch :] = 0
        width = c_ids.size(1)
        # every generated token gets the advantage of the one block it belongs to (docs/datpo.md#block-advantages, docs/datpo.md#training-rows)
        token_base = torch.zeros(n_rows, width, dtype=torch.float32)
        token_bonus = torch.zeros(n_rows, width, dtype=torch.float32)
        for b in blocks["by_process"][process]:
            kind, row, start, end = blocks["source"][b]
            r = row if kind == "base" else n_base + row
            token_base[r, start:end] = float(base_advantages[b])
            token_bonus[r, start:end] = float(bonus[b])
        restored = []  # (base row, tokens): leading blocks of a truncated base rollout that keep their loss
        if self.mask_truncated_completions:
            # A truncated leaf has no final answer of its own: its last block is masked, and a branch (one block)
            # whole. The earlier blocks of a truncated base rollout are valued by the leaves under their end fork;
            # they keep their loss while those values rest on a finished leaf (`grounded`), as a run from the start
            # of the row (a masked block in the middle would also hide its tokens from the attention of the later
            # ones). With every leaf truncated nothing is trained, as in GRPO.
            eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            first_row = process * n_base
            for r, ids in enumerate(completion_rows[: n_base + n_branch]):
                if not _truncated(ids, eos_and_pad):
                    continue
                keep = 0
                if r < n_base:
                    for j, fork in enumerate(local_forks[r]):
                        if (first_row + r, j) not in grounded:
                            break
                        keep = fork
                c_mask[r, keep:] = 0
                if keep:
                    restored.append((r, keep))
        output = {
            "prompt_ids": p_ids,
            "prompt_mask": p_mask,
            "completion_ids": c_ids,
            "completion_mask": c_mask,
            # A_base + α·bonus at this step (what TRL's completion table and callers see); `_compute_loss`
            # recomputes it with α of the optimizer step it trains
            "advantages": (token_base + alpha * token_bonus).to(device),
            "datpo_base_advantages": token_base.to(device),
            "datpo_diversity_bonus": token_bonus.to(device),
            # real rows of the generation batch on all processes, for the loss types that average over rows
            "datpo_num_rows": torch.tensor(sum(row_counts), device=device),
        }

        def merge(base_values: torch.Tensor, branch_values: torch.Tensor | None, fill: float = 0.0):
            # base rows keep TRL's values (completion right-padded, so positions line up); branch rows get theirs
            cols = width if base_values.size(1) != 1 else 1
            merged = torch.full((n_rows, cols), fill, dtype=base_values.dtype, device=device)
            take = min(cols, base_values.size(1))
            merged[:n_base, :take] = base_values[:, :take]
            if branch_values is not None and n_branch:
                take = min(cols, branch_values.size(1))
                merged[n_base : n_base + n_branch, :take] = branch_values[:, :take].to(base_values.dtype)
            return merged

        # Rows scored here: the branches, and the kept blocks of truncated base rollouts, for which TRL's old/ref
        # log-probs were computed with the whole completion masked out of attention. Each is scored on prompt +
        # its kept tokens, the context the loss sees them in.
        scored_prompts = branch_prefixes + [prompt_ids_list[r] for r, _ in restored]
        scored_completions = branch_ids + [completion_ids_list[r][:keep] for r, keep in restored]

        def merge_scored(base_values: torch.Tensor, scored: torch.Tensor | None):
            merged = merge(base_values, None if scored is None else scored[:n_branch])
            for k, (r, keep) in enumerate(restored):
                merged[r, :keep] = scored[n_branch + k, :keep].to(merged.dtype)
            return merged

        branch_mask = c_mask[n_base : n_base + n_branch]
        need_old = "old_per_token_logps" in base
        if need_old:
            old = self._score_collectively(self.model, scored_prompts, scored_completions)
            output["old_per_token_logps"] = merge_scored(base["old_per_token_logps"], old)
        if "ref_per_token_logps" in base:
            if self.ref_model is not None:
                ref = self._score_collectively(self.ref_model, scored_prompts, scored_completions)
            else:
                unwrapped = self.accelerator.unwrap_model(self.model)
                with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                    ref = self._score_collectively(self.model, scored_prompts, scored_completions)
            output["ref_per_token_logps"] = merge_scored(base["ref_per_token_logps"], ref)
        sampling = None
        if "sampling_per_token_logps" in base:
            if branch_logprobs is not None and n_branch:
                # vLLM's sampling log-probs of the branch tokens; None (unscorable) -> NaN, as TRL does
                sampling = torch.zeros(n_branch, width, device=device)
                for r, lp in enumerate(branch_logprobs):
                    sampling[r, : len(lp)] = torch.tensor(
                        [float("nan") if x is None else float(x) for x in lp], device=device
                    )
            output["sampling_per_token_logps"] = merge(base["sampling_per_token_logps"], sampling)
        if "importance_sampling_ratio" in base:
            branch_ratio = None
            if n_branch:
                if sampling is None or not need_old:
                    raise RuntimeError("vLLM importance sampling needs sampling log-probs for the branch rollouts")
                branch_ratio = self._importance_sampling_ratio(
                    output["old_per_token_logps"][n_base : n_base + n_branch], sampling, branch_mask
                )
            ratio = merge(base["importance_sampling_ratio"], branch_ratio, fill=1.0)
            if restored:  # TRL's ratio of a masked row is 1; the kept blocks get theirs from the new old log-probs
                rows = torch.tensor([r for r, _ in restored], device=device)
                ratio[rows] = self._importance_sampling_ratio(
                    output["old_per_token_logps"][rows], output["sampling_per_token_logps"][rows], c_mask[rows]
                )[:, : ratio.size(1)].to(ratio.dtype)
            output["importance_sampling_ratio"] = ratio
        output["num_items_in_batch"] = self.accelerator.gather(c_mask.sum()).sum()
        return output

    def _importance_sampling_ratio(self, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor):
        # Same formula as GRPOTrainer._generate_and_score_completions (trl 1.16.0) for its base rows.
        diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
        mode = self.vllm_importance_sampling_mode
        log_ratio = diff.sum(dim=-1, keepdim=True) if mode in ("sequence_mask", "sequence_truncate") else diff
        ratio = torch.exp(log_ratio)
        if mode in ("sequence_truncate", "token_truncate"):
            ratio = torch.clamp(ratio, min=self.vllm_importance_sampling_clip_min, max=self.vllm_importance_sampling_clip_max)
        else:
            low = self.vllm_importance_sampling_clip_min
            high = self.vllm_importance_sampling_clip_max
            low = -math.inf if low is None else low
            high = math.inf if high is None else high
            ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
        return ratio

    def _score_collectively(self, model, prompt_rows: Sequence[Sequence[int]], completion_rows: Sequence[Sequence[int]]):
        """Log-probs of ``completion_rows`` under ``model`` (None when no process has rows).

        Every process runs the same number of forward passes (ZeRO-3 gathers parameters in each): a process with
        fewer rows scores a one-token filler row instead and drops the result.
        """
        counts = gather_counts(self, len(completion_rows))
        most = max(counts)
        if most == 0:
            return None
        batch_size = self.args.per_device_train_batch_size
        device = self.accelerator.device
        pieces = []
        for start in range(0, most, batch_size):
            prompts = list(prompt_rows[start : start + batch_size])
            completions = list(completion_rows[start : start + batch_size])
            real = len(completions)
            if real == 0:
                prompts, completions = [[self._tokenizer.pad_token_id]], [[self._tokenizer.pad_token_id]]
            p_ids, p_mask, c_ids, c_mask = pad_rows(prompts, completions, self._tokenizer.pad_token_id, device)
            logps, _ = score_completions(self, model, p_ids, p_mask, c_ids, c_mask, batch_size=len(completions))
            if real:
                pieces.append(logps)
        if not pieces:
            return torch.zeros(0, 1, device=device)
        width = max(p.size(1) for p in pieces)
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.size(1))) for p in pieces], dim=0)

    # ------------------------------------------------------------------ metrics
    def _log_table_advantages(self, blocks, advantages, records):
        """TRL's completions table (``log_completions``) lists the base rollouts with GRPO's advantages; replace
        them with DATPO's, averaged over each rollout's tokens."""
        sums = {row: 0.0 for row, _, _ in records}
        for b, (kind, _, start, end) in enumerate(blocks["source"]):
            if kind == "base":
                sums[blocks["rollout"][b][1]] += float(advantages[b]) * (end - start)
        means = [sums[row] / max(length, 1) for row, _, length in records]
        table = self._logs["advantages"]
        if len(table) >= len(means):
            for k, value in enumerate(means):
                table[len(table) - len(means) + k] = value

    def _log_tree_metrics(
        self, budgets, v_root, blocks, base_unscorable, base_success, branch_success, records, branch_lengths,
        branch_rewards, diversity, has_siblings,
    ):
        """Tree metrics. Pass rates are the verifier's verdicts (any correct leaf per prompt), over the prompts
        with at least one scorable leaf; unscorable leaves count in no rate or mean."""
        args: DATPOConfig = self.args
        num_groups = len(budgets)
        N = self.num_generations
        leaves = [N] * num_groups
        scorable_base = [not all(base_unscorable[g * N : (g + 1) * N]) for g in range(num_groups)]
        base_pass = [any(base_success[g * N : (g + 1) * N]) for g in range(num_groups)]
        correct_any, scorable_any = list(base_pass), list(scorable_base)
        n = 0
        for b, group in enumerate(blocks["group"]):
            if blocks["kind"][b] == "branch":
                leaves[group] += 1
                if not math.isnan(blocks["reward"][b]):
                    scorable_any[group] = True
                correct_any[group] = correct_any[group] or bool(branch_success[n])
                n += 1
        num_blocks = [0] * num_groups
        for group in blocks["group"]:
            num_blocks[group] += 1
        base_tokens = sum(length for _, _, length in records)
        branch_tokens = sum(branch_lengths)
        leaf_lengths = [length for _, _, length in records] + blocks["branch_response_lengths"]
        total_leaves = sum(leaves)
        defined_v = [v for v in v_root if not math.isnan(v)]
        log_metric(self, "datpo/leaves_per_prompt", total_leaves / num_groups)
        log_metric(self, "datpo/k_hat", sum(k for k, _ in budgets) / num_groups)
        log_metric(self, "datpo/b_hat", sum(b for _, b in budgets) / num_groups)
        if defined_v:
            log_metric(self, "datpo/v_root", sum(defined_v) / len(defined_v))
        if any(scorable_any):
            log_metric(self, "datpo/pass_rate", sum(c for c, s in zip(correct_any, scorable_any) if s) / sum(scorable_any))
        if any(scorable_base):
            log_metric(self, "datpo/base_pass_rate", sum(p for p, s in zip(base_pass, scorable_base) if s) / sum(scorable_base))
        log_metric(self, "datpo/unscorable_rate", (sum(base_unscorable) + sum(
            1 for b, kind in enumerate(blocks["kind"]) if kind == "branch" and math.isnan(blocks["reward"][b])
        )) / total_leaves)
        log_metric(self, "datpo/blocks_per_prompt", sum(num_blocks) / num_groups)
        log_metric(self, "datpo/forks_per_rollout", sum(len(forks) for _, forks, _ in records) / len(records))
        log_metric(self, "datpo/tokens_per_leaf", (base_tokens + branch_tokens) / total_leaves)
        log_metric(self, "datpo/leaf_length", sum(leaf_lengths) / total_leaves)
        scored_branches = [r for r in branch_rewards if not math.isnan(r)]
        if scored_branches:
            log_metric(self, "datpo/branch_reward", sum(scored_branches) / len(scored_branches))
        if args.use_diversity and bool(has_siblings.any()):
            log_metric(self, "datpo/sibling_diversity", float(diversity[has_siblings].mean()))


def _truncated(ids, eos_and_pad) -> bool:
    """TRL's test for ``mask_truncated_completions``: a completion that does not end with EOS (or padding)."""
    return len(ids) > 0 and ids[-1] not in eos_and_pad


def _sampled_length(ids, budget: int, pad_id: int | None) -> int:
    """Tokens of a generated branch row that the sampler produced: ``ids`` less the padding (``pad_id``; None: the
    sampler does not pad) that ``generate`` appended past the row's ``budget`` after it stopped there."""
    length = len(ids)
    if pad_id is not None:
        while length > budget and ids[length - 1] == pad_id:
            length -= 1
    return length


def _build_blocks(records, branch_counts, branch_lengths, budgets, base_rewards, branch_rewards, num_generations):
    """All blocks of all trees of the generation batch, in process order (base blocks, then branches).

    ``records`` = [(global base row, forks, length)] in process order; branches of process q are ordered by base
    row, fork, branch number, as each process generated them. Node ids: ``ROOT`` (0) and ``(row, j)`` for fork j of
    base row ``row``; rollout ids: ``("base", row)``, ``("branch", q, n)``.
    """
    blocks = {
        "start": [], "end": [], "reward": [], "rollout": [], "group": [], "kind": [], "source": [],
        "sibling_key": [], "by_group": {}, "by_process": [], "branch_response_lengths": [],
    }

    def add(group, start, end, reward, rollout, kind, source):
        b = len(blocks["start"])
        blocks["start"].append(start)
        blocks["end"].append(end)
        blocks["reward"].append(reward)
        blocks["rollout"].append(rollout)
        blocks["group"].append(group)
        blocks["kind"].append(kind)
        blocks["source"].append(source)
        blocks["sibling_key"].append((group, start))
        blocks["by_group"].setdefault(group, []).append(b)
        return b

    n_local = len(records) // len(branch_counts)
    branch_offset = 0
    for q, count in enumerate(branch_counts):
        local_blocks = []
        q_records = records[q * n_local : (q + 1) * n_local]
        for i, (row, forks, length) in enumerate(q_records):
            group = row // num_generations
            cuts = [0, *forks, length]
            nodes = [ROOT, *[(row, j) for j in range(len(forks))]]
            for j in range(len(nodes)):
                end = nodes[j + 1] if j + 1 < len(nodes) else None
                reward = base_rewards[row] if end is None else None
                local_blocks.append(add(group, nodes[j], end, reward, ("base", row), "base", ("base", i, cuts[j], cuts[j + 1])))
        n = 0
        for i, (row, forks, _) in enumerate(q_records):
            group = row // num_generations
            _, b_hat = budgets[group]
            for j, fork in enumerate(forks):
                for _ in range(b_hat):
                    length = branch_lengths[branch_offset + n]
                    reward = branch_rewards[branch_offset + n]
                    local_blocks.append(
                        add(group, (row, j), None, reward, ("branch", q, n), "branch", ("branch", n, 0, length))
                    )
                    blocks["branch_response_lengths"].append(fork + length)
                    n += 1
        if n != count:
            raise RuntimeError(f"process {q} reported {count} branches but its forks imply {n}")
        branch_offset += count
        blocks["by_process"].append(local_blocks)
    return blocks


def sort_rows_by_length(batch: dict) -> dict:
    """The rows of ``batch`` ordered by prompt + completion length (masks), so consecutive rows pad little."""
    lengths = batch["prompt_mask"].sum(dim=1) + batch["completion_mask"].sum(dim=1)
    order = torch.argsort(lengths.cpu(), stable=True)
    num_rows = lengths.size(0)
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == num_rows:
            out[key] = value[order.to(value.device)]
        elif isinstance(value, list) and len(value) == num_rows:
            out[key] = [value[k] for k in order.tolist()]
        else:
            out[key] = value
    return out


def split_rows(batch: dict, num_chunks: int, pad_to_multiple_of: int | None = None) -> list[dict]:
    """Split a batch of B rows into ``num_chunks`` micro-batches of ⌊B/n⌋ or ⌈B/n⌉ rows, dropping none, and trim
    each to its own longest prompt and completion (prompts are left-padded, completions right-padded), keeping
    widths multiples of ``pad_to_multiple_of`` when it is set."""

    def round_up(cols: int, limit: int) -> int:
        if not pad_to_multiple_of:
            return cols
        return min(limit, -(-cols // pad_to_multiple_of) * pad_to_multiple_of)

    num_rows = batch["completion_ids"].size(0)
    if num_rows < num_chunks:
        raise ValueError(f"{num_rows} rows cannot fill {num_chunks} micro-batches (steps_per_generation)")
    sizes = [num_rows // num_chunks + (1 if c < num_rows % num_chunks else 0) for c in range(num_chunks)]
    chunks, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        start += size
        chunk = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                chunk[key] = value[rows]
            elif isinstance(value, list):
                chunk[key] = value[rows]
            else:
                chunk[key] = value
        prompt_cols = int(chunk["prompt_mask"].sum(dim=0).nonzero().min()) if chunk["prompt_mask"].any() else 0
        used = (chunk["completion_mask"].sum(dim=0) > 0).nonzero()
        completion_cols = int(used.max()) + 1 if used.numel() else 1
        width = chunk["completion_ids"].size(1)
        prompt_width = chunk["prompt_ids"].size(1)
        prompt_cols = prompt_width - round_up(prompt_width - prompt_cols, prompt_width)
        completion_cols = round_up(completion_cols, width)
        chunk["prompt_ids"] = chunk["prompt_ids"][:, prompt_cols:]
        chunk["prompt_mask"] = chunk["prompt_mask"][:, prompt_cols:]
        for key in _COMPLETION_KEYS:
            value = chunk.get(key)
            if isinstance(value, torch.Tensor) and value.dim() == 2 and value.size(1) == width:
                chunk[key] = value[:, :completion_cols]
        chunks.append(chunk)
    return chunks
