"""The implicit PRM's weights and its online update (docs/process.md#the-prms-weights).

- The policy is a PEFT model: the PRM is a second adapter (``implicit_prm``) on the policy's base model, a copy of
  the policy's adapter when training starts (the paper initializes π_φ from the policy); no second copy of the base
  weights. Its reference is the base model with the adapters disabled (what TRL's own reference is under PEFT), the
  policy's initial weights when its adapter starts at LoRA's identity (B = 0); a trained adapter is warned about.
- Otherwise the PRM is a full copy of the policy, and its reference TRL's reference model (``beta > 0``) or a frozen
  copy of the policy's initial weights.

The PRM has its own AdamW (no weight decay, gradient norm clipped at ``prime_grad_clip``: the released recipe's
10.0) over its own
parameters only; they are frozen (``requires_grad=False``) outside its update, so the policy's optimizer, DDP and
TRL's gradient accumulation never see them. With several processes each computes the loss of its rows and the
gradients are summed across processes (one gather) before the step, so every process takes the same step.

Under DeepSpeed ZeRO-3 (docs/process.md#the-prms-weights, "Engines") the policy's weights are partitioned across
processes:

- The PRM copy (and its own reference copy) is made whole on each process from the gathered policy
  (:func:`_whole_detached_copies`) and trained as under DDP, outside the engine.
- The PRM adapter lives in the engine's module and the engine partitions it too: its forwards run inside the engine
  (parameters gathered by the engine's hooks), and its AdamW steps on whole copies of its parameters
  (``parameters``), written back into the partitioned adapter after each step (``GatheredParameters``, every process
  holding the same values). Its gradients are the whole parameters' (the engine reduces only its own optimizer's).
- A forward of the partitioned model is a collective call: every process runs the same number of PRM (and
  reference) forwards and backwards, a process with fewer rows a one-row filler whose result it drops.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import torch

from trl_credit.prime.advantages import cross_entropy_loss

__all__ = ["ADAPTER", "CHECKPOINT_FILE", "ImplicitPRM", "checkpoint_callback", "completion_logps"]

#: The PRM adapter's name on a PEFT policy.
ADAPTER = "implicit_prm"
#: The file, in each of the trainer's checkpoint folders, holding the PRM's parameters and AdamW state.
CHECKPOINT_FILE = "implicit_prm.pt"


def completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """log π(y_t | x, y_<t) of each completion token under ``model`` (B, T), float32, gradients kept when enabled.
    The model's own distribution (no sampling temperature: the implicit reward is log π_φ / π_ref)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logits = logits[:, prompt_ids.size(1) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def _detached_copy(model):
    """A deep copy of ``model`` that computes with its own weights. Accelerate and TRL patch a model's ``forward``
    onto the instance (mixed-precision wrappers bound to the original module); a deep copy would keep those bound
    methods and run, and back-propagate into, the policy's weights. The copy gets its class's ``forward`` back (its
    passes run under the batch's autocast)."""
    duplicate = copy.deepcopy(model)
    for module in duplicate.modules():
        if "forward" in vars(module):
            del module.forward
    return duplicate


def _partitioned(parameters) -> list:
    """The parameters DeepSpeed ZeRO-3 has partitioned (deepspeed's ``is_zero_param``: they carry a ``ds_id``)."""
    return [p for p in parameters if hasattr(p, "ds_id")]


def _whole_detached_copies(model, count: int) -> list:
    """``count`` :func:`_detached_copy` of ``model`` with whole weights on each process. A policy that ZeRO-3 created
    partitioned (``zero.Init``: transformers under ``accelerate launch`` with a ZeRO-3 config) holds an empty
    placeholder per parameter: its parameters are gathered once (a collective: every process builds the trainer) and
    copied while whole; a deep copy of a parameter is an ordinary ``Parameter`` of its data, so the copies are plain
    modules outside the engine. Elsewhere plain deep copies."""
    partitioned = _partitioned(model.parameters())
    if not partitioned:
        return [_detached_copy(model) for _ in range(count)]
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
        return [_detached_copy(model) for _ in range(count)]


class ImplicitPRM:
    """π_φ and π_ref for one trainer (module docstring). Built in the credit's ``setup(trainer)``."""

    def __init__(self, trainer, learning_rate: float, grad_clip: float):
        self.grad_clip = grad_clip
        policy = trainer.model  # not wrapped yet: DDP / DeepSpeed wrap it when training starts
        zero3 = bool(getattr(trainer, "is_deepspeed_enabled", False)) and getattr(
            getattr(trainer.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0) == 3
        self.peft = hasattr(policy, "peft_config") and hasattr(policy, "disable_adapter")  # a PeftModel
        if self.peft:
            self.policy = policy
            self.policy_adapter = policy.active_adapter if isinstance(policy.active_adapter, str) else \
                policy.active_adapter[0]
            config = copy.deepcopy(policy.peft_config[self.policy_adapter])
            if getattr(config, "modules_to_save", None) and getattr(trainer.args, "use_vllm", False):
                # TRL's vLLM weight sync strips only the policy adapter's modules_to_save prefix: the PRM's copies
                # would reach vLLM under names it does not know.
                raise ValueError("credit='implicit_prm' with a LoRA policy whose modules_to_save is set cannot use "
                                 "vLLM (use_vllm=True): the PRM adapter's copies of those modules would be sent to "
                                 "vLLM. Leave modules_to_save unset, or train without vLLM.")
            config.inference_mode = False
            with self._keeping_trainable(policy):
                policy.add_adapter(ADAPTER, config)
            suffix, prm_suffix = f".{self.policy_adapter}.", f".{ADAPTER}."
            own = dict(policy.named_parameters())
            self.parameters = []
            with torch.no_grad():
                for name, parameter in own.items():
                    if prm_suffix in name:
                        source = own.get(name.replace(prm_suffix, suffix))
                        if source is not None:
                            parameter.copy_(source)
                        parameter.requires_grad_(False)
                        self.parameters.append(parameter)
            # Under ZeRO-3 the engine partitions the adapter with the rest of the policy when training starts: the
            # AdamW steps on whole copies, written back into the adapter after each step (module docstring).
            self.adapter_parameters = self.parameters
            if zero3:
                self.parameters = [torch.nn.Parameter(p.detach().clone(), requires_grad=False)
                                   for p in self.adapter_parameters]
            if any(p.abs().max() > 0 for n, p in own.items() if "lora_B" in n and suffix in n):
                warnings.warn(
                    "credit='implicit_prm': the policy's LoRA adapter is not at its identity initialization (lora_B "
                    "is not 0), so the PRM's reference, the base model with adapters disabled (as TRL's reference "
                    "under PEFT), is not the policy's initial weights: the implicit rewards start from log "
                    "pi_adapter / pi_base instead of 0.", UserWarning, stacklevel=3)
            self.model = None
            self.reference = None
            # TRL's reference under PEFT (beta > 0) is the same base model with the adapters disabled, unless the
            # policy carries a "ref" adapter (an initial copy of a trained adapter), which TRL reads instead.
            self.reference_is_trls = "ref" not in policy.peft_config
        else:
            self.policy = None
            reference = getattr(trainer, "ref_model", None)
            own_reference = reference is None or getattr(trainer.args, "sync_ref_model", False)
            copies = _whole_detached_copies(policy, 2 if own_reference else 1)  # whole weights even under ZeRO-3
            self.model = copies[0]
            self.model.requires_grad_(False)
            self.adapter_parameters = None
            self.parameters = [p for p in self.model.parameters() if p.is_floating_point()]
            if reference is not None and getattr(trainer.args, "sync_ref_model", False):
                # TRL moves its reference toward the policy every ref_model_sync_steps: the PRM's π_ref must stay the
                # initial weights (its implicit rewards are log π_φ / π_ref of a fixed π_ref).
                warnings.warn(
                    "credit='implicit_prm' with sync_ref_model=True: TRL's reference model drifts toward the policy, "
                    "so the PRM keeps its own frozen copy of the initial weights as its reference (one more copy of "
                    "the model's weights, and one more reference forward per batch).", UserWarning, stacklevel=3)
                reference = None
            self.reference_is_trls = reference is not None
            if reference is None:
                reference = copies[1].eval()
                reference.requires_grad_(False)
            self.reference = reference
        self.optimizer = torch.optim.AdamW(self.parameters, lr=learning_rate, weight_decay=0.0)

    # ---- the two distributions
    @staticmethod
    @contextlib.contextmanager
    def _keeping_trainable(model):
        """PEFT's ``add_adapter`` / ``set_adapter`` change which parameters require gradients: restore them."""
        flags = {name: p.requires_grad for name, p in model.named_parameters()}
        try:
            yield
        finally:
            for name, p in model.named_parameters():
                p.requires_grad_(flags.get(name, False))

    @contextlib.contextmanager
    def _prm(self):
        """The PRM as a module: the policy with the PRM adapter active, or the PRM copy."""
        if not self.peft:
            yield self.model
            return
        with self._keeping_trainable(self.policy):
            self.policy.set_adapter(ADAPTER)
            try:
                yield self.policy
            finally:
                self.policy.set_adapter(self.policy_adapter)

    def prm_logps(self, rows, batch_size: int, autocast, chunks: int = 0) -> torch.Tensor:
        """No-grad log π_φ over ``rows`` (prompt_ids, prompt_mask, completion_ids, completion_mask), in at least
        ``chunks`` forwards where the PRM runs in the engine's partitioned model (:meth:`_pieces`)."""
        with torch.no_grad(), self._prm() as model:
            return self._chunked(model, rows, batch_size, autocast, chunks if self.peft else 0)

    def reference_logps(self, rows, batch_size: int, autocast, chunks: int = 0) -> torch.Tensor:
        """No-grad log π_ref over ``rows``, in at least ``chunks`` forwards where π_ref is the engine's model (the
        policy's base, or TRL's reference model)."""
        with torch.no_grad():
            if self.peft:
                with self.policy.disable_adapter():
                    return self._chunked(self.policy, rows, batch_size, autocast, chunks)
            return self._chunked(self.reference, rows, batch_size, autocast, chunks if self.reference_is_trls else 0)

    @staticmethod
    def _pieces(rows, batch_size: int, chunks: int):
        """``(rows of one forward, whether they are real)``: ``batch_size`` rows at a time, then one-row fillers up to
        ``chunks`` forwards. Under ZeRO-3 a forward of the partitioned model gathers its parameters, a collective
        call: every process must run as many as the process with the most rows (the caller's ``chunks``)."""
        total = rows[0].size(0)
        starts = range(0, total, batch_size)
        for start in starts:
            yield tuple(x[start:start + batch_size] for x in rows), True
        if len(starts) < chunks:
            # one token of prompt, one of completion: the cheapest forward that gathers every parameter
            filler = tuple(x.new_ones((1, 1)) for x in rows)
            for _ in range(chunks - len(starts)):
                yield filler, False

    @classmethod
    def _chunked(cls, model, rows, batch_size: int, autocast, chunks: int = 0) -> torch.Tensor:
        was_training = model.training
        model.eval()  # no dropout in a scoring pass (TRL's log-prob passes run the same way)
        try:
            pieces = []
            for piece, real in cls._pieces(rows, batch_size, chunks):
                with autocast():
                    logps = completion_logps(model, *piece)
                if real:
                    pieces.append(logps)
            return torch.cat(pieces) if pieces else rows[2].new_zeros(rows[2].shape, dtype=torch.float32)
        finally:
            model.train(was_training)

    # ---- checkpoints: the PRM is no part of the policy's optimizer or (without LoRA) of its weights
    def state_dict(self) -> dict:
        return {"parameters": [p.detach().cpu().clone() for p in self.parameters],
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        saved = state["parameters"]
        if len(saved) != len(self.parameters) or any(a.shape != p.shape for a, p in zip(saved, self.parameters)):
            raise ValueError(f"the implicit PRM's checkpoint ({CHECKPOINT_FILE}) holds {len(saved)} tensors of other "
                             f"shapes than this PRM's {len(self.parameters)}: it was saved by another model or "
                             "LoRA configuration.")
        with torch.no_grad():
            for parameter, value in zip(self.parameters, saved):
                parameter.copy_(value.to(parameter.device, parameter.dtype))
        self.optimizer.load_state_dict(state["optimizer"])
        self._write_adapter()

    def _write_adapter(self) -> None:
        """Under ZeRO-3, the whole parameters the AdamW steps on into the PRM adapter the engine partitioned (every
        process holds the same values: rank 0's are broadcast, each process keeps its partition). Elsewhere the
        optimizer steps on the adapter itself: nothing to do."""
        if self.adapter_parameters is None or self.adapter_parameters is self.parameters:
            return
        import deepspeed

        partitioned = _partitioned(self.adapter_parameters)
        with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=0, enabled=bool(partitioned)), \
                torch.no_grad():
            for adapter, whole in zip(self.adapter_parameters, self.parameters):
                adapter.data.copy_(whole.data)

    # ---- the update
    def update(self, rows, mask, ref_logps, labels, beta: float, num_rows: int, batch_size: int, autocast,
               sum_across_processes, chunks: int = 0) -> dict:
        """One AdamW step of L_CE (§3.2) over this process's ``rows`` (``labels`` r_o, the credited rows only;
        ``mask`` the tokens of each completion) for a batch of ``num_rows`` credited rows on all processes, in at
        least ``chunks`` forwards and backwards where the PRM is an adapter of the engine's model (:meth:`_pieces`).
        Returns this process's summed loss, the sequence rewards r_φ(y) it was computed from and the token log-probs
        of that forward (before the step: ``prime_update="after"`` scores the batch with them)."""
        self.optimizer.zero_grad(set_to_none=True)
        trained = self.parameters if self.adapter_parameters is None else self.adapter_parameters  # in the forward
        for p in trained:
            p.grad = None
        loss_sum, sequence_rewards, token_logps = 0.0, [], []
        # TRL scores a generation batch under torch.no_grad(): the PRM's update needs its gradients back.
        with torch.enable_grad(), self._prm() as model:
            for p in trained:
                p.requires_grad_(True)
            try:
                start = 0
                for piece, real in self._pieces(rows, batch_size, chunks if self.peft else 0):
                    with autocast():
                        logps = completion_logps(model, *piece)
                    if not real:  # a filler: the same gathers in its backward, no gradient
                        (logps.sum() * 0.0).backward()
                        continue
                    taken = slice(start, start + logps.size(0))
                    start = taken.stop
                    rewards = (beta * (logps - ref_logps[taken]) * mask[taken]).sum(dim=1)
                    loss = cross_entropy_loss(rewards, labels[taken])
                    (loss / max(num_rows, 1)).backward()
                    loss_sum += float(loss.detach())
                    sequence_rewards.append(rewards.detach())
                    token_logps.append(logps.detach())
            finally:
                for p in trained:
                    p.requires_grad_(False)
        # Whole gradients (under ZeRO-3 the engine reduces only its own optimizer's parameters, not the adapter's).
        grads = [t.grad if t.grad is not None else torch.zeros_like(p) for t, p in zip(trained, self.parameters)]
        for t in trained:
            t.grad = None
        flat = sum_across_processes(torch.cat([g.reshape(-1).float() for g in grads]))
        offset = 0
        for p in self.parameters:
            p.grad = flat[offset:offset + p.numel()].view_as(p).to(device=p.device, dtype=p.dtype)
            offset += p.numel()
        torch.nn.utils.clip_grad_norm_(self.parameters, self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._write_adapter()
        rewards = torch.cat(sequence_rewards) if sequence_rewards else ref_logps.new_zeros(0)
        logps = torch.cat(token_logps) if token_logps else rows[2].new_zeros(rows[2].shape, dtype=torch.float32)
        return {"loss_sum": loss_sum, "sequence_rewards": rewards, "logps": logps}


def checkpoint_callback(prm: ImplicitPRM):
    """A trainer callback that saves ``prm`` (parameters and AdamW state) into every checkpoint folder the trainer
    writes, and restores it when training resumes from one (``trainer.train(resume_from_checkpoint=...)``): without
    it a resumed run would restart the PRM, silently changing the token rewards."""
    import os

    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    def folder(args, state) -> str:
        return os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")

    class PRMCheckpoints(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero and os.path.isdir(folder(args, state)):
                torch.save(prm.state_dict(), os.path.join(folder(args, state), CHECKPOINT_FILE))

        def on_train_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                return
            # Resumed: the trainer has loaded the checkpoint's trainer state (global_step) before this call.
            path = os.path.join(folder(args, state), CHECKPOINT_FILE)
            if not os.path.exists(path):
                raise ValueError(
                    f"credit='implicit_prm': training resumes at step {state.global_step}, but {path} does not "
                    "exist: the PRM's weights and optimizer are read from the output_dir's checkpoint of that step "
                    "(written there by this trainer). Resume from a checkpoint in output_dir, or copy "
                    f"{CHECKPOINT_FILE} of the checkpoint you resume from there.")
            prm.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))

    return PRMCheckpoints()
