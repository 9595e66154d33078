"""DATPOTrainer: GRPOTrainer with DATPO's difficulty-adaptive tree rollouts (docs/datpo.md, paper Alg. 3).

What changes relative to GRPOTrainer (trl 1.16.0), and nothing else:

- ``_generate_and_score_completions`` (training only; evaluation stays GRPO on the base rollouts):
  1. phase 1 = ``super()._generate_and_score_completions``: TRL generates the N base rollouts per prompt, scores
     them with the reward functions, computes old/ref log-probs and vLLM importance ratios, logs its metrics.
     A rollout capture (``mixins.RolloutCaptureMixin``) keeps TRL's token ids and global rewards of that call;
     ``_generate_single_turn`` records the sampled tokens' entropies on the way (HF generate).
  Then ``_grow_trees`` fills one ``forest.TreeBatch`` step by step (named methods below):
  2. ``_set_budgets``, ``_fork_entropies``, ``_fork_base_rollouts``: V_root = the fraction of the prompt's scorable base rollouts the verifier calls correct (``success_reward``
     >= ``success_threshold``) and (K̂, B̂) per prompt (``budget.adaptive_budget``), token entropies of the base
     rollouts (recorded while HF generate sampled them; else one no-grad pass), forks (``forks.select_forks``:
     prefix lengths; by default the prefix ends with the selected sentence's first token, paper Alg. 1/3;
     ``datpo/no_fork_rate`` reports rollouts left without a fork). Unscorable rollouts do not fork.
  3. ``_grow_branches`` (:mod:`.branches`), phase 2: the forks of every process, shared out evenly across processes, through TRL's
     ``_generate_single_turn`` (HF generate, vLLM server/colocate) with the B̂ branches of a fork as consecutive
     rows of one call (``num_generations=B̂``), in ``branch_chunk_size`` chunks, each branch within its fork's
     ``branch_budget``; branch rewards through TRL's ``_calculate_rewards`` on prefix + branch.
  4. ``_assemble_forest``: the tree of every prompt is gathered on every process as a :class:`.forest.Forest` of
     blocks; :mod:`.credit` computes its block advantages by the pure functions of ``tree`` and ``diversity``;
     :mod:`.rows` builds the training rows, each process its own: one per base rollout (advantage per
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

import torch
from trl import GRPOTrainer

from trl_credit.trl_compat import shuffle_sequence_dict

from ..collectives import gather_counts, gather_rows, local_rows
from ..generation_hooks import GenerationRecorder
from ..model_card import MethodModelCardMixin
from ..scoring import pad_rows, score_completions
from ..success import unscorable_rows
from ..trainer_logs import log_metric, nonfinite_reward_groups, replace_logged_advantages, warn_once
from ..trainer_setup import bind_success, check_single_turn, outside_zero3_init, resolve_method_args, rollout_success
from .batching import sort_rows_by_length, split_rows
from .branches import branch_rewards, generate_branches
from .budget import adaptive_budget, root_success_rate
from .config import DATPOConfig
from .credit import block_credit
from .diversity import annealed_alpha
from .forest import Skeletons, TreeBatch, build_forest
from .forks import select_forks, sentence_spans, token_char_offsets
from .rows import training_rows
from .tree import leaf_rewards
from .tree_metrics import log_fork_coverage, log_tree_metrics

__all__ = ["DATPOTrainer"]


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
        self._datpo_branching = False  # True while the branches of phase 2 are generated
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

    # ------------------------------------------------------------------ generation
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation; for the phase-1 base rollouts under HF ``generate``, the entropies of the distributions
        the tokens were sampled from are recorded on the way (:class:`~trl_credit.generation_hooks.GenerationRecorder`),
        so forking needs no extra forward pass."""
        phase1 = self._rollout_capture is not None and not self._datpo_branching
        if not phase1 or not GenerationRecorder.available(self):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        recorder = GenerationRecorder(self.temperature, logps=False, entropies=True)
        with recorder.attached(self):
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        self._datpo_sampled_entropies = recorder.entropies(completion_ids)
        return completion_ids, logprobs

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
        self._datpo_sampled_entropies = None
        with self._capturing_rollouts() as phase1:  # TRL's token ids and global rewards of the base rollouts
            base = super()._generate_and_score_completions(inputs)
        prompt_ids_list, completion_ids_list = [list(p) for p in phase1.generated[0]], [list(c) for c in phase1.generated[1]]
        prompts = [x["prompt"] for x in inputs]
        return self._grow_trees(
            inputs, prompts, base, prompt_ids_list, completion_ids_list, phase1.rewards("DATPOTrainer")
        )

    def _grow_trees(self, inputs, prompts, base, prompt_ids_list, completion_ids_list, rewards_per_func):
        """Phase 1's rollouts → budgets → forks → branches (phase 2) → the forest → block credit → training rows."""
        trees = TreeBatch(
            inputs, prompts, prompt_ids_list, completion_ids_list, rewards_per_func,
            first_row=local_rows(self, len(prompt_ids_list)).start,  # TRL's process slice: equal base rows per process
        )
        self._set_budgets(trees)
        self._fork_base_rollouts(trees, self._fork_entropies(trees))
        self._grow_branches(trees)
        self._assemble_forest(trees)
        credit = block_credit(self, trees, self._diversity_alpha())
        # TRL's completions table (log_completions) lists the base rollouts with GRPO's advantages: DATPO's instead,
        # averaged over each rollout's tokens
        replace_logged_advantages(self, trees.forest.rollout_mean_advantages(credit.advantages, trees.skeletons.records))
        batch = training_rows(self, base, trees, credit)
        log_tree_metrics(self, trees, credit)
        # Base rows are cut into blocks at their forks (a block id per token: forks passed so far); a branch row is
        # one block.
        width = batch["completion_ids"].size(1)
        block_ids = [[bisect.bisect_right(forks, t) for t in range(width)] for forks in trees.forks]
        self._log_credit(batch, block_ids=block_ids)
        return batch

    def _set_budgets(self, trees: TreeBatch) -> None:
        """The verifier's verdicts on the base rollouts and (K̂, B̂) per prompt (Eq. 1-2), from the global verdicts, so
        every process agrees. Leaf values use TRL's weighted total reward (NaN: unscorable); correct/wrong (pass
        rate, V_root) is the verifier's verdict (``success_reward`` >= ``success_threshold``). A prompt none of whose
        base rollouts could be scored has no V_root and does not branch (nothing under it could be scored)."""
        args: DATPOConfig = self.args
        N = self.num_generations
        trees.unscorable = unscorable_rows(trees.rewards_per_func).tolist()
        trees.success = rollout_success(self, trees.rewards_per_func).tolist()
        trees.v_root = [
            root_success_rate(trees.success[g * N : (g + 1) * N], trees.unscorable[g * N : (g + 1) * N])
            for g in range(len(trees.unscorable) // N)
        ]
        if args.difficulty_adaptive:
            trees.budgets = [(0, 0) if math.isnan(v) else adaptive_budget(v, args.max_forks, args.max_branches)
                             for v in trees.v_root]
        else:
            trees.budgets = [(0, 0) if math.isnan(v) else (args.max_forks, args.max_branches) for v in trees.v_root]

    def _fork_entropies(self, trees: TreeBatch) -> torch.Tensor | None:
        """Token entropies of the base rollouts (only for the entropy fork methods, when some prompt branches):
        recorded by the sampler (HF generate), else one no-grad forward pass. The pass is collective (ZeRO-3 gathers
        parameters in it), so all processes take the same path."""
        sampled, self._datpo_sampled_entropies = self._datpo_sampled_entropies, None
        if self.args.fork_method not in ("sent_entropy", "tok_entropy") or not any(k > 0 for k, _ in trees.budgets):
            return None
        lines_up = sampled is not None and [len(e) for e in sampled] == [len(c) for c in trees.completion_ids]
        from_sampler = all(gather_rows(self, [lines_up]))
        log_metric(self, "datpo/entropy_from_sampler", float(from_sampler))
        if from_sampler:
            entropies = torch.zeros(trees.num_local, max([1] + [len(e) for e in sampled]))
            for i, row in enumerate(sampled):
                entropies[i, : len(row)] = torch.tensor(row)
            return entropies
        p_ids, p_mask, c_ids, c_mask = pad_rows(
            trees.prompt_ids, trees.completion_ids, self._tokenizer.pad_token_id, self.accelerator.device
        )
        _, entropies = score_completions(self, self.model, p_ids, p_mask, c_ids, c_mask, compute_entropy=True)
        return entropies.float().cpu()

    def _fork_base_rollouts(self, trees: TreeBatch, entropies: torch.Tensor | None) -> None:
        """Forks per local base rollout (``forks.select_forks``). An unscorable rollout does not fork: its tokens
        keep advantage 0."""
        args: DATPOConfig = self.args
        coverage = []  # (scorable with K̂ > 0: the method wants to branch from it, got a fork, by the fallback)
        trees.forks = []
        for i, ids in enumerate(trees.completion_ids):
            g_row = trees.first_row + i
            k_hat, _ = trees.budgets[g_row // self.num_generations]
            length = len(ids)
            should_fork = k_hat > 0 and not trees.unscorable[g_row]
            forks, fallback = [], False
            if should_fork and length >= 2:
                spans = None
                if args.fork_method == "sent_entropy":
                    spans = sentence_spans(*token_char_offsets(self._tokenizer, ids))
                rng = random.Random(f"{args.seed}-{self.state.global_step}-{g_row}")
                row_entropies = entropies[i, :length] if entropies is not None else None
                forks = select_forks(
                    row_entropies, spans, k_hat, args.fork_method, num_tokens=length, min_gap=args.fork_min_gap,
                    rng=rng, position=args.fork_position,
                )
                if not forks and args.fork_method == "sent_entropy" and args.fork_fallback == "tok_entropy":
                    # Only with fork_position="before_token": one sentence, which starts at token 0 (a fork before
                    # it would be a fresh rollout, not a branch). Fall back to the top-K̂ tokens by entropy.
                    forks = select_forks(row_entropies, None, k_hat, "tok_entropy", num_tokens=length,
                                         position=args.fork_position)
                    fallback = bool(forks)
            trees.forks.append(forks)
            coverage.append((should_fork, bool(forks), fallback))
        log_fork_coverage(self, gather_rows(self, coverage))

    def _grow_branches(self, trees: TreeBatch) -> None:
        """Phase 2: B̂ branches from every fork (``_generate_branches``: the forks of all processes, shared out
        evenly), their rewards through TRL's reward path, and the verifier's verdicts on them."""
        max_length = self.max_completion_length
        fork_requests: list[tuple[list[int], int, int]] = []  # (prompt + prefix, B̂, new-token budget) per fork
        for i, forks in enumerate(trees.forks):
            _, b_hat = trees.budgets[(trees.first_row + i) // self.num_generations]
            for j, fork in enumerate(forks):
                prefix = trees.prompt_ids[i] + trees.completion_ids[i][:fork]
                # "remaining": the leaf (prefix + branch) is a response of at most max_completion_length tokens
                new_tokens = max(1, max_length - fork) if self.args.branch_budget == "remaining" else max_length
                fork_requests.append((prefix, b_hat, new_tokens))
                trees.branch_meta += [(i, j)] * b_hat
                trees.branch_prefixes += [prefix] * b_hat
        self._datpo_branching = True
        try:
            branch_ids, trees.branch_logprobs = self._generate_branches(fork_requests)
        finally:
            self._datpo_branching = False
        trees.branch_ids = [list(ids) for ids in branch_ids]
        trees.branch_counts = gather_counts(self, len(trees.branch_ids))
        trees.branch_rewards_per_func = branch_rewards(self, trees)

    def _assemble_forest(self, trees: TreeBatch) -> None:
        """Leaf rewards of every tree, and the tree skeletons (small: forks and lengths per row) gathered so every
        process builds every tree."""
        N = self.num_generations
        branch_groups = gather_rows(self, [(trees.first_row + i) // N for i, _ in trees.branch_meta])
        trees.base_rewards, trees.branch_rewards = self._leaf_rewards(
            trees.rewards_per_func, trees.branch_rewards_per_func, branch_groups
        )
        trees.branch_success = rollout_success(self, trees.branch_rewards_per_func).tolist()
        records = [(trees.first_row + i, trees.forks[i], len(ids)) for i, ids in enumerate(trees.completion_ids)]
        trees.skeletons = Skeletons(
            gather_rows(self, records), trees.branch_counts, gather_rows(self, [len(ids) for ids in trees.branch_ids])
        )
        trees.forest = build_forest(trees.skeletons, trees.budgets, trees.base_rewards, trees.branch_rewards, N)

    def _leaf_rewards(self, base_rewards_per_func, branch_rewards_per_func, branch_groups):
        """Leaf rewards r (NaN: unscorable) of the global base rollouts and branches, per ``leaf_rewards``."""
        N = self.num_generations
        trees = [row // N for row in range(base_rewards_per_func.size(0))] + list(branch_groups)
        matrix = torch.cat([base_rewards_per_func, branch_rewards_per_func.to(base_rewards_per_func.device)])
        nonfinite_reward_groups(self, matrix, trees, "datpo/nonfinite_reward_rate")  # block_advantages gives them 0
        rewards = leaf_rewards(matrix.cpu(), trees, self.reward_weights.cpu(), self.args.multi_objective_aggregation)
        rewards = rewards.tolist()
        return rewards[: base_rewards_per_func.size(0)], rewards[base_rewards_per_func.size(0) :]

    def _generate_branches(self, fork_requests: list[tuple[list[int], int, int]]):
        """B̂ continuations of every local fork ``(prompt + prefix ids, B̂, new-token budget)``:
        :func:`trl_credit.datpo.branches.generate_branches` (a collective call)."""
        return generate_branches(self, fork_requests)

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
