"""The settings of the opt-in delivery pipeline: ``mme:pipeline``, one JSON object in ``cdk.json``
(or ``-c mme:pipeline='{...}'``). Without it the app is the endpoint stack alone, as before.

    "mme:pipeline": {
      "account": "111111111111", "region": "us-east-1",
      "source": {"kind": "codestar", "connection_arn": "arn:aws:codeconnections:...",
                 "repository": "my-org/triton-models", "branch": "main"},
      "approval_topic_arn": "arn:aws:sns:us-east-1:111111111111:model-approvals",
      "stages": [
        {"name": "staging", "account": "222222222222", "region": "us-east-1",
         "settings": {"instance_type": "ml.g4dn.xlarge", "max_instance_count": 1}},
        {"name": "prod", "account": "333333333333", "region": "us-east-1", "require_approval": "always"}
      ]
    }

Each stage deploys the endpoint stack with the app's settings, overridden by its own
``settings`` (the same keys as ``mme:<key>``, checked the same way). A stage's
``require_approval`` is ``when-needed`` (the default: a person approves when the plan would exit
4) or ``always`` (a person approves every deploy of that stage). Every refusal is one line
naming the setting (``mme:pipeline.stages[1].account: ...``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from triton_mme_cdk.stacks.settings import SettingsError

ACCOUNT = r"^[0-9]{12}$"
REGION = r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-[0-9]$"
#: A CodeStar / CodeConnections connection (both ARN forms are current).
CONNECTION_ARN = (r"^arn:aws[a-z-]*:(codestar-connections|codeconnections):[a-z0-9-]+:[0-9]{12}:"
                  r"connection/[0-9a-f-]{36}$")
SNS_ARN = r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}$"
#: A stage name becomes part of CodePipeline stage names and of IAM role names.
STAGE_NAME = r"^[a-z][a-z0-9-]{0,19}$"
SETTING_KEY = "mme:pipeline"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PipelineSource(_Strict):
    """Where the pipeline takes the repository from."""

    kind: Literal["codestar", "codecommit"]
    #: ``owner/name`` for a CodeStar connection (GitHub, GitLab, Bitbucket); the name for CodeCommit.
    repository: str = Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$", max_length=200)
    branch: str = Field(default="main", pattern=r"^[^\s~^:?*\[\\]{1,255}$")
    connection_arn: str | None = Field(default=None, pattern=CONNECTION_ARN)

    @model_validator(mode="after")
    def _connection(self) -> PipelineSource:
        if self.kind == "codestar" and self.connection_arn is None:
            raise ValueError("connection_arn: missing; a codestar source needs the connection's ARN")
        if self.kind == "codestar" and "/" not in self.repository:
            raise ValueError(f"repository: got {self.repository!r}; a codestar source is 'owner/name'")
        if self.kind == "codecommit" and self.connection_arn is not None:
            raise ValueError("connection_arn: given for a codecommit source; it is for kind codestar only")
        return self


class PipelineStage(_Strict):
    """One target: its name, account and region, and the settings it overrides."""

    name: str = Field(pattern=STAGE_NAME)
    account: str = Field(pattern=ACCOUNT)
    region: str = Field(pattern=REGION)
    #: ``mme:<key>`` settings for this stage only (the keys without ``mme:``).
    settings: dict[str, Any] = Field(default_factory=dict)
    #: ``when-needed``: the approval is entered when the plan would exit 4 (data at risk, the fleet
    #: replaced or unknown, access widened); ``always``: for every deploy of this stage.
    require_approval: Literal["when-needed", "always"] = "when-needed"


class PipelineSettings(_Strict):
    """The pipeline: where it runs, its source, who is told of an approval, its stages in order."""

    account: str = Field(pattern=ACCOUNT)
    region: str = Field(pattern=REGION)
    source: PipelineSource
    stages: list[PipelineStage] = Field(min_length=1, max_length=10)
    approval_topic_arn: str | None = Field(default=None, pattern=SNS_ARN)

    @model_validator(mode="after")
    def _unique(self) -> PipelineSettings:
        names = [stage.name for stage in self.stages]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"stages: the name {repeated[0]!r} is given twice; each stage needs its own name")
        return self


def pipeline_settings(value: Any) -> PipelineSettings:
    """``mme:pipeline`` as given (an object, or its JSON as a string); one line naming the field."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise SettingsError(f"{SETTING_KEY}: not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{SETTING_KEY}: got {type(value).__name__}; expected an object (docs/pipelines.md)")
    try:
        return PipelineSettings.model_validate(value)
    except ValidationError as error:
        first = error.errors()[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
        given = first.get("input")
        message = str(first["msg"]).removeprefix("Value error, ")
        named = re.match(r"^([a-z_]+): (.*)$", message) if first["type"] == "value_error" else None
        if named:  # a rule between fields names its field first
            where, message = f"{where}.{named.group(1)}", named.group(2)
        shown = f"got {given!r}; " if first["type"] != "missing" and not isinstance(given, dict) else ""
        raise SettingsError(f"{SETTING_KEY}{where}: {shown}{message}") from None
