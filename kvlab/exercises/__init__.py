"""Lab exercises, and ``check``, which marks an answer right or wrong with a helpful hint.

    from kvlab.exercises import check, question
    print(question("01.kv_bytes_llama3_8b"))
    check("01.kv_bytes_llama3_8b", answer)   # "Correct ..." or a hint

Each lab's exercises are in ``labNN.py``; ``base`` says what an exercise is. Every answer
is computed from kvlab itself (``kvlab.memory`` presets, the padding account of
``kvlab.measure.naive_hf``, the allocators of ``kvlab.cache``), never typed in, so it
follows the library. A wrong answer that matches a known mistake gets that mistake's
hint; any other gets the exercise's general hint; ``None`` (the placeholder in the labs)
gets a reminder to fill it in.

Build-it exercises, where the learner writes the mechanism, graded criterion by criterion
(``grading``) and then run inside the engine: ``build_arena`` (lab 02), ``build_block_manager``
(lab 03), ``build_scheduler`` (lab 04), ``build_kernel`` (lab 05), ``build_prefix_cache``
(lab 06).

Predict, then run: ``reveal(prediction, measured, unit=..., why=...)`` (``predict``) shows
a learner's guess beside what the experiment measured.

Not handled: free-text answers, partial credit.
"""

from kvlab.exercises import lab01, lab02, lab03, lab04  # noqa: F401 (each registers its own)
from kvlab.exercises.base import EXERCISES, Exercise, Feedback, Mistake, check, question
from kvlab.exercises.predict import reveal

__all__ = ["EXERCISES", "Exercise", "Feedback", "Mistake", "check", "question", "reveal"]
