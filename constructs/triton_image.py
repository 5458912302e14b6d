"""The SageMaker Triton inference image, resolved per region by a CloudFormation mapping.

The image URIs come from the table the sagemaker SDK ships
(``sagemaker/core/image_uri_config/sagemaker-tritonserver.json``), as a copy of the pinned SDK's
file beside this module (``make image-table`` refreshes it; ``tests/test_stack_image.py`` checks
it is the installed SDK's): a synth needs neither the SDK (sagemaker-core brings pandas, scipy and
more) nor its import time. The whole table of
one version becomes a ``CfnMapping`` keyed by region, so one template deploys in every region the
SDK lists, and the ECR repository ARN the execution role may pull from comes from the same row.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Self

from aws_cdk import Aws, CfnMapping, Stack, Token
from aws_cdk import aws_iam as iam
from pydantic import AfterValidator, Field, model_validator

from constructs import Construct
from triton_mme_cdk.constructs.nag_acknowledgments import acknowledge_wildcard_resource
from triton_mme_cdk.constructs.props import Namer, Props, is_unresolved
from triton_mme_cdk.constructs.sagemaker_limits import InferenceAmiVersion, InstanceType, PropsError
from triton_mme_cdk.model_build.gpu_hosts import (
    INFERENCE_AMIS,
    TRITON_RELEASES,
    HostVerdict,
    default_ami,
    default_image,
    gpu_of,
    host_verdict,
)

FRAMEWORK = "sagemaker-tritonserver"
_TABLE_PARTS = ("core", "image_uri_config", f"{FRAMEWORK}.json")
#: DNS suffix of ECR per partition (region prefix); the commercial partition is the fallback.
_DNS_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("cn-", "amazonaws.com.cn"),
    ("us-isob-", "sc2s.sgov.gov"),
    ("us-iso-", "c2s.ic.gov"),
)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def ecr_dns_suffix(region: str) -> str:
    for prefix, suffix in _DNS_SUFFIXES:
        if region.startswith(prefix):
            return suffix
    return "amazonaws.com"


@dataclass(frozen=True)
class ImageVersion:
    """One version row of the SDK table."""

    version: str
    repository: str
    tag: str
    #: Account that owns the repository, by region.
    registries: dict[str, str]

    def image_uri(self, region: str) -> str:
        account = self.registries[region]
        return f"{account}.dkr.ecr.{region}.{ecr_dns_suffix(region)}/{self.repository}:{self.tag}"

    def check_region(self, region: str, name: str = "region") -> None:
        """Raise :class:`PropsError` unless the image is published in ``region`` (tokens pass)."""
        if not Token.is_unresolved(region) and region not in self.registries:
            raise PropsError(
                f"{name}: got {region!r}; the Triton image {self.version} is published in "
                + ", ".join(self.registries)
            )


@dataclass(frozen=True)
class ImageTable:
    """The Triton rows of the sagemaker SDK's image URI table."""

    path: Path
    rows: dict[str, ImageVersion]

    @property
    def versions(self) -> tuple[str, ...]:
        """Every version, oldest first."""
        return tuple(sorted(self.rows, key=_version_key))

    @property
    def newest(self) -> str:
        return self.versions[-1]

    def row(self, version: str | None = None) -> ImageVersion:
        """The row of ``version`` (default: the newest); raises ``ValueError``."""
        chosen = version or self.newest
        if chosen not in self.rows:
            raise ValueError(f"got {chosen!r}; the sagemaker SDK's {FRAMEWORK} table has " + ", ".join(self.versions))
        return self.rows[chosen]


#: The copy of the SDK's table this package synthesizes from.
IMAGE_TABLE = Path(__file__).with_name(f"{FRAMEWORK}.json")


def image_table_path() -> Path:
    """The table this package synthesizes from (a copy of the pinned SDK's)."""
    return IMAGE_TABLE


def sdk_image_table_path() -> Path | None:
    """The table in the installed sagemaker SDK, found without importing the package; None
    where the SDK is not installed (it is not needed to synthesize)."""
    spec = importlib.util.find_spec("sagemaker")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location).joinpath(*_TABLE_PARTS)
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=1)
def load_image_table(path: Path | None = None) -> ImageTable:
    """Read and check the SDK table (cached: it does not change during a synth)."""
    source = path or image_table_path()
    data = json.loads(source.read_text(encoding="utf-8"))
    rows: dict[str, ImageVersion] = {}
    for version, row in data.get("versions", {}).items():
        registries = row.get("registries") or {}
        repository = row.get("repository")
        if not registries or not repository:
            continue
        rows[version] = ImageVersion(
            version=version,
            repository=repository,
            tag=row.get("tag_prefix", version),
            registries=dict(sorted(registries.items())),
        )
    if not rows:
        raise PropsError(f"triton image: no usable version in {source}")
    return ImageTable(path=source, rows=rows)


@dataclass(frozen=True)
class FleetHost:
    """The image and inference AMI a fleet runs, as :func:`resolve_host` chose or checked them."""

    image_version: str
    inference_ami_version: str
    #: ``None`` where the image is not in model_build/gpu_hosts.py's CUDA table (unknown).
    verdict: HostVerdict | None
    #: What was chosen instead of the default and why ('' when nothing was), for synth to say.
    note: str = ""


def _names(setting: str) -> str:
    return setting


def resolve_host(
    versions: tuple[str, ...], *, version: str | None, instance_type: str, ami: str | None, name: Namer = _names
) -> FleetHost:
    """The Triton image and the inference AMI of a fleet of ``instance_type``, checked together.

    An unset ``version`` is the newest of ``versions`` that runs on the instance's GPU (with ``ami``
    when given); an unset ``ami`` the newest AMI whose driver runs the image
    (:func:`model_build.gpu_hosts.default_ami`). A pair known not to work raises
    :class:`PropsError` naming the image, its CUDA and the AMI's driver (or the GPU's compute
    capability); a pair nothing confirms comes back with an ``unverified`` verdict for synth to warn
    about. ``name`` shows a setting (``triton_image_version``, ``instance_type``,
    ``inference_ami_version``) as the caller's field."""
    gpu = gpu_of(instance_type)
    given = INFERENCE_AMIS[ami] if ami is not None else None
    if given is not None and given.accelerator != "gpu":
        raise PropsError(
            f"{name('inference_ami_version')}: got {ami!r}; it is the {given.accelerator} AMI (Inferentia and "
            f"Trainium), and {instance_type} has an {gpu.name}: use one of "
            + ", ".join(value for value, each in INFERENCE_AMIS.items() if each.accelerator == "gpu")
            + " or leave it unset"
        )
    on_ami = f" with {name('inference_ami_version')} {ami}" if ami else ""
    note = ""
    if version is None:
        chosen = default_image(versions, gpu, given, unverified=True)
        newest = TRITON_RELEASES.get(versions[-1])
        why = (host_verdict(newest, given or INFERENCE_AMIS[_newest_gpu_ami()], gpu).reason if newest
               else f"{versions[-1]} is not in the CUDA table")
        if chosen is None:
            raise PropsError(
                f"{name('instance_type')}: got {instance_type!r}{on_ami}; no Triton image of the table "
                f"({', '.join(versions)}) runs on its {gpu.name} (compute capability {gpu.compute_capability}): "
                f"{why}; use an ml.g4dn or ml.g5 instance type"
            )
        if chosen != versions[-1]:
            note = (f"{name('triton_image_version')} unset: {versions[-1]}, the newest image, does not run on the "
                    f"{gpu.name} of {instance_type}{on_ami} ({why}); using {chosen}, the newest that does")
        version = chosen
    release = TRITON_RELEASES.get(version)
    if release is None:
        if given is None:
            raise PropsError(
                f"{name('triton_image_version')}: got {version!r}, which the CUDA table "
                f"(model_build/gpu_hosts.py) does not list ({', '.join(TRITON_RELEASES)}); which driver it needs "
                f"is unknown: add its row from NVIDIA's release notes, or set {name('inference_ami_version')}"
            )
        return FleetHost(version, given.value, None, note)
    if given is None:
        best = default_ami(release, gpu, unverified=True)  # an image given: unverified is a warning, not a refusal
        if best is None:
            reason = host_verdict(release, INFERENCE_AMIS[_newest_gpu_ami()], gpu).reason
            runs = default_image(versions, gpu)
            fix = f"use {runs} or older" if runs else "use an ml.g4dn or ml.g5 instance type"
            raise PropsError(
                f"{name('triton_image_version')}: got {version!r} with {name('instance_type')} {instance_type}; "
                f"it runs on no inference AMI there: {reason}: {fix}"
            )
        return FleetHost(version, best.value, host_verdict(release, best, gpu), note)
    verdict = host_verdict(release, given, gpu)
    if verdict.status == "fails":
        best = default_ami(release, gpu)
        fix = (f"use {name('inference_ami_version')} {best.value} or leave it unset" if best
               else f"choose another {name('triton_image_version')} or instance type")
        raise PropsError(
            f"{name('inference_ami_version')}: got {ami!r} with {name('triton_image_version')} {version} on "
            f"{instance_type}; {verdict.reason}: {fix}"
        )
    return FleetHost(version, given.value, verdict, note)


def _newest_gpu_ami() -> str:
    return [value for value, ami in INFERENCE_AMIS.items() if ami.accelerator == "gpu"][-1]


def _version(version: str) -> str:
    load_image_table().row(version)
    return version


#: A sagemaker-tritonserver version of the image table (a props field type).
TritonVersion = Annotated[str, AfterValidator(_version)]


class TritonImageProps(Props):
    """Props of :class:`TritonImage`."""

    version: TritonVersion | None = Field(
        default=None,
        description="Version of the sagemaker-tritonserver image (e.g. 25.09), checked against the "
        "sagemaker SDK's image table; unset: the newest version in that table that runs on the fleet's "
        "GPU (instance_type) with its inference AMI (model_build/gpu_hosts.py).",
    )
    instance_type: InstanceType | None = Field(
        default=None,
        description="The fleet's instance type, whose GPU an unset version must run on; unset: no GPU "
        "is assumed (the newest version).",
    )
    inference_ami_version: InferenceAmiVersion | None = Field(
        default=None,
        description="The fleet's inference AMI, whose driver an unset version must run on; unset: any "
        "of them.",
    )

    @model_validator(mode="after")
    def _known_version(self) -> Self:
        if is_unresolved(self.version):
            raise PropsError("version: got a token; the version picks a row of the image table at synth: give it as text")
        return self


class TritonImage(Construct):
    """The ``sagemaker-tritonserver`` image of one version, for whatever region the stack is in.

    Renders a ``CfnMapping`` with one entry per region the SDK lists for the version (the image URI
    and the account of its registry); ``image_uri`` and ``repository_arn`` look the deployment
    region up in it. A deployment to a region the table does not list fails at the mapping lookup;
    a stack whose region is known refuses one the table does not list.
    """

    def __init__(self, scope: Construct, id: str, *, props: TritonImageProps | None = None) -> None:
        super().__init__(scope, id)
        props = props or TritonImageProps()
        table = load_image_table()
        #: The image and AMI the fleet's GPU needs (None without an instance type).
        self.host: FleetHost | None = None
        version = props.version
        if props.instance_type is not None:
            self.host = resolve_host(table.versions, version=props.version, instance_type=props.instance_type,
                                     ami=props.inference_ami_version)
            version = self.host.image_version
        row = table.row(version)
        row.check_region(Stack.of(self).region)
        #: The Triton version (``26.05``...).
        self.version: str = row.version
        #: ECR repository name (``sagemaker-tritonserver``).
        self.repository_name: str = row.repository
        #: Regions the mapping covers.
        self.regions: tuple[str, ...] = tuple(row.registries)
        #: The mapping's content: region -> image URI and registry account.
        self.mapping_values: dict[str, dict[str, str]] = {
            name: {"Account": account, "ImageUri": row.image_uri(name)} for name, account in row.registries.items()
        }
        self.mapping = CfnMapping(self, "Resource", mapping=self.mapping_values)
        #: The image URI in the deployment region (a ``Fn::FindInMap`` token).
        self.image_uri: str = self.mapping.find_in_map(Aws.REGION, "ImageUri")
        #: ARN of the ECR repository that holds the image in the deployment region.
        self.repository_arn: str = Stack.of(self).format_arn(
            service="ecr",
            account=self.mapping.find_in_map(Aws.REGION, "Account"),
            resource="repository",
            resource_name=row.repository,
        )

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` pull the image.

        ``ecr:BatchGetImage``, ``ecr:GetDownloadUrlForLayer`` and
        ``ecr:BatchCheckLayerAvailability`` on the image's repository, and
        ``ecr:GetAuthorizationToken``, which has no resource-level permissions (resource ``*``).
        """
        layers = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
            resource_arns=[self.repository_arn],
        )
        token = iam.Grant.add_to_principal(
            grantee=grantee, actions=["ecr:GetAuthorizationToken"], resource_arns=["*"]
        )
        principal = grantee.grant_principal
        if isinstance(principal, Construct):
            acknowledge_wildcard_resource(
                principal,
                "*",
                "ecr:GetAuthorizationToken supports no resource-level permissions (its resource "
                "must be '*'); image layers are pulled from the Triton repository ARN only.",
            )
        return layers.combine(token)
