"""The graded labs: shared lab-side helpers (`common`), one contract module per lab (`lab01`, ...),
and the generator of student notebooks (`build`). Authoring guide: solutions/README.md."""
