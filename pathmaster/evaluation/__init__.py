"""TODO package docstring for pathmaster.evaluation."""
