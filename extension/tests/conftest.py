"""Kernel tests run against the built opforge_ops (installed, or built in place)."""

import pytest
import torch

import opforge_ops


def pytest_report_header(config):
    info = opforge_ops.build_info()
    return (
        f"opforge_ops {info['version']} from {opforge_ops.__file__} "
        f"(variant {info['variant']}, backends {info['backends']}, built against torch {info['torch_version']})"
    )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
