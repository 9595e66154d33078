"""The tool regime's task: follow a chain of keys through a ``lookup`` tool, then ``submit`` the answer it ends in.

An episode is a store of key -> word entries the model cannot see and a start key (docs/testbed.md#the-tool-regime).
The model calls ``lookup(key)``; the store answers with the next key, or with an answer (a colour: the end of the
chain), which the model hands in with ``submit(answer)``. A chain has 3-6 keys, so an episode is 4-7 tool calls and a
closing turn::

    user       Follow the keys from "oak" and submit the answer.
    assistant  <tool_call> lookup {"key": "oak"}      -> fern
    assistant  <tool_call> lookup {"key": "fern"}     -> lime
    assistant  <tool_call> lookup {"key": "lime"}     -> teal
    assistant  <tool_call> submit {"answer": "teal"}  -> ok
    assistant  Done.

Keys are plant names (:data:`KEYS`) and fruits (:data:`TRAPS`), answers colours (:data:`ANSWERS`), each one token of
the regime's tokenizer, so a call copies one token of the last result. **The planted error**: a *trap key* is a
fruit, and the supervised episodes (:func:`scripted_episode`) copy it as its twin fruit ``trap_error_rate`` of the
time (``lookup("lemon")`` for ``lookup("lime")``). The store holds the twin too (a *decoy*), whose own chain of the
same length, free of traps, ends in another colour: the error is silent, as a wrong record ID in a real agent, and
the episode runs to a wrong submission. Every other call is copied right. A chain holds 0-3 trap keys
(:data:`TRAP_COUNTS`), so greedy decoding (which takes the majority, the mis-copy) solves about the trap-free chains
only, while sampling copies a trap key right a fifth of the time: headroom that lowering the temperature does not
reach.

:func:`first_wrong_call` is the checker: the expected calls are ``lookup`` of every key of the chain in order, then
``submit`` of its answer; the first call that differs (or the missing one, when the episode stops short) is wrong,
with its kind (``"planted"`` for the trap mis-copy). :class:`KeyChainEnvironment` is TRL's ``environment_factory``
environment: ``reset``, the two tools, ``get_reward`` (the outcome) and ``turn_rewards`` from the checker
(docs/multiturn.md#turn-rewards).
"""

from __future__ import annotations

import json
import random
import re

__all__ = [
    "KEYS",
    "TRAPS",
    "ANSWERS",
    "WORDS",
    "TRAP_COUNTS",
    "CHAIN_LENGTHS",
    "QUESTION",
    "CLOSING",
    "miscopy",
    "make_episode",
    "make_dataset",
    "expected_calls",
    "first_wrong_call",
    "transcript_first_wrong",
    "KeyChainEnvironment",
    "scripted_episode",
]

#: The keys that are copied right.
KEYS = ("oak", "elm", "ash", "fir", "yew", "bay", "cedar", "pine", "birch", "maple", "hazel", "alder", "rose", "iris",
        "lily", "fern", "moss", "reed", "sage", "mint", "dill", "kale", "leek", "corn", "rice", "bean", "pea", "nut",
        "seed", "root", "leaf", "bark", "twig", "bud", "stem", "vine", "bush", "herb", "weed", "palm")
#: The trap keys and the twin each is mis-copied as (the twin is the decoy's first key).
TRAPS = {"lime": "lemon", "plum": "prune", "pear": "peach", "fig": "date", "kiwi": "mango", "apple": "grape",
         "melon": "berry", "olive": "cherry"}
#: The chains' ends.
ANSWERS = ("red", "blue", "green", "gold", "gray", "pink", "black", "white", "brown", "cyan", "teal", "navy", "tan",
           "rust", "jade", "ruby")
#: Every word of the task: one token each in the regime's tokenizer (trl_credit.testbed.tool_regime).
WORDS = (*KEYS, *TRAPS, *TRAPS.values(), *ANSWERS)
#: How many trap keys a chain holds, with their probabilities (capped by the chain's length).
TRAP_COUNTS = {0: 0.4, 1: 0.3, 2: 0.2, 3: 0.1}
#: Keys per chain (the episode is one more call: the submission).
CHAIN_LENGTHS = (3, 4, 5, 6)
QUESTION = 'Follow the keys from "{start}" and submit the answer.'
#: The closing turn after a submission.
CLOSING = "Done."


def miscopy(key: str) -> str:
    """The planted error's argument: a trap key's twin (any other key unchanged)."""
    return TRAPS.get(key, key)


def make_episode(rng: random.Random) -> dict:
    """One episode: ``{"start", "answer", "store"}``, a chain of :data:`CHAIN_LENGTHS` distinct keys with
    :data:`TRAP_COUNTS` trap keys at random places, and a decoy chain of fresh plain keys behind every trap key's
    twin, as long as what is left of the true chain, ending in another answer."""
    length = rng.choice(CHAIN_LENGTHS)
    traps = min(length, rng.choices(list(TRAP_COUNTS), weights=list(TRAP_COUNTS.values()))[0])
    trap_at = set(rng.sample(range(length), traps))
    trap_keys = iter(rng.sample(sorted(TRAPS), traps))
    plain = iter(rng.sample(KEYS, len(KEYS)))
    chain = [next(trap_keys) if i in trap_at else next(plain) for i in range(length)]
    answers = iter(rng.sample(ANSWERS, traps + 1))
    answer = next(answers)
    store = {}
    for i, key in enumerate(chain):
        store[key] = chain[i + 1] if i + 1 < length else answer
    for i in sorted(trap_at):
        decoy = [miscopy(chain[i])] + [next(plain) for _ in range(length - i - 1)]
        wrong = next(answers)
        for j, key in enumerate(decoy):
            store[key] = decoy[j + 1] if j + 1 < len(decoy) else wrong
    return {"start": chain[0], "answer": answer, "store": store}


def make_dataset(num_train: int = 2000, num_test: int = 256, seed: int = 0):
    """``DatasetDict`` with ``train``/``test`` splits: ``prompt`` (one user message), ``start``, ``answer`` (the
    column OPPO reads), ``store`` (JSON) and ``traps`` (the chain's trap keys). The test split is drawn first."""
    from datasets import Dataset, DatasetDict

    rng = random.Random(seed)

    def rows(count):
        episodes = [make_episode(rng) for _ in range(count)]
        return {"prompt": [[{"role": "user", "content": QUESTION.format(start=e["start"])}] for e in episodes],
                "start": [e["start"] for e in episodes], "answer": [e["answer"] for e in episodes],
                "store": [json.dumps(e["store"]) for e in episodes],
                "traps": [sum(k in TRAPS for _, k in expected_calls(e["store"], e["start"])[:-1])
                          for e in episodes]}

    test = rows(num_test)
    return DatasetDict(train=Dataset.from_dict(rows(num_train)), test=Dataset.from_dict(test))


def _store(store) -> dict:
    return json.loads(store) if isinstance(store, str) else store


def expected_calls(store, start: str) -> list[tuple[str, str]]:
    """The right episode's calls: ``("lookup", key)`` along the chain from ``start``, then ``("submit", answer)``."""
    store, calls, key = _store(store), [], start
    while True:
        calls.append(("lookup", key))
        key = store[key]
        if key in ANSWERS:
            return calls + [("submit", key)]


def first_wrong_call(store, start: str, calls: list[tuple[str, object]]) -> tuple[int | None, str | None]:
    """``(k, kind)``: the 1-indexed first call of ``calls`` (``(tool name, argument)`` pairs) that is not the right
    episode's, or None when every call is right and the submission made. ``kind``:

    - ``"planted"``: a ``lookup`` of the trap key's twin (:func:`miscopy`) where the trap key was due;
    - ``"argument"``: the right tool with another argument; ``"tool"``: another tool (e.g. submitting early);
    - ``"extra"``: a call after the right submission; ``"missing"``: the calls stop short, ``k`` one past the last.
    """
    expected = expected_calls(store, start)
    for index, (name, argument) in enumerate(calls, start=1):
        if index > len(expected):
            return index, "extra"
        due_name, due = expected[index - 1]
        if name != due_name:
            return index, "tool"
        if argument != due:
            planted = name == "lookup" and due in TRAPS and argument == miscopy(due)
            return index, "planted" if planted else "argument"
    if len(calls) < len(expected):
        return len(calls) + 1, "missing"
    return None, None


_START = re.compile(r'from "([^"]+)"')
_CALL = re.compile(r'"name":\s*"(\w+)",\s*"arguments":\s*(\{[^{}]*\})')
_RESULT = "Tool result: "


def transcript_first_wrong(question: str, thoughts) -> int | None:
    """SRPO's step checker of the task (``step_checker="keychain"``, reset="oracle"): the 1-indexed step of the first
    wrong call, read from the transcript alone. ``thoughts``: the steps of a multi-turn rollout as SRPO's localization
    shows them (trl_credit/srpo/multiturn.py: the model's text of the step, then a ``Tool result: ...`` line per tool
    message after it); ``question``: the prompt, which names the start key.

    The store is not needed: a right call copies the last result (the start key first; ``submit`` once the result
    is an answer), so the first call that does not is :func:`first_wrong_call`'s first wrong call whenever every call
    before it was right (tests/test_testbed_tools.py checks the two agree on played episodes). A step whose calls
    cannot be parsed, or one without a call before the submission, is the missing call; calls after the right
    submission are extra. None: every call right and the answer submitted."""
    match = _START.search(question)
    if match is None:
        return None
    due, submitted = match.group(1), False
    for step, text in enumerate(thoughts, start=1):
        model_text, *results = text.split("\n" + _RESULT)
        calls = _CALL.findall(model_text)
        if not calls:
            if submitted:
                continue
            return step  # stops short of the submission (or a call TRL could not parse)
        for index, (name, arguments) in enumerate(calls):
            if submitted:
                return step  # a call after the right submission
            try:
                argument = next(iter(json.loads(arguments).values()), None)
            except (json.JSONDecodeError, StopIteration):
                return step
            wanted = "submit" if due in ANSWERS else "lookup"
            if name != wanted or argument != due:
                return step
            if name == "submit":
                submitted = True
            else:
                due = results[index].strip() if index < len(results) else None
                if due is None:
                    return step  # no result recorded for a call: the transcript ended in it
    return None if submitted else len(thoughts)


class KeyChainEnvironment:
    """TRL's ``environment_factory`` environment of the task (one instance per rollout, reset per episode).

    Tools: :meth:`lookup` and :meth:`submit` (TRL offers every public method but ``reset`` and ``get_reward`` to the
    model, so everything else here is private or a property). ``get_reward``: 1.0 when the first submission is the
    chain's answer. ``turn_rewards`` (process credit, ``process_step_reward="environment"``): one value per model turn,
    the tool calls in order and then the closing turn: 1.0 for a call before :func:`first_wrong_call`'s, 0.0 for it
    and every later turn (a closing turn that stopped short of the submission is the missing call: 0.0); None for the
    closing turn of a right episode (the outcome scores it)."""

    def reset(self, store, start, **row) -> None:
        self._store = _store(store)
        self._start = start
        self.calls: list[tuple[str, object]] = []
        self.submitted = None
        return None  # the prompt asks the question

    def lookup(self, key: str) -> str:
        """
        Look up a key.

        Args:
            key: The key.
        """
        self.calls.append(("lookup", key))
        if key not in self._store:
            raise KeyError(f"no key {key}")
        return self._store[key]

    def submit(self, answer: str) -> str:
        """
        Submit the answer.

        Args:
            answer: The answer.
        """
        self.calls.append(("submit", answer))
        if self.submitted is not None:
            raise ValueError("already submitted")
        self.submitted = answer
        return "ok"

    def get_reward(self) -> float:
        return float(self.submitted is not None and self.submitted == self._answer)

    @property
    def _answer(self) -> str:
        return expected_calls(self._store, self._start)[-1][1]

    @property
    def first_wrong(self) -> tuple[int | None, str | None]:
        """:func:`first_wrong_call` of the calls so far."""
        return first_wrong_call(self._store, self._start, self.calls)

    @property
    def turn_rewards(self) -> list:
        wrong, _ = self.first_wrong
        if wrong is None:
            return [1.0] * len(self.calls) + [None]
        return [1.0 if k < wrong else 0.0 for k in range(1, len(self.calls) + 1)] + [0.0]


def scripted_episode(row: dict, trap_error_rate: float, rng: random.Random) -> dict:
    """A supervised episode played through the environment's own tools: each key copied from the last result (the
    start key from the question), a trap key copied as its twin with probability ``trap_error_rate`` (the episode
    then follows the decoy), the answer submitted, :data:`CLOSING`. ``{"messages": [...], "tools": [...]}`` for
    :func:`trl_credit.testbed.tool_model.warm_start_tool_calls`."""
    env = KeyChainEnvironment()
    env.reset(**row)

    def call(name, arguments):
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}

    messages = list(row["prompt"]) if "prompt" in row else [
        {"role": "user", "content": QUESTION.format(start=row["start"])}]
    key = row["start"]
    while True:
        if key in TRAPS and rng.random() < trap_error_rate:
            key = miscopy(key)
        result = env.lookup(key)
        messages += [call("lookup", {"key": key}), {"role": "tool", "name": "lookup", "content": result}]
        if result in ANSWERS:
            break
        key = result
    messages += [call("submit", {"answer": result}),
                 {"role": "tool", "name": "submit", "content": env.submit(result)},
                 {"role": "assistant", "content": CLOSING}]
    return {"messages": messages, "tools": [env.lookup, env.submit]}
