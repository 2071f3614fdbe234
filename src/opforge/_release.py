"""What a release of opforge knows about itself beyond its version.

``WORKFLOWS_COMMIT`` is the full commit of opforge's repository this release was cut from;
the release process writes it here (and nothing else changes this file). ``opforge init``
pins the reusable workflows the callers it writes ``uses:`` to it. Empty in a development
tree: init then takes the commit of the checkout or of a ``pip install git+...@<commit>``,
or ``--workflows-ref``.
"""

WORKFLOWS_REPOSITORY = "opforge/opforge"
WORKFLOWS_COMMIT = ""
