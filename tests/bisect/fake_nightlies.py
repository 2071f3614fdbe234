"""A fake PyTorch nightly index, a fake pytorch git repository, and a way to run the real CLI.

(A module of its own, not conftest.py, so the tests import it by a name no other test dir uses.)

The index holds tiny pure-Python ``torch`` wheels named like real nightlies: dates with gaps,
a branch cut (2.4 -> 2.5) with two builds on one date, a rebuild with a build tag, wheels for
other platforms and Pythons, and three wheels older than the index lists (reachable only by
their direct URLs). Each fake torch knows its date and carries, in ``torch/version.py``, the nightly
commit of the fake repository whose ``nightly`` branch subjects read
``YYYY-MM-DD nightly release (<main sha>)``.

Behaviour by date (``torch.nms_check()``): from 2024-06-07 on it raises "operator opforge::nms
does not exist" (the regression); on 2024-06-04 it fails with an unrelated loader error.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import subprocess
import sys
import urllib.parse
import zipfile
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from packaging import tags

import opforge

REGRESSION = date(2024, 6, 7)
UNRELATED_BREAKAGE = date(2024, 6, 4)
PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"
_HOST = list(dict.fromkeys(t.platform for t in tags.sys_tags()))
# this machine's wheels (Linux: linux_<arch>, as PyTorch names its nightlies), and two platforms
# whose wheels it must ignore (the first without a local tag, like macOS wheels under /cpu)
HERE_PLATFORM = next((p for p in _HOST if p.startswith("linux_")), _HOST[0])
OTHER_PLATFORMS = [p for p in ("macosx_11_0_arm64", "win_amd64", "linux_x86_64", "linux_aarch64")
                   if p not in _HOST][:2]

# (date, version, build tag or None, python tag, platform tag, listed in the index)
_LISTED = [date(2024, 5, 20), date(2024, 5, 22), date(2024, 5, 23), date(2024, 5, 25),
           date(2024, 5, 27), date(2024, 5, 28), date(2024, 5, 29), date(2024, 5, 31),
           date(2024, 6, 1), date(2024, 6, 2), date(2024, 6, 3), date(2024, 6, 4),
           date(2024, 6, 5), date(2024, 6, 7), date(2024, 6, 8), date(2024, 6, 10),
           date(2024, 6, 11)]
# old nightlies the index no longer lists: found by their direct URLs only
UNLISTED = [date(2024, 5, 10), date(2024, 5, 12), date(2024, 5, 15)]
BRANCH_CUT = date(2024, 6, 1)


def version_for(day: date, minor: int | None = None) -> str:
    minor = minor if minor is not None else (5 if day >= BRANCH_CUT else 4)
    return f"2.{minor}.0.dev{day:%Y%m%d}"


TORCH_INIT = '''\
from . import version as _version
from .version import __version__, git_version
# a nightly's date is in its version; a release carries the date it was cut
DATE = int(__version__.split(".dev")[1][:8]) if ".dev" in __version__ else _version.release_date


def nms_check():
    if DATE == {unrelated}:
        raise ImportError("libgomp-a34b3233.so.1: cannot open shared object file")
    if DATE >= {regression}:
        raise RuntimeError("operator opforge::nms does not exist")
    return "ok"
'''


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(directory: Path, name: str, version: str, tag: str, files: dict[str, str],
                build: str | None = None, requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding ``files``."""
    dist = f"{name}-{version}.dist-info"
    deps = "".join(f"Requires-Dist: {r}\n" for r in requires)
    py, abi, plat = tag.split("-")
    purelib = "true" if plat == "any" else "false"
    contents = {**files,
                f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                    + deps,
                f"{dist}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: opforge-tests\n"
                                  f"Root-Is-Purelib: {purelib}\nTag: {tag}\n"
                                  + (f"Build: {build}\n" if build else "")),
                f"{dist}/top_level.txt": f"{sorted(files)[0].split('/')[0]}\n"}
    record = [f"{path},{_record_hash(text.encode())},{len(text.encode())}"
              for path, text in contents.items()] + [f"{dist}/RECORD,,"]
    filename = f"{name}-{version}{'-' + build if build else ''}-{tag}.whl"
    path = directory / filename
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in contents.items():
            archive.writestr(zipfile.ZipInfo(member, (2024, 1, 1, 0, 0, 0)), text)
        archive.writestr(zipfile.ZipInfo(f"{dist}/RECORD", (2024, 1, 1, 0, 0, 0)),
                         "\n".join(record) + "\n")
    return path


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


@dataclass
class FakeRepo:
    path: Path
    main_at: dict[date, str]      # the main commit each nightly was cut from
    nightly_at: dict[date, str]   # the nightly-branch commit (torch.version.git_version)
    main_log: list[tuple[date, str]]  # every main commit, oldest first

    def main_between(self, good: date, bad: date) -> list[str]:
        """First-parent main commits after good's cut, up to bad's cut, newest first."""
        start = self.main_log.index((good, self.main_at[good]))
        end = self.main_log.index((bad, self.main_at[bad]))
        return [sha for _, sha in reversed(self.main_log[start + 1:end + 1])]


def build_fake_repo(repo: Path) -> FakeRepo:
    """A pytorch-like repository: main with two commits a day, and its nightly branch."""
    _git(repo, "init", "-q", "-b", "main")
    main_at, main_log = {}, []
    day = UNLISTED[0]
    while day <= date(2024, 6, 11):
        for k in (1, 2):  # two changes a day on main
            _git(repo, "commit", "-q", "--allow-empty", "-m", f"change {k} of {day}")
            main_log.append((day, _git(repo, "rev-parse", "HEAD")))
        main_at[day] = main_log[-1][1]
        day += timedelta(days=1)
    _git(repo, "checkout", "-q", "--orphan", "nightly")
    nightly_at = {}
    for day in [*UNLISTED, *_LISTED]:
        _git(repo, "commit", "-q", "--allow-empty", "-m",
             f"{day.isoformat()} nightly release ({main_at[day]})")
        nightly_at[day] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    return FakeRepo(repo, main_at, nightly_at, main_log)


@dataclass
class FakeIndex:
    root: Path            # wheels + torch/index.html (PEP 503)
    json_root: Path       # the same wheels through a PEP 691 torch/index.json
    repo: FakeRepo

    @property
    def url(self) -> str:
        return self.root.as_uri()


def _torch_files(version: str, git_version: str, release_date: date | None = None
                 ) -> dict[str, str]:
    extra = f"release_date = {release_date:%Y%m%d}\n" if release_date else ""
    return {"torch/__init__.py": TORCH_INIT.format(unrelated=f"{UNRELATED_BREAKAGE:%Y%m%d}",
                                                   regression=f"{REGRESSION:%Y%m%d}"),
            "torch/version.py": f"__version__ = {version!r}\ngit_version = {git_version!r}\n"
                                f"cuda = None\n{extra}"}


# --with torchvision: a torchvision nightly for every listed date but this one
NO_TORCHVISION = date(2024, 6, 5)
TORCHVISION_INIT = "import torch\nDATE = {day}\nassert DATE == torch.DATE, 'torchvision of another date'\n"


def torchvision_wheel(directory: Path, day: date, version: str, requires: tuple[str, ...] = ()
                      ) -> Path:
    return write_wheel(directory, "torchvision", version, f"{PY}-{PY}-{HERE_PLATFORM}",
                       {"torchvision/__init__.py": TORCHVISION_INIT.format(day=f"{day:%Y%m%d}")},
                       requires=requires)


# released versions (the variant's release index) and the day each was cut: 2.5.0 carries
# the regression (2024-06-07), so the nightlies between 2.4.1 and 2.5.0 hold it
RELEASES = {"2.3.0": date(2024, 4, 20), "2.3.1": date(2024, 5, 5), "2.4.0": date(2024, 5, 25),
            "2.4.1": date(2024, 5, 30), "2.5.0": date(2024, 6, 11), "2.5.1": date(2024, 6, 12)}
# release candidates (the test channel): rc1 before the regression, rc2 after it
TEST_CHANNEL = {"2.5.0rc1": date(2024, 6, 5), "2.5.0rc2": date(2024, 6, 8)}


def build_fake_releases(root: Path, releases: dict[str, date]) -> Path:
    """A PEP 503 release index of fake torch releases (+cpu, as the cpu index names them),
    with another platform's wheel of each that must be ignored."""
    (root / "torch").mkdir()
    wheels = []
    for text, day in releases.items():
        version = f"{text}+cpu"
        for plat in (HERE_PLATFORM, OTHER_PLATFORMS[0]):
            wheels.append(write_wheel(root, "torch", version, f"{PY}-{PY}-{plat}",
                                      _torch_files(version, "e" * 40, day)))
        if text != "2.3.1":  # one release without its torchvision
            minor = int(text.split(".")[1]) + 15
            tv = f"0.{minor}.{text.split('.')[2][0]}{text[len('2.5.0'):]}+cpu"
            torchvision_wheel(root, day, tv, requires=(f"torch=={version}",))
    anchors = "\n".join(f'<a href="../{urllib.parse.quote(p.name)}">{html.escape(p.name)}</a>'
                        for p in wheels)
    (root / "torch" / "index.html").write_text(f"<html><body>\n{anchors}\n</body></html>\n")
    return root


def build_fake_index(root: Path, json_root: Path, fake_pytorch_repo: FakeRepo) -> FakeIndex:
    """The fake nightly index in ``root`` (PEP 503) and ``json_root`` (PEP 691)."""
    (root / "torch").mkdir()
    listed: list[Path] = []

    def torch_wheel(day, plat=HERE_PLATFORM, py=PY, minor=None, local=True, build=None,
                    git_version=None):
        version = version_for(day, minor) + ("+cpu" if local else "")
        sha = git_version or fake_pytorch_repo.nightly_at.get(day, "f" * 40)
        return write_wheel(root, "torch", version, f"{py}-{py}-{plat}",
                           _torch_files(version, sha), build=build)

    for day in _LISTED:
        listed.append(torch_wheel(day))
        listed.append(torch_wheel(day, plat=OTHER_PLATFORMS[0], local=False))
        listed.append(torch_wheel(day, plat=OTHER_PLATFORMS[1]))
    # branch cut: the old branch's last build and the new branch's first on the same date
    listed.append(torch_wheel(BRANCH_CUT, minor=4, git_version="0" * 40))
    # a rebuild on 2024-06-03 with a build tag: the later build is the one to test
    listed.append(torch_wheel(date(2024, 6, 3), build="1"))
    # dates with wheels for other platforms or Pythons only: not candidates here
    listed.append(torch_wheel(date(2024, 6, 6), plat=OTHER_PLATFORMS[0], local=False))
    listed.append(torch_wheel(date(2024, 6, 9), py="cp39" if PY != "cp39" else "cp310"))
    for day in UNLISTED:
        torch_wheel(day)
    (root / "torchvision").mkdir()
    vision = [torchvision_wheel(root, day, f"0.20.0.dev{day:%Y%m%d}+cpu") for day in _LISTED
              if day != NO_TORCHVISION]
    (root / "torchvision" / "index.html").write_text("<html><body>\n" + "\n".join(
        f'<a href="../{urllib.parse.quote(p.name)}">{html.escape(p.name)}</a>' for p in vision)
        + "\n</body></html>\n")
    anchors = "\n".join(
        f'<a href="../{urllib.parse.quote(p.name)}">{html.escape(p.name)}</a><br/>'
        for p in listed)
    (root / "torch" / "index.html").write_text(
        f"<!DOCTYPE html>\n<html><body><h1>Links for torch</h1>\n{anchors}\n</body></html>\n")
    (json_root / "torch").mkdir()
    (json_root / "torch" / "index.json").write_text(json.dumps({
        "meta": {"api-version": "1.1"}, "name": "torch",
        "files": [{"filename": p.name, "url": p.as_uri(),
                   "hashes": {"sha256": hashlib.sha256(p.read_bytes()).hexdigest()}}
                  for p in listed]}))
    return FakeIndex(root, json_root, fake_pytorch_repo)


PROBE_SCRIPT = '''\
"""The test command the e2e tests bisect with (stdlib + the fake torch only)."""
import os, signal, sys, time
import torch

with open(os.environ["PROBE_LOG"], "a") as f:
    f.write(f"{torch.DATE}\\n")
if os.environ.get("KILL_AT") == str(torch.DATE) and not os.path.exists(os.environ["KILL_ONCE"]):
    open(os.environ["KILL_ONCE"], "w").close()
    os.kill(os.getppid(), signal.SIGKILL)  # the bisect dies mid-step, like a killed runner
    sys.exit(0)
if os.environ.get("HANG_AT") == str(torch.DATE) and not os.path.exists(os.environ["HANG_ONCE"]):
    import subprocess  # a test command with a child of its own, both stopped by a signal
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(os.environ["HANG_ONCE"] + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace(os.environ["HANG_ONCE"] + ".tmp", os.environ["HANG_ONCE"])
    time.sleep(300)
if os.environ.get("FLAKY_AT") == str(torch.DATE) and not os.path.exists(os.environ["FLAKY_ONCE"]):
    open(os.environ["FLAKY_ONCE"], "w").close()
    sys.exit(3)
if str(torch.DATE) in os.environ.get("SKIP_AT", "").split(","):
    sys.exit(125)  # this nightly cannot be tested
mode, _, since = os.environ.get("PROBE_MODE", "nms").partition(":")
if mode == "bad_from":
    sys.exit(1 if torch.DATE >= int(since) else 0)
if mode == "good_from":  # something started to work
    sys.exit(0 if torch.DATE >= int(since) else 1)
if mode == "hang_from":  # the regression is a hang
    if torch.DATE >= int(since):
        time.sleep(60)
    sys.exit(0)
if mode == "exit":
    sys.exit(int(since))
print(torch.nms_check())
'''


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


class Bisector:
    """Runs ``python -m opforge bisect`` in a subprocess, the way a user does."""

    def __init__(self, index: FakeIndex, probe: Path, cache: Path, work: Path):
        self.index = index
        self.probe = probe
        self.cache = cache
        self.work = work
        self.probe_log = work / "probed.txt"
        self.state = work / "state.json"
        self.env = {}

    def probed(self) -> list[str]:
        if not self.probe_log.exists():
            return []
        return [f"{d[:4]}-{d[4:6]}-{d[6:]}" for d in self.probe_log.read_text().split()]

    def _argv_env(self, args, command, index) -> tuple[list[str], dict[str, str]]:
        src = str(Path(opforge.__file__).resolve().parent.parent)
        env = {**os.environ, "OPFORGE_CACHE_DIR": str(self.cache), "PROBE_LOG": str(self.probe_log),
               "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "COLUMNS": "200", **self.env}
        cmd = command if command is not None else ["python", str(self.probe)]  # the env's python
        argv = [sys.executable, "-m", "opforge", "bisect", "--index", index or str(self.index.root),
                "--state", str(self.state), *args, "--", *cmd]
        return argv, env

    def __call__(self, *args: str, command: list[str] | None = None, index: str | None = None,
                 timeout: float = 180) -> Run:
        argv, env = self._argv_env(args, command, index)
        result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.work,
                                timeout=timeout)
        return Run(result.returncode, result.stdout, result.stderr)

    def start(self, *args: str) -> subprocess.Popen:
        """The bisect as a running process (to send it signals)."""
        argv, env = self._argv_env(args, None, None)
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=self.work)
