"""Slow, obviously-correct references, written from the operators' definitions: the one
reference per op that every backend (tests/backends.py) is compared with.

They loop in Python over boxes, bins and sample points and use differentiable tensor
indexing, so autograd through them gives the reference gradient too. Roi geometry (bin
edges, sample positions) is computed in the precision the kernels use for it (_acc), so a
float32 kernel and the reference agree on which pixels a bin covers; values are summed in
the input's dtype (pass a float64 input for an exact reference). deform_conv2d samples at
positions computed in the offsets' dtype, as its kernels do (bilinear sampling is continuous,
so a float64 reference of the same values serves every kernel dtype).
"""

import math

import numpy as np
import torch


def box_iou(a, b):
    """IoU of two (x1, y1, x2, y2) boxes given as Python floats; NaN for two empty boxes."""
    inter_w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    inter_h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = inter_w * inter_h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union != 0 else math.nan


def nms(boxes, scores, iou_threshold):
    """Visit boxes by decreasing score (ties: lower index first); keep a box unless its IoU
    with an already kept box exceeds the threshold."""
    box_list = boxes.double().tolist()
    score_list = scores.double().tolist()
    order = sorted(range(len(score_list)), key=lambda i: -score_list[i])
    kept = []
    for i in order:
        if not any(box_iou(box_list[i], box_list[k]) > iou_threshold for k in kept):
            kept.append(i)
    return torch.tensor(kept, dtype=torch.int64)


def batched_nms(boxes, scores, idxs, iou_threshold):
    """NMS within each category, merged by decreasing score."""
    kept = []
    for category in sorted(set(idxs.tolist())):
        members = [i for i, c in enumerate(idxs.tolist()) if c == category]
        for k in nms(boxes[members], scores[members], iou_threshold).tolist():
            kept.append(members[k])
    kept.sort(key=lambda i: (-float(scores[i]), i))
    return torch.tensor(kept, dtype=torch.int64)


def _bilinear(plane, y, x):
    """plane: [C, H, W]; sample at (y, x) with the torchvision/Detectron border rule."""
    height, width = plane.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width or height == 0 or width == 0:
        return plane.new_zeros(plane.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_low = y_high = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_low = x_high = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1.0 - ly, 1.0 - lx
    return (
        hy * hx * plane[:, y_low, x_low]
        + hy * lx * plane[:, y_low, x_high]
        + ly * hx * plane[:, y_high, x_low]
        + ly * lx * plane[:, y_high, x_high]
    )


def roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """Average of bilinear samples on a regular grid inside each of the roi's bins."""
    num_rois, channels = rois.shape[0], input.shape[1]
    acc = _acc(rois)
    rows = []
    offset = acc(0.5 if aligned else 0.0)
    for roi in rois.double().tolist():
        plane = input[int(roi[0])]
        x1, y1, x2, y2 = (acc(v) * acc(spatial_scale) - offset for v in roi[1:])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, acc(1)), max(roi_h, acc(1))
        bin_h, bin_w = roi_h / acc(pooled_height), roi_w / acc(pooled_width)
        grid_h = sampling_ratio if sampling_ratio > 0 else max(0, math.ceil(bin_h))
        grid_w = sampling_ratio if sampling_ratio > 0 else max(0, math.ceil(bin_w))
        count = max(grid_h * grid_w, 1)
        bins = []
        for ph in range(pooled_height):
            for pw in range(pooled_width):
                total = input.new_zeros(channels)
                for iy in range(grid_h):
                    y = y1 + acc(ph) * bin_h + (acc(iy) + acc(0.5)) * bin_h / acc(grid_h)
                    for ix in range(grid_w):
                        x = x1 + acc(pw) * bin_w + (acc(ix) + acc(0.5)) * bin_w / acc(grid_w)
                        total = total + _bilinear(plane, float(y), float(x))
                bins.append(total / count)
        rows.append(torch.stack(bins, dim=1).reshape(channels, pooled_height, pooled_width))
    if not rows:
        return input.new_zeros((num_rois, channels, pooled_height, pooled_width))
    return torch.stack(rows)


def roi_pool(input, rois, spatial_scale, pooled_height, pooled_width):
    """Max over each bin of the roi quantized to input pixels; argmax is the flat H*W index
    of the first maximum (-1 and output 0 for an empty bin)."""
    num_rois, channels = rois.shape[0], input.shape[1]
    height, width = input.shape[-2:]
    output = input.new_zeros((num_rois, channels, pooled_height, pooled_width))
    argmax = torch.full(output.shape, -1, dtype=torch.int32)
    outputs = []
    acc = _acc(rois)
    for n, roi in enumerate(rois.double().tolist()):
        plane = input[int(roi[0])]
        x1, y1, x2, y2 = (_round_half_away(float(acc(v) * acc(spatial_scale))) for v in roi[1:])
        roi_w, roi_h = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
        bin_h, bin_w = acc(roi_h) / acc(pooled_height), acc(roi_w) / acc(pooled_width)
        bins = []
        for ph in range(pooled_height):
            h0 = min(max(math.floor(acc(ph) * bin_h) + y1, 0), height)
            h1 = min(max(math.ceil(acc(ph + 1) * bin_h) + y1, 0), height)
            for pw in range(pooled_width):
                w0 = min(max(math.floor(acc(pw) * bin_w) + x1, 0), width)
                w1 = min(max(math.ceil(acc(pw + 1) * bin_w) + x1, 0), width)
                if h1 <= h0 or w1 <= w0:
                    bins.append(input.new_zeros(channels))
                    continue
                region = plane[:, h0:h1, w0:w1].reshape(channels, (h1 - h0) * (w1 - w0))
                values, where = region.max(dim=1)
                bins.append(values)
                rows_, cols_ = where // (w1 - w0) + h0, where % (w1 - w0) + w0
                argmax[n, :, ph, pw] = (rows_ * width + cols_).to(torch.int32)
        outputs.append(torch.stack(bins, dim=1).reshape(channels, pooled_height, pooled_width))
    if outputs:
        output = torch.stack(outputs)
    return output, argmax


def _round_half_away(value):
    return int(math.floor(value + 0.5)) if value >= 0 else -int(math.floor(-value + 0.5))


def _acc(rois):
    """The scalar type the kernels compute roi geometry in: double for float64, float
    (np.float32) for float32 / half / bfloat16. Mimicking it makes bin edges and sample
    positions land exactly where the kernels put them."""
    return np.float64 if rois.dtype == torch.float64 else np.float32


def ps_roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    """(output, channel_mapping): output channel c of bin (ph, pw) averages bilinear samples
    of input channel (c * PH + ph) * PW + pw on a regular grid inside the bin, boxes shifted
    by -0.5 pixel. An adaptive grid of 0 along a side averages nothing over 0 (NaN)."""
    acc = _acc(rois)
    bins = pooled_height * pooled_width
    channels_out = input.shape[1] // bins
    shape = (rois.shape[0], channels_out, pooled_height, pooled_width)
    mapping = (torch.arange(channels_out * bins, dtype=torch.int32).reshape(shape[1:])).expand(shape)
    rows = []
    for roi in rois.double().tolist():
        planes = input[int(roi[0])].double()
        start_x, start_y = (acc(v) * acc(spatial_scale) - acc(0.5) for v in roi[1:3])
        end_x, end_y = (acc(v) * acc(spatial_scale) - acc(0.5) for v in roi[3:5])
        bin_h, bin_w = (end_y - start_y) / acc(pooled_height), (end_x - start_x) / acc(pooled_width)
        raw_h = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_h)
        raw_w = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_w)
        grid_h, grid_w = max(raw_h, 0), max(raw_w, 0)
        count = math.nan if raw_h == 0 or raw_w == 0 else max(grid_h * grid_w, 1)
        out = []
        for ph in range(pooled_height):
            for pw in range(pooled_width):
                plane = planes[ph * pooled_width + pw :: bins]  # one channel per output channel
                total = plane.new_zeros(channels_out)
                for iy in range(grid_h):
                    y = start_y + acc(ph) * bin_h + (acc(iy) + acc(0.5)) * bin_h / acc(grid_h)
                    for ix in range(grid_w):
                        x = start_x + acc(pw) * bin_w + (acc(ix) + acc(0.5)) * bin_w / acc(grid_w)
                        total = total + _bilinear(plane, float(y), float(x))
                out.append(total / count)
        rows.append(torch.stack(out, dim=1).reshape(shape[1:]))
    output = torch.stack(rows) if rows else input.new_zeros(shape, dtype=torch.float64)
    return output.to(input.dtype), mapping.contiguous()


def ps_roi_pool(input, rois, spatial_scale, pooled_height, pooled_width):
    """(output, channel_mapping): output channel c of bin (ph, pw) is the mean of input
    channel (c * PH + ph) * PW + pw over the bin quantized to pixels; bins are clipped to
    [0, H - 1) x [0, W - 1), as torchvision's (the last row and column are never pooled)."""
    acc = _acc(rois)
    height, width = input.shape[-2:]
    bins = pooled_height * pooled_width
    channels_out = input.shape[1] // bins
    shape = (rois.shape[0], channels_out, pooled_height, pooled_width)
    mapping = (torch.arange(channels_out * bins, dtype=torch.int32).reshape(shape[1:])).expand(shape)
    rows = []
    for roi in rois.double().tolist():
        planes = input[int(roi[0])].double()
        x1, y1, x2, y2 = (_round_half_away(float(acc(v) * acc(spatial_scale))) for v in roi[1:])
        bin_h = acc(max(y2 - y1, 1)) / acc(pooled_height)
        bin_w = acc(max(x2 - x1, 1)) / acc(pooled_width)
        out = []
        for ph in range(pooled_height):
            h0 = min(max(math.floor(acc(ph) * bin_h) + y1, 0), max(height - 1, 0))
            h1 = min(max(math.ceil(acc(ph + 1) * bin_h) + y1, 0), max(height - 1, 0))
            for pw in range(pooled_width):
                w0 = min(max(math.floor(acc(pw) * bin_w) + x1, 0), max(width - 1, 0))
                w1 = min(max(math.ceil(acc(pw + 1) * bin_w) + x1, 0), max(width - 1, 0))
                plane = planes[ph * pooled_width + pw :: bins]
                if h1 <= h0 or w1 <= w0:
                    out.append(plane.new_zeros(channels_out))
                else:
                    out.append(plane[:, h0:h1, w0:w1].mean(dim=(1, 2)))
        rows.append(torch.stack(out, dim=1).reshape(shape[1:]))
    output = torch.stack(rows) if rows else input.new_zeros(shape, dtype=torch.float64)
    return output.to(input.dtype), mapping.contiguous()


def _bilinear_zero_padded(planes, y, x):
    """Bilinear sample of every plane at (y, x), neighbours outside the image counting as 0
    (deform_conv2d's rule; a point one pixel or more outside samples 0). y and x are 0-d
    tensors, so autograd reaches the offsets; they keep the offsets' dtype, as the kernels'
    sampling positions do (float32 offsets: float32 positions)."""
    height, width = planes.shape[-2:]
    yv, xv = float(y.detach()), float(x.detach())
    if math.isnan(yv) or math.isnan(xv):
        return planes.new_full(planes.shape[:-2], math.nan)
    if yv <= -1 or yv >= height or xv <= -1 or xv >= width:
        return planes.new_zeros(planes.shape[:-2])
    y0, x0 = math.floor(yv), math.floor(xv)
    ly, lx = y - y0, x - x0
    out = planes.new_zeros(planes.shape[:-2])
    for yy, wy in ((y0, 1 - ly), (y0 + 1, ly)):
        for xx, wx in ((x0, 1 - lx), (x0 + 1, lx)):
            if 0 <= yy < height and 0 <= xx < width:
                out = out + wy * wx * planes[..., yy, xx]
    return out


def deform_conv2d(
    input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None
):
    """Deformable convolution point by point: kernel tap (i, j) of output pixel (oh, ow)
    samples the input at (oh * sh - ph + i * dh, ow * sw - pw + j * dw) plus the tap's
    offset (offset group of the channel), times the tap's mask; then a grouped 1x1-per-tap
    contraction with the weight, plus bias."""
    n, c = input.shape[:2]
    out_c, c_per_group, kh, kw = weight.shape
    groups = c // c_per_group if c_per_group else 1
    offset_groups = offset.shape[1] // (2 * kh * kw) if kh * kw else 1
    out_h, out_w = offset.shape[-2:]
    c_per_offset_group = c // offset_groups
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    samples = []  # per image: (c, kh, kw, out_h, out_w)
    for b in range(n):
        per_channel = [[[None] * kw for _ in range(kh)] for _ in range(c)]
        for g in range(offset_groups):
            chans = slice(g * c_per_offset_group, (g + 1) * c_per_offset_group)
            for i in range(kh):
                for j in range(kw):
                    k = i * kw + j
                    grid = []
                    for oh in range(out_h):
                        row = []
                        for ow in range(out_w):
                            y = oh * sh - ph + i * dh + offset[b, g * 2 * kh * kw + 2 * k, oh, ow]
                            x = ow * sw - pw + j * dw + offset[b, g * 2 * kh * kw + 2 * k + 1, oh, ow]
                            v = _bilinear_zero_padded(input[b, chans], y, x)
                            if mask is not None:
                                v = v * mask[b, g * kh * kw + k, oh, ow]
                            row.append(v)
                        grid.append(torch.stack(row, dim=-1))
                    tap = torch.stack(grid, dim=-2)
                    for ci in range(c_per_offset_group):
                        per_channel[g * c_per_offset_group + ci][i][j] = tap[ci]
        samples.append(
            torch.stack([torch.stack([torch.stack(r) for r in ch]) for ch in per_channel])
        )
    if not samples or c == 0 or kh * kw == 0 or out_h * out_w == 0:
        out = input.new_zeros((n, out_c, out_h, out_w))
    else:
        cols = torch.stack(samples)  # (n, c, kh, kw, out_h, out_w)
        outs = []
        oc_per_group = out_c // groups
        for gr in range(groups):
            w = weight[gr * oc_per_group : (gr + 1) * oc_per_group]
            col = cols[:, gr * c_per_group : (gr + 1) * c_per_group]
            outs.append(torch.einsum("ocij,bcijhw->bohw", w, col))
        out = torch.cat(outs, dim=1)
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1)
    return out
