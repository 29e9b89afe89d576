"""What a build-it check returns: one verdict per criterion, shown as a checklist.

Every build-it exercise (``build_arena``, ``build_block_manager``, ``build_scheduler``,
``build_kernel``, ``build_prefix_cache``) grades the learner's code criterion by criterion,
in order, and stops at the first failure: later criteria assume the earlier ones hold. A
``Report`` prints as

    3 of 7 criteria hold
      [x] ... a criterion that held
      [!] ... the first one that failed
          what went wrong (the shortest case that shows it)
          likely: the misconception such a failure most often means
      [ ] ... one not checked yet

The graders behind the checks share two loops: ``shrunk_failures`` tries seeded random
operation sequences and keeps the first failure of each criterion, shrunk by
``shrink_loop`` to the fewest operations that still show it.

Not handled: partial credit within a criterion.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    """One criterion's result.

    Attributes:
        criterion: a key of the exercise's criteria.
        passed: whether it held.
        detail: what went wrong (the shortest operations that show it), or "".
        misconception: what such a failure most often means, or "".
    """

    criterion: str
    passed: bool
    detail: str = ""
    misconception: str = ""


@dataclass(frozen=True)
class Report:
    """Every criterion's verdict, in order; shows as a checklist in a notebook.

    Attributes:
        verdicts: the criteria checked so far.
        criteria: every criterion of the exercise, ``key -> what it asks``.
        stuck: the line printed under a failed report: where the hints are.
    """

    verdicts: list[Verdict]
    criteria: dict[str, str]
    stuck: str

    @property
    def score(self) -> int:
        return sum(v.passed for v in self.verdicts)

    @property
    def passed(self) -> bool:
        return self.score == len(self.criteria)

    def __repr__(self) -> str:
        lines = [f"{self.score} of {len(self.criteria)} criteria hold"]
        graded = {v.criterion: v for v in self.verdicts}
        for key, text in self.criteria.items():
            verdict = graded.get(key)
            if verdict is None:
                lines.append(f"  [ ] {text} (not checked yet: fix the first failure)")
                continue
            lines.append(f"  [{'x' if verdict.passed else '!'}] {text}")
            if verdict.detail:
                lines.append(f"      {verdict.detail}")
            if verdict.misconception:
                lines.append(f"      likely: {verdict.misconception}")
        if not self.passed:
            lines.append(self.stuck)
        return "\n".join(lines)


def shrunk_failures(
    make: Callable,
    first_difference: Callable,
    shrink: Callable,
    random_case: Callable[[random.Random], list],
    show_case: Callable[[list], str],
    num_sequences: int,
    seed: int,
) -> dict[str, tuple[str, str]]:
    """``criterion -> (what happened in the shortest case, misconception)`` for every
    criterion some of ``num_sequences`` seeded random cases break.

    Args:
        make: the learner's class.
        first_difference: ``(make, ops) -> (criterion, detail, misconception) | None``.
        shrink: ``(make, ops, criterion) -> ops``, fewer or smaller, still failing.
        random_case: a random, valid list of operations.
        show_case: a case in words.
    """
    rng = random.Random(seed)
    failures: dict[str, tuple[str, str]] = {}
    for _ in range(num_sequences):
        ops = random_case(rng)
        failure = first_difference(make, ops)
        if failure is None or failure[0] in failures:
            continue
        small = shrink(make, ops, failure[0])
        _, detail, misconception = first_difference(make, small)
        failures[failure[0]] = (f"{detail} (shortest case: {show_case(small)})", misconception)
    return failures


def show_ops(show_op: Callable) -> Callable[[list], str]:
    """A case of operations in words, from how one operation reads."""
    return lambda ops: "; ".join(show_op(op) for op in ops)


def shrink_loop(
    ops: list, still_fails: Callable[[list], bool], candidates: Callable[[list], Iterable[list]]
) -> list:
    """Replace ``ops`` by the first of its ``candidates`` (smaller versions) that still
    fails, until none does."""
    shrunk = True
    while shrunk:
        shrunk = False
        for candidate in candidates(ops):
            if still_fails(candidate):
                ops, shrunk = candidate, True
                break
    return ops


def verdicts_until_failure(criteria: list[str], failures: dict[str, tuple[str, str]]):
    """One verdict per criterion, in order, up to and including the first that ``failures``
    (``criterion -> (detail, misconception)``) holds; and whether one failed."""
    verdicts = []
    for criterion in criteria:
        if criterion in failures:
            detail, why = failures[criterion]
            verdicts.append(Verdict(criterion, False, detail, why))
            return verdicts, True
        verdicts.append(Verdict(criterion, True))
    return verdicts, False


CHAT_QUESTIONS = ("What is a KV cache?", "Name a prime number.", "Say hello.", "Count to 3.")


class Hint(str):
    """A hint's text. A notebook shows it as text, line breaks and all, where a plain
    string would show quoted, with its line breaks as ``\\n``."""

    def __repr__(self) -> str:
        return str(self)


def hint(hints: Sequence[str], level: int) -> Hint:
    """Hint ``level`` of a build-it: 1 is a nudge, the last the whole algorithm in steps.

    Raises:
        ValueError: a level outside 1..len(hints).
    """
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= len(hints):
        raise ValueError(f"level={level!r} is not allowed: use 1 to {len(hints)}")
    return Hint(hints[level - 1])


def model_and_prompts(model=None, prompts=None):
    """``(model, prompts)`` for a check's generation: SmolLM2 and four chat prompts by
    default; prompts must be given with any other model (it may have no tokenizer)."""
    from kvlab.model.loading import chat_prompt, load_model

    tokenizer = None
    if model is None:
        model, tokenizer = load_model("smollm2-135m", device="cpu")
    if prompts is None:
        if tokenizer is None:
            raise ValueError("prompts=None needs the default model (SmolLM2, with its tokenizer)")
        prompts = [chat_prompt(tokenizer, question) for question in CHAT_QUESTIONS]
    return model, prompts


@contextlib.contextmanager
def one_torch_thread():
    """Run a check's real generation on one torch thread, then restore the count: on a
    shared 2-core machine two threads fighting over the cores are many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def engine_stopped(error: Exception) -> Verdict:
    """The generation verdict when the learner's code inside the engine raised."""
    return Verdict(
        "generation",
        False,
        f"the engine stopped: {type(error).__name__}: {error}",
        "a method returned something the engine could not use",
    )


def check_calls(
    make: Callable[[], object],
    calls: Sequence[tuple[str, tuple]],
    noun: str,
    why_after: Callable[[object, str, tuple], str] | None = None,
) -> Verdict:
    """The first criterion of the build-its whose learner writes a class: every method runs
    on a fresh object. A call that raises is shown after the calls that came before it (the
    bug may be in one of those).

    Args:
        make: builds the fresh object (the learner's ``__init__``).
        calls: ``(method, args)`` in order.
        noun: what ``make`` builds, for the message ("arena", "manager", ...).
        why_after: reads the object after each call that ran and returns a misconception
            to name if a later call raises ("" for none).
    """
    try:
        obj = make()
    except Exception as error:  # noqa: BLE001 - any error of the learner's code is a verdict
        return Verdict("written", False, f"__init__ raised {type(error).__name__}: {error}")
    done, why = [], ""
    for name, args in calls:
        call = f"{name}({', '.join(map(str, args))})"
        try:
            getattr(obj, name)(*args)
        except NotImplementedError:
            return Verdict("written", False, f"{name}() is not written yet")
        except Exception as error:  # noqa: BLE001
            before = f", after {'; '.join(done)}" if done else ""
            detail = f"{call} raised {type(error).__name__}: {error} (on a fresh {noun}{before})"
            return Verdict("written", False, detail, why)
        done.append(call)
        if why_after is not None:
            why = why_after(obj, name, args) or why
    return Verdict("written", True)
