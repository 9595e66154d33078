"""The tiny testbed's model: a character tokenizer and a ~0.3M-parameter Llama trained from scratch on the sums task.

:func:`build_model` is deterministic: one thread, seeded data and initialisation, a plain supervised loop (loss on
completion tokens only). Its result is cached under ``~/.cache/trl_credit/testbed/<digest>`` (``TRL_CREDIT_CACHE``
moves the root), where the digest hashes the recipe (:class:`Recipe`, the vocabulary and :data:`BUILD_VERSION`),
so a changed recipe never loads a stale model. ``build.json`` beside the weights records the recipe, the weights'
SHA-256, the held-out numbers the build measured and its CPU time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import time

import torch

from trl_credit import models
from trl_credit.srpo.prompts import localization_prompt
from trl_credit.tasks import sums

__all__ = ["VOCAB", "Recipe", "make_tokenizer", "model_config", "build_model", "testbed_model_path", "weights_digest",
           "save_profile"]

#: Bump when the build changes in a way the recipe does not show (the training loop, the data mix's code).
BUILD_VERSION = 1
#: Every character the task, OPPO's oracle prompt and SRPO's localization prompt use (``Step k: `` and
#: ``\boxed{k}`` included), after the three special tokens.
VOCAB = ["<pad>", "<s>", "</s>", *"0123456789", "+", "=", "\n", " ", ":", "\\", "{", "}",
         *"SATLN", *"tepboxd"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything that decides the built weights (hashed into the cache folder's name)."""

    hidden_size: int = 96
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    steps: int = 1500
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    num_train: int = 2000
    num_test: int = 256
    data_seed: int = 0
    seed: int = 0
    slip_rate: float = 0.6
    backward_rate: float = 0.15
    carry_weight: float = 4.0
    oracle_rate: float = 0.2
    localization_rate: float = 0.25
    #: The trap regime (docs/testbed.md#the-trap-regime): digits whose addition the supervised solutions get wrong
    #: ``trap_error_rate`` of the time, always the same way (``z`` one too high), so greedy decoding repeats the
    #: error while sampling finds the right step. Empty: no trap (the sharpening regime).
    trap_digits: str = ""
    trap_error_rate: float = 0.0

    def digest(self) -> str:
        recipe = dataclasses.asdict(self)
        for name in _LATER_FIELDS:  # fields added after the first build hash only when set: old digests stay
            if recipe[name] == _LATER_FIELDS[name]:
                del recipe[name]
        text = json.dumps({"recipe": recipe, "vocab": VOCAB, "version": BUILD_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


_LATER_FIELDS = {"trap_digits": "", "trap_error_rate": 0.0}


def make_tokenizer():
    """A ``PreTrainedTokenizerFast`` with one token per character of :data:`VOCAB` (no BOS added; EOS ``</s>``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({token: index for index, token in enumerate(VOCAB)}, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<pad>", padding_side="left")
    tokenizer.model_max_length = 512
    return tokenizer


def model_config(recipe: Recipe):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(VOCAB), hidden_size=recipe.hidden_size,
                       intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
                       num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_heads,
                       max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2, rms_norm_eps=1e-5)


def weights_digest(model) -> str:
    """SHA-256 of the weights, parameter by parameter in name order (what 'the same build' means)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_profile(profile: dict, model_dir: str, regime: str, results: str | None, per_item: str) -> None:
    """A regime's start profile, stamped with its regime and the model's weights digest (``build.json``): printed
    without its per-problem lists (keys ending ``_correct`` or ``per_item``), and written whole to ``results``."""
    with open(f"{model_dir}/build.json") as f:
        profile.update(regime=regime, weights_sha256=json.load(f)["weights_sha256"])
    print(json.dumps({k: v for k, v in profile.items() if not k.endswith(("_correct", per_item))}, indent=1))
    if results:
        with open(results, "w") as f:
            json.dump(profile, f, indent=1)


def testbed_model_path(recipe: Recipe | None = None, build: bool = True, progress: bool = False) -> str:
    """The folder of the model ``recipe`` builds (default recipe), built first when it is not cached."""
    recipe = recipe or Recipe()
    path = models._cache_root() / "testbed" / recipe.digest()  # the package's cache (TRL_CREDIT_CACHE, XDG)
    if not (path / "build.json").exists():
        if not build:
            raise FileNotFoundError(f"no tiny testbed model at {path}: run `python -m trl_credit.testbed.build`.")
        build_model(recipe, str(path), progress=progress)
    return str(path)


def _batches(examples, tokenizer, batch_size: int, rng: random.Random):
    """Endless shuffled batches: (input_ids, attention_mask, labels) with prompt tokens and padding labelled -100."""
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        chosen, order = order[:batch_size], order[batch_size:]
        rows, labels = [], []
        for index in chosen:
            prompt, completion = examples[index]
            p = tokenizer.encode(prompt, add_special_tokens=False)
            c = tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_token_id]
            rows.append(p + c)
            labels.append([-100] * len(p) + c)
        width = max(map(len, rows))
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        target = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, (row, label) in enumerate(zip(rows, labels)):  # right padding: positions start at 0
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            target[i, : len(row)] = torch.tensor(label)
        yield ids, mask, target


@torch.no_grad()
def _greedy(model, tokenizer, prompts, max_new_tokens: int, batch_size: int = 128) -> list[str]:
    texts = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False)
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts += tokenizer.batch_decode(out[:, batch["input_ids"].size(1):], skip_special_tokens=True)
    return texts


def diagnostics(model, tokenizer, problems, seed: int = 0) -> dict:
    """Greedy held-out accuracy with the plain and the oracle prompt, and greedy self-localization on slipped
    solutions of the held-out problems (exact: the first wrong step; uniform: a uniform draw's expected exact rate)."""
    from trl_credit.srpo.prompts import localization_prompt, parse_reset_step

    model.eval()
    answers = [str(p.answer) for p in problems]
    plain = _greedy(model, tokenizer, [p.question for p in problems], 48)
    oracle = _greedy(model, tokenizer, [p.question + sums.ORACLE_TEMPLATE.format(answer=p.answer) for p in problems], 48)
    rng = random.Random(seed)
    chains = []
    for p in problems:
        clean = sums.solve(p, "forward")
        lines = sums.solution_lines(sums.solve(p, "forward", slip_at=rng.randint(1, len(clean)), slip=1))
        chains.append((p, lines, sums.step_checker(p.question, lines)))
    picks = _greedy(model, tokenizer, [localization_prompt(p.question, lines, sums.LOCALIZATION_TEMPLATE)
                                       for p, lines, _ in chains], 12)
    exact = [parse_reset_step(text, len(lines)) == wrong for text, (_, lines, wrong) in zip(picks, chains)]
    return {"greedy_accuracy": sum(sums.accuracy_reward(plain, answers)) / len(problems),
            "greedy_accuracy_oracle_prompt": sum(sums.accuracy_reward(oracle, answers)) / len(problems),
            "localization_exact": sum(exact) / len(exact),
            "localization_exact_uniform": sum(1 / len(lines) for _, lines, _ in chains) / len(chains)}


def build_model(recipe: Recipe, output_dir: str, progress: bool = False) -> dict:
    """Train the tiny model from scratch (module docstring) into ``output_dir``; returns its ``build.json``."""
    from transformers import LlamaForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float sums wherever it runs (a CPU reduction depends on the thread split)
    start = time.process_time()
    try:
        torch.manual_seed(recipe.seed)
        tokenizer = make_tokenizer()
        model = LlamaForCausalLM(model_config(recipe))
        data = sums.make_dataset(recipe.num_train, recipe.num_test, recipe.data_seed)
        train_problems = [sums.SumsProblem(sums.question_digits(q)) for q in data["train"]["question"]]
        rng = random.Random(recipe.seed)
        examples = []
        for _ in range(4):  # four draws of the mix per problem: slips, structures and kinds vary across copies
            examples += sft_examples(train_problems, rng, recipe.slip_rate, recipe.backward_rate,
                                     recipe.carry_weight, recipe.oracle_rate, recipe.localization_rate,
                                     recipe.trap_digits, recipe.trap_error_rate)
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.01)

        def lr_at(step):  # linear warm-up, cosine decay to 10%
            if step < recipe.warmup_steps:
                return (step + 1) / recipe.warmup_steps
            progress_ = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress_))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
        batches = _batches(examples, tokenizer, recipe.batch_size, rng)
        model.train()
        losses = []
        for step in range(recipe.steps):
            ids, mask, labels = next(batches)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            if progress and (step + 1) % 100 == 0:
                print(f"testbed build: step {step + 1}/{recipe.steps} loss {sum(losses[-100:]) / 100:.4f}",
                      flush=True)
        model.eval()
        test_problems = [sums.SumsProblem(sums.question_digits(q)) for q in data["test"]["question"]]
        measured = diagnostics(model, tokenizer, test_problems)
        os.makedirs(output_dir, exist_ok=True)
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        info = {"recipe": dataclasses.asdict(recipe), "digest": recipe.digest(), "version": BUILD_VERSION,
                "weights_sha256": weights_digest(model), "parameters": sum(p.numel() for p in model.parameters()),
                "final_loss": sum(losses[-100:]) / min(100, len(losses)), "build_cpu_seconds": time.process_time() - start,
                **measured}
        with open(os.path.join(output_dir, "build.json"), "w") as f:
            json.dump(info, f, indent=1)
        return info
    finally:
        torch.set_num_threads(threads)


# The supervised mix (trl_credit/tasks/sums.py's docstring): the task's solutions with the base model's flaws
# built in, and SRPO's localization and OPPO's oracle prompts in the forms the trainers send them.
def _slip_step(steps: list[tuple[int, int, int]], rng: random.Random, carry_weight: float) -> int:
    """A 1-indexed step drawn with weight ``carry_weight`` on carry steps (x + y >= 10), 1 on the others."""
    weights = [carry_weight if x + y >= 10 else 1.0 for x, y, _ in steps]
    return rng.choices(range(1, len(steps) + 1), weights=weights)[0]


def trapped_solution(problem: sums.SumsProblem, structure: str, rng: random.Random, trap_digits: str,
                     trap_error_rate: float, slip_at: int | None = None, slip: int = 0) -> list[tuple[int, int, int]]:
    """The step lines of a solution in the trap regime: each step adding a digit of ``trap_digits`` writes ``z`` one
    too high with probability ``trap_error_rate`` (the systematic error), ``slip_at`` adds ``slip`` to that step's
    ``z`` (a random slip, as :func:`sums.solve`), and the chain continues from the written value."""
    order = problem.order(structure)
    steps, x = [], order[0]
    for index, y in enumerate(order[1:], start=1):
        z = (x + y) % 10
        if str(y) in trap_digits and rng.random() < trap_error_rate:
            z = (z + 1) % 10
        if index == slip_at:
            z = (z + slip) % 10
        steps.append((x, y, z))
        x = z
    return steps


def sft_examples(problems: list[sums.SumsProblem], rng: random.Random, slip_rate: float = 0.6,
                 backward_rate: float = 0.15, carry_weight: float = 4.0, oracle_rate: float = 0.2,
                 localization_rate: float = 0.25, trap_digits: str = "",
                 trap_error_rate: float = 0.0) -> list[tuple[str, str]]:
    """``(prompt, completion)`` pairs of the supervised mix (module docstring), one per problem: an oracle-prompted
    error-free solution (``oracle_rate``), a localization example on a slipped solution (``localization_rate``), or
    a plain solution (the rest; ``slip_rate`` of them slipped). With ``trap_digits`` (the trap regime) the plain
    solutions and the localization examples' chains carry the systematic error (:func:`trapped_solution`); a
    localization chain the trap and the slip both left right gets a slip, so every one has an error."""
    if trap_digits:
        return _trap_examples(problems, rng, slip_rate, backward_rate, carry_weight, oracle_rate, localization_rate,
                              trap_digits, trap_error_rate)
    examples = []
    for problem in problems:
        structure = "backward" if rng.random() < backward_rate else "forward"
        kind = rng.random()
        if kind < oracle_rate:
            prompt = problem.question + sums.ORACLE_TEMPLATE.format(answer=problem.answer)
            examples.append((prompt, "\n".join(sums.solution_lines(sums.solve(problem, structure)))))
            continue
        clean = sums.solve(problem, structure)
        slipped = kind < oracle_rate + localization_rate or rng.random() < slip_rate
        if not slipped:
            examples.append((problem.question, "\n".join(sums.solution_lines(clean))))
            continue
        at = _slip_step(clean, rng, carry_weight)
        lines = sums.solution_lines(sums.solve(problem, structure, slip_at=at, slip=rng.choice((1, -1))))
        if kind < oracle_rate + localization_rate:
            # the seed as SRPO renders it (its thoughts are the lines, the answer line last), answered with the
            # first wrong step; a truncated chain (no answer line) now and then, as the policy's seeds can be
            if rng.random() < 0.2 and len(lines) > 2:
                lines = lines[: rng.randint(2, len(lines) - 1)]
            wrong = sums.step_checker(problem.question, lines)
            prompt = localization_prompt(problem.question, lines, sums.LOCALIZATION_TEMPLATE)
            examples.append((prompt, f"\\boxed{{{wrong}}}"))
        else:
            examples.append((problem.question, "\n".join(lines)))
    return examples


def _trap_examples(problems, rng, slip_rate, backward_rate, carry_weight, oracle_rate, localization_rate,
                   trap_digits, trap_error_rate) -> list[tuple[str, str]]:
    """The trap regime's mix (:func:`sft_examples`): the oracle-prompted solutions stay error-free (OPPO's self-oracle
    knows the right step), every other chain carries the trap errors and, ``slip_rate`` of the time, a random slip."""
    examples = []
    for problem in problems:
        structure = "backward" if rng.random() < backward_rate else "forward"
        kind = rng.random()
        if kind < oracle_rate:
            prompt = problem.question + sums.ORACLE_TEMPLATE.format(answer=problem.answer)
            examples.append((prompt, "\n".join(sums.solution_lines(sums.solve(problem, structure)))))
            continue
        clean = sums.solve(problem, structure)
        localize = kind < oracle_rate + localization_rate
        slip_at, slip = None, 0
        if rng.random() < slip_rate:
            slip_at, slip = _slip_step(clean, rng, carry_weight), rng.choice((1, -1))
        steps = trapped_solution(problem, structure, rng, trap_digits, trap_error_rate, slip_at, slip)
        if localize and steps == clean:  # a localization example needs an error: a slip (the plain mix unbiased)
            slip_at = _slip_step(clean, rng, carry_weight)
            steps = sums.solve(problem, structure, slip_at=slip_at, slip=rng.choice((1, -1)))
        lines = sums.solution_lines(steps)
        if localize:
            if rng.random() < 0.2 and len(lines) > 2:  # a truncated chain now and then, as in the sums mix
                lines = lines[: rng.randint(2, len(lines) - 1)]
            wrong = sums.step_checker(problem.question, lines)
            prompt = localization_prompt(problem.question, lines, sums.LOCALIZATION_TEMPLATE)
            examples.append((prompt, f"\\boxed{{{wrong}}}"))
        else:
            examples.append((problem.question, "\n".join(lines)))
    return examples
