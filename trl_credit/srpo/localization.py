"""Scored self-localization, step checkers and localization quality of SRPO (docs/srpo.md#reset-index). Stdlib only.

SRPO's reset thought h* is the policy's own answer to the localization prompt of the paper's Appendix D ("L2
self-localization", §4.2 "SRPO: self-localized reset"). The paper decodes that answer and reads ``\\boxed{N}``; a
small policy may never write it (SmolLM2-135M: never), and a reset drawn at random then turns SRPO into RRPO. Scored
localization asks the same policy the same question but reads its answer off its probabilities instead: after the
localization prompt and a forced ``\\boxed{``, every valid answer ``N}`` (N = 1..H_s) is scored by its log-probability
under the policy, in one forward pass, and h* is the best-scored one (or a draw from the normalised scores at a
temperature). It always gives a valid index and is still the policy's choice among the answers it was asked for.

Calibrated scoring divides the answer probabilities by those the policy gives on a *content-free* chain of the same
length (every step ``N/A``), as contextual calibration does (Zhao et al., 2021, "Calibrate Before Use"): what is
left is how much the seed's actual steps move the policy's pick, not its prior for small step numbers.

A step checker (``checker(question, thoughts) -> int | None``: the 1-indexed first wrong thought, None when it finds
none) realises the paper's credit-assignment oracle (§3, the reset "just before the first wrong thought") exactly
where steps can be checked: ``reset="oracle"`` resets there, and with any reset mode it measures how good h* is
(:class:`LocalizationQuality`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

__all__ = [
    "BOXED_OPEN",
    "CONTENT_FREE_STEP",
    "answer_texts",
    "content_free_thoughts",
    "normalize_scores",
    "calibrate_scores",
    "pick_step",
    "chain_step_checker",
    "STEP_CHECKERS",
    "resolve_step_checker",
    "checked_step",
    "LocalizationQuality",
]

#: The forced opening of the answer the localization prompt asks for (Appendix D: "end with \\boxed{N}").
BOXED_OPEN = "\\boxed{"
#: The content-free step of calibrated scoring (contextual calibration's "N/A" input).
CONTENT_FREE_STEP = "N/A"

StepChecker = Callable[[str, list], "int | None"]


def answer_texts(num_steps: int) -> list[str]:
    """The scored answers after the forced ``\\boxed{``: ``"1}"`` .. ``"H_s}"``. The closing brace ends the number,
    so ``1`` is not scored as a prefix of ``12``."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
    return [f"{step}}}" for step in range(1, num_steps + 1)]


def content_free_thoughts(num_steps: int) -> list[str]:
    """A content-free chain of ``num_steps`` steps, for calibrated scoring."""
    return [CONTENT_FREE_STEP] * num_steps


def normalize_scores(scores: Sequence[float]) -> list[float]:
    """Log-softmax over the candidates: log-probabilities of the answers, renormalised among the valid ones."""
    top = max(scores)
    log_total = top + math.log(sum(math.exp(s - top) for s in scores))
    return [s - log_total for s in scores]


def calibrate_scores(scores: Sequence[float], content_free: Sequence[float]) -> list[float]:
    """Contextual calibration: ``log p(N | chain) - log p(N | content-free chain)``, both renormalised over the valid
    answers, then renormalised again (p_cal ∝ p / p_cf)."""
    if len(scores) != len(content_free):
        raise ValueError(f"{len(scores)} scores but {len(content_free)} content-free scores.")
    return normalize_scores([s - c for s, c in zip(normalize_scores(scores), normalize_scores(content_free))])


def pick_step(scores: Sequence[float], temperature: float = 0.0, rng: random.Random | None = None) -> int:
    """The 1-indexed pick from answer scores: the argmax (the first on ties) at ``temperature`` 0, else a draw from
    ``softmax(scores / temperature)`` with ``rng``."""
    if not scores:
        raise ValueError("pick_step needs at least one score.")
    if temperature <= 0:
        return max(range(len(scores)), key=lambda i: (scores[i], -i)) + 1
    if rng is None:
        raise ValueError("pick_step needs an rng to sample at temperature > 0.")
    probs = [math.exp(p) for p in normalize_scores([s / temperature for s in scores])]
    return rng.choices(range(1, len(scores) + 1), weights=probs)[0]


# ---------------------------------------------------------------------------------------------------- checkers
def chain_step_checker(question: str, thoughts: Sequence[str]) -> int | None:
    """Step checker of the built-in ``chain`` task (trl_credit/tasks/chain.py, docs/testbed.md): the thought holding the
    first wrong line. The checker numbers the completion's non-empty lines; with ``thought_delimiter="\\n"`` line k
    is thought k, and a thought spanning several lines owns all of them. A missing answer (one past the last line)
    maps to the last thought. ``question`` is the chain problem, with or without the task's instruction."""
    from trl_credit.tasks.chain import CHAIN_INSTRUCTION, first_wrong_step

    owner = [k for k, text in enumerate(thoughts, start=1) for line in text.splitlines() if line.strip()]
    if not owner:
        return None
    step = first_wrong_step(_chain_question(question, CHAIN_INSTRUCTION), "\n".join(thoughts))
    if step is None:
        return None
    return owner[step - 1] if step <= len(owner) else len(thoughts)


def _chain_question(text: str, instruction: str) -> str:
    # The dataset prompt is the instruction around the question ("Compute <question>. Write ..."); the checker
    # parses the bare question, which has no period of its own.
    head = instruction.partition("{question}")[0]
    text = text.strip()
    if head and text.startswith(head):
        text = text[len(head):]
    return text.split(".")[0].strip()


#: Step checkers a config can name (``SRPOConfig.step_checker``, ``--step_checker chain``).
def sums_step_checker(question: str, thoughts: Sequence[str]) -> int | None:
    """Step checker of the tiny testbed's sums task (trl_credit/tasks/sums.py, docs/testbed.md#the-tiny-testbed)."""
    from trl_credit.tasks.sums import step_checker

    return step_checker(question, list(thoughts))


def keychain_step_checker(question: str, thoughts: Sequence[str]) -> int | None:
    """Step checker of the tool regime's key-chain task (trl_credit/tasks/keychain.py; multi-turn rollouts, one step per
    model turn): the step of the first call that does not copy the last tool result."""
    from trl_credit.tasks.keychain import transcript_first_wrong

    return transcript_first_wrong(question, thoughts)


STEP_CHECKERS: dict[str, StepChecker] = {"chain": chain_step_checker, "sums": sums_step_checker,
                                         "keychain": keychain_step_checker}


def resolve_step_checker(value) -> StepChecker | None:
    """A callable is returned as is; a name is looked up in :data:`STEP_CHECKERS`; None stays None."""
    if value is None or callable(value):
        return value
    if isinstance(value, str) and value in STEP_CHECKERS:
        return STEP_CHECKERS[value]
    raise ValueError(
        f"step_checker must be a callable (question, thoughts) -> int | None or one of {sorted(STEP_CHECKERS)}, "
        f"got {value!r}."
    )


def checked_step(checker: StepChecker, question: str, thoughts: Sequence[str]) -> int | None:
    """The checker's first wrong thought, validated: an integer in ``[1, len(thoughts)]`` or None."""
    step = checker(question, list(thoughts))
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= len(thoughts):
        raise ValueError(
            f"step_checker returned {step!r} for a chain of {len(thoughts)} thoughts; it must return the 1-indexed "
            f"first wrong thought (an int in [1, {len(thoughts)}]) or None."
        )
    return step


# ---------------------------------------------------------------------------------------------------- quality
@dataclass
class LocalizationQuality:
    """Counts behind the quality metrics of the reset index against a step checker (sums; add them over processes).

    For a reset h* and the checker's first wrong thought h_o: *exact* when h* = h_o (the paper's oracle reset),
    *clean* when h* <= h_o (the kept prefix, thoughts 1..h*-1, has no wrong thought), deviation h* - h_o.
    ``checked`` counts the resets the checker found a wrong thought for; the others are ``unchecked``.
    """

    checked: int = 0
    unchecked: int = 0
    exact: int = 0
    clean: int = 0
    deviation_sum: int = 0

    def add(self, reset_step: int, oracle_step: int | None) -> bool | None:
        """Count one reset; returns whether its prefix is clean (None when the checker found no wrong thought)."""
        if oracle_step is None:
            self.unchecked += 1
            return None
        self.checked += 1
        self.exact += int(reset_step == oracle_step)
        self.clean += int(reset_step <= oracle_step)
        self.deviation_sum += reset_step - oracle_step
        return reset_step <= oracle_step

    def as_list(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_list(cls, values: Sequence[float]) -> LocalizationQuality:
        return cls(*(int(round(v)) for v in values))

    def rates(self) -> dict[str, float]:
        """``exact_rate``, ``clean_rate``, ``deviation`` (mean h* - h_o) over the checked resets; empty if none."""
        if not self.checked:
            return {}
        return {
            "exact_rate": self.exact / self.checked,
            "clean_rate": self.clean / self.checked,
            "deviation": self.deviation_sum / self.checked,
        }
