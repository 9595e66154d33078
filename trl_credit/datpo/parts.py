"""DATPO as parts of the credit core (trl_credit/core/trainer.py; docs/datpo.md, paper Alg. 3): :class:`Trees`, the rollout,
and :class:`BlockCredit`, the credit. The pure math stays in budget.py, forks.py, tree.py and diversity.py.

Each training generation batch:

1. phase 1 (:meth:`Trees.generate_and_score`): ``ctx.trl_batch`` = TRL generates the N
   base rollouts per prompt, scores them with the reward functions, computes old/ref log-probs and vLLM importance
   ratios, logs its metrics; the core's rollout capture keeps TRL's token ids and global rewards of that call, and
   :meth:`Trees.generate_single_turn` records the sampled tokens' entropies on the way (HF generate).
   Then :meth:`Trees.grow` fills one :class:`~.forest.TreeBatch` step by step:
   :meth:`~Trees.set_budgets` (V_root = the share of the prompt's scorable base rollouts the verifier calls correct,
   ``success_reward`` >= ``success_threshold``, and (K̂, B̂) per prompt, ``budget.adaptive_budget``),
   :meth:`~Trees.fork_entropies` and :meth:`~Trees.fork_base_rollouts` (``forks.select_forks``: prefix lengths; by
   default the prefix ends with the selected sentence's first token, paper Alg. 1/3; ``datpo/no_fork_rate`` reports
   rollouts left without a fork; unscorable rollouts do not fork), :meth:`~Trees.grow_branches` (phase 2,
   :mod:`.branches`: the forks of every process, shared out evenly, through TRL's ``_generate_single_turn``, the B̂
   branches of a fork as consecutive rows of one call, each within its fork's ``branch_budget``; their rewards
   through TRL's ``_calculate_rewards`` on prefix + branch) and :meth:`~Trees.assemble_forest` (the tree of every
   prompt, gathered on every process as a :class:`~.forest.Forest` of blocks).
2. credit (:meth:`BlockCredit.advantages`): the blocks' A_base and sibling-diversity bonus (:mod:`.credit`).
3. the training rows (:meth:`Trees.training_batch`, :mod:`.rows`), each process its own: one per base rollout
   (advantage per token = its block's) and one per branch (prompt = prompt + prefix, completion = branch), so no
   token is trained twice. Advantages are (B, T), which TRL's ``_compute_loss`` takes as they are.

Around TRL's batching and loss (the row count varies with the trees; ``Trees.builds_rows``): the core splits the
rows into ``steps_per_generation`` micro-batches without dropping any (TRL's split floor-divides) and renormalizes
the row-averaging loss types (and ``bnpo``) to the whole generation batch, so micro-batch sizes, filler rows and the
number of processes do not change any row's weight (trl_credit/core/row_count.py); ``num_items_in_batch`` counts the
loss tokens of all rows of all processes, so ``loss_type="dapo"`` (the default) averages over every token of the
generation batch. :meth:`Trees.micro_batch_loss` runs forwards of at most ``rows_per_forward`` rows;
:meth:`BlockCredit.loss` sets advantages = A_base + α_t·bonus with α_t of the optimizer step being trained.

Multi-turn rollouts (TRL's ``tools``, ``environment_factory``; :mod:`.multiturn`, docs/datpo.md#multi-turn-rollouts):
phase 1's rollouts are TRL's episodes, forks replace model tokens only, each branch resumes TRL's tool loop from its
fork (an environment replayed to it per branch; a mismatch skips the fork), and the rows carry TRL's ``tool_mask``.

Groups may span processes: trees are assembled from gathered per-row records, so advantages do not depend on how
rows are distributed. Every collective call (generation, scoring passes, reward gather, object gathers) is made by
every process the same number of times, also when a process has no branches.
"""

from __future__ import annotations

import bisect
import math
import random

import torch

from trl_credit.trl_bridge import privates as bridge

from trl_credit.core.batch import RowBatch, trl_groups
from trl_credit.core.logs import nonfinite_reward_groups, warn_once
from trl_credit.core.registry import only, register_part
from trl_credit.core.row_count import NUM_ROWS, split_rows
from trl_credit.core.scoring import pad_rows
from trl_credit.core.setup import bind_success, check_single_turn, outside_zero3_init, speaker, whole_copy
from trl_credit.core.success import success_rows, unscorable_rows
from trl_credit.core.trainer import Credit, Rollout
from trl_credit.generation.hooks import GenerationRecorder, runs_hf_generate
from .batching import sort_rows_by_length
from .branches import branch_rewards, generate_branches
from .budget import adaptive_budget, root_success_rate
from .config import DATPOConfig, DATPOFields
from .credit import block_credit, tree_leaves
from .diversity import annealed_alpha
from .embedding import BlockEmbedder
from .forest import ForestCredit, LeafOutcomes, Skeletons, TreeBatch, build_forest
from .forks import select_forks, sentence_spans, token_char_offsets
from .multiturn import base_episodes, model_sentence_spans, model_tokens, replay_forks, resume_branches
from .rows import training_rows
from .tree import leaf_rewards
from .tree_metrics import log_fork_coverage, log_tree_metrics

__all__ = ["Trees", "BlockCredit", "diversity_alpha"]



def diversity_alpha(ctx) -> float:
    """α_t at the current optimizer step (``ctx.step``: 0-based ``global_step`` of a ``ctx.max_steps`` run; paper
    §4.4)."""
    args: DATPOConfig = ctx.args
    return annealed_alpha(
        ctx.step,
        max(int(ctx.max_steps or 1), 1),
        args.diversity_alpha,
        args.diversity_alpha_final,
        args.diversity_alpha_schedule,
    )


def _leaf_rewards(ctx, base_rewards_per_func, branch_rewards_per_func, branch_groups):
    """Leaf rewards r (NaN: unscorable) of the global base rollouts and branches, per ``tree.leaf_rewards``."""
    N = ctx.group_size
    trees = [row // N for row in range(base_rewards_per_func.size(0))] + list(branch_groups)
    matrix = torch.cat([base_rewards_per_func, branch_rewards_per_func.to(base_rewards_per_func.device)])
    # block_advantages gives them 0; the trees rollout assembles the leaves
    nonfinite_reward_groups(ctx, matrix, trees, "datpo/nonfinite_reward_rate", part="trees")
    rewards = leaf_rewards(matrix.cpu(), trees, ctx.reward_weights.cpu(), ctx.args.multi_objective_aggregation)
    rewards = rewards.tolist()
    return rewards[: base_rewards_per_func.size(0)], rewards[base_rewards_per_func.size(0) :]


@register_part(
    "rollout", "trees", help="DATPO's difficulty-adaptive trees", fields=DATPOFields,
    check_after_grpo="_check_datpo_after_grpo",
    accepts={"credit": only("blocks", why="DATPO's trees train branch rows that only the block Monte Carlo credit "
                                          "values; other credits assume one completion per row of a group"),
             "modifiers": only("cue", why="its P and weights come from the leaf outcomes")},
)
class Trees(Rollout):
    """DATPO's difficulty-adaptive tree rollouts (module docstring). Training only: evaluation stays GRPO on the
    base rollouts. The record (:class:`~trl_credit.core.batch.RowBatch`) holds TRL's base rows (``trl_groups``: the group
    of a row is its prompt's tree), with the :class:`~.forest.TreeBatch` attached as a payload: the rows TRL
    trains on (branches, fillers, the masks of truncated rows and their old/ref log-probs) depend on the credit, so
    they are built after it, in :meth:`training_batch`; TRL's completions table lists the base rows."""

    name = "trees"
    resumes_tool_loop = True  # branches resume TRL's tool loop from their forks (datpo/multiturn.py)
    builds_rows = True  # a row per base rollout and per branch (training_batch), more rows than TRL generated

    # State of one training batch lives in ctx.scratch(self): "phase1" (True while TRL generates the base rollouts),
    # "branching" (True while the branches of phase 2 are generated) and "sampled_entropies" (recorded while HF
    # generate sampled the base rollouts).

    def setup(self, trainer) -> None:
        who = speaker(trainer, self)
        # tools and environments: branches resume TRL's tool loop from their forks (datpo/multiturn.py); a user's
        # rollout_func would replace the base rollouts the trees grow from
        check_single_turn(trainer, who, "its trees generate their own branches from fork points inside the "
                          "completions", tool_loop=True)
        bind_success(trainer)
        if bridge.is_vlm(trainer):
            raise ValueError(f"{who} supports text-only models: branch prompts are token prefixes of the response.")
        if bridge.entropy_bonus_enabled(trainer):
            # TRL adds the entropy bonus per micro-batch inside its loss; DATPO rescales that loss to the generation
            # batch per micro-batch and per forward piece (see `loss`), which would rescale the bonus too.
            raise ValueError(
                f"{who} does not support the entropy bonus (`entropy_coef` != 0 or `use_adaptive_entropy=True`): "
                "its micro-batches vary in size and their loss is renormalized to the generation batch, which would "
                "change the bonus's weight. Set entropy_coef=0.0 and use_adaptive_entropy=False."
            )
        if trainer.aux_loss_enabled:
            warn_once(
                trainer, "datpo_router_aux_loss",
                f"{who}: the MoE router auxiliary loss is added inside TRL's loss, which DATPO renormalizes to the "
                "generation batch and evaluates in forwards of at most `rows_per_forward` rows, so the auxiliary "
                "term's weight is not TRL's (it scales with the micro-batch and the number of forward pieces); set "
                "router_aux_loss_coef=0.0 to train without it.",
            )

    # ------------------------------------------------------------------ generation
    def generate_single_turn(self, ctx, proceed, prompt_ids, images, multimodal_fields, num_generations,
                             has_tool_images=False):
        """TRL's generation; for the phase-1 base rollouts under HF ``generate``, the entropies of the distributions
        the tokens were sampled from are recorded on the way (:class:`~trl_credit.generation.hooks.GenerationRecorder`),
        so forking needs no extra forward pass."""
        # only HF generate's forward is seen step by step; TRL's tool loop generates a rollout in several calls, so no
        # one call's record lines up with the completions (the entropies then come from one scoring pass)
        if not ctx.scratch(self).get("phase1") or not runs_hf_generate(ctx.sampling) or ctx.sampling.tool_loop:
            return proceed(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        recorder = GenerationRecorder(ctx.sampling.temperature, logps=False, entropies=True)
        with recorder.attached_to(ctx.causal_lm):
            completion_ids, logprobs = proceed(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        ctx.scratch(self)["sampled_entropies"] = recorder.entropies(completion_ids)
        return completion_ids, logprobs

    def generate_and_score(self, ctx, inputs, capture) -> tuple[dict, RowBatch | None]:
        if ctx.mode != "train":
            return ctx.trl_batch(inputs), None
        if "image" in inputs[0] or "images" in inputs[0]:
            raise ValueError(f"{ctx.speaker(self)} does not support image inputs.")
        state = ctx.scratch(self)
        state["phase1"] = True
        try:
            base = ctx.trl_batch(inputs)
        finally:
            state["phase1"] = False
        rewards_per_func = capture.rewards(ctx.speaker(self))  # global: every process's base rollouts
        prompt_ids, completion_ids = [list(p) for p in capture.generated[0]], [list(c) for c in capture.generated[1]]
        trees = self.grow(ctx, inputs, prompt_ids, completion_ids, rewards_per_func)
        batch = trl_groups(ctx, rewards_per_func, len(completion_ids))
        batch.attach(trees)
        return base, batch

    def outcomes(self, ctx, batch: RowBatch) -> LeafOutcomes:
        """The trees' leaves as outcomes (:func:`.credit.tree_leaves`), for the core's outcome stage: the modifiers that
        act on outcomes re-weight them before :class:`BlockCredit` aggregates them."""
        return tree_leaves(ctx, batch.payload(TreeBatch))

    def training_batch(self, ctx, batch: RowBatch, inputs, output: dict, advantages: ForestCredit) -> dict:
        """The training rows (:func:`.rows.training_rows`) of the trees with the blocks' credit (``advantages``: the
        :class:`~.forest.ForestCredit` of :class:`BlockCredit`); ``output`` is TRL's batch of the base rows."""
        trees = batch.payload(TreeBatch)
        # TRL's completions table (log_completions) lists the base rollouts with GRPO's advantages: DATPO's instead,
        # averaged over each rollout's tokens
        masks = None if trees.episodes is None else ctx.gather_rows([e.model_mask for e in trees.episodes])
        batch.log_advantages(trees.forest.rollout_mean_advantages(advantages.advantages, trees.skeletons.records,
                                                                  masks))
        rows = training_rows(ctx, output, trees, advantages)
        log_tree_metrics(ctx, trees, advantages)
        # Base rows are cut into blocks at their forks (a block id per token: forks passed so far); a branch row is
        # one block.
        width = rows["completion_ids"].size(1)
        batch.block_ids = [[bisect.bisect_right(forks, t) for t in range(width)] for forks in trees.forks]
        return rows

    def grow(self, ctx, inputs, prompt_ids, completion_ids, rewards_per_func) -> TreeBatch:
        """Phase 1's rollouts (this process's ids, the global rewards) → budgets → forks → branches → the forest.
        Multi-turn rollouts (TRL's tool loop, environments: the episodes of ``ctx.capture``) fork inside the model's
        turns and their branches resume the tool loop (datpo/multiturn.py)."""
        capture = ctx.capture
        episodes = None if capture is None or capture.generated is None else base_episodes(ctx, capture.generated)
        # the prompts TRL generated from: with an environment_factory, with the reset() observation (the dataset may
        # have no prompt column then: the environment owns the data)
        prompts = [x["prompt"] for x in inputs] if episodes is None else list(capture.generated_prompts)
        trees = TreeBatch(
            inputs, prompts, prompt_ids, completion_ids, rewards_per_func,
            first_row=ctx.process_index * len(prompt_ids),  # TRL's process slice: equal base rows per process
        )
        trees.episodes = episodes
        self.set_budgets(ctx, trees)
        self.fork_base_rollouts(ctx, trees, self.fork_entropies(ctx, trees))
        if trees.episodes is not None and ctx.environments is not None:
            replay_forks(ctx, trees)  # each branch's environment, replayed to its fork; mismatching forks dropped
        self.grow_branches(ctx, trees)
        self.assemble_forest(ctx, trees)
        return trees

    def set_budgets(self, ctx, trees: TreeBatch) -> None:
        """The verifier's verdicts on the base rollouts and (K̂, B̂) per prompt (Eq. 1-2), from the global verdicts, so
        every process agrees. Leaf values use TRL's weighted total reward (NaN: unscorable); correct/wrong (pass
        rate, V_root) is the verifier's verdict (``success_reward`` >= ``success_threshold``). A prompt none of whose
        base rollouts could be scored has no V_root and does not branch (nothing under it could be scored)."""
        args: DATPOConfig = ctx.args
        N = ctx.group_size
        trees.unscorable = unscorable_rows(trees.rewards_per_func).tolist()
        trees.success = success_rows(trees.rewards_per_func, ctx.success_index, args.success_threshold).tolist()
        trees.v_root = [
            root_success_rate(trees.success[g * N : (g + 1) * N], trees.unscorable[g * N : (g + 1) * N])
            for g in range(len(trees.unscorable) // N)
        ]
        if args.difficulty_adaptive:
            trees.budgets = [(0, 0) if math.isnan(v) else adaptive_budget(v, args.max_forks, args.max_branches)
                             for v in trees.v_root]
        else:
            trees.budgets = [(0, 0) if math.isnan(v) else (args.max_forks, args.max_branches) for v in trees.v_root]

    def fork_entropies(self, ctx, trees: TreeBatch) -> torch.Tensor | None:
        """Token entropies of the base rollouts (only for the entropy fork methods, when some prompt branches):
        recorded by the sampler (HF generate), else one no-grad forward pass. The pass is collective (ZeRO-3 gathers
        parameters in it), so all processes take the same path."""
        sampled = ctx.scratch(self).pop("sampled_entropies", None)
        if ctx.args.fork_method not in ("sent_entropy", "tok_entropy") or not any(k > 0 for k, _ in trees.budgets):
            return None
        lines_up = sampled is not None and [len(e) for e in sampled] == [len(c) for c in trees.completion_ids]
        from_sampler = all(ctx.gather_rows([lines_up]))
        ctx.metric("datpo/entropy_from_sampler", float(from_sampler))
        if from_sampler:
            entropies = torch.zeros(trees.num_local, max([1] + [len(e) for e in sampled]))
            for i, row in enumerate(sampled):
                entropies[i, : len(row)] = torch.tensor(row)
            return entropies
        p_ids, p_mask, c_ids, c_mask = pad_rows(trees.prompt_ids, trees.completion_ids, ctx.rows.pad_token_id, ctx.device)
        _, entropies = ctx.logprobs(p_ids, p_mask, c_ids, c_mask, compute_entropy=True)
        return entropies.float().cpu()

    def fork_base_rollouts(self, ctx, trees: TreeBatch, entropies: torch.Tensor | None) -> None:
        """Forks per local base rollout (``forks.select_forks``). An unscorable rollout does not fork: its tokens
        keep advantage 0."""
        args: DATPOConfig = ctx.args
        coverage = []  # (scorable with K̂ > 0: the method wants to branch from it, got a fork, by the fallback)
        trees.forks = []
        for i, ids in enumerate(trees.completion_ids):
            g_row = trees.first_row + i
            k_hat, _ = trees.budgets[g_row // ctx.group_size]
            length = len(ids)
            should_fork = k_hat > 0 and not trees.unscorable[g_row]
            forks, fallback = [], False
            # multi-turn: forks replace model tokens only, sentences split per model turn (datpo/multiturn.py)
            mask = None if trees.episodes is None else trees.episodes[i].model_mask
            if should_fork and length >= 2:
                spans = None
                if args.fork_method == "sent_entropy":
                    spans = (sentence_spans(*token_char_offsets(ctx.tokenizer, ids)) if mask is None or all(mask)
                             else model_sentence_spans(ctx.tokenizer, ids, mask))
                rng = random.Random(f"{args.seed}-{ctx.step}-{g_row}")
                row_entropies = entropies[i, :length] if entropies is not None else None
                forks = select_forks(
                    row_entropies, spans, k_hat, args.fork_method, num_tokens=length, min_gap=args.fork_min_gap,
                    rng=rng, position=args.fork_position, model_mask=mask,
                )
                if not forks and args.fork_method == "sent_entropy" and args.fork_fallback == "tok_entropy":
                    # Only with fork_position="before_token": one sentence, which starts at token 0 (a fork before
                    # it would be a fresh rollout, not a branch). Fall back to the top-K̂ tokens by entropy.
                    forks = select_forks(row_entropies, None, k_hat, "tok_entropy", num_tokens=length,
                                         position=args.fork_position, model_mask=mask)
                    fallback = bool(forks)
            trees.forks.append(forks)
            coverage.append((should_fork, bool(forks), fallback))
        log_fork_coverage(ctx, ctx.gather_rows(coverage))

    def grow_branches(self, ctx, trees: TreeBatch) -> None:
        """Phase 2: B̂ branches from every fork (:meth:`generate_branches`: the forks of all processes, shared out
        evenly), their rewards through TRL's reward path, and the verifier's verdicts on them."""
        max_length = ctx.rows.max_completion_length
        fork_requests: list[tuple[list[int], int, int]] = []  # (prompt + prefix, B̂, new-token budget) per fork
        for i, forks in enumerate(trees.forks):
            _, b_hat = trees.budgets[(trees.first_row + i) // ctx.group_size]
            for j, fork in enumerate(forks):
                prefix = trees.prompt_ids[i] + trees.completion_ids[i][:fork]
                # "remaining": the leaf (prefix + branch) is a response of at most max_completion_length tokens
                new_tokens = max(1, max_length - fork) if ctx.args.branch_budget == "remaining" else max_length
                fork_requests.append((prefix, b_hat, new_tokens))
                trees.branch_meta += [(i, j)] * b_hat
                trees.branch_prefixes += [prefix] * b_hat
        state = ctx.scratch(self)
        state["branching"] = True
        try:
            branch_ids, trees.branch_logprobs = self.generate_branches(ctx, fork_requests)
            if trees.episodes is not None:  # multi-turn: TRL's tool loop resumed after each continuation
                branch_ids, trees.branch_logprobs = resume_branches(ctx, trees, branch_ids, trees.branch_logprobs)
        finally:
            state["branching"] = False
        trees.branch_ids = [list(ids) for ids in branch_ids]
        trees.branch_counts = ctx.gather_counts(len(trees.branch_ids))
        trees.branch_rewards_per_func = branch_rewards(ctx, trees)

    def generate_branches(self, ctx, fork_requests: list[tuple[list[int], int, int]]):
        """B̂ continuations of every local fork ``(prompt + prefix ids, B̂, new-token budget)``:
        :func:`trl_credit.datpo.branches.generate_branches` (a collective call)."""
        return generate_branches(ctx, fork_requests)

    def assemble_forest(self, ctx, trees: TreeBatch) -> None:
        """Leaf rewards of every tree, and the tree skeletons (small: forks and lengths per row) gathered so every
        process builds every tree."""
        N = ctx.group_size
        branch_groups = ctx.gather_rows([(trees.first_row + i) // N for i, _ in trees.branch_meta])
        trees.base_rewards, trees.branch_rewards = _leaf_rewards(
            ctx, trees.rewards_per_func, trees.branch_rewards_per_func, branch_groups
        )
        trees.branch_success = success_rows(
            trees.branch_rewards_per_func, ctx.success_index, ctx.args.success_threshold
        ).tolist()
        records = [(trees.first_row + i, trees.forks[i], len(ids)) for i, ids in enumerate(trees.completion_ids)]
        trees.skeletons = Skeletons(
            ctx.gather_rows(records), trees.branch_counts,
            ctx.gather_rows([len(ids) for ids in trees.branch_ids]),
        )
        trees.forest = build_forest(trees.skeletons, trees.budgets, trees.base_rewards, trees.branch_rewards, N)
        if trees.episodes is not None:  # the token metrics count the model's tokens only
            trees.model_tokens = model_tokens(ctx, trees)

    # ------------------------------------------------------------------ loss (the split and the renormalization of the
    # variable row count are the core's: trl_credit/core/row_count.py)
    def micro_batch_loss(self, ctx, proceed, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The micro-batch's loss, computed in forwards of at most ``rows_per_forward`` rows (default
        ``per_device_train_batch_size``): DATPO's micro-batches hold a variable number of rows (a whole tree's worth
        can land in one), so all but the last piece are back-propagated here, outside DDP's gradient sync, and the
        returned loss (which the Trainer back-propagates) carries the others' values for logging. Each piece's loss
        is normalized against the whole generation batch (the core's ``row_count.renormalized_loss``), so the pieces add up to exactly the loss of
        the micro-batch in one forward. Each piece goes through the rest of the chain (TRL's ``compute_loss`` ->
        the trainer's ``_compute_loss`` with every part's ``loss`` hook)."""
        if return_outputs or ctx.mode != "train" or NUM_ROWS not in inputs:
            return proceed(model, inputs, return_outputs, num_items_in_batch)
        num_rows = inputs["completion_ids"].size(0)
        cap = ctx.args.rows_per_forward or ctx.args.per_device_train_batch_size
        if num_rows <= cap:
            return proceed(model, inputs, return_outputs, num_items_in_batch)
        if ctx.deepspeed:
            # DeepSpeed's engine counts backward calls for its own gradient accumulation: one backward per
            # micro-batch only.
            ctx.warn(
                "datpo_rows_per_forward_deepspeed",
                f"{ctx.speaker(self)}: a micro-batch of {num_rows} rows runs in one forward under DeepSpeed "
                "(rows_per_forward="
                f"{cap} applies only without DeepSpeed); lower per_device_train_batch_size or raise "
                "steps_per_generation if it does not fit in memory.",
            )
            return proceed(model, inputs, return_outputs, num_items_in_batch)
        # rows of similar length share a forward (less padding); the loss does not depend on the order of rows
        pieces = split_rows(sort_rows_by_length(inputs), math.ceil(num_rows / cap), ctx.rows.pad_to_multiple_of)
        earlier = 0.0
        for piece in pieces[:-1]:
            with ctx.no_sync(model):
                loss = proceed(model, piece, return_outputs, num_items_in_batch)
                ctx.backward(loss)
            earlier = earlier + loss.detach()
        return proceed(model, pieces[-1], return_outputs, num_items_in_batch) + earlier



@register_part("credit", "blocks", help="DATPO's block Monte Carlo advantages",
               accepts={"rollout": only("trees", why="block advantages are defined on DATPO's trees only")})
class BlockCredit(Credit):
    """DATPO's credit (docs/datpo.md#block-advantages): per block of the trees of a :class:`Trees` rollout
    (the record's :class:`~.forest.TreeBatch` payload), A_base (Eq. 3, the tree's Monte Carlo values) and the gated sibling-diversity bonus
    (Eq. 4, 8; ``use_diversity``, with ``embedder``, a sentence-transformers model or anything with
    ``encode(texts, batch_size=, convert_to_tensor=)``; ``args.embedding_model`` is loaded when None).

    :meth:`advantages` returns a :class:`~.forest.ForestCredit` (per block), not a tensor of the rows: the rows are
    built from it by :meth:`Trees.training_batch`, so this credit runs only with that rollout and a modifier after it
    receives that object. A modifier acts on the trees at the outcome stage instead (``Modifier.acts_on_outcomes``:
    the core hands it the leaf outcomes :meth:`Trees.outcomes` builds, :class:`~.forest.LeafOutcomes`, before this
    credit runs), reading (and possibly re-weighting) the outcomes the blocks' Monte Carlo values average
    (Cue-GRPO's rarity weights: ``cue_grpo.parts.RarityWeights.leaf_outcomes``); this credit aggregates the record's
    ``outcomes`` (:meth:`outcome_rewards`); the modifier's ``apply`` then
    gets this credit's :class:`~.forest.ForestCredit` (Cue-GRPO's rule scales its rows' positive blocks there). The bonus is part of the credit, not a modifier: it is gated by each block's A_base
    and kept apart from it down to the loss, where :meth:`loss` applies α of the optimizer step being trained (the
    schedule runs over optimizer steps, also when a generation batch serves several of them)."""

    name = "blocks"

    def __init__(self, embedder=None):
        self.embedder = embedder
        self._block_embedder: BlockEmbedder | None = None  # wraps self.embedder: its cache lives across steps

    def setup(self, trainer) -> None:
        args: DATPOConfig = trainer.args
        if args.use_diversity:
            if self.embedder is None:
                self.embedder = self._load_embedder(trainer)
            else:  # loaded by the user: partitioned if a ZeRO-3 config was registered then
                self.embedder = whole_copy(self.embedder)
            if not hasattr(self.embedder, "encode"):
                raise TypeError("`embedder` must have an `encode(texts, ...)` method (a sentence-transformers model)")
        elif self.embedder is not None:
            raise ValueError("An `embedder` was passed but `use_diversity=False`; drop one of them.")

    @staticmethod
    def _load_embedder(trainer):
        from ..models import DEFAULT_EMBEDDER, load_default_embedder

        args: DATPOConfig = trainer.args
        device = str(trainer.accelerator.device)
        with outside_zero3_init():  # a whole frozen copy per process, not ZeRO-3 shards
            if args.embedding_model in (None, "", DEFAULT_EMBEDDER):
                return load_default_embedder(device=device)
            from sentence_transformers import SentenceTransformer

            return SentenceTransformer(
                args.embedding_model, device=device, trust_remote_code=args.embedding_trust_remote_code
            )

    def advantages(self, ctx, batch: RowBatch, inputs, output: dict) -> ForestCredit:
        trees = batch.payload(TreeBatch)  # MissingPayload names it: this credit needs the `Trees` rollout
        rewards = None if batch.outcomes is None else self.outcome_rewards(trees, batch.outcomes)
        return block_credit(ctx, trees, diversity_alpha(ctx), self.block_embedder(ctx.args), rewards)

    def block_embedder(self, args: DATPOConfig) -> BlockEmbedder | None:
        """``self.embedder`` behind a :class:`~.embedding.BlockEmbedder` (``embedding_batch_size``,
        ``embedding_cache_size``), made once per embedder so its cache of block texts serves every step."""
        if self.embedder is None:
            return None
        if self._block_embedder is None or self._block_embedder.embedder is not self.embedder:
            self._block_embedder = BlockEmbedder(self.embedder, args.embedding_batch_size, args.embedding_cache_size)
        return self._block_embedder

    @staticmethod
    def outcome_rewards(trees: TreeBatch, leaves) -> list[float | None]:
        """The leaf outcomes the block Monte Carlo values aggregate (one per block, as ``Forest.rewards``), as the
        outcome-stage modifiers left them (``leaves``: the record's :class:`~.forest.LeafOutcomes`)."""
        rewards = trees.forest.rewards()
        for leaf, b in enumerate(leaves.blocks):
            rewards[b] = float(leaves.rewards[leaf])
        return rewards

    def loss(self, ctx, proceed, model, inputs):
        if ctx.mode != "train" or "datpo_base_advantages" not in inputs:
            return proceed(model, inputs)
        alpha = diversity_alpha(ctx)  # α of the optimizer step being trained (paper §4.4)
        inputs = dict(inputs)
        inputs["advantages"] = inputs["datpo_base_advantages"] + alpha * inputs["datpo_diversity_bonus"]
        ctx.metric("datpo/alpha", alpha)
        return proceed(model, inputs)
