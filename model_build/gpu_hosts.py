"""The GPU host as the fleet really runs: which GPU an instance type has (and its compute
capability), which CUDA and TensorRT each Triton image was built with, and which NVIDIA driver each
SageMaker inference AMI gives. From these follow the AMI a fleet needs for its image
(:func:`default_ami`), the pairs that cannot run (:func:`host_verdict`), and which TensorRT plans a
fleet can load.

Standard library only: the CDK app imports it at synth, the build at validate. Each table says
where its rows come from, so that a row can be re-checked; docs/gpu-hosts.md quotes the sources and
says which values are not confirmed there. What the tables do not know is reported as unknown
(``unverified``), never as working.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# GPUs per instance family (AWS instance type pages; NVIDIA's "CUDA GPUs" compute capability table)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One instance family's GPU."""

    name: str
    #: ``major.minor``, as Triton's ``cc_model_filenames`` keys it (``7.5``).
    compute_capability: str
    #: The instance family (``ml.g5``).
    family: str = ""

    @property
    def cc_tuple(self) -> tuple[int, int]:
        return version_tuple(self.compute_capability)[:2]  # type: ignore[return-value]


#: Instance family -> its GPU. Every multi-model GPU instance type has one GPU of its family's kind.
INSTANCE_GPUS: dict[str, Gpu] = {
    "ml.g4dn": Gpu("NVIDIA T4", "7.5", "ml.g4dn"),
    "ml.g5": Gpu("NVIDIA A10G", "8.6", "ml.g5"),
    "ml.p3": Gpu("NVIDIA V100", "7.0", "ml.p3"),
    "ml.p2": Gpu("NVIDIA K80", "3.7", "ml.p2"),
}
#: GPUs a newer driver branch no longer supports: the last branch that does. R470 was the last
#: branch for Kepler (the K80); every inference AMI has R535 or newer. (R580 is documented as the
#: last branch for Volta, so the V100 runs on every AMI below.)
LAST_DRIVER_BRANCH: dict[str, int] = {"NVIDIA K80": 470}


#: Where a row of :data:`INSTANCE_TYPES` comes from. ``EC2_GUIDE``: the Amazon EC2 User Guide,
#: "Accelerated computing instances" (hardware table: vCPUs, memory GiB, GPU count; family text: the
#: T4's 16 GiB and the K80's 12 GiB per GPU) and "Instance store volumes" (g4dn, g5 NVMe sizes),
#: awsdocs/amazon-ec2-user-guide at d2899614 (2023-05). ``HOSTING_VOLUMES``: the SageMaker developer
#: guide, "Hosting instance storage volumes" (the EBS volume SageMaker attaches to p2 and p3 hosting
#: instances), awsdocs/amazon-sagemaker-developer-guide doc_source/host-instance-storage.md.
EC2_GUIDE = "Amazon EC2 User Guide, accelerated computing instances and instance store volumes"
HOSTING_VOLUMES = "SageMaker developer guide, Hosting instance storage volumes (EBS default of p2/p3)"
PRODUCT_PAGE = "aws.amazon.com/ec2/instance-types product page (not confirmed at a source read here)"
GIB = 1024**3
GB = 1000**3


@dataclass(frozen=True)
class InstanceType:
    """One instance type a multi-model GPU endpoint accepts: its GPU, memory and disk.

    ``disk_gb`` is what SageMaker gives the endpoint's models: the NVMe instance store on g4dn and g5
    (their fixed size; ``VolumeSizeInGB`` is refused), the EBS volume SageMaker attaches to p2 and p3
    (its default; ``volume_size_gb`` replaces it there, see :func:`instance_disk_bytes`)."""

    name: str
    gpu: Gpu
    gpu_count: int
    #: GiB of memory per GPU, as AWS states it (the card's nominal memory; the driver, ECC and the
    #: CUDA context take some of it, which the fit check counts separately).
    gpu_memory_gib: float
    vcpus: int
    memory_gib: float
    disk_gb: int
    #: ``nvme`` (instance store, fixed) or ``ebs`` (SageMaker's default volume).
    disk_kind: str
    #: Where each value comes from (``gpu``, ``gpu_memory``, ``memory``, ``disk``).
    sources: tuple[tuple[str, str], ...]
    #: Values no source read here confirms (``gpu_memory``...); each is stated as unconfirmed.
    unconfirmed: tuple[str, ...] = ()

    @property
    def gpu_memory_bytes(self) -> int:
        """Memory of one GPU in bytes."""
        return int(self.gpu_memory_gib * GIB)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def disk_bytes(self) -> int:
        """The disk in bytes (GB as AWS counts them: 10^9)."""
        return self.disk_gb * GB

    def source_of(self, value: str) -> str:
        """Where ``value`` (``gpu_memory``, ``memory``, ``disk``...) comes from, and whether it is confirmed."""
        found = dict(self.sources).get(value, "no source")
        return f"{found} (unconfirmed)" if value in self.unconfirmed else found


def _instance_rows() -> dict[str, InstanceType]:
    rows: list[InstanceType] = []
    t4, a10g = INSTANCE_GPUS["ml.g4dn"], INSTANCE_GPUS["ml.g5"]
    nvme = (("gpu", EC2_GUIDE), ("gpu_memory", EC2_GUIDE), ("memory", EC2_GUIDE), ("disk", EC2_GUIDE))
    # size: (vCPUs, memory GiB, g4dn NVMe GB, g5 NVMe GB)
    sizes = (("xlarge", 4, 16, 125, 250), ("2xlarge", 8, 32, 225, 450), ("4xlarge", 16, 64, 225, 600),
             ("8xlarge", 32, 128, 900, 900), ("16xlarge", 64, 256, 900, 1900))
    for size, vcpus, memory, g4dn_disk, _ in sizes:
        rows.append(InstanceType(f"ml.g4dn.{size}", t4, 1, 16, vcpus, memory, g4dn_disk, "nvme", nvme))
    for size, vcpus, memory, _, g5_disk in sizes:
        # The A10G's 24 GiB is on the G5 product page; the user guide's G5 text names the GPU only.
        rows.append(InstanceType(f"ml.g5.{size}", a10g, 1, 24, vcpus, memory, g5_disk, "nvme",
                                 (*nvme[:1], ("gpu_memory", PRODUCT_PAGE), *nvme[2:]), ("gpu_memory",)))
    ebs = (("gpu", EC2_GUIDE), ("memory", EC2_GUIDE), ("disk", HOSTING_VOLUMES))
    rows.append(InstanceType("ml.p2.xlarge", INSTANCE_GPUS["ml.p2"], 1, 12, 4, 61, 30, "ebs",
                             (*ebs, ("gpu_memory", EC2_GUIDE))))
    # The user guide says "up to 32 GiB of memory per GPU" for P3 (p3dn); the 16 GiB of p3.2xlarge's
    # V100 is the P3 product page's.
    rows.append(InstanceType("ml.p3.2xlarge", INSTANCE_GPUS["ml.p3"], 1, 16, 8, 61, 30, "ebs",
                             (*ebs, ("gpu_memory", PRODUCT_PAGE)), ("gpu_memory",)))
    return {row.name: row for row in rows}


#: Every instance type a GPU multi-model endpoint accepts (the construct's ``MME_GPU_INSTANCE_TYPES``,
#: a test keeps the two equal), with its GPU, memory and disk; docs/gpu-hosts.md shows the table.
INSTANCE_TYPES: dict[str, InstanceType] = _instance_rows()


def instance_type(name: str) -> InstanceType:
    """The row of ``ml.g5.xlarge``; ``KeyError`` naming the instance types known."""
    return _row(INSTANCE_TYPES, name, f"{name!r}: not an instance type of the table")


def instance_disk_bytes(name: str, volume_size_gb: int | None = None) -> int:
    """The disk the endpoint's models get on ``name``: ``volume_size_gb`` where the type takes one
    (EBS: p2, p3), else the table's (the instance store, or SageMaker's default volume)."""
    row = instance_type(name)
    if volume_size_gb is not None and row.disk_kind == "ebs":
        return volume_size_gb * GB
    return row.disk_bytes


def version_tuple(version: str) -> tuple[int, ...]:
    """``"12.4.1"`` -> ``(12, 4, 1)``; a part that is not a number counts as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def _row(table: dict[str, T], key: str, missing: str) -> T:
    """``table[key]``, or ``KeyError`` saying ``missing`` and the keys known."""
    if key not in table:
        raise KeyError(f"{missing}; known: {', '.join(table)}")
    return table[key]


def gpu_of(instance_type: str) -> Gpu:
    """The GPU of ``ml.g5.2xlarge`` (its family's); ``KeyError`` naming the families known."""
    family = instance_type.rsplit(".", 1)[0]
    return _row(INSTANCE_GPUS, family, f"{instance_type!r}: no GPU known for family {family!r}")


# ---------------------------------------------------------------------------------------------
# Triton images (NVIDIA's Frameworks Support Matrix and each release's notes)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TritonRelease:
    """What one Triton container release was built with."""

    version: str
    #: CUDA toolkit of the image (``major.minor.patch``).
    cuda: str
    #: TensorRT of the image (``major.minor.patch``); a plan must be built with the same. ``None``:
    #: not confirmed at a source (see :data:`TRITON_RELEASES`).
    tensorrt: str | None
    #: The driver branch the image's CUDA needs without forward compatibility.
    min_driver: int
    #: The oldest compute capability the image's CUDA builds for.
    min_compute_capability: str


#: Every version of the sagemaker SDK's sagemaker-tritonserver table (constructs/triton_image.py).
#: CUDA, driver and compute capability: the release notes
#: (docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-YY-MM.html, "Driver
#: Requirements", "GPU Requirements"); 24.09 and 25.09: the CUDA of the same release's vLLM image
#: (server docs/introduction/compatibility.md), their notes could not be read. TensorRT: ``None``
#: where no source confirmed the py3 image's version (the notes defer to the Frameworks Support
#: Matrix, which could not be read): plans are then reported as unchecked, never as matching.
#: 24.05: TensorRT 10.0.1.6, as the same month's NGC framework containers list it. The notes'
#: forward-compatible driver lists are not kept: forward compatibility is never counted as running
#: (:func:`host_verdict`; docs/gpu-hosts.md, "Forward compatibility", says why).
TRITON_RELEASES: dict[str, TritonRelease] = {
    release.version: release
    for release in (
        TritonRelease("23.12", "12.3.2", None, 545, "6.0"),
        TritonRelease("24.01", "12.3.2", None, 545, "6.0"),
        TritonRelease("24.03", "12.4.0", None, 545, "6.0"),
        TritonRelease("24.05", "12.4.1", "10.0.1", 545, "6.0"),
        TritonRelease("24.09", "12.6.1", None, 560, "6.0"),
        TritonRelease("25.04", "12.9.0", None, 575, "7.5"),
        # The 25.08 and 25.10 notes (CUDA 13.0) still print CUDA 12's driver text; R580 is CUDA 13's
        # first branch (NVIDIA's data-center driver table), and no forward-compatible branch is stated.
        TritonRelease("25.09", "13.0.1", None, 580, "7.5"),
        TritonRelease("26.05", "13.2.1", None, 580, "7.5"),
    )
}


def triton_release(version: str) -> TritonRelease:
    """The row of Triton ``version``; ``KeyError`` naming the versions known."""
    return _row(TRITON_RELEASES, version, f"{version!r}: not in the Triton CUDA table")


# ---------------------------------------------------------------------------------------------
# SageMaker inference AMIs (botocore's sagemaker service model, ProductionVariantInferenceAmiVersion)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InferenceAmi:
    """One value of ``ProductionVariant.InferenceAmiVersion``."""

    value: str
    accelerator: str
    #: NVIDIA driver branch (0 for a Neuron AMI).
    driver: int
    #: The CUDA the driver gives (``major.minor``).
    cuda: str
    #: False where the AMI's NVIDIA Container Toolkit does not mount the image's CUDA-compat
    #: libraries: forward compatibility then works only if the container puts them on its
    #: ``LD_LIBRARY_PATH`` itself.
    compat_mounting: bool


#: The instance families each AMI is documented for. Only ``-gpu-2`` has such a list: the API
#: reference of botocore 1.36.20 ("Supported instance types: ml.g4dn.*, ml.g5.*, ml.g6.*, ml.p3.*,
#: ml.p4d.*, ml.p4de.*, ml.p5.*"); the later values' documentation lists none. An AMI on a family
#: not listed is *unverified*, never *runs*: CreateEndpointConfig may refuse the pair at deploy.
AMI_FAMILIES: dict[str, frozenset[str]] = {
    "al2-ami-sagemaker-inference-gpu-2": frozenset({"ml.g4dn", "ml.g5", "ml.p3"}),
}
#: Oldest first; the order :func:`default_ami` prefers the newest in. The botocore documentation
#: of each value gives the driver and CUDA quoted here.
INFERENCE_AMIS: dict[str, InferenceAmi] = {
    ami.value: ami
    for ami in (
        InferenceAmi("al2-ami-sagemaker-inference-gpu-2", "gpu", 535, "12.2", True),
        InferenceAmi("al2-ami-sagemaker-inference-gpu-2-1", "gpu", 535, "12.2", False),
        InferenceAmi("al2-ami-sagemaker-inference-gpu-3-1", "gpu", 550, "12.4", False),
        InferenceAmi("al2023-ami-sagemaker-inference-gpu-4-1", "gpu", 580, "13.0", False),
        InferenceAmi("al2-ami-sagemaker-inference-neuron-2", "neuron", 0, "", False),
    )
}


@dataclass(frozen=True)
class HostVerdict:
    """Whether an image runs on an AMI's driver and an instance's GPU, and why.

    ``runs``: the driver's CUDA covers the image's, natively or through CUDA minor version
    compatibility (same major version, which NVIDIA's driver table documents per branch), and the
    AMI is documented for the instance family (:data:`AMI_FAMILIES`). ``unverified``: the CUDA is
    covered but the AMI documents no such instance type, or the image's CUDA major is newer than the
    driver's, so it runs only through the forward-compatibility package, which nothing here has
    confirmed for that pair. ``fails``: known not to work.
    """

    status: str
    reason: str
    #: Whether the driver's CUDA covers the image's (natively or by minor version compatibility):
    #: of two unverified pairs, the one whose only unknown is the AMI's instance families is chosen.
    cuda_covered: bool = False

    @property
    def runs(self) -> bool:
        return self.status == "runs"

    @property
    def rank(self) -> int:
        """2 runs, 1 unverified with the CUDA covered, 0 unverified through forward compatibility, -1 fails."""
        if self.status == "fails":
            return -1
        return 2 if self.runs else int(self.cuda_covered)


def host_verdict(image: TritonRelease, ami: InferenceAmi, gpu: Gpu) -> HostVerdict:
    """Whether Triton ``image`` runs on ``ami`` with ``gpu``; the reason names each number."""
    if ami.accelerator != "gpu":
        return HostVerdict("fails", f"{ami.value} is a {ami.accelerator} AMI (Inferentia and Trainium), "
                                    f"not one for an {gpu.name}")
    what = f"Triton {image.version} is CUDA {image.cuda}; {ami.value} has driver R{ami.driver} (CUDA {ami.cuda})"
    last = LAST_DRIVER_BRANCH.get(gpu.name)
    if last is not None and ami.driver > last:
        return HostVerdict("fails", f"{what}, which no longer supports the {gpu.name} (R{last} was the last "
                                    "branch that did)")
    if gpu.cc_tuple < version_tuple(image.min_compute_capability)[:2]:
        return HostVerdict("fails", f"{what}; Triton {image.version} supports compute capability "
                                    f"{image.min_compute_capability} and later, and the {gpu.name} is "
                                    f"{gpu.compute_capability}")
    need, have = version_tuple(image.cuda)[:2], version_tuple(ami.cuda)[:2]
    if have >= need or have[0] == need[0]:
        reason = what if have >= need else f"{what}: CUDA minor version compatibility"
        if gpu.family and gpu.family not in AMI_FAMILIES.get(ami.value, frozenset()):
            return HostVerdict("unverified", f"{reason}; but {ami.value} is not documented for {gpu.family} "
                                             "instances (the API reference lists instance types for "
                                             "al2-ami-sagemaker-inference-gpu-2 alone)", cuda_covered=True)
        return HostVerdict("runs", reason, cuda_covered=True)
    mounting = "" if ami.compat_mounting else (
        ", and this AMI does not mount the CUDA-compat libraries (the container must load them itself)")
    return HostVerdict("unverified", f"{what}: only CUDA forward compatibility could run it, which is not "
                                     f"confirmed for driver R{ami.driver}{mounting}")


def default_ami(image: TritonRelease, gpu: Gpu, *, unverified: bool = False) -> InferenceAmi | None:
    """The newest AMI on which ``image`` runs with ``gpu`` (:func:`host_verdict` ``runs``); with
    ``unverified``, where none does, the best one nothing rules out (:attr:`HostVerdict.rank`, then
    the newest); else None."""
    floor = 0 if unverified else 2
    ranked = [(host_verdict(image, ami, gpu).rank, index, ami) for index, ami in enumerate(INFERENCE_AMIS.values())]
    best = max(ranked, key=lambda item: (item[0], item[1]))
    return best[2] if best[0] >= floor else None


def default_image(versions: tuple[str, ...], gpu: Gpu, ami: InferenceAmi | None = None, *,
                  unverified: bool = False) -> str | None:
    """The newest of ``versions`` (oldest first, as the SDK table sorts them) that runs with
    ``gpu`` on ``ami`` (on the best AMI when None); with ``unverified``, where none does, the best
    that nothing rules out (:attr:`HostVerdict.rank`, then the newest). Versions this table does not
    know are skipped."""
    floor = 0 if unverified else 2
    ranked = []
    for index, version in enumerate(versions):
        release = TRITON_RELEASES.get(version)
        if release is None:
            continue
        chosen = ami or default_ami(release, gpu, unverified=True)
        if chosen is not None:
            ranked.append((host_verdict(release, chosen, gpu).rank, index, version))
    if not ranked:
        return None
    best = max(ranked)
    return best[2] if best[0] >= floor else None
