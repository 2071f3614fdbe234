"""What a release of opforge knows about itself: its version and the commit it was cut from.

The release process (``nox -s release``, opforge.release) writes both lines from the release
tag (``v0.2.0``) and the commit it points to; nothing else changes them. ``VERSION`` is the
distribution's version (pyproject.toml reads it) and ``opforge.__version__``; between
releases a development tree keeps the last release's. ``WORKFLOWS_COMMIT`` is the commit
``opforge init`` pins the reusable workflows to; empty in a development tree, where init
refuses to pin to a commit in no release unless ``--workflows-ref`` names one (a checkout of
a release tag is accepted).
"""

WORKFLOWS_REPOSITORY = "opforge/opforge"
VERSION = "0.1.0"
WORKFLOWS_COMMIT = ""
