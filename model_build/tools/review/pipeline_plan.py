"""The delivery pipeline's plan step: ``python -m model_build.tools.review.pipeline_plan STACK [-c mme:k=v ...]``.

It plans one stage: the stage's template from the synthesized cloud assembly (``cdk.out``)
against the stage's live routes (the bucket named by the stack's ``ModelBucketName`` output) and
its deployed template, with ``python -m model_build plan``. It writes ``plan/plan.md`` and
``plan/plan.json`` (the step's output, kept by the pipeline), prints the markdown (so the build's
log, which the approval links, shows it) and writes ``plan/verdict.env``, which the buildspec
sources so that CodeBuild exports ``PLAN_VERDICT``, ``PLAN_APPROVAL`` and ``PLAN_BUILD_URL``.
``PLAN_APPROVAL`` is ``false`` for the verdicts ``plan --detailed-exitcode`` exits 0 or 3 with
(no change, models only, the fleet updated in place or created, a security change that only
narrows access) and ``true`` for those it exits 4 with (data at risk, the fleet replaced or
unknown, a security change that widens access or cannot be classified), and for any verdict this
module does not know. ``--require-approval always`` (the stage's ``require_approval`` setting)
makes it ``true`` whatever the verdict: a person approves every deploy of that stage.

``--access-stack NAME`` (the stage's stack of read-only roles, deployed with the endpoint stack
after the approval) compares that stack's new template with its deployed one: any change of
those roles, or a deployed template that cannot be read, asks a person (``PLAN_APPROVAL`` true;
a verdict that needs nobody becomes ``security-changed``). Where the step could not assume its
read-only role (``PLAN_NO_ACCESS`` names it: the access stack is not deployed yet, or was
removed), nothing of the stage is read, with no other credentials: the verdict is
``security-changed`` and a person is asked.

A stack that does not exist yet is a first deploy: verdict ``security-changed`` (it creates every
role, policy and key of the stack, which ``plan`` itself judges as access widened, exit 4), so a
person is asked. A plan that fails (exit 1: no credentials, a routes document of another
stack...) fails the step with its error line: the pipeline stops before the approval and the deploy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Verdicts that need nobody (the approval stage is skipped): plan's exits 0 and 3. Any other
#: verdict (data-at-risk, fleet-replaced, fleet-unknown: exit 4; security-changed unless it
#: exits 3, access narrowed only; or one this module does not know) asks a person.
NO_APPROVAL = ("no-change", "models-only", "fleet-updated", "fleet-created")
#: The stage setting ``require_approval``: ``when-needed`` (the plan decides) or ``always``.
REQUIRE_APPROVAL = ("when-needed", "always")


def needs_approval(report: dict[str, Any], require: str = "when-needed") -> bool:
    """Whether a person approves this deploy: always with ``require="always"``; else when the plan
    would exit 4 (a security change that only narrows, exit 3, needs nobody)."""
    if require == "always":
        return True
    verdict = str(report.get("verdict"))
    if verdict == "security-changed":
        return report.get("exit_code") != 3
    return verdict not in NO_APPROVAL


def find_template(cdk_out: Path, stack: str) -> Path:
    """The template of the stack named ``stack`` in a cloud assembly (nested stage assemblies too)."""
    for manifest in sorted(cdk_out.rglob("manifest.json")):
        artifacts = json.loads(manifest.read_text(encoding="utf-8")).get("artifacts", {})
        for artifact in artifacts.values():
            properties = artifact.get("properties", {})
            if artifact.get("type") == "aws:cloudformation:stack" and properties.get("stackName") == stack:
                return manifest.parent / properties["templateFile"]
    raise SystemExit(f"error: no stack named {stack!r} in the cloud assembly {cdk_out}")


def stack_bucket(stack: str) -> str | None:
    """The stack's ``ModelBucketName`` output; None when the stack does not exist (a first deploy)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        described = boto3.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0]
    except ClientError as error:
        if "does not exist" in str(error):
            return None
        raise SystemExit(f"error: describe-stacks {stack}: {error}") from None
    except BotoCoreError as error:
        raise SystemExit(f"error: describe-stacks {stack}: {error}") from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    if "ModelBucketName" not in outputs:
        raise SystemExit(f"error: stack {stack} has no ModelBucketName output; is it the endpoint stack?")
    return outputs["ModelBucketName"]


def access_change(cdk_out: Path, access_stack: str) -> str | None:
    """What changes in the access stack's roles (None: nothing); a template that cannot be read
    is a change a person looks at."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    new = json.loads(find_template(cdk_out, access_stack).read_text(encoding="utf-8"))
    try:
        body = boto3.client("cloudformation").get_template(StackName=access_stack, TemplateStage="Original")["TemplateBody"]
        old = json.loads(body) if isinstance(body, str) else body
    except (ClientError, BotoCoreError, ValueError) as error:
        return f"the deployed template of {access_stack} cannot be read ({str(error)[:200]})"
    a, b = new.get("Resources", {}), old.get("Resources", {})
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return f"the read-only roles of {access_stack} change: {', '.join(changed)}" if changed else None


def run(stack: str, context: Sequence[str], cdk_out: Path, out: Path,
        require_approval: str = "when-needed", access_stack: str | None = None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    template = find_template(cdk_out, stack)
    if access_stack is not None:
        find_template(cdk_out, access_stack)  # a missing stack is an error before any AWS call
    no_access = os.environ.get("PLAN_NO_ACCESS")
    bucket = None if no_access else stack_bucket(stack)
    report: dict[str, Any]
    if no_access:
        report = {"verdict": "security-changed", "exit_code": 4, "stack": stack,
                  "summary": f"the plan's read-only role {no_access} cannot be assumed: nothing of the stage can be "
                             "read (a first deploy of its access stack, or the stack was removed); a person decides"}
        (out / "plan.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        (out / "plan.md").write_text(f"## {stack}: cannot be read\n\n{report['summary']}.\n", encoding="utf-8")
    elif bucket is None:
        report = {"verdict": "security-changed", "exit_code": 4, "stack": stack,
                                  "summary": f"stack {stack} does not exist yet: a first deploy creates the fleet and "
                                             "every role, policy and key of the stack (access widens)"}
        (out / "plan.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        (out / "plan.md").write_text(f"## {stack}: first deploy\n\n{report['summary']}.\n", encoding="utf-8")
    else:
        flags = [part for item in context for part in ("-c", item)]
        # The package by its installed name, without the working folder on the path (-P): the step
        # runs in the commit's folder, and the commit's own model_build is not the judge.
        command = [sys.executable, "-P", "-m", "triton_mme_cdk.model_build", "plan", "--bucket", bucket, "--stack-name", stack,
                   "--template", str(template), *flags, "--markdown-file", str(out / "plan.md"),
                   "--json-file", str(out / "plan.json"), "--detailed-exitcode"]
        done = subprocess.run(command, check=False)
        if done.returncode not in (0, 3, 4):
            raise SystemExit(done.returncode)  # plan printed its one error line
        report = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    change = access_change(cdk_out, access_stack) if access_stack is not None and not no_access else None
    if change is not None:
        report["access_stack"] = change
        if not needs_approval(report):
            report["verdict"], report["exit_code"] = "security-changed", 4
        (out / "plan.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        with (out / "plan.md").open("a", encoding="utf-8") as md:
            md.write(f"\n**Access stack**: {change} (a person approves).\n")
    verdict = str(report["verdict"])
    approval = needs_approval(report, require_approval)
    variables = {"PLAN_VERDICT": verdict, "PLAN_APPROVAL": "true" if approval else "false",
                 "PLAN_BUILD_URL": os.environ.get("CODEBUILD_BUILD_URL", "")}
    (out / "verdict.env").write_text("".join(f"{k}={json.dumps(v)}\n" for k, v in variables.items()), encoding="utf-8")
    print((out / "plan.md").read_text(encoding="utf-8"))
    print(" ".join(f"{k}={v}" for k, v in variables.items()))
    return variables


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_build.tools.review.pipeline_plan", description=__doc__.split("\n\n")[1])
    parser.add_argument("stack", help="the stage's endpoint stack name")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="mme:KEY=VALUE",
                        help="the stage's settings, as cdk synth takes them")
    parser.add_argument("--cdk-out", type=Path, default=Path("cdk.out"), help="the cloud assembly (default cdk.out)")
    parser.add_argument("--out", type=Path, default=Path("plan"), help="where plan.md, plan.json, verdict.env go")
    parser.add_argument("--require-approval", choices=REQUIRE_APPROVAL, default="when-needed",
                        help="always: a person approves every deploy of the stage, whatever the verdict "
                             "(default when-needed: when plan would exit 4)")
    parser.add_argument("--access-stack", metavar="NAME",
                        help="the stage's stack of read-only roles: any change of it asks a person")
    args = parser.parse_args(argv)
    run(args.stack, args.context, args.cdk_out, args.out, args.require_approval, args.access_stack)
    return 0


if __name__ == "__main__":
    sys.exit(main())
