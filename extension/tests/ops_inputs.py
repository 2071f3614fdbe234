"""Random inputs shared by the kernel tests."""

import torch


def random_rois(
    num_rois, batch_size, height, width, dtype=torch.float32, scale=1.0, generator=None
):
    """Rois [K, 5] with valid batch indices and boxes that mostly lie inside an H x W image
    (coordinates in input space divided by scale), some reaching past its border."""
    x1 = torch.rand(num_rois, generator=generator) * (width + 2) - 1
    y1 = torch.rand(num_rois, generator=generator) * (height + 2) - 1
    w = torch.rand(num_rois, generator=generator) * width * 0.8
    h = torch.rand(num_rois, generator=generator) * height * 0.8
    index = torch.randint(0, max(batch_size, 1), (num_rois,), generator=generator).to(torch.float64)
    rois = torch.stack([index, x1, y1, x1 + w, y1 + h], dim=1)
    rois[:, 1:] /= scale
    return rois.to(dtype)


def random_boxes(n, dtype=torch.float32):
    xy = torch.rand(n, 2) * 50
    wh = torch.rand(n, 2) * 20 + 0.1
    return torch.cat([xy, xy + wh], dim=1).to(dtype)
