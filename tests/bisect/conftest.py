"""Fixtures for the bisect tests: the fake nightly index, the fake pytorch repo, the CLI runner.

What they hold is described in fake_nightlies.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_nightlies import (
    PROBE_SCRIPT,
    RELEASES,
    TEST_CHANNEL,
    Bisector,
    FakeIndex,
    FakeRepo,
    build_fake_index,
    build_fake_releases,
    build_fake_repo,
)


@pytest.fixture(scope="session")
def fake_pytorch_repo(tmp_path_factory) -> FakeRepo:
    return build_fake_repo(tmp_path_factory.mktemp("pytorch"))


@pytest.fixture(scope="session")
def fake_index(tmp_path_factory, fake_pytorch_repo) -> FakeIndex:
    return build_fake_index(tmp_path_factory.mktemp("nightly-cpu"),
                            tmp_path_factory.mktemp("nightly-cpu-json"), fake_pytorch_repo)


@pytest.fixture(scope="session")
def fake_releases(tmp_path_factory) -> Path:
    return build_fake_releases(tmp_path_factory.mktemp("releases-cpu"), RELEASES)


@pytest.fixture(scope="session")
def fake_test_channel(tmp_path_factory) -> Path:
    return build_fake_releases(tmp_path_factory.mktemp("test-cpu"), TEST_CHANNEL)


@pytest.fixture(scope="session")
def probe_script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "probe.py"
    path.write_text(PROBE_SCRIPT)
    return path


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """One environment cache for the tests that do not count installs (envs are reused)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def bisector(fake_index, probe_script, shared_cache, tmp_path) -> Bisector:
    return Bisector(fake_index, probe_script, shared_cache, tmp_path)


@pytest.fixture
def fresh_bisector(fake_index, probe_script, tmp_path) -> Bisector:
    """A bisector with its own, empty environment cache."""
    return Bisector(fake_index, probe_script, tmp_path / "cache", tmp_path)
