"""The tool regime's task: follow a chain of keys through a ``lookup`` tool, then ``submit`` the answer it ends in.

An episode is a store of key -> text entries the model cannot see and a start key (docs/testbed.md#the-tool-regime).
The model calls ``lookup(key)``; the store answers ``key K`` (the next key) or ``answer A`` (the end of the chain),
and the model hands ``A`` in with ``submit(answer)``. A chain has 3-6 keys, so an episode is 4-7 tool calls and a
closing turn::

    user       Follow the keys from 417 and submit the answer.
    assistant  <tool_call> lookup {"key": 417}      -> key 352
    assistant  <tool_call> lookup {"key": 352}      -> key 168
    assistant  <tool_call> lookup {"key": 168}      -> answer 52
    assistant  <tool_call> submit {"answer": 52}    -> ok
    assistant  Done.

Keys have three digits 1-9; an answer two. **The planted error**: a *trap key* holds one 8, and the supervised
episodes (:func:`scripted_episode`) copy that 8 as a 9 ``trap_error_rate`` of the time (``lookup(169)`` for
``lookup(168)``). The store holds that mis-copied key too (a *decoy*), whose own chain of the same length, free of
traps, ends in another answer: the error is silent, as a wrong record ID in a real agent, and the episode runs to a
wrong submission. Every other call is copied right. A chain holds 0-3 trap keys (:data:`TRAP_COUNTS`), so greedy
decoding (which takes the majority, the mis-copy) solves about the trap-free chains only, while sampling copies a
trap key right a fifth of the time: headroom that lowering the temperature does not reach.

:func:`first_wrong_call` is the checker: the expected calls are ``lookup`` of every key of the chain in order, then
``submit`` of its answer; the first call that differs (or the missing one, when the episode stops short) is wrong,
with its kind (``"planted"`` for the trap mis-copy). :class:`KeyChainEnvironment` is TRL's ``environment_factory``
environment: ``reset``, the two tools, ``get_reward`` (the outcome) and ``turn_rewards`` from the checker
(docs/multiturn.md#turn-rewards).
"""

from __future__ import annotations

import json
import random

__all__ = [
    "TRAP_DIGIT",
    "MISCOPY_DIGIT",
    "TRAP_COUNTS",
    "CHAIN_LENGTHS",
    "QUESTION",
    "CLOSING",
    "miscopy",
    "make_episode",
    "make_dataset",
    "expected_calls",
    "first_wrong_call",
    "KeyChainEnvironment",
    "scripted_episode",
]

#: The digit of a trap key, and what the supervised episodes copy it as.
TRAP_DIGIT, MISCOPY_DIGIT = "8", "9"
#: How many trap keys a chain holds, with their probabilities (capped by the chain's length).
TRAP_COUNTS = {0: 0.4, 1: 0.3, 2: 0.2, 3: 0.1}
#: Keys per chain (the episode is one more call: the submission).
CHAIN_LENGTHS = (3, 4, 5, 6)
QUESTION = "Follow the keys from {start} and submit the answer."
#: The closing turn after a submission.
CLOSING = "Done."
_KEY_DIGITS = "1234567" + MISCOPY_DIGIT  # every digit but the trap digit


def miscopy(key: int) -> int:
    """The planted error's argument: ``key`` with its trap digit written as :data:`MISCOPY_DIGIT`."""
    return int(str(key).replace(TRAP_DIGIT, MISCOPY_DIGIT))


def _fresh_key(rng: random.Random, used: set, trap: bool) -> int:
    while True:
        digits = [rng.choice(_KEY_DIGITS) for _ in range(3)]
        if trap:
            digits[rng.randrange(3)] = TRAP_DIGIT
        key = int("".join(digits))
        if key not in used and (not trap or miscopy(key) not in used):
            used.add(key)
            if trap:
                used.add(miscopy(key))  # reserved for the decoy
            return key


def _fresh_answer(rng: random.Random, taken: set) -> int:
    while True:
        answer = int(rng.choice("1234567" + MISCOPY_DIGIT) + rng.choice("0" + _KEY_DIGITS))
        if answer not in taken:
            taken.add(answer)
            return answer


def make_episode(rng: random.Random) -> dict:
    """One episode: ``{"start", "answer", "store"}`` (the store's keys as strings, JSON-ready), a chain of
    :data:`CHAIN_LENGTHS` keys with :data:`TRAP_COUNTS` trap keys at random places, and a decoy chain behind every
    trap key's mis-copy."""
    length = rng.choice(CHAIN_LENGTHS)
    traps = min(length, rng.choices(list(TRAP_COUNTS), weights=list(TRAP_COUNTS.values()))[0])
    trap_at = set(rng.sample(range(length), traps))
    used: set = set()
    chain = [_fresh_key(rng, used, trap=i in trap_at) for i in range(length)]
    answers: set = set()
    answer = _fresh_answer(rng, answers)
    store = {}
    for i, key in enumerate(chain):
        store[str(key)] = f"key {chain[i + 1]}" if i + 1 < length else f"answer {answer}"
    for i in sorted(trap_at):  # the decoy: as many keys as the true chain has left, then another answer
        decoy = [miscopy(chain[i])] + [_fresh_key(rng, used, trap=False) for _ in range(length - i - 1)]
        wrong = _fresh_answer(rng, answers)
        for j, key in enumerate(decoy):
            store[str(key)] = f"key {decoy[j + 1]}" if j + 1 < len(decoy) else f"answer {wrong}"
    return {"start": chain[0], "answer": answer, "store": store}


def make_dataset(num_train: int = 2000, num_test: int = 256, seed: int = 0):
    """``DatasetDict`` with ``train``/``test`` splits: ``prompt`` (one user message), ``start``, ``answer`` (text, the
    column OPPO reads), ``store`` (JSON) and ``traps`` (the chain's trap keys). The test split is drawn first."""
    from datasets import Dataset, DatasetDict

    rng = random.Random(seed)

    def rows(count):
        episodes = [make_episode(rng) for _ in range(count)]
        return {"prompt": [[{"role": "user", "content": QUESTION.format(start=e["start"])}] for e in episodes],
                "start": [e["start"] for e in episodes], "answer": [str(e["answer"]) for e in episodes],
                "store": [json.dumps(e["store"]) for e in episodes],
                "traps": [sum(TRAP_DIGIT in str(k) for k, _ in expected_calls(e["store"], e["start"])[:-1])
                          for e in episodes]}

    test = rows(num_test)
    return DatasetDict(train=Dataset.from_dict(rows(num_train)), test=Dataset.from_dict(test))


def _store(store) -> dict:
    return json.loads(store) if isinstance(store, str) else store


def expected_calls(store, start: int) -> list[tuple[str, int]]:
    """The right episode's calls: ``("lookup", key)`` along the chain from ``start``, then ``("submit", answer)``."""
    store, calls, key = _store(store), [], int(start)
    while True:
        calls.append(("lookup", key))
        kind, value = store[str(key)].split()
        if kind == "answer":
            return calls + [("submit", int(value))]
        key = int(value)


def first_wrong_call(store, start: int, calls: list[tuple[str, object]]) -> tuple[int | None, str | None]:
    """``(k, kind)``: the 1-indexed first call of ``calls`` (``(tool name, argument)`` pairs) that is not the right
    episode's, or None when every call is right and the submission made. ``kind``:

    - ``"planted"``: a ``lookup`` of the trap key's mis-copy (:func:`miscopy`) where the trap key was due;
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
            planted = name == "lookup" and TRAP_DIGIT in str(due) and argument == miscopy(due)
            return index, "planted" if planted else "argument"
    if len(calls) < len(expected):
        return len(calls) + 1, "missing"
    return None, None


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
        self._start = int(start)
        self.calls: list[tuple[str, object]] = []
        self.submitted = None
        return None  # the prompt asks the question

    def lookup(self, key: int) -> str:
        """
        Look up a key.

        Args:
            key: The key.
        """
        self.calls.append(("lookup", key))
        if str(key) not in self._store:
            raise KeyError(f"no key {key}")
        return self._store[str(key)]

    def submit(self, answer: int) -> str:
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
    def _answer(self) -> int:
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
    start key from the question), a trap key copied as its mis-copy with probability ``trap_error_rate`` (the episode
    then follows the decoy), the answer submitted, :data:`CLOSING`. ``{"messages": [...], "tools": [...]}`` for
    :func:`trl_credit.testbed.tool_model.warm_start_tool_calls`."""
    env = KeyChainEnvironment()
    env.reset(**row)

    def call(name, arguments):
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}

    messages = list(row["prompt"]) if "prompt" in row else [
        {"role": "user", "content": QUESTION.format(start=row["start"])}]
    key = int(row["start"])
    while True:
        if TRAP_DIGIT in str(key) and rng.random() < trap_error_rate:
            key = miscopy(key)
        result = env.lookup(key)
        messages += [call("lookup", {"key": key}), {"role": "tool", "name": "lookup", "content": result}]
        kind, value = result.split()
        if kind == "answer":
            break
        key = int(value)
    messages += [call("submit", {"answer": int(value)}),
                 {"role": "tool", "name": "submit", "content": env.submit(int(value))},
                 {"role": "assistant", "content": CLOSING}]
    return {"messages": messages, "tools": [env.lookup, env.submit]}
