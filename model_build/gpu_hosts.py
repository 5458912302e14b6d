"""The GPU host as the fleet really runs: which GPU an instance type has (and its compute
capability), which CUDA and TensorRT each Triton image was built with, and which NVIDIA driver each
SageMaker inference AMI gives. From these follow the AMI a fleet needs for its image, the pairs that
cannot run, and which TensorRT plans a fleet can load.

Standard library only: the CDK app imports it at synth, the build at validate. Each table says
where its rows come from, so that a row can be re-checked; docs/gpu-hosts.md has the sources whole.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------------------------------------
# GPUs per instance family (AWS instance type pages; NVIDIA's "CUDA GPUs" compute capability table)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One instance family's GPU."""

    name: str
    #: ``major.minor``, as Triton's ``cc_model_filenames`` keys it (``7.5``).
    compute_capability: str

    @property
    def cc_tuple(self) -> tuple[int, int]:
        return version_tuple(self.compute_capability)[:2]  # type: ignore[return-value]


#: Instance family -> its GPU. Every multi-model GPU instance type has one GPU of its family's kind.
INSTANCE_GPUS: dict[str, Gpu] = {
    "ml.g4dn": Gpu("NVIDIA T4", "7.5"),
    "ml.g5": Gpu("NVIDIA A10G", "8.6"),
    "ml.p3": Gpu("NVIDIA V100", "7.0"),
    "ml.p2": Gpu("NVIDIA K80", "3.7"),
}


def version_tuple(version: str) -> tuple[int, ...]:
    """``"12.4.1"`` -> ``(12, 4, 1)``; a part that is not a number counts as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def gpu_of(instance_type: str) -> Gpu:
    """The GPU of ``ml.g5.2xlarge`` (its family's); ``KeyError`` naming the families known."""
    family = instance_type.rsplit(".", 1)[0]
    if family not in INSTANCE_GPUS:
        raise KeyError(f"{instance_type!r}: no GPU known for family {family!r}; known: {', '.join(INSTANCE_GPUS)}")
    return INSTANCE_GPUS[family]


# ---------------------------------------------------------------------------------------------
# Triton images (NVIDIA's Frameworks Support Matrix and each release's notes)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TritonRelease:
    """What one Triton container release was built with."""

    version: str
    #: CUDA toolkit of the image (``major.minor.patch``).
    cuda: str
    #: TensorRT of the image (``major.minor.patch``); a plan must be built with the same.
    tensorrt: str
    #: The driver branch the image's CUDA needs without forward compatibility.
    min_driver: int
    #: Older driver branches that run it on data-center GPUs through CUDA forward compatibility
    #: (the release notes' "if you are running on a data center GPU ... you can use" list).
    compat_drivers: tuple[int, ...]
    #: The oldest compute capability the image's CUDA builds for.
    min_compute_capability: str


TRITON_RELEASES: dict[str, TritonRelease] = {}


def triton_release(version: str) -> TritonRelease:
    """The row of Triton ``version``; ``KeyError`` naming the versions known."""
    if version not in TRITON_RELEASES:
        raise KeyError(f"{version!r}: not in the Triton CUDA table; known: {', '.join(TRITON_RELEASES)}")
    return TRITON_RELEASES[version]
