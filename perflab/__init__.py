"""perflab: the reference profiler behind the course kit."""

__version__ = "0.1.0"
