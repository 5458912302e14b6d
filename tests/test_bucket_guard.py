"""Who may change what the fleet serves (issue 49, point 4): the model bucket's policy, evaluated.

moto enforces no IAM, so each request is decided by ``tests/policy_eval.py`` (explicit deny,
allow, implicit deny, the condition operators the policy uses), itself checked here against the
examples of the IAM User Guide. The policies are those of a real synthesized template: the bucket
policy, and each role's identity policies; the roles and keys get the ARNs of one account."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from cdk_helpers import as_list, policy_of_role, synth
from policy_eval import ACCOUNT, Unmodelled, arn_of, condition_holds, decide, resolve

from triton_mme_cdk import ModelSource, PropsError, TritonMultiModelEndpoint

PUBLISHER = f"arn:aws:iam::{ACCOUNT}:role/ci/model-publisher"
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/Administrator"
EVERYTHING = [{"Effect": "Allow", "Action": "*", "Resource": "*"}]
TLS = {"aws:SecureTransport": "true", "s3:TlsVersion": "1.3"}

pytestmark = pytest.mark.slow  # one real synth


# ---------------------------------------------------------------------------------------------
# The evaluator against the IAM User Guide's evaluation logic
# ---------------------------------------------------------------------------------------------


def test_an_explicit_deny_wins_and_nothing_allowed_is_an_implicit_deny() -> None:
    allow = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}
    deny = {"Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": "arn:aws:s3:::b/secret/*"}
    request = {"aws:PrincipalArn": ADMIN}
    assert decide("s3:GetObject", "arn:aws:s3:::b/x", request, identity=[allow], resource_policy=[deny]) == "Allow"
    assert decide("s3:GetObject", "arn:aws:s3:::b/secret/x", request, identity=[allow], resource_policy=[deny]) == "Deny"
    assert decide("s3:PutObject", "arn:aws:s3:::b/x", request, identity=[allow]) == "ImplicitDeny"
    # Actions match without regard to case; resources with it.
    assert decide("s3:getobject", "arn:aws:s3:::b/x", request, identity=[allow]) == "Allow"
    assert decide("s3:GetObject", "arn:aws:s3:::B/x", request, identity=[allow]) == "ImplicitDeny"
    # A resource policy naming a role's ARN applies to its sessions (aws:PrincipalArn is the role's).
    named = {**allow, "Principal": {"AWS": ADMIN}}
    assert decide("s3:GetObject", "arn:aws:s3:::b/x", request, identity=[], resource_policy=[named]) == "Allow"
    other = {"aws:PrincipalArn": PUBLISHER}
    assert decide("s3:GetObject", "arn:aws:s3:::b/x", other, identity=[], resource_policy=[named]) == "ImplicitDeny"


def test_conditions_follow_the_documented_operators() -> None:
    # "If the key that you specify in a policy condition is not present in the request context,
    # the values do not match and the condition is false. If the policy condition requires that the
    # key is not matched, such as StringNotLike or ArnNotLike, and the right key is not present,
    # the condition is true." (IAM User Guide, condition operators)
    assert condition_holds("StringEquals", "s3:x", "a", {}) is False
    assert condition_holds("StringNotEquals", "s3:x", "a", {}) is True
    assert condition_holds("ArnNotLike", "aws:PrincipalArn", ADMIN, {}) is True
    # ...IfExists: true where the key is absent, checked where present.
    assert condition_holds("StringEqualsIfExists", "s3:x", "a", {}) is True
    assert condition_holds("StringEqualsIfExists", "s3:x", "a", {"s3:x": "b"}) is False
    # Null: true holds when the key is absent, false when present.
    assert condition_holds("Null", "s3:x", "true", {}) is True
    assert condition_holds("Null", "s3:x", "false", {}) is False
    assert condition_holds("Null", "s3:x", "false", {"s3:x": "a"}) is True
    # Several values: ORed for a positive operator, ANDed for a negated one (the note on
    # negated matching operators).
    assert condition_holds("StringEquals", "s3:x", ["a", "b"], {"s3:x": "b"}) is True
    assert condition_holds("StringNotEquals", "s3:x", ["a", "b"], {"s3:x": "b"}) is False
    assert condition_holds("StringNotEquals", "s3:x", ["a", "b"], {"s3:x": "c"}) is True
    # ARN operators: each of the six parts on its own; a wildcard does not span a ':'.
    assert condition_holds("ArnLike", "aws:PrincipalArn", "arn:aws:iam::*:role/*", {"aws:PrincipalArn": PUBLISHER})
    assert not condition_holds("ArnLike", "aws:PrincipalArn", "arn:aws:iam::*", {"aws:PrincipalArn": PUBLISHER})
    assert condition_holds("ArnNotLike", "aws:PrincipalArn", [ADMIN, PUBLISHER], {"aws:PrincipalArn": PUBLISHER}) is False
    assert condition_holds("Bool", "aws:SecureTransport", "false", {"aws:SecureTransport": "false"})
    assert condition_holds("NumericLessThan", "s3:TlsVersion", 1.2, {"s3:TlsVersion": "1.1"})


@pytest.mark.parametrize("statement", [
    {"Effect": "Allow", "NotAction": "s3:*", "Resource": "*"},
    {"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": {"ForAnyValue:StringEquals": {"aws:TagKeys": "a"}}},
    {"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}},
])
def test_what_it_does_not_model_is_refused_not_guessed(statement: dict[str, Any]) -> None:
    with pytest.raises(Unmodelled):
        decide("s3:GetObject", "arn:aws:s3:::b/x", {"aws:PrincipalArn": ADMIN}, identity=[statement])


def test_an_account_principal_is_refused_not_guessed() -> None:
    # Naming an account delegates to its identity policies: the evaluator does not model it.
    account = {"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}, "Action": "s3:*",
               "Resource": "*"}
    with pytest.raises(Unmodelled):
        decide("s3:GetObject", "arn:aws:s3:::b/x", {"aws:PrincipalArn": ADMIN}, identity=[], resource_policy=[account])


# ---------------------------------------------------------------------------------------------
# The synthesized stack's bucket policy
# ---------------------------------------------------------------------------------------------


class Account:
    """The synthesized template's policies, resolved to one account's ARNs."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        resources = data["Resources"]
        self.ids = {kind: [k for k, v in resources.items() if v["Type"] == kind]
                    for kind in ("AWS::IAM::Role", "AWS::S3::Bucket", "AWS::S3::BucketPolicy", "AWS::KMS::Key")}
        self.bucket_id = next(k for k in self.ids["AWS::S3::Bucket"] if "AccessLogs" not in k)
        self.bucket_arn = arn_of(data, self.bucket_id)
        self.key_arn = arn_of(data, self.ids["AWS::KMS::Key"][0])
        (policy,) = [resources[k] for k in self.ids["AWS::S3::BucketPolicy"]
                     if resources[k]["Properties"]["Bucket"] == {"Ref": self.bucket_id}]
        self.bucket_policy = resolve(data, policy["Properties"]["PolicyDocument"]["Statement"])

    def role(self, prefix: str) -> tuple[str, list[dict[str, Any]]]:
        """The ARN and identity statements of the one role whose logical id starts with ``prefix``."""
        (logical_id,) = [k for k in self.ids["AWS::IAM::Role"] if k.startswith(prefix)]
        inline = [s for p in self.data["Resources"][logical_id]["Properties"].get("Policies", [])
                  for s in p["PolicyDocument"]["Statement"]]
        return arn_of(self.data, logical_id), resolve(self.data, policy_of_role(self.data, logical_id) + inline)

    def decide(self, principal: tuple[str, list[dict[str, Any]]] | None, action: str, key: str,
               **headers: str) -> str:
        request = {**TLS, **{f"s3:x-amz-server-side-encryption{name}": value for name, value in headers.items()}}
        identity: list[dict[str, Any]] = []
        if principal is not None:  # None: an anonymous request (no aws:PrincipalArn)
            request["aws:PrincipalArn"], identity = principal
        return decide(action, f"{self.bucket_arn}/{key}", request, identity=identity,
                      resource_policy=self.bucket_policy)


@pytest.fixture(scope="module")
def account(tmp_path_factory: pytest.TempPathFactory) -> Account:
    out = tmp_path_factory.mktemp("guard")
    data = synth(out, nag=False, bucket_removal_policy="destroy", model_publishers=[PUBLISHER]).data
    return Account(data)


SERVING_KEYS = ("models/served/bert-0123456789ab.tar.gz", "models/_routes/routes.json",
                "models/_builds/k-0123/bert.tar.gz", "models/_releases/r-0123456789abcdef/_index.json",
                "models/_plans/r-0123456789abcdef.json")
CHANGES = ("s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObjectTagging", "s3:PutObjectAcl")


@pytest.mark.parametrize("key", SERVING_KEYS)
def test_the_placing_role_writes_and_deletes_what_the_fleet_serves(account: Account, key: str) -> None:
    place = account.role("ModelBuildRole")
    # The placing role writes what the fleet serves (and a failure record under _plans/); the store is the build's.
    expected = "Allow" if key.split("/")[1] in ("served", "_routes", "_releases", "_plans") else "ImplicitDeny"
    assert account.decide(place, "s3:PutObject", key) == expected
    assert account.decide(place, "s3:PutObjectTagging", key) == "Allow"
    if key.startswith("models/served/"):
        assert account.decide(place, "s3:DeleteObjectVersion", key) == "Allow"


@pytest.mark.parametrize("key", SERVING_KEYS)
@pytest.mark.parametrize("action", CHANGES)
def test_the_build_role_that_parses_sources_writes_the_store_and_plans_only(
        account: Account, key: str, action: str) -> None:
    build = account.role("ModelBuildBuildRole")
    # Even with every S3 action added to its own policy, the bucket policy denies it what is served.
    widened = (build[0], [*build[1], {"Effect": "Allow", "Action": "s3:*", "Resource": f"{account.bucket_arn}/*"}])
    if key.split("/")[1] in ("served", "_routes", "_releases"):
        assert account.decide(widened, action, key) == "Deny", (action, key)
        assert account.decide(build, action, key) != "Allow", (action, key)
    else:
        assert account.decide(widened, action, key) == "Allow", (action, key)
        # As granted: it puts, it never deletes or tags.
        assert account.decide(build, action, key) == ("Allow" if action == "s3:PutObject" else "ImplicitDeny"), (
            action, key)


@pytest.mark.parametrize("key", SERVING_KEYS)
@pytest.mark.parametrize("action", CHANGES)
def test_no_other_principal_of_the_account_changes_it_whatever_its_own_policies_say(
        account: Account, key: str, action: str) -> None:
    execution_arn, execution = account.role("ExecutionRole")
    # The attack: one statement added to the execution role's policy.
    widened = (execution_arn, [*execution, {"Effect": "Allow", "Action": "s3:*", "Resource": f"{account.bucket_arn}/*"}])
    for principal in (widened, (ADMIN, EVERYTHING), account.role("ModelBuildProcessingRole"),
                      account.role("ModelBuildBuildStateMachineRole"), None):
        assert account.decide(principal, action, key) == "Deny", (principal and principal[0], action, key)


def test_the_execution_role_still_reads_what_it_serves_and_the_admin_the_rest(account: Account) -> None:
    execution = account.role("ExecutionRole")
    assert account.decide(execution, "s3:GetObject", SERVING_KEYS[0]) == "Allow"
    assert account.decide(execution, "s3:PutObject", SERVING_KEYS[0]) == "Deny"
    assert account.decide((ADMIN, EVERYTHING), "s3:GetObject", SERVING_KEYS[1]) == "Allow"
    # Outside the serving folders the admin's own policies decide (the bucket is the stack's).
    assert account.decide((ADMIN, EVERYTHING), "s3:PutObject", "models/notes/readme.txt") == "Allow"


@pytest.mark.parametrize("key", SERVING_KEYS)
def test_a_named_publisher_writes_it(account: Account, key: str) -> None:
    publisher = (PUBLISHER, EVERYTHING)
    assert account.decide(publisher, "s3:PutObject", key) == "Allow"
    assert account.decide(publisher, "s3:DeleteObject", key) == "Allow"
    # A publisher's own policies still have to allow it: the bucket policy grants nothing.
    assert account.decide((PUBLISHER, []), "s3:PutObject", key) == "ImplicitDeny"


def test_the_jobs_folder_is_the_build_and_processing_roles(account: Account) -> None:
    key = "models/_jobs/r-0123456789abcdef/bert/unit.tar.gz"
    assert account.decide(account.role("ModelBuildProcessingRole"), "s3:PutObject", key) == "Allow"
    assert account.decide(account.role("ModelBuildBuildRole"), "s3:PutObject", key) == "Allow"
    # The placing role is a named writer (it deletes the folder on destroy) but is granted no write there.
    assert account.decide(account.role("ModelBuildRole"), "s3:PutObject", key) == "ImplicitDeny"
    assert account.decide((ADMIN, EVERYTHING), "s3:PutObject", key) == "Deny"
    assert account.decide((PUBLISHER, EVERYTHING), "s3:PutObject", key) == "Deny"


def test_the_auto_delete_role_empties_the_bucket_on_destroy(account: Account) -> None:
    auto_delete = account.role("CustomS3AutoDeleteObjectsCustomResourceProviderRole")
    for key in (*SERVING_KEYS, "models/_jobs/r-0123456789abcdef/bert/output/unit.tar.gz"):
        assert account.decide(auto_delete, "s3:DeleteObjectVersion", key) == "Allow"
        # Not denied by the guard, but nothing allows it to write.
        assert account.decide(auto_delete, "s3:PutObject", key) == "ImplicitDeny"


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, "Allow"),  # no header: the bucket's default, the stack's key
    ({"": "aws:kms", "-aws-kms-key-id": "KEY"}, "Allow"),
    ({"": "AES256"}, "Deny"),  # SSE-S3: readable without the key
    ({"": "aws:kms:dsse", "-aws-kms-key-id": "KEY"}, "Deny"),
    ({"": "aws:kms"}, "Deny"),  # aws:kms without a key id: S3 uses aws/s3
    ({"": "aws:kms", "-aws-kms-key-id": "arn:aws:kms:us-east-1:111122223333:key/other"}, "Deny"),
    ({"-aws-kms-key-id": "arn:aws:kms:us-east-1:111122223333:key/other"}, "Deny"),
    ({"-customer-algorithm": "AES256"}, "Deny"),  # SSE-C
])
def test_a_put_asks_for_the_stacks_key_or_for_nothing(account: Account, headers: dict[str, str], expected: str) -> None:
    headers = {name: account.key_arn if value == "KEY" else value for name, value in headers.items()}
    assert account.decide(account.role("ModelBuildRole"), "s3:PutObject", SERVING_KEYS[0], **headers) == expected
    # Anywhere in the created bucket, for anyone.
    assert account.decide((ADMIN, EVERYTHING), "s3:PutObject", "elsewhere/x", **headers) == expected


def test_the_policy_names_the_writers_of_each_folder_by_their_role_arn(account: Account) -> None:
    place, build = account.role("ModelBuildRole")[0], account.role("ModelBuildBuildRole")[0]
    auto_delete = account.role("CustomS3AutoDeleteObjectsCustomResourceProviderRole")[0]
    processing = account.role("ModelBuildProcessingRole")[0]
    expected = {
        "OnlyNamedWritersChangeServing": ({place, PUBLISHER, auto_delete}, ("served", "_routes", "_releases")),
        "OnlyBuildWritesBuilds": ({place, build, PUBLISHER, auto_delete}, ("_builds", "_plans")),
        "OnlyBuildWritesJobs": ({place, build, processing, auto_delete}, ("_jobs",)),
    }
    for sid, (writers, folders) in expected.items():
        (statement,) = [s for s in account.bucket_policy if s.get("Sid", "").startswith(sid)]
        assert statement["Effect"] == "Deny" and statement["Principal"] == {"AWS": "*"}
        assert set(statement["Condition"]["ArnNotLike"]["aws:PrincipalArn"]) == writers, sid
        assert sorted(as_list(statement["Resource"])) == sorted(
            f"{account.bucket_arn}/models/{folder}/*" for folder in folders), sid


# ---------------------------------------------------------------------------------------------
# A bucket you bring; the publishers setting
# ---------------------------------------------------------------------------------------------


def _endpoint(tmp_path: Path, bucket_of: Any, publishers: Sequence[str] = (),
              **settings: Any) -> tuple[cdk.Stack, dict[str, Any]]:
    """The construct on a bucket of ``bucket_of``; each of ``publishers`` (an ARN) imported as a role."""
    app = cdk.App(outdir=str(tmp_path / "out"), analytics_reporting=False)
    stack = cdk.Stack(app, "Platform")
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    if publishers:
        settings["model_publishers"] = [iam.Role.from_role_arn(stack, f"Publisher{index}", arn)
                                        for index, arn in enumerate(publishers)]
    TritonMultiModelEndpoint(stack, "Mme", models=ModelSource.from_release("r-0123456789abcdef"),
                             bucket=bucket_of(stack, key), encryption_key=key, **settings)
    return stack, app.synth().get_stack_by_name("Platform").template


def test_your_bucket_in_this_stack_gets_the_statements_scoped_to_the_prefix(tmp_path: Path) -> None:
    stack, template = _endpoint(tmp_path, lambda stack, key: s3.Bucket(
        stack, "Theirs", encryption=s3.BucketEncryption.KMS, encryption_key=key, enforce_ssl=True),
        model_prefix="team/models", publishers=[PUBLISHER])
    account = Account(template)
    for key in ("team/models/served/a-0123456789ab.tar.gz", "team/models/_routes/routes.json"):
        assert account.decide((ADMIN, EVERYTHING), "s3:PutObject", key) == "Deny"
        assert account.decide((PUBLISHER, EVERYTHING), "s3:PutObject", key) == "Allow"
        assert account.decide((PUBLISHER, EVERYTHING), "s3:PutObject", key, **{"": "AES256"}) == "Deny"
    # The rest of the bucket stays its owner's: any encryption, any writer its policies allow.
    assert account.decide((ADMIN, EVERYTHING), "s3:PutObject", "other/x", **{"": "AES256"}) == "Allow"
    assert not [a for a in cdk.assertions.Annotations.from_stack(stack).find_warning("*", cdk.assertions.Match.any_value())
                if "bucket-policy-guard" in json.dumps(a.entry.data)]


def test_a_bucket_defined_elsewhere_gets_a_warning_with_the_statements(tmp_path: Path) -> None:
    stack, _ = _endpoint(tmp_path, lambda stack, key: s3.Bucket.from_bucket_name(stack, "Theirs", "their-models"),
                         publishers=[PUBLISHER])
    warnings = [str(a.entry.data) for a in cdk.assertions.Annotations.from_stack(stack).find_warning(
        "*", cdk.assertions.Match.any_value())]
    (guard,) = [w for w in warnings if "bucket-policy-guard" in w]
    assert "add these statements" in guard and PUBLISHER in guard and "models/served/*" in guard
    assert "DenyPutNotSseKms" in guard


def test_a_release_without_publishers_warns_that_no_one_can_publish(tmp_path: Path) -> None:
    stack, template = _endpoint(tmp_path, lambda stack, key: s3.Bucket(
        stack, "Theirs", encryption=s3.BucketEncryption.KMS, encryption_key=key))
    warnings = [str(a.entry.data) for a in cdk.assertions.Annotations.from_stack(stack).find_warning(
        "*", cdk.assertions.Match.any_value())]
    assert any("model_publishers: empty" in w for w in warnings), warnings
    account = Account(template)
    assert account.decide((PUBLISHER, EVERYTHING), "s3:PutObject", "models/_routes/routes.json") == "Deny"


@pytest.mark.parametrize("value", [
    "arn:aws:sts::111122223333:assumed-role/publisher/session",
    "arn:aws:iam::111122223333:role/*",
])
def test_a_publisher_that_is_no_role_or_user_arn_is_refused_in_one_line(tmp_path: Path, value: str) -> None:
    with pytest.raises(PropsError) as refused:
        _endpoint(tmp_path, lambda stack, key: s3.Bucket(stack, "Theirs"), publishers=[value])
    message = str(refused.value)
    assert "\n" not in message and message.startswith("model_publishers: ") and repr(value) in message


@pytest.mark.parametrize("value", [PUBLISHER, "publisher"])
def test_a_publisher_given_as_a_string_is_refused_with_how_to_pass_a_role(tmp_path: Path, value: str) -> None:
    """The construct takes roles (iam.IGrantable), not ARNs: one line saying how to import one."""
    with pytest.raises(PropsError) as refused:
        _endpoint(tmp_path, lambda stack, key: s3.Bucket(stack, "Theirs"), model_publishers=[value])
    assert str(refused.value) == (f"model_publishers: got {value!r}; expected an iam.IGrantable (a role or user): "
                                  f"pass iam.Role.from_role_arn(self, 'Publisher', {value!r})")
