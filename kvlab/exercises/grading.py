"""The build-its' one skeleton: a description of each, and the check, hint and reveal that
read it.

Every build-it exercise (``build_arena``, ``build_block_manager``, ``build_scheduler``,
``build_kernel``, ``build_prefix_cache``) is a ``BuildIt``. ``BuildIt.check`` grades the
learner's code criterion by criterion, in order, and stops at the first failure: later
criteria assume the earlier ones hold. A ``Report`` prints as

    3 of 7 criteria hold
      [x] ... a criterion that held
      [!] ... the first one that failed
          what went wrong (the shortest case that shows it)
          likely: the misconception such a failure most often means
      [ ] ... one not checked yet

``Search.failures`` tries seeded random cases and keeps the first failure of each
criterion, shrunk to the fewest operations that still show it. The last criterion serves
real requests (``CHAT_QUESTIONS``, the one list of default prompts).

Not handled: partial credit within a criterion.
"""

from __future__ import annotations

import contextlib
import inspect
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from kvlab.cache.base import BlockInfo


@dataclass(frozen=True)
class Verdict:
    """One criterion's result."""

    criterion: str  # a key of the exercise's criteria
    passed: bool
    detail: str = ""  # what went wrong (the shortest operations that show it), or ""
    misconception: str = ""  # what such a failure most often means, or ""


@dataclass(frozen=True)
class Report:
    """Every criterion's verdict, in order; shows as a checklist in a notebook."""

    verdicts: list[Verdict]  # the criteria checked so far
    criteria: dict[str, str]  # every criterion of the exercise, key -> what it asks
    stuck: str  # the line printed under a failed report: where the hints are

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


@dataclass(frozen=True)
class Search:
    """How a build-it's grader finds the shortest case that breaks each criterion."""

    first_difference: Callable  # (learner, case) -> (criterion, detail, misconception) | None
    candidates: Callable[[list], Iterable[list]]  # smaller cases, tried in order
    random_case: Callable[[random.Random], list]  # a seeded, valid case (operations, requests)
    show_op: Callable | None = None  # one operation in words; show_case joins them, unless given
    show_case: Callable[[list], str] | None = None  # a whole case, where ops do not read alone
    probes: tuple = ()  # fixed cases the random ones rarely reach: learner -> failure | None

    def shrink(self, make, case: list, criterion: str) -> list:
        """The smallest version of ``case`` that still breaks ``criterion``."""
        shrunk = True
        while shrunk:  # the first smaller case that still fails, until none does
            shrunk = False
            for candidate in self.candidates(case):
                failure = self.first_difference(make, candidate)
                if failure is not None and failure[0] == criterion:
                    case, shrunk = candidate, True
                    break
        return case

    def failures(self, make, num_cases: int, seed: int):
        """``(criterion -> (detail, misconception), criterion -> shortest case)`` for every
        criterion that some of ``num_cases`` seeded random cases, or a probe, break (a
        probe's failure has no case)."""
        show = self.show_case or (lambda case: "; ".join(map(self.show_op, case)))
        rng = random.Random(seed)
        failures: dict[str, tuple[str, str]] = {}
        cases: dict[str, list] = {}
        for _ in range(num_cases):
            case = self.random_case(rng)
            failure = self.first_difference(make, case)
            if failure is None or failure[0] in failures:
                continue
            small = cases[failure[0]] = self.shrink(make, case, failure[0])
            _, detail, why = self.first_difference(make, small)
            failures[failure[0]] = (f"{detail} (shortest case: {show(small)})", why)
        for probe in self.probes:
            failure = probe(make)
            if failure is not None:
                failures.setdefault(failure[0], failure[1:])
        return failures, cases


@dataclass(frozen=True)
class Replay:
    """How ``kvlab.widgets.failure_replay`` runs a failing case on the learner's state."""

    asks: str  # the method that tells a learner's class for this build-it
    title: str  # the page map's title
    new_state: Callable  # learner class -> the state the calls run on
    run: Callable  # (state, op) -> None: one call on the learner's code
    pool: Callable  # state -> (block infos, usage, block_size), as the page map draws it


@dataclass(frozen=True)
class BuildIt:
    """One build-it exercise, as the generic check, hint, reveal and replay read it."""

    criteria: dict[str, str]  # key -> what it asks, in order: "written" first, "generation" last
    hints: tuple[str, ...]  # from a nudge to the whole algorithm in numbered steps
    stuck: str  # the line under a failed report: where the hints are
    written: Callable  # learner -> Verdict, the first criterion: every method runs
    search: object  # the cases that break the criteria between (``Search.failures``)
    reveal_sources: Callable[[], tuple]  # () -> the kvlab objects whose source reveal shows
    replay: Replay | None = None  # how a failing case is drawn

    def check(
        self, learner, generation: Callable[[], Verdict], num_cases: int = 0, seed: int = 0
    ) -> Report:
        """Grade ``learner`` criterion by criterion, stopping at the first failure (later
        criteria assume the earlier ones hold); ``generation`` runs last, only when every
        other criterion holds."""
        verdicts = [self.written(learner)]
        if verdicts[0].passed:
            failures, _ = self.search.failures(learner, num_cases, seed)
            # Only up to the first failure: a case stops at its first difference, so a later
            # criterion that no case reached failing is not known to hold.
            for criterion in list(self.criteria)[1:-1]:
                detail, why = failures.get(criterion, ("", ""))
                verdicts.append(Verdict(criterion, criterion not in failures, detail, why))
                if criterion in failures:
                    break
            else:
                verdicts.append(generation())
        return Report(verdicts, self.criteria, self.stuck)

    def hint(self, level: int = 1) -> Hint:
        """Hint ``level``, 1 (a nudge) to len(hints) (the whole algorithm in steps); any
        other level raises ValueError."""
        last = len(self.hints)
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= last:
            raise ValueError(f"level={level!r} is not allowed: use 1 to {last}")
        return Hint(self.hints[level - 1])

    def reveal(self) -> str:
        """kvlab's own code for what the learner writes."""
        return "\n".join(inspect.getsource(source) for source in self.reveal_sources())


CHAT_QUESTIONS = ("What is a KV cache?", "Name a prime number.", "Say hello.", "Count to 3.")


class Hint(str):
    """A hint's text. A notebook shows it as text, line breaks and all, where a plain
    string would show quoted, with its line breaks as ``\\n``."""

    def __repr__(self) -> str:
        return str(self)


def model_and_prompts(model=None, prompts=None):
    """``(model, prompts)`` for a check's generation: SmolLM2 and four chat prompts by
    default; prompts must be given with any other model (it may have no tokenizer)."""
    from kvlab.model.loading import load_model

    tokenizer = None
    if model is None:
        model, tokenizer = load_model("smollm2-135m", device="cpu")
    if prompts is None:
        if tokenizer is None:
            raise ValueError("prompts=None needs the default model (SmolLM2, with its tokenizer)")
        prompts = chat_prompts(tokenizer)
    return model, prompts


def chat_prompts(tokenizer, system: str | None = None) -> list[list[int]]:
    """``CHAT_QUESTIONS`` as token ids, in the model's chat template."""
    from kvlab.model.loading import chat_prompt

    return [chat_prompt(tokenizer, question, system=system) for question in CHAT_QUESTIONS]


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


def different_requests(
    yours: list, kvlab: list, why: str, what: str = "requests {} came out different from kvlab's"
) -> Verdict | None:
    """The failed generation verdict when some requests' tokens are not kvlab's, or None;
    ``what`` says so, the requests' indices in its ``{}``."""
    bad = [i for i, (a, b) in enumerate(zip(yours, kvlab, strict=True)) if a != b]
    return Verdict("generation", False, what.format(bad), why) if bad else None


def engine_stopped(error: Exception) -> Verdict:
    """The generation verdict when the learner's code inside the engine raised."""
    why = "a method returned something the engine could not use"
    return Verdict("generation", False, f"the engine stopped: {type(error).__name__}: {error}", why)


def check_calls(
    make: Callable[[], object],
    calls: Sequence[tuple[str, tuple]],
    noun: str,
    why_after: Callable[[object, str, tuple], str] | None = None,
) -> Verdict:
    """The first criterion of the build-its whose learner writes a class: every method of
    ``calls`` (``(method, args)``, in order) runs on a fresh object that ``make`` builds (a
    ``noun``, in the message). A call that raises is shown after the calls before it (the
    bug may be in one of those); ``why_after(obj, method, args)``, read after each call that
    ran, names a misconception for a later call that raises ("" for none)."""
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


def block_infos(holders: dict, filled: dict, num_blocks: int) -> tuple[BlockInfo, ...]:
    """A learner's pool as the page map draws it (``Replay.pool``): ``holders``, block ->
    [(seq_id, its index in that sequence's table)], and ``filled``, block -> slots written."""
    infos = []
    for block in range(num_blocks):
        held = holders.get(block, ())
        seq_ids, first = tuple(s for s, _ in held), held[0][1] if held else None
        infos.append(BlockInfo(block, len(held), seq_ids, first, filled.get(block, 0), False))
    return tuple(infos)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
