"""How good a site's answers are, measured on cells it did not learn from.

Modules: ``crossval`` (folds by slide image, leave-one-out, held-out queries), ``metrics``
(the figures and their intervals), ``report`` (the text ``pathmaster evaluate`` prints).
Nothing in the product imports it but the ``evaluate`` command.
"""
