"""TODO package docstring for pathmaster.analysis."""
