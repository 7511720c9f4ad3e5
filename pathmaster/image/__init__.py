"""TODO package docstring for pathmaster.image."""
