"""The teacher's tools, behind ``transformer-course student-edition`` and ``grade`` (hand-written).

- ``edition``: the student edition of the chapters (solutions stubbed, checks kept) and its
  manifest, which keeps learners' files from being overwritten or removed;
- ``exercise_cells``: how an exercise cell, its solution regions and its label are found (shared by
  the other modules);
- ``leak_check``: does a student edition reproduce a solution elsewhere in its notebook?
- ``grading``: grade handed-in notebooks (a table, a CSV), one bad notebook never stopping a batch;
- ``sandbox``: the grader's worker (``python -m transformer_course.classroom.sandbox``), one
  notebook in a fresh kernel with one time limit, in Linux namespaces where they can be made.

Import a name from the module that defines it (``from transformer_course.classroom.grading
import grade_notebooks``). Nothing is imported here: the sandbox worker runs as ``python -m``,
which imports this package first, and must not find itself imported already by way of ``grading``.
"""
