"""TODO package docstring for pathmaster.learning."""
