"""Recipes that write themselves: ``opforge recipes --derive`` finds, for each stub recipe,
a call the op accepts, and writes it into the recipes file marked ``"derived": True``.

``calls`` is a call as data (parameters from the schema, one value each, rendered as the
recipe's Python), ``clues`` reads an op's error messages, ``derive`` is the search (pure:
candidates and their refinement), ``recipes_file`` reads and rewrites the recipes file's
text, ``worker`` runs trial calls in the environment under test through ``target.trial``
(shipped in the probe's archive), and ``app`` drives them for the command.
"""
