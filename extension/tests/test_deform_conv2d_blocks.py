"""deform_conv2d's CPU forward samples a channels-last copy of the input in blocks of output
positions (about 512 KiB of columns each, and at least 128 positions: 128 positions at 256
channels and a 3x3 kernel, 224 at 64 channels in float32) and multiplies each block on its own. These cases make blocks
that end inside an image, groups that split offset groups and offset groups that split
groups, and compare with the float64 reference of test_deform_conv2d.py; the layout and
thread count of a call must not change a single bit of its output."""

from __future__ import annotations

import functools

import pytest
import torch
from test_deform_conv2d import _call, assert_matches, make_case, reference

from opforge_ops import deform_conv2d


def _wide_case(groups, offset_groups, dtype, use_mask=True, batch=2):
    # 256 input channels, 10x10 outputs: 100 positions an image, 200 in all, so a call (float32
    # and float64 alike) has a block of 128 positions that ends inside the second image and a
    # short last block.
    return make_case(batch=batch, in_c=256, out_c=8, size=(10, 10), padding=(1, 1), groups=groups,
                     offset_groups=offset_groups, use_mask=use_mask, offset_scale=2.0, dtype=dtype)


@functools.cache
def _wide_reference(groups, offset_groups, use_mask):
    return _call(reference, _wide_case(groups, offset_groups, torch.float64, use_mask))


@pytest.mark.parametrize("groups, offset_groups, use_mask", [
    (1, 1, True),
    (4, 2, True),    # an offset group spans two groups
    (2, 8, False),   # a group spans four offset groups
    (8, 8, True),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_blocks_across_images_match_reference(groups, offset_groups, use_mask, dtype):
    want = _wide_reference(groups, offset_groups, use_mask)
    got = _call(deform_conv2d, _wide_case(groups, offset_groups, dtype, use_mask))
    assert got.dtype == dtype and got.is_contiguous()
    assert_matches(got, want, dtype, f"groups {groups}, offset groups {offset_groups}")


@pytest.mark.parametrize("groups, out_c", [(1, 16), (1, 96), (2, 96), (4, 256)])
def test_whole_vectors_of_output_channels_match_reference(groups, out_c):
    # A multiple of 16 output channels per group: float32 goes through cpu/small_gemm.h on an
    # AVX-512 machine (tiles of 6 positions, strips of 64 channels, then a narrower one: 96 is
    # 64 + 32, 48 per group is 3 vectors). The blocks of 128 positions end inside the second
    # image, and 128 leaves a tile of 2.
    case = make_case(batch=2, in_c=256, out_c=out_c, size=(10, 10), padding=(1, 1),
                     groups=groups, offset_groups=2, offset_scale=2.0, dtype=torch.float32)
    want = _call(reference, {k: v.double() if isinstance(v, torch.Tensor) else v
                             for k, v in case.items()})
    got = _call(deform_conv2d, case)
    assert_matches(got, want, torch.float32, f"groups {groups}, out_c {out_c}")


def test_channels_last_input_gives_the_same_bits():
    case = _wide_case(2, 4, torch.float32)
    want = _call(deform_conv2d, case)
    for layout in ("channels_last", "strided"):
        x = case["input"]
        x = (x.to(memory_format=torch.channels_last) if layout == "channels_last"
             else torch.stack([x, x], -1)[..., 0])
        got = _call(deform_conv2d, dict(case, input=x))
        assert got.is_contiguous(), layout
        assert torch.equal(got, want), layout


def test_nan_and_far_offsets_sample_nan_and_zero():
    case = _wide_case(1, 1, torch.float32, batch=1)
    offset = case["offset"].clone()
    offset[0, 0, 2, 3] = float("nan")     # tap 0's y at output (2, 3)
    offset[0, 3, 5, 5] = 100.0            # tap 1's x at output (5, 5): outside, samples 0
    case = dict(case, offset=offset)
    want = _call(reference, {k: v.double() if isinstance(v, torch.Tensor) else v
                             for k, v in case.items()})
    got = _call(deform_conv2d, case)
    assert torch.isnan(got[0, :, 2, 3]).all()
    assert torch.isnan(got).sum() == got.shape[1]
    assert_matches(got, want, torch.float32, "nan and far offsets")


def test_forward_on_two_threads_gives_the_same_bits_as_one():
    # 3 images of 20x20 at 64 channels: 1200 positions, blocks of 224 that end inside images,
    # enough work for the policy to hand the blocks to two threads.
    case = make_case(batch=3, in_c=64, out_c=64, size=(20, 20), padding=(1, 1),
                     dtype=torch.float32, offset_scale=1.5)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(_call(deform_conv2d, case))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])
