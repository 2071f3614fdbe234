"""``opforge bisect``'s request: the command line checked once into a frozen BisectRequest;
``--file``'s matrix travels in it to the commands run in the nightlies' environments, and
nothing writes this process's ``os.environ`` (an in-process caller runs another command next).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

import opforge
from opforge.bisect.request import BisectRequest, request_from
from opforge.cli import build_parser, main
from opforge.errors import UsageError

REPO_ROOT = Path(opforge.__file__).resolve().parents[2]

# run in each nightly's environment: say which matrix it was given, then test the nightly
SEES_MATRIX = ("import os, torch; "
               "open(os.environ['SEEN_LOG'], 'a').write(os.environ.get('OPFORGE_MATRIX', '-')"
               " + '\\n'); torch.nms_check()")


def namespace(*argv: str):
    return build_parser().parse_args(["bisect", *argv])


@pytest.mark.slow
def test_file_reaches_the_command_and_leaves_os_environ_unchanged(fake_index, shared_cache,
                                                                   tmp_path, monkeypatch,
                                                                   capsys):
    matrix = tmp_path / "elsewhere" / "matrix.yaml"
    matrix.parent.mkdir()
    shutil.copy(REPO_ROOT / "matrix.yaml", matrix)
    work = tmp_path / "work"  # no matrix.yaml here or above: only --file names one
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("OPFORGE_MATRIX", raising=False)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
    seen = tmp_path / "seen.txt"
    monkeypatch.setenv("SEEN_LOG", str(seen))
    before = dict(os.environ)
    argv = ["bisect", "--file", str(matrix), "--index", str(fake_index.root), "--good",
            "2024-06-05", "--bad", "2024-06-08", "--match", "does not exist", "--state",
            str(tmp_path / "state.json"), "--json", "--", "python", "-c", SEES_MATRIX]
    assert main(argv) == 0
    assert dict(os.environ) == before
    data = json.loads(capsys.readouterr().out)
    assert data["first_bad"]["date"] == "2024-06-07"
    lines = seen.read_text().split()
    assert len(lines) == data["probes"] >= 2
    assert set(lines) == {str(matrix.resolve())}


def test_the_request_is_frozen_and_reads_no_further_than_the_namespace(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OPFORGE_MATRIX", raising=False)
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "out.txt"))
    args = namespace("--file", str(REPO_ROOT / "matrix.yaml"), "--match", "", "--with",
                     "torchvision", "--state", str(tmp_path / "s.json"), "--", "true")
    request = request_from(args)
    assert isinstance(request, BisectRequest)
    assert request.match is None  # an empty workflow input: no signature
    assert args.match == ""  # the namespace is read, not changed
    assert request.matrix == str((REPO_ROOT / "matrix.yaml").resolve())
    assert request.companions == ("torchvision",)
    assert request.command == ("--", "true")
    assert request.state_path == tmp_path / "s.json"
    assert request.log_path == tmp_path / "s.log.jsonl"
    assert request.cache == tmp_path / "cache"
    assert request.github_output == str(tmp_path / "out.txt")
    assert not request.resume and not request.fan_out
    assert "OPFORGE_MATRIX" not in os.environ
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.resume = True  # type: ignore[misc]


def test_a_round_on_an_existing_state_continues_it(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    state = tmp_path / "s.json"
    args = namespace("--plan", "2", "--state", str(state))
    assert not request_from(args).resume  # the first round starts the bisect
    state.write_text("{}")
    request = request_from(args)
    assert request.resume and request.fan_out
    assert not args.resume  # the rule is the request's, not written back
    assert not request_from(namespace("--plan", "2", "--restart", "--state",
                                      str(state))).resume


def test_a_bad_file_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OPFORGE_MATRIX", raising=False)
    with pytest.raises(UsageError):
        request_from(namespace("--file", str(tmp_path / "missing.yaml"), "--state",
                               str(tmp_path / "s.json")))
    assert "OPFORGE_MATRIX" not in os.environ
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "cache").exists()
