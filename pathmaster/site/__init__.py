"""TODO package docstring for pathmaster.site."""
