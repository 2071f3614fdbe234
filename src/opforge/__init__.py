"""opforge: build, smoke-test and bisect PyTorch op extensions.

Nothing in this package imports torch or the extension it works on: it drives other
interpreters (fresh virtual environments) that do.
"""

__version__ = "0.1.0"
