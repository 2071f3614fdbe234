"""opforge_ops.torchvision: routing an unchanged torchvision to opforge's ops, and undoing it."""

import sys

import pytest
import torch
from tv_support import require_torchvision

import opforge_ops
import opforge_ops.torchvision as otv

tv = require_torchvision()
import torchvision.models.detection  # noqa: E402  (binds the ops by name in roi_heads, poolers, ...)

# Where torchvision binds the ops by name: each must follow the patch.
BINDINGS = [
    ("torchvision.ops", "nms"),
    ("torchvision.ops", "batched_nms"),
    ("torchvision.ops", "roi_align"),
    ("torchvision.ops", "RoIAlign"),
    ("torchvision.ops", "roi_pool"),
    ("torchvision.ops", "RoIPool"),
    ("torchvision.ops", "deform_conv2d"),
    ("torchvision.ops", "DeformConv2d"),
    ("torchvision.ops.boxes", "nms"),
    ("torchvision.ops.boxes", "batched_nms"),
    ("torchvision.ops.roi_align", "roi_align"),
    ("torchvision.ops.roi_pool", "roi_pool"),
    ("torchvision.ops.deform_conv", "deform_conv2d"),
    ("torchvision.ops.poolers", "roi_align"),
    ("torchvision.models.detection.roi_heads", "roi_align"),
]


def snapshot():
    """Every attribute of every loaded torchvision module, by identity."""
    return {
        (name, attr): id(value)
        for name, module in list(sys.modules.items())
        if name.startswith("torchvision") and module is not None
        for attr, value in list(vars(module).items())
    }


@pytest.fixture(autouse=True)
def _always_unpatched():
    yield
    otv.unpatch()


@pytest.mark.parametrize("module, name", BINDINGS)
def test_patch_routes_every_binding_to_opforge(module, name):
    with otv.patched():
        assert getattr(sys.modules[module], name) is getattr(opforge_ops, name)
    assert getattr(sys.modules[module], name) is not getattr(opforge_ops, name)


def test_unpatch_restores_torchvision_exactly():
    before = snapshot()
    otv.patch()
    otv.patch()  # twice is once
    assert otv.is_patched()
    import torchvision.models.detection.keypoint_rcnn  # noqa: F401  (imported while patched)

    otv.unpatch()
    after = snapshot()
    assert not otv.is_patched()
    changed = {key for key in before if after.get(key) != before[key]}
    assert not changed, f"not restored: {sorted(changed)[:10]}"


def test_patched_calls_run_opforge_kernels():
    x, rois = torch.rand(1, 2, 8, 8), torch.tensor([[0.0, 1, 1, 6, 6]])
    with otv.patched():
        pooler = torchvision.ops.MultiScaleRoIAlign(["0"], 2, 2)
        with torch.autograd.profiler.profile() as prof:
            pooler({"0": x}, [rois[:, 1:]], [(16, 16)])
    names = {event.name for event in prof.function_events}
    assert "opforge::roi_align" in names and "torchvision::roi_align" not in names


def test_nested_patched_blocks_restore_only_at_the_outermost():
    with otv.patched():
        with otv.patched():
            pass
        assert torchvision.ops.nms is opforge_ops.nms
    assert torchvision.ops.nms is not opforge_ops.nms


def test_scripting_after_unpatch_uses_torchvision_again():
    pooler = torchvision.ops.MultiScaleRoIAlign(["0"], 2, 2)
    with otv.patched():
        patched_code = str(torch.jit.script(pooler).inlined_graph)
    restored_code = str(torch.jit.script(pooler).inlined_graph)
    assert "opforge::roi_align" in patched_code and "torchvision::roi_align" not in patched_code
    assert "torchvision::roi_align" in restored_code and "opforge::roi_align" not in restored_code


def test_feature_extraction_treats_patched_modules_as_leaves():
    from torchvision.models.feature_extraction import create_feature_extractor

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.align = torchvision.ops.RoIAlign(2, 1.0, 2)

        def forward(self, x, rois):
            return self.align(x, rois).relu()

    with otv.patched():
        head = Head()
        assert isinstance(head.align, opforge_ops.RoIAlign)
        extractor = create_feature_extractor(head, return_nodes=["align"])
        x, rois = torch.rand(1, 2, 8, 8), torch.tensor([[0.0, 1, 1, 6, 6]])
        out = extractor(x, rois)["align"]
    torch.testing.assert_close(out, opforge_ops.roi_align(x, rois, 2, 1.0, 2))
