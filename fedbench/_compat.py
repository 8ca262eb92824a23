"""Make `import torchvision` work with the CUDA-built torchvision 0.28 wheel on a CPU-only torch.

That wheel registers kernels for `torchvision::nms` and `torchvision::qnms` whose op schemas live in
its compiled extension, which does not load against the CPU torch build; importing torchvision then
fails with "operator torchvision::nms does not exist". Defining the two schemas through
`torch.library` first lets the import succeed. fedbench never calls nms. Where torchvision imports
cleanly (a matching build, a GPU machine) the schemas already exist and this is a no-op.
"""

from __future__ import annotations

_done = False
_lib = None  # keep the Library object alive: dropping it removes the definitions


def import_torchvision():
    """Import and return torchvision, defining the missing op schemas first when needed."""
    global _done, _lib
    if not _done:
        _done = True
        import torch

        missing = []
        for op, schema in (
            ("nms", "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"),
            ("qnms", "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"),
        ):
            try:
                torch._C._dispatch_find_schema_or_throw(f"torchvision::{op}", "")
            except RuntimeError:
                missing.append(schema)
        if missing:
            _lib = torch.library.Library("torchvision", "DEF")
            for schema in missing:
                _lib.define(schema)
    import torchvision

    return torchvision
