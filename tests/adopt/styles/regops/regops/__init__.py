"""Segment reductions (torch-scatter style: one compiled library per backend)."""

import importlib.machinery
import os.path as osp

import torch

__version__ = "1.2.0"

suffix = "cuda" if torch.cuda.is_available() else "cpu"
for library in ["_segment"]:
    spec = importlib.machinery.PathFinder().find_spec(f"{library}_{suffix}",
                                                      [osp.dirname(__file__)])
    if spec is None:
        raise ImportError(f"Could not find module '{library}_{suffix}' in "
                          f"{osp.dirname(__file__)}")
    torch.ops.load_library(spec.origin)


def segment_sum(src: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    return torch.ops.regops.segment_sum(src, ptr)
