"""The fleet's host (issue 37): the Triton image's CUDA against the inference AMI's driver and the
instance's GPU, across the whole image table; the default AMI and image; refusals as one line at
synth; an unconfirmed pair as a synth warning; the template's InferenceAmiVersion."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, get_args

import aws_cdk as cdk
import botocore
import pytest
from aws_cdk.assertions import Annotations, Match, Template
from cdk_helpers import context  # (also puts the project root on sys.path)

from triton_mme_cdk.constructs.sagemaker_hosting import SageMakerHosting, SageMakerHostingProps
from triton_mme_cdk.constructs.sagemaker_limits import MME_GPU_INSTANCE_TYPES, InferenceAmiVersion
from triton_mme_cdk.constructs.triton_image import TritonImage, TritonImageProps, load_image_table
from triton_mme_cdk.model_build.gpu_hosts import (
    INFERENCE_AMIS,
    INSTANCE_GPUS,
    TRITON_RELEASES,
    default_ami,
    default_image,
    gpu_of,
    host_verdict,
)
from triton_mme_cdk.stacks.settings import MmeSettings, SettingsError

NEWEST_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
DOCUMENTED_AMI = "al2-ami-sagemaker-inference-gpu-2"


def settings(**values: Any) -> Any:
    return MmeSettings.from_context(context(**values))


def refusal(**values: Any) -> str:
    with pytest.raises(SettingsError) as caught:
        settings(**values)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_every_image_of_the_sdk_table_has_a_cuda_row() -> None:
    """A newer sagemaker SDK brings a new image version: its CUDA row must be added with it."""
    assert set(load_image_table().versions) <= set(TRITON_RELEASES)


def test_the_ami_table_is_the_apis_enum() -> None:
    model = Path(botocore.__file__).parent / "data" / "sagemaker" / "2017-07-24" / "service-2.json.gz"
    shapes = json.loads(gzip.decompress(model.read_bytes()))["shapes"]
    enum = shapes["ProductionVariantInferenceAmiVersion"]["enum"]
    assert sorted(INFERENCE_AMIS) == sorted(enum) == sorted(get_args(InferenceAmiVersion))
    for value, ami in INFERENCE_AMIS.items():
        if ami.accelerator == "gpu":  # the documented driver and CUDA of each value
            doc = shapes["ProductionVariant"]["members"]["InferenceAmiVersion"]["documentation"]
            section = doc[doc.index(value):]
            assert f"NVIDIA driver version: {ami.driver}" in section[:400]
            assert f"CUDA version: {ami.cuda}" in section[:400]


@pytest.mark.parametrize("instance_type", [t for t in MME_GPU_INSTANCE_TYPES if not t.startswith("ml.p2")])
def test_the_default_runs_on_every_gpu_across_the_table(instance_type: str) -> None:
    gpu = gpu_of(instance_type)
    for version in load_image_table().versions:
        release = TRITON_RELEASES[version]
        ami = default_ami(release, gpu)
        if gpu.cc_tuple < (7, 5) and version >= "25.03":
            assert ami is None  # the V100 is 7.0: the images from 25.03 on are built for 7.5 and later
            continue
        if release.cuda.startswith("13."):
            # Only driver 580 runs CUDA 13, and its AMI documents no instance type: unverified, never
            # the default; an image given gets it with a synth warning.
            assert ami is None
            fallback = default_ami(release, gpu, unverified=True)
            assert fallback is not None and fallback.value == "al2023-ami-sagemaker-inference-gpu-4-1"
            assert host_verdict(release, fallback, gpu).status == "unverified"
            continue
        # CUDA 12: driver 535 (CUDA 12.2) by minor version compatibility, on the one AMI whose
        # instance types are documented (g4dn, g5 and p3 among them).
        assert ami is not None and ami.value == DOCUMENTED_AMI and host_verdict(release, ami, gpu).runs
    host = settings(instance_type=instance_type).fleet_host()
    expected = "24.09" if instance_type.startswith("ml.p3") else "25.04"
    assert (host.image_version, host.inference_ami_version, host.verdict.status) == (expected, DOCUMENTED_AMI, "runs")
    assert host.note.startswith(f"mme:triton_image_version unset: 26.05, the newest image, does not run on the {gpu.name} "
                                f"of {instance_type}") and host.note.endswith(f"using {expected}, the newest that does")


def test_verdicts_say_why() -> None:
    a10g = INSTANCE_GPUS["ml.g5"]
    cuda13 = TRITON_RELEASES["26.05"]
    same_major = host_verdict(cuda13, INFERENCE_AMIS[NEWEST_AMI], a10g)
    assert (same_major.status, same_major.cuda_covered) == ("unverified", True)
    assert same_major.reason.endswith("CUDA minor version compatibility; but al2023-ami-sagemaker-inference-gpu-4-1 is "
                                      "not documented for ml.g5 instances (the API reference lists instance types "
                                      "for al2-ami-sagemaker-inference-gpu-2 alone)")
    newer_major = host_verdict(cuda13, INFERENCE_AMIS["al2-ami-sagemaker-inference-gpu-3-1"], a10g)
    assert (newer_major.status, newer_major.cuda_covered) == ("unverified", False)
    assert "only CUDA forward compatibility could run it" in newer_major.reason
    assert "does not mount the CUDA-compat libraries" in newer_major.reason
    mounted = host_verdict(cuda13, INFERENCE_AMIS[DOCUMENTED_AMI], a10g)
    assert mounted.status == "unverified" and "does not mount" not in mounted.reason
    cuda12 = host_verdict(TRITON_RELEASES["25.04"], INFERENCE_AMIS[DOCUMENTED_AMI], a10g)
    assert cuda12.runs and cuda12.reason == ("Triton 25.04 is CUDA 12.9.0; al2-ami-sagemaker-inference-gpu-2 has driver "
                                             "R535 (CUDA 12.2): CUDA minor version compatibility")
    on_550 = INFERENCE_AMIS["al2-ami-sagemaker-inference-gpu-3-1"]
    assert default_image(("24.05", "26.05"), a10g, on_550) is None  # nothing runs there for sure
    # Unverified allowed: the image whose CUDA the driver covers, before one that needs forward compatibility.
    assert default_image(("24.05", "26.05"), a10g, on_550, unverified=True) == "24.05"
    assert default_image(("99.01",), a10g) is None  # a version the table does not know is never chosen


@pytest.mark.parametrize(("values", "expected"), [
    ({"instance_type": "ml.p2.xlarge"},
     "mme:instance_type: got 'ml.p2.xlarge'; no Triton image of the table (23.12, 24.01, 24.03, 24.05, 24.09, "
     "25.04, 25.09, 26.05) runs on its NVIDIA K80 (compute capability 3.7): Triton 26.05 is CUDA 13.2.1; "
     "al2023-ami-sagemaker-inference-gpu-4-1 has driver R580 (CUDA 13.0), which no longer supports the NVIDIA K80 "
     "(R470 was the last branch that did); use an ml.g4dn or ml.g5 instance type"),
    ({"instance_type": "ml.p3.2xlarge", "triton_image_version": "26.05"},
     "mme:triton_image_version: got '26.05' with mme:instance_type ml.p3.2xlarge; it runs on no inference AMI "
     "there: Triton 26.05 is CUDA 13.2.1; al2023-ami-sagemaker-inference-gpu-4-1 has driver R580 (CUDA 13.0); "
     "Triton 26.05 supports compute capability 7.5 and later, and the NVIDIA V100 is 7.0: use 24.09 or older"),
    ({"inference_ami_version": "al2-ami-sagemaker-inference-neuron-2"},
     "mme:inference_ami_version: got 'al2-ami-sagemaker-inference-neuron-2'; it is the neuron AMI (Inferentia and "
     "Trainium), and ml.g5.xlarge has an NVIDIA A10G: use one of al2-ami-sagemaker-inference-gpu-2, "
     "al2-ami-sagemaker-inference-gpu-2-1, al2-ami-sagemaker-inference-gpu-3-1, "
     "al2023-ami-sagemaker-inference-gpu-4-1 or leave it unset"),
    ({"instance_type": "ml.p3.2xlarge", "triton_image_version": "25.04",
      "inference_ami_version": "al2-ami-sagemaker-inference-gpu-2"},
     "mme:inference_ami_version: got 'al2-ami-sagemaker-inference-gpu-2' with mme:triton_image_version 25.04 on "
     "ml.p3.2xlarge; Triton 25.04 is CUDA 12.9.0; al2-ami-sagemaker-inference-gpu-2 has driver R535 (CUDA 12.2); "
     "Triton 25.04 supports compute capability 7.5 and later, and the NVIDIA V100 is 7.0: choose another "
     "mme:triton_image_version or instance type"),
])
def test_pairs_known_not_to_work_fail_with_one_line(values: dict[str, str], expected: str) -> None:
    assert refusal(**values) == expected


def test_an_unknown_ami_value_is_refused_with_the_allowed_ones() -> None:
    message = refusal(inference_ami_version="al2-ami-sagemaker-inference-gpu-9")
    assert message.startswith('mme:inference_ami_version: got "al2-ami-sagemaker-inference-gpu-9"; input should be')
    assert NEWEST_AMI in message


def test_an_ami_given_picks_the_newest_image_that_runs_on_it() -> None:
    host = settings(inference_ami_version="al2-ami-sagemaker-inference-gpu-3-1").fleet_host()
    assert (host.image_version, host.verdict.status) == ("25.04", "unverified")  # -gpu-3-1 documents no instance type
    assert host.note.startswith("mme:triton_image_version unset: 26.05, the newest image, does not run on the "
                                "NVIDIA A10G of ml.g5.xlarge with mme:inference_ami_version")


def _endpoint(stack: cdk.Stack, **props: Any) -> SageMakerHosting:
    image = TritonImage(stack, "Image", props=TritonImageProps(version=props.pop("version", None),
                                                               instance_type=props.get("instance_type")))
    from aws_cdk import aws_iam as iam

    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    return SageMakerHosting(stack, "Endpoint", props=SageMakerHostingProps(
        image=image, execution_role=role, model_data_url="s3://bucket/models/", **props))


def test_the_template_sets_the_ami_and_an_unconfirmed_pair_is_a_synth_warning() -> None:
    app = cdk.App()
    stack = cdk.Stack(app, "Hosts")
    endpoint = _endpoint(stack, instance_type="ml.g4dn.xlarge")
    assert (endpoint.host.image_version, endpoint.inference_ami_version) == ("25.04", DOCUMENTED_AMI)
    Template.from_stack(stack).has_resource_properties("AWS::SageMaker::EndpointConfig", {
        "ProductionVariants": [{"InstanceType": "ml.g4dn.xlarge", "InferenceAmiVersion": DOCUMENTED_AMI}]})
    assert Annotations.from_stack(stack).find_warning("*", Match.any_value()) == []
    warned = cdk.Stack(cdk.App(), "Warned")
    _endpoint(warned, version="26.05", inference_ami_version="al2-ami-sagemaker-inference-gpu-2-1")
    messages = [str(entry.entry.data) for entry in Annotations.from_stack(warned).find_warning("*", Match.any_value())]
    assert len(messages) == 1 and "is not confirmed to work" in messages[0]
    assert "only CUDA forward compatibility could run it" in messages[0]
    Template.from_stack(warned).has_resource_properties("AWS::SageMaker::EndpointConfig", {
        "ProductionVariants": [{"InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-2-1"}]})


def _table(page: str, header: str) -> list[list[str]]:
    lines = page[page.index(header):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_the_docs_tables_are_the_codes() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "gpu-hosts.md").read_text(encoding="utf-8")
    images = _table(page, "| image | CUDA |")
    assert [row[0] for row in images] == list(TRITON_RELEASES)
    for version, cuda, driver, cc, tensorrt, _source in images:
        release = TRITON_RELEASES[version]
        assert (cuda, int(driver), cc) == (release.cuda, release.min_driver, release.min_compute_capability)
        assert tensorrt == (release.tensorrt or "unconfirmed")
    amis = _table(page, "| `inference_ami_version` | driver |")
    assert [row[0] for row in amis] == list(INFERENCE_AMIS)
    for value, driver, cuda, mounted, _source in amis:
        ami = INFERENCE_AMIS[value]
        if ami.accelerator == "gpu":
            assert (int(driver), cuda, mounted) == (ami.driver, ami.cuda, "yes" if ami.compat_mounting else "no")
    gpus = _table(page, "| instance family | GPU |")
    assert {row[0]: (row[1], row[2]) for row in gpus} == {
        family: (gpu.name, gpu.compute_capability) for family, gpu in INSTANCE_GPUS.items()}


def test_the_instance_table_of_the_page_is_the_codes() -> None:
    from triton_mme_cdk.model_build.gpu_hosts import INSTANCE_TYPES

    page = (Path(__file__).resolve().parents[1] / "docs" / "gpu-hosts.md").read_text(encoding="utf-8")
    rows = _table(page, "| instance type | GPU | GPU memory (GiB) |")
    assert [row[0] for row in rows] == list(INSTANCE_TYPES)
    for name, gpu, memory, vcpus, host, disk, kind in rows:
        row = INSTANCE_TYPES[name]
        assert gpu == f"{row.gpu_count} x {row.gpu.name}"
        assert memory == f"{row.gpu_memory_gib:g}" + (" (unconfirmed)" if "gpu_memory" in row.unconfirmed else "")
        assert (int(vcpus), float(host), int(disk)) == (row.vcpus, row.memory_gib, row.disk_gb)
        assert kind.startswith("NVMe" if row.disk_kind == "nvme" else "EBS")
