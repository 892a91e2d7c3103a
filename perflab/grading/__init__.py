"""The autograder: nbgrader plumbing (`nbgrader_api`) and the pipeline behind `perflab grade`."""
