"""nbgrader settings for the perflab course folder.

`perflab.grading.nbgrader_api` loads this file for every course folder it makes and copies it
there, so that plain nbgrader (`nbgrader db student list`, `nbgrader generate_feedback`, ...) and
formgrader (`jupyter lab` started there) work inside one. A copy roots the course at its own folder
(one holding `source/`); this file, in autograder/, roots it at the default course `autograder/course/`.
"""

import os

c = get_config()  # noqa: F821  (traitlets injects get_config into config files)

HERE = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "perflab"
c.CourseDirectory.root = HERE if os.path.isdir(os.path.join(HERE, "source")) else os.path.join(HERE, "course")
# What a lab leaves beside its notebook at run time never travels with a release or a submission,
# nor does a course lab's judges.py or judges/ (the grader's checks, beside its source notebook).
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "results", "*.trace.json",
    "*.bin", "*.prof", "*.lprof", "judges.py", "judges",
]

# Every notebook runs on the `python3` kernel of the environment perflab is installed in.
c.Execute.kernel_name = "python3"
# Seconds one cell may run in autograding. Timing cells re-measure speedups through
# perflab.verify with its own budget (minutes at most), so a cell gets ten of them.
c.Execute.timeout = 600
c.Execute.interrupt_on_timeout = True
# Seconds to wait for a kernel to start (a cold import of torch takes several seconds).
c.Execute.startup_timeout = 120

# What the student sees where a solution was cut out.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Long outputs are cut in the autograded copy so feedback stays readable.
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 40
