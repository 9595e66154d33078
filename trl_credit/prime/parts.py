"""PRIME as a credit of the credit core (trl_credit/core/trainer.py): :class:`ImplicitPRMCredit`,
``credit="implicit_prm"`` (Cui et al. 2025, "Process Reinforcement through Implicit Rewards"; docs/process.md,
"Implicit process rewards").
Per generation batch:

- The credited rows (scorable, in a group, their group free of ±inf rewards and, in training, kept by the paper's
  prompt filter (:mod:`.filter`); a truncated row too unless the filter drops its group: TRL masks its loss, not its
  reward) are scored by the reference π_ref (or TRL's reference log-probs reused); the implicit PRM π_φ takes
  ``prime_updates_per_batch`` AdamW steps of L_CE on their outcome labels (the verifier's verdicts,
  ``success_reward``) before (``prime_update="before"``) or after (``"after"``, scored by the update's forward)
  scoring them.
- Only the model's own tokens carry rewards, the CE and the statistics: tokens that tools, environments or a
  rollout_func's ``env_mask`` inserted (TRL's ``tool_mask`` 0) are context for the forwards, nothing more.
- Token rewards r_t = β log π_φ / π_ref (:func:`~.advantages.token_rewards`), optionally scaled by the batch's
  largest |return|; the leave-one-out baseline of each row from the other rows' mean token rewards; the process
  returns plus the RLOO outcome advantage of TRL's weighted total reward (:mod:`.advantages`), optionally whitened
  over the batch's trained tokens: per-token advantages (B, T).
- Each row's sequence-level direction is its first token's advantage (``RowBatch.sequence_signs`` for Cue-GRPO's
  positive set, ``sequence_anchors`` for TRL's per-sequence decisions), as for the process credit.

Collective calls: every process runs the same gathers (row means, the largest return, the whitening moments, the
PRM's gradients), whatever its rows.
"""

from __future__ import annotations

import torch

from trl_credit.core.batch import NO_GROUP, RowBatch, generated_lengths
from trl_credit.core.context import BatchContext
from trl_credit.core.logs import nonfinite_reward_groups
from trl_credit.core.registry import only, register_part
from trl_credit.core.success import total_rewards
from trl_credit.core.trainer import Credit
from trl_credit.prime.advantages import (
    batch_max_normalized,
    classification_accuracy,
    cross_entropy_loss,
    has_baseline,
    largest_return,
    leave_one_out_means,
    outcome_advantages,
    pairwise_accuracy,
    prime_advantages,
    process_returns,
    token_rewards,
    whitened,
)
from trl_credit.prime.config import PrimeFields
from trl_credit.prime.filter import kept_rows, truncated_rows
from trl_credit.prime.prm import ImplicitPRM, checkpoint_callback

__all__ = ["ImplicitPRMCredit", "SIGN_TOLERANCE"]

#: |first-token advantage| at or below this is direction 0 (as the process credit's rows).
SIGN_TOLERANCE = 1e-9


@register_part(
    "credit", "implicit_prm", help="PRIME: token rewards of an implicit PRM learned online from outcome labels",
    fields=PrimeFields, check="_check_prime_fields",
    accepts={"rollout": only("groups", why="the leave-one-out baselines and the PRM's labels are defined on GRPO's "
                                            "groups of iid completions of one prompt")},
)
class ImplicitPRMCredit(Credit):
    """PRIME's per-token advantages (module docstring)."""

    name = "implicit_prm"
    sets_sequence_anchors = True  # (B, T) advantages: TRL's per-sequence decisions read batch.sequence_anchors

    def __init__(self):
        self.prm = None

    def setup(self, trainer) -> None:
        # Tools, environments and a user's rollout_func are accepted: PRIME generates nothing itself, and the tokens
        # they insert (TRL's tool_mask 0) are no action of the model's: no implicit reward, no CE, no advantage.
        # DeepSpeed ZeRO-1/2 shard the policy's optimizer state and gradients, not its weights: the PRM (an adapter of
        # the policy, frozen to the policy's optimizer, or a copy outside the engine) computes and steps with whole
        # weights. ZeRO-3 partitions the weights, the PRM adapter's too: the PRM copy is made whole, the adapter is
        # stepped on whole copies written back into it, and every process runs the same forwards (prime/prm.py).
        # FSDP shards the weights too, and wraps the policy's modules in its own units: not supported.
        if getattr(trainer, "is_fsdp_enabled", False):
            raise ValueError(
                "credit='implicit_prm' does not run under FSDP: it shards the model's weights, the implicit PRM's (a "
                "LoRA adapter on the policy or a model copy) included once FSDP wraps the policy, while the PRM is "
                "trained by its own optimizer outside FSDP, which needs whole weights. Use DeepSpeed (ZeRO-1, 2 or "
                "3) or DDP.")
        if not hasattr(trainer.args, "success_reward"):
            raise ValueError("credit='implicit_prm' learns from the verifier's verdicts: use CreditConfig (its "
                             "success_reward names the verifier), not a plain GRPOConfig.")
        self.prm = ImplicitPRM(trainer, trainer.args.prime_learning_rate, trainer.args.prime_grad_clip)
        trainer.add_callback(checkpoint_callback(self.prm))  # saved with every checkpoint, restored on resume

    def advantages(self, ctx: BatchContext, batch: RowBatch, inputs, output: dict):
        args = ctx.args
        completion_ids = batch.completion_ids
        num_local, num_tokens = completion_ids.shape
        device = completion_ids.device
        # Credited rows: scorable, in a group, no ±inf reward in the group (GRPO gives those 0).
        grouped = batch.group_ids != NO_GROUP
        nonfinite = torch.zeros(batch.num_rows, dtype=torch.bool)
        nonfinite[grouped] = nonfinite_reward_groups(
            ctx, batch.rewards_per_func[grouped.to(batch.rewards_per_func.device)], batch.group_ids[grouped],
            "prime/nonfinite_reward_rate").cpu()
        credited = (batch.scorable.cpu() & grouped & ~nonfinite)
        if batch.success is None:
            raise ValueError("credit='implicit_prm': the batch has no verifier verdicts (success_reward).")
        # A truncated row's tokens too (mask_truncated_completions zeroes its completion_mask, not its reward).
        generated = generated_lengths(completion_ids, batch.completion_mask, ctx.pad_token_id)
        if args.prime_prompt_filter and ctx.mode == "train":
            credited = self._filtered(ctx, batch, credited, generated)
        local = batch.local_rows(credited)
        rows_here = local.nonzero().flatten().tolist()
        index = torch.tensor(rows_here, dtype=torch.long, device=device)
        lengths = torch.tensor(generated, device=device)
        full_mask = (torch.arange(num_tokens, device=device)[None] < lengths[:, None]).long()
        # The forwards attend to every generated token (tool results are context); the model's own tokens (the record's
        # model_mask: TRL's tool_mask of tools, environments or a rollout_func's env_mask) carry the rewards, the CE
        # and the statistics.
        rows = (batch.prompt_ids[index], batch.prompt_mask[index], completion_ids[index], full_mask[index])
        mask = full_mask[index].double()
        mask = mask * batch.model_mask[index].double()
        labels = batch.local_rows(batch.success.cpu())[local].double().to(device)
        num_credited = int(credited.sum())
        size = args.per_device_train_batch_size

        def sum_across_processes(tensor):
            return ctx.gather(tensor[None]).sum(dim=0)

        # Under ZeRO-3 a forward of the policy is a collective call: the PRM's and the reference's forwards run as
        # many times on every process (fillers where a process has fewer credited rows).
        chunks = max(ctx.gather_counts(-(-len(rows_here) // size))) if ctx.collective_forward else 0

        beta, updates = args.prime_beta, args.prime_updates_per_batch
        if ctx.mode != "train":
            updates = 0  # evaluation batches are scored by the PRM, never learned from
        # Whether the PRM scoring this batch has taken a step (before it, or on an earlier batch): it then differs from
        # its reference by more than two kernels' rounding, and TRL's reference log-probs can stand for PRIME's.
        moved = bool(self.prm.optimizer.state) or (args.prime_update == "before" and updates > 0 and num_credited > 0)
        reference = self._reference_logps(ctx, batch, output, rows, index, lengths, moved, chunks)
        first = None  # the first update's loss and pre-step sequence rewards: the PRM as it met this batch

        def learn():
            nonlocal first
            for _ in range(updates if num_credited else 0):
                step = self.prm.update(rows, mask, reference, labels, beta, num_credited, size, ctx.autocast,
                                       sum_across_processes, chunks)
                first = first or step

        if args.prime_update == "before":
            learn()
            prm = self.prm.prm_logps(rows, size, ctx.autocast, chunks).double()
        else:  # "after": the update's own forward (before its step) scores the batch, as verl's single forward
            learn()
            prm = (first["logps"] if first is not None else self.prm.prm_logps(rows, size, ctx.autocast, chunks))
            prm = prm.double()
        rewards = token_rewards(prm, reference, mask, beta)  # (C, T): the credited rows of this process
        self._log_prm(ctx, batch, rows_here, labels, rewards, first)

        if args.prime_process_norm == "batch_max":
            largest = float(ctx.gather(torch.tensor([largest_return(rewards)], device=device)).max())
            rewards = batch_max_normalized(rewards, largest)
        row_means = torch.zeros(num_local, dtype=torch.float64, device=device)
        if rows_here:
            row_means[index] = rewards.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        every_mean = ctx.gather(row_means).cpu()
        baselines = batch.local_rows(leave_one_out_means(every_mean, batch.group_ids, credited))[local].to(device)
        returns = process_returns(rewards, mask, baselines, args.prime_gamma)
        totals = total_rewards(batch.rewards_per_func, ctx.reward_weights).double().cpu()
        outcome = batch.local_rows(outcome_advantages(torch.nan_to_num(totals), batch.group_ids, credited))[local]
        compared = batch.local_rows(has_baseline(batch.group_ids, credited))[local].to(device)
        values = prime_advantages(returns, outcome.to(device), mask, compared, args.prime_process_coef,
                                  args.prime_outcome_coef)
        if args.prime_whiten:
            # Over the rows that have a baseline only: a row without one (alone in its group after unscorable rows)
            # keeps advantage 0, and its zeros stay out of the moments of every other row.
            compared_mask = mask * compared.double()[:, None]
            trained = compared_mask * batch.loss_mask[index].double()  # the statistics: tokens TRL trains
            moments = sum_across_processes(torch.tensor(
                [float((values * trained).sum()), float((values * values * trained).sum()), float(trained.sum())],
                dtype=torch.float64, device=device))
            values = whitened(values, compared_mask, *moments.tolist())

        advantages = torch.zeros(num_local, num_tokens, dtype=torch.float64, device=device)
        if rows_here:
            advantages[index] = values
        # a row's first own token's advantage (its first token, unless a rollout_func's row opens with an env token)
        own = full_mask * batch.model_mask
        first = own.float().argmax(dim=1)
        sequence = ctx.gather_rows(advantages[torch.arange(num_local, device=device), first].tolist())
        batch.log_advantages(sequence)
        batch.sequence_signs = torch.tensor(
            [0.0 if abs(s) <= SIGN_TOLERANCE else (1.0 if s > 0 else -1.0) for s in sequence], dtype=torch.float64)
        batch.sequence_anchors = torch.tensor(sequence, dtype=torch.float64)
        return advantages.to(dtype=output["advantages"].dtype, device=output["advantages"].device)

    def _reference_logps(self, ctx, batch, output, rows, index, lengths, moved: bool, chunks: int) -> torch.Tensor:
        """log π_ref of the credited rows of this process. With TRL's ``beta > 0`` TRL has scored these rows with the
        same model (``ref_per_token_logps``): reused when its distribution is PRIME's (temperature 1: TRL's log-probs
        are of logits / temperature), TRL attended to every generated token of them (``mask_truncated_completions``
        hides a truncated row's) and the PRM has ``moved`` from its initialization. Until then π_φ = π_ref and the
        implicit rewards must be exactly 0, which only the same forward on both sides gives (TRL's fused LM head
        rounds differently from PRIME's, ~5e-7 per log-prob, and the batch_max scaling would blow that up). Else
        one forward of PRIME's reference (at least ``chunks``: collective under ZeRO-3, where the processes also
        decide together, all reusing TRL's or none)."""
        trl_reference = output.get("ref_per_token_logps")
        reusable = (moved and trl_reference is not None and self.prm.reference_is_trls
                    and ctx.args.temperature == 1.0)
        if reusable:
            reusable = bool((batch.completion_mask[index].sum(dim=1) == lengths[index]).all())
            if ctx.collective_forward:
                reusable = all(ctx.gather_rows([reusable]))
        if reusable:
            return trl_reference[index].double()
        return self.prm.reference_logps(rows, ctx.args.per_device_train_batch_size, ctx.autocast, chunks).double()

    @staticmethod
    def _filtered(ctx, batch, credited, generated) -> torch.Tensor:
        """Algorithm 1's prompt filter (:mod:`.filter`): the credited rows of the groups that pass; the others get
        advantage 0 and no PRM label. Logs the share of groups dropped; warns once when a batch keeps none."""
        args = ctx.args
        last = [int(ids[n - 1]) if n else None for ids, n in zip(batch.completion_ids.tolist(), generated)]
        truncated = torch.tensor(ctx.gather_rows(truncated_rows(last, [*ctx.eos_token_ids, ctx.pad_token_id])))
        kept, num_groups, num_dropped = kept_rows(
            batch.group_ids, credited, batch.success.cpu(), truncated, args.prime_filter_accuracy_lower,
            args.prime_filter_accuracy_upper, args.prime_filter_truncated)
        if num_groups:
            ctx.metric("prime/filtered_group_rate", num_dropped / num_groups)
        if num_groups and num_dropped == num_groups:
            why = " or holds a truncated row" if args.prime_filter_truncated else ""
            ctx.warn("prime_all_filtered", (
                f"{ctx.speaker()}: every group of a generation batch was dropped by PRIME's prompt filter (its "
                f"accuracy is not strictly between prime_filter_accuracy_lower={args.prime_filter_accuracy_lower} "
                f"and prime_filter_accuracy_upper={args.prime_filter_accuracy_upper}{why}): the batch trains "
                "nothing, policy or PRM. prime/filtered_group_rate logs the share every step. Train on prompts of "
                "mixed difficulty, raise max_completion_length, widen the bounds, or set "
                "prime_prompt_filter=False."))
        return kept

    @staticmethod
    def _log_prm(ctx, batch, rows_here, labels, rewards, first) -> None:
        """Global metrics of the PRM on this batch (every process gathers every credited row's values)."""
        offset = batch.local.start
        scored = rewards.sum(dim=1)  # r_φ(y) after this batch's update under "before"
        met = scored if first is None else first["sequence_rewards"].double()  # the PRM as the batch found it
        records = ctx.gather_rows([
            (offset + row, float(met[k]), float(scored[k]), float(labels[k])) for k, row in enumerate(rows_here)])
        if not records:
            return
        met_all = torch.tensor([r[1] for r in records], dtype=torch.float64)
        label_all = torch.tensor([r[3] for r in records], dtype=torch.float64)
        groups = [int(batch.group_ids[r[0]]) for r in records]
        loss = float(cross_entropy_loss(met_all, label_all)) / len(records)
        ctx.metric("prime/prm_loss", loss)
        ctx.metric("prime/prm_accuracy", float(classification_accuracy(met_all, label_all).mean()))
        pairwise = pairwise_accuracy(met_all, label_all, groups)
        if pairwise is not None:
            ctx.metric("prime/prm_pairwise_accuracy", pairwise)
        for name, wanted in (("correct", 1.0), ("wrong", 0.0)):
            chosen = [r[2] for r in records if r[3] == wanted]
            if chosen:
                ctx.metric(f"prime/sequence_reward_{name}", sum(chosen) / len(chosen))
        ctx.metric("prime/credited_rate", len(records) / batch.num_rows)
