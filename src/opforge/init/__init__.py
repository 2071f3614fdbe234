"""``opforge init``: write an extension's opforge configuration from its sources.

``scan_extension`` (opforge.scan) reads the sources; ``plan_files`` renders matrix.yaml (with
comments), a recipes stub, a three-line noxfile and three caller workflows (CI, nightly canary,
bisect) that call opforge's reusable workflows pinned by commit; ``write_files`` writes all of
them or none (staged beside their targets, then renamed into place; any failure undoes it
all), never replacing a file unless asked. The extension's own files are never touched.

``config`` decides matrix.yaml, the recipes stub and the noxfile from the scan; ``callers``
writes the caller workflows and finds the commit they pin; this module plans and writes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from opforge import _release
from opforge.errors import UsageError
from opforge.files import (
    check_target,
    lookup,
    open_problem,
    read_bytes,
    read_head,
    write_file,
)
from opforge.init.callers import WorkflowsPin, render_workflows, workflows_pin
from opforge.init.config import (
    CUDA_VARIANT,
    DEFAULT_FLOOR,
    DEFAULT_TORCH,
    RECIPES_FILE,
    check_copied,
    choose_namespace,
    device_words,
    render_matrix,
    render_noxfile,
    render_recipes,
    unchecked_keys,
)
from opforge.matrix import parse_matrix
from opforge.scan import Scan, scan_extension

__all__ = ["CUDA_VARIANT", "DEFAULT_FLOOR", "DEFAULT_TORCH", "RECIPES_FILE", "WorkflowsPin",
           "check_copied", "choose_namespace", "plan_files", "render_matrix",
           "render_noxfile", "render_recipes", "render_workflows", "repository_root",
           "workflows_pin", "write_files"]


def repository_root(root: Path) -> Path:
    """The git repository ``root`` is in (workflows live at its top), else ``root``.

    A repository is a folder holding a real ``.git``: a directory (not a link to one), or a
    ``gitdir: PATH`` file (a worktree, a submodule) whose PATH is a directory. An empty or
    any other file named ``.git`` in some ancestor decides nothing.
    """
    here = root.resolve()
    for folder in (here, *here.parents):
        if _is_git_dir(folder / ".git") or _git_file_points(folder / ".git"):
            return folder
    return here


def _is_git_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def _git_file_points(path: Path) -> bool:
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        first = read_head(path, 4096).decode("utf-8", "replace").splitlines()
    except (OSError, UsageError):
        return False
    if not first or not first[0].startswith("gitdir:"):
        return False
    target = Path(first[0][len("gitdir:"):].strip())
    return _is_git_dir(target if target.is_absolute() else path.parent / target)


def plan_files(root: Path, *, torch_version: str = DEFAULT_TORCH, python: str = "3.11",
               workflows_ref: str | None = None) -> tuple[Scan, dict[Path, str]]:
    root = Path(root)
    info = lookup(root, what="the extension's directory")
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{root}: no such directory")
    scan = scan_extension(root)
    check_copied(scan)
    if not (root / "pyproject.toml").is_file() and not (root / "setup.py").is_file():
        raise UsageError(f"no op extension in {root}: no pyproject.toml or setup.py to build it")
    if scan.package is None:
        raise UsageError(f"no Python package (a directory with __init__.py) in {root}")
    matrix_text = render_matrix(scan, torch_version, python)
    try:  # never write a matrix that opforge itself would refuse (--torch banana)
        parse_matrix(matrix_text, root / "matrix.yaml")
    except UsageError as exc:
        raise UsageError(f"the matrix.yaml init would write is not valid ({exc}); check "
                         "--torch and --python") from None
    unchecked = unchecked_keys(scan)
    if unchecked:
        scan.notes.append("kernels for devices no variant builds, so none expects them "
                          "(matrix.yaml records them on each op's line): " + "; ".join(
                              f"{key} ({device_words([key], scan)}): {', '.join(ops)}"
                              for key, ops in unchecked.items()))
    pin = workflows_pin(workflows_ref)
    repo = repository_root(root)
    matrix_file = (root.resolve() / "matrix.yaml").relative_to(repo).as_posix()
    files = {root / "matrix.yaml": matrix_text,
             root / RECIPES_FILE: render_recipes(scan),
             root / "noxfile.py": render_noxfile()}
    for name, text in render_workflows(matrix_text, matrix_file, pin).items():
        files[repo / ".github" / "workflows" / name] = text
    scan.notes.append(f"workflows pinned to {_release.WORKFLOWS_REPOSITORY}@{pin.commit[:12]} "
                      f"(from {pin.source}); they install {pin.opforge}")
    return scan, files


def _write_root(path: Path) -> Path:
    """The folder a written file must stay under: the repository for a workflow (so a
    symlinked ``.github`` is refused), else the file's own folder."""
    if path.parent.name == "workflows" and path.parent.parent.name == ".github":
        return path.parents[2]
    return path.parent


def write_files(files: dict[Path, str], force: bool) -> list[Path]:
    """All of them or none, whichever file fails.

    Every target is checked before any write (an existing file is refused unless ``force``;
    a link, FIFO or directory where a file goes, or a link among the folders, always). Then
    each file is written under a temporary name beside its target (folders made as needed,
    none followed through a link), and only once all are written is each renamed into place.
    A failure at any step undoes every step: the temporary files and the folders init made
    are removed, a file already replaced (``force``) gets its bytes and mode back, and one
    line names the file and why (exit 2)."""
    existing = [p for p in files if check_target(p, root=_write_root(p), what="init")]
    if existing and not force:
        raise UsageError("would overwrite " + ", ".join(str(p) for p in existing)
                         + " (--force to replace them, --dry-run to see what would be written)")
    originals = {p: (read_bytes(p, what="init"), stat.S_IMODE(os.stat(p).st_mode))
                 for p in existing}
    made = _missing_folders(files)
    staged: dict[Path, Path] = {}
    written: list[Path] = []
    try:
        for path, text in files.items():
            temp = path.with_name(f".{path.name[:64]}.opforge-init-{secrets.token_hex(8)}")
            try:
                write_file(temp, text, root=_write_root(path),
                           mode=originals[path][1] if path in originals else None)
            except UsageError as exc:
                raise _not_written(path, str(exc).removeprefix(f"{temp}: ")) from None
            staged[path] = temp
        for path, temp in staged.items():
            check_target(path, root=_write_root(path), what="init")  # nothing planted since
            try:
                os.replace(temp, path)
            except OSError as exc:
                raise _not_written(path, open_problem(exc)) from None
            written.append(path)
    except BaseException:
        _undo(staged, written, originals, made)
        raise
    return written


def _not_written(path: Path, why: str) -> UsageError:
    return UsageError(f"{path}: {why}; nothing was written (init writes all of its files or "
                      "none)")


def _missing_folders(files: dict[Path, str]) -> list[Path]:
    """The folders that writing ``files`` will make, shallowest first."""
    missing: list[Path] = []
    for path in files:
        root = _write_root(path)
        folder = root
        for part in path.parent.relative_to(root).parts:
            folder = folder / part
            if folder not in missing and not os.path.lexists(folder):
                missing.append(folder)
    return missing


def _undo(staged: dict[Path, Path], written: list[Path],
          originals: dict[Path, tuple[bytes, int]], made: list[Path]) -> None:
    """Put the tree back as init found it (best effort: the error that got here is raised)."""
    for path in written:
        with contextlib.suppress(OSError, UsageError):
            if path in originals:
                data, mode = originals[path]
                write_file(path, data, root=_write_root(path), mode=mode)
            else:
                os.unlink(path)
    for path, temp in staged.items():
        if path not in written:
            with contextlib.suppress(OSError):
                os.unlink(temp)
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
