r"""The fixed Strategy-Cue catalog of Cue-GRPO (paper Appendix A, Table 6; docs/cue_grpo.md#cue-extraction), as data.

27 cues in priority order: the 12 symbolic LaTeX cues (ids 1-12) first, then the 15 natural-language cues
(ids 13-27). A step is labelled with the matching cue of lowest id. ``verify`` (26) and the unmatched label
``other`` are filtered out before clustering; ``conclude`` (27) is kept (and usually suppressed group-wide).

Each cue lists the paper's trigger phrases (``examples``, for humans) and the :class:`Trigger` regexes actually
matched. The paper gives phrases, not regexes; these are our matching rules, written once here:

- LaTeX commands are case-sensitive (``\Delta`` is the discriminant, ``\delta`` is not) and must not be the prefix
  of a longer command (``\ln`` does not fire on ``\lnot``, ``\int`` not on ``\intercal``).
- Words are case-insensitive, with word boundaries on both sides. A verb trigger also matches its regular
  inflections (``solve`` -> solves, solved, solving), since a whole-word match of the bare form would miss most
  uses in real traces; ``find`` does not match ``found``. Multi-word triggers allow any whitespace between words.
- ``let $x$ be`` is "let", then up to 40 characters without a period or newline, then "be";
  ``if ... otherwise`` is "if" followed by "otherwise" later in the same step; ``Case 1`` is "case" + a number;
  ``b^2-4ac`` allows ``b^{2}`` and spaces; ``\frac{d}`` is a derivative ``\frac{d...}{d...}``;
  ``\begin{matrix}`` includes the p/b/v/B/V matrix environments; ``\subset`` includes ``\subseteq``.

Every trigger regex starts with its literal ``anchor``: the fast extractor (:mod:`.cues`) finds anchors with
``str.find`` and confirms each hit with the regex, which is exact because a match can only start at its anchor.
``\x00`` separates steps in the fast extractor, so patterns that span characters exclude it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Trigger", "Cue", "CUE_CATALOG", "CUE_NAMES", "CUE_INDEX", "NUM_CUES", "FILTERED_LABELS", "OTHER", "VERIFY"]

_V = r"(?:e|es|ed|ing)"  # inflections of a verb stem ending in consonant + "e": solv-e, solv-es, solv-ed, solv-ing


@dataclass(frozen=True)
class Trigger:
    """One trigger: ``regex`` matches starting at the literal ``anchor``. Word triggers (``latex=False``) are
    matched on lower-cased text with ``\b`` on both sides; LaTeX triggers on the original, case-sensitive text."""

    anchor: str
    regex: str
    latex: bool

    @property
    def full_regex(self) -> str:
        """The regex as applied (boundaries added for words); lower-case literals, so words need IGNORECASE."""
        return self.regex if self.latex else rf"\b{self.regex}\b"


def _tex(*commands: str) -> tuple[Trigger, ...]:
    # "\cmd" not followed by a letter (so "\ln" does not fire on "\lnot")
    return tuple(Trigger("\\" + c, re.escape("\\" + c) + r"(?![A-Za-z])", True) for c in commands)


def _word(anchor: str, regex: str | None = None) -> Trigger:
    return Trigger(anchor, regex if regex is not None else re.escape(anchor), False)


@dataclass(frozen=True)
class Cue:
    """One catalog entry: ``id`` (1 = highest priority), ``name``, ``kind`` (``symbolic``/``language``), the paper's
    trigger phrases ``examples`` and the matched ``triggers``."""

    id: int
    name: str
    kind: str
    examples: tuple[str, ...]
    triggers: tuple[Trigger, ...]

    @property
    def pattern(self) -> str:
        """One regex for the whole cue, usable with ``re.search`` on a step's original text (reference matcher)."""
        parts = [t.full_regex if t.latex else f"(?i:{t.full_regex})" for t in self.triggers]
        return "|".join(parts)


CUE_CATALOG: tuple[Cue, ...] = (
    # --- symbolic (LaTeX) cues, ids 1-12 ---
    Cue(1, "modulo_op", "symbolic", (r"\pmod", r"\bmod", r"\equiv"), _tex("pmod", "bmod", "equiv")),
    Cue(2, "combinatorics", "symbolic", (r"\binom", r"\choose", "combination"),
        (*_tex("binom", "choose"), _word("combination", r"combinations?"))),
    Cue(3, "discriminant", "symbolic", (r"\Delta", "b^2-4ac", "discriminant"),
        (*_tex("Delta"), Trigger("b^", r"b\^\{?2\}?\s*-\s*4\s*a\s*c", True), _word("discriminant", "discriminants?"))),
    Cue(4, "radicals", "symbolic", (r"\sqrt", r"\sqrt[]"), _tex("sqrt")),
    Cue(5, "summation", "symbolic", (r"\sum", r"\prod"), _tex("sum", "prod")),
    Cue(6, "calculus", "symbolic", (r"\int", r"\lim", r"\frac{d}"),
        (*_tex("int", "lim"), Trigger("\\frac{d", r"\\frac\{d[^{}\x00]{0,8}\}\{d", True))),
    Cue(7, "log_exp", "symbolic", (r"\log", r"\ln", r"\exp"), _tex("log", "ln", "exp")),
    Cue(8, "trigonometry", "symbolic", (r"\sin", r"\cos", r"\tan"), _tex("sin", "cos", "tan")),
    Cue(9, "inequality", "symbolic", (r"\leq", r"\geq", r"\neq"), _tex("leq", "geq", "neq")),
    Cue(10, "set_theory", "symbolic", (r"\cup", r"\cap", r"\subset"),
        (*_tex("cup", "cap"), Trigger("\\subset", r"\\subset(?:eq)?(?![A-Za-z])", True))),
    Cue(11, "matrix_op", "symbolic", (r"\begin{matrix}", r"\det"),
        (Trigger("\\begin{", r"\\begin\{[pbvBV]?matrix\}", True), *_tex("det"))),
    Cue(12, "gcd_lcm", "symbolic", (r"\gcd", r"\lcm", "greatest common"),
        (*_tex("gcd", "lcm"), Trigger("\\operatorname{lcm}", r"\\operatorname\{lcm\}", True),
         _word("greatest", r"greatest\s+common"))),
    # --- natural-language cues, ids 13-27 ---
    Cue(13, "define", "language", ("let $x$ be", "assume", "suppose", "given"),
        (_word("let", r"let\b[^.\n\x00]{0,40}?\bbe"), _word("assum", f"assum{_V}"), _word("suppos", f"suppos{_V}"),
         _word("given"))),
    Cue(14, "equation_setup", "language", ("set up equation", "we have the following"),
        (_word("set", r"set(?:s|ting)?\s+up\s+(?:(?:an?|the)\s+)?(?:system\s+of\s+)?equations?"),
         _word("we", r"we\s+have\s+the\s+following"))),
    Cue(15, "substitute", "language", ("substitute", "plug in", "replace"),
        (_word("substitut", r"substitut(?:e|es|ed|ing|ion|ions)"), _word("plug", r"plug(?:s|ged|ging)?\s+in(?:to)?"),
         _word("replac", f"replac{_V}"))),
    Cue(16, "solve_linear", "language", ("solve", "find", "isolate", "rearrange"),
        (_word("solv", f"solv{_V}"), _word("find", r"find(?:s|ing)?"), _word("isolat", f"isolat{_V}"),
         _word("rearrang", f"rearrang{_V}"))),
    Cue(17, "solve_quadratic", "language", ("quadratic formula", "complete square", "factor"),
        (_word("quadratic", r"quadratic\s+formula"), _word("complet", rf"complet{_V}\s+(?:the\s+)?squares?"),
         _word("factor", r"factor(?:s|ed|ing|ise|ised|ising|ize|ized|izes|izing|isation|ization)?"))),
    Cue(18, "solve_cubic", "language", ("cubic equation", "rational root theorem"),
        (_word("cubic", r"cubic\s+equations?"), _word("rational", r"rational\s+roots?\s+theorem"))),
    Cue(19, "case_split", "language", ("Case 1", "consider two cases", "if ... otherwise"),
        (_word("case", r"case\s*\d+"), _word("consider", r"consider\s+(?:two|three|four|\d+)\s+cases"),
         _word("if", r"if\b[^\x00]*?\botherwise"))),
    Cue(20, "theorem_apply", "language", ("theorem", "Pythagorean", "Fermat", "binomial"),
        (_word("theorem", "theorems?"), _word("pythagorean"), _word("fermat"), _word("binomial"))),
    Cue(21, "modulo_arith", "language", ("modulo", "congruence", "remainder", "CRT"),
        (_word("modulo"), _word("modular"), _word("congruen", r"congruen(?:ce|ces|t)"),
         _word("remainder", "remainders?"), _word("crt"))),
    Cue(22, "induction", "language", ("induction", "base case", "inductive hypothesis"),
        (_word("induction"), _word("base", r"base\s+cases?"), _word("inductive", r"inductive\s+hypothes[ie]s"))),
    Cue(23, "combin_count", "language", ("count", "pigeonhole", "stars and bars"),
        (_word("count", r"count(?:s|ed|ing)?"), _word("pigeonhole"), _word("stars", r"stars\s+and\s+bars"))),
    Cue(24, "simplify", "language", ("simplify", "reduce", "cancel", "combine"),
        (_word("simplif", r"simplif(?:y|ies|ied|ying|ication)"), _word("reduc", f"reduc{_V}"),
         _word("cancel", r"cancel(?:s|ed|led|ing|ling)?"), _word("combin", f"combin{_V}"))),
    Cue(25, "compute", "language", ("compute", "calculate", "evaluate"),
        (_word("comput", r"comput(?:e|es|ed|ing|ation)"), _word("calculat", r"calculat(?:e|es|ed|ing|ion)"),
         _word("evaluat", f"evaluat{_V}"))),
    Cue(26, "verify", "language", ("check", "verify", "test"),
        (_word("check", r"check(?:s|ed|ing)?"), _word("verif", r"verif(?:y|ies|ied|ying|ication)"),
         _word("test", r"test(?:s|ed|ing)?"))),
    Cue(27, "conclude", "language", ("therefore", "thus", r"\boxed"),
        (_word("therefore"), _word("thus"), *_tex("boxed"))),
)

NUM_CUES = len(CUE_CATALOG)  # 27 = the dimension of bag-of-cues vectors
CUE_NAMES: tuple[str, ...] = tuple(cue.name for cue in CUE_CATALOG)
CUE_INDEX: dict[str, int] = {name: i for i, name in enumerate(CUE_NAMES)}  # name -> vector coordinate (id - 1)
OTHER = "other"
VERIFY = "verify"
FILTERED_LABELS = frozenset({VERIFY, OTHER})  # removed after merging (Table 6 caption)

assert NUM_CUES == 27 and [cue.id for cue in CUE_CATALOG] == list(range(1, 28))
