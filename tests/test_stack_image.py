"""The image mapping, rendered from the SDK's data file, against the SDK's own ``image_uris``."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template
from cdk_helpers import ROOT  # noqa: F401  (puts the project root on sys.path)

from triton_mme_cdk.constructs.triton_image import (
    TritonImage,
    TritonImageProps,
    image_table_path,
    load_image_table,
    sdk_image_table_path,
)

#: Regions of several partitions and registries (commercial, opt-in, China where listed).
SAMPLE_REGIONS = ("us-east-1", "eu-west-1", "ap-southeast-2", "af-south-1", "il-central-1",
                  "mx-central-1", "ap-southeast-6", "cn-north-1", "cn-northwest-1")


@pytest.fixture(scope="module")
def image_uris() -> Iterator[Any]:  # sagemaker.core.image_uris (untyped)
    """The SDK's module, with its endpoint resolver built once: each ``retrieve`` builds a new
    botocore loader and parses botocore's endpoint table again (once per region and version,
    5.8 s of this file's 9). The resolver is made from that static table alone, so one for all
    answers the same."""
    from sagemaker.core import common_utils, image_uris  # ~3 s: only this test module imports the SDK

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(common_utils, "_botocore_resolver", functools.cache(common_utils._botocore_resolver))
        yield image_uris


def test_the_table_is_the_pinned_sdks_own() -> None:
    """The package synthesizes from a copy of the table the pinned sagemaker SDK ships (no SDK at
    synth); `make image-table` refreshes the copy after a new pin."""
    sdk = sdk_image_table_path()
    assert sdk is not None and sdk.parts[-4:-1] == ("sagemaker", "core", "image_uri_config")
    assert image_table_path().read_bytes() == sdk.read_bytes(), "run `make image-table` after pinning a new SDK"
    table = load_image_table()
    assert "23.12" in table.versions and "26.05" in table.versions
    assert table.versions == tuple(sorted(table.versions, key=lambda v: tuple(map(int, v.split(".")))))


@pytest.mark.parametrize("version", ["newest", "25.04", "23.12"])
def test_mapping_matches_sdk_image_uris(image_uris: Any, version: str) -> None:
    table = load_image_table()
    chosen = table.newest if version == "newest" else version
    row = table.row(chosen)
    stack = cdk.Stack(cdk.App(), "Image")
    image = TritonImage(stack, "Triton", props=TritonImageProps(version=None if version == "newest" else version))
    mapping = Template.from_stack(stack).to_json()["Mappings"]
    (rendered,) = mapping.values()
    assert sorted(rendered) == sorted(row.registries) == list(image.regions)
    for region, entry in rendered.items():
        expected = image_uris.retrieve(
            framework="sagemaker-tritonserver", region=region, version=chosen, instance_type="ml.g5.xlarge"
        )
        assert entry["ImageUri"] == expected, region
        assert entry["Account"] == expected.split(".", 1)[0]
    assert set(SAMPLE_REGIONS) & set(rendered)


def test_image_uri_and_repository_resolve_in_the_deployment_region() -> None:
    stack = cdk.Stack(cdk.App(), "Image")
    image = TritonImage(stack, "Triton")
    mapping_id = stack.resolve(stack.get_logical_id(image.mapping))
    assert stack.resolve(image.image_uri) == {"Fn::FindInMap": [mapping_id, {"Ref": "AWS::Region"}, "ImageUri"]}
    arn = stack.resolve(image.repository_arn)
    assert arn == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"}, ":ecr:", {"Ref": "AWS::Region"}, ":",
        {"Fn::FindInMap": [mapping_id, {"Ref": "AWS::Region"}, "Account"]},
        ":repository/sagemaker-tritonserver",
    ]]}
