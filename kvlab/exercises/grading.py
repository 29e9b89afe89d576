"""What a build-it check returns: one verdict per criterion, shown as a checklist.

Every build-it exercise (``build_arena`` in lab 02, ``build_block_manager`` in lab 03)
grades the learner's code criterion by criterion, in order, and stops at the first
failure: later criteria assume the earlier ones hold. A ``Report`` prints as

    3 of 7 criteria hold
      [x] ... a criterion that held
      [!] ... the first one that failed
          what went wrong (the shortest case that shows it)
          likely: the misconception such a failure most often means
      [ ] ... one not checked yet

Not handled: partial credit within a criterion.
"""

from __future__ import annotations

from dataclasses import dataclass


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
