"""The grader's half of each lab: the checks only hidden test cells call, with the reference answers
they compare against (`lab01`, ...). Grader-only: the student bundle (`perflab.bundle`) leaves this
package out, and nothing a student's copy runs imports it. A hidden cell imports its lab's module
inside its `BEGIN HIDDEN TESTS` block, e.g. `from perflab.labs.hidden import lab04 as hidden04`."""
