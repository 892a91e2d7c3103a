"""nbgrader's settings for a student who runs `nbgrader validate labs/<lab>/<lab>.ipynb` from the
kit's root folder (nbgrader reads this file from the folder it is run in).

A lab cell in laptop mode may run for minutes (a benchmark, a sweep); nbgrader's default of 30 s a
cell would fail a correct notebook. The grader gives each cell 600 s
(`perflab.grading.nbgrader_api.DEFAULT_CELL_TIMEOUT`); validation gives the same.
"""

c = get_config()  # noqa: F821  (nbgrader defines it when it loads this file)
c.Execute.timeout = 600
