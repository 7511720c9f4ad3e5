"""One uploaded cell analysed within its budget.

Modules: ``cell`` (``analyse_cell``: features and the eye's patch of one cell), ``uploads``
(is an upload a cell picture at all), ``budget`` (each cell in a worker process under a CPU,
memory and time budget).
"""
