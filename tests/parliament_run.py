"""Runs parliament (duo-labs' IAM policy linter) on policy documents, in the scanner environment.

``tests/test_parliament.py`` runs this file with ``.venv-checkov/bin/python``: parliament 1.6.4
imports ``pkg_resources``, which the main environment's setuptools (82 and later) no longer has;
the scanner environment pins a setuptools that has it (requirements-checkov.txt).

Input (stdin): a JSON list of ``{"id": ..., "document": {...}}``. Output (stdout): a JSON list of
``{"id", "issue", "severity", "detail"}``, one per finding, with the community auditors on.
This file imports nothing of the project.

Two adaptations, each reported rather than hidden: a number or boolean in a ``Condition`` (IAM
accepts ``"NumericLessThan": {"s3:TlsVersion": 1.2}``) is given to parliament as its string, since
parliament 1.6.4 fails on a non-string condition value; a document parliament fails on anyway is a
finding ``PARLIAMENT_FAILED`` naming the error, never a pass.
"""

from __future__ import annotations

import json
import sys
import warnings

#: The exit status when parliament is not installed in the interpreter that runs this file.
NOT_INSTALLED = 3


def _strings(value):
    if isinstance(value, dict):
        return {key: _strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_strings(item) for item in value]
    return json.dumps(value) if isinstance(value, (bool, int, float)) else value


def _conditions_as_strings(document):
    statements = document.get("Statement", [])
    for statement in statements if isinstance(statements, list) else [statements]:
        if "Condition" in statement:
            statement["Condition"] = _strings(statement["Condition"])
    return document


def main() -> int:
    warnings.simplefilter("ignore")  # pkg_resources' deprecation warning, on stderr
    try:
        from parliament import analyze_policy_string
    except ImportError as error:
        print(f"parliament cannot be imported here ({error}): `make setup` installs it in .venv-checkov "
              "(requirements-checkov.txt)", file=sys.stderr)
        return NOT_INSTALLED

    findings = []
    for item in json.load(sys.stdin):
        text = json.dumps(_conditions_as_strings(item["document"]))
        try:
            policy = analyze_policy_string(text, include_community_auditors=True)
        except Exception as error:  # reported as a finding, which no acknowledgment covers
            findings.append({"id": item["id"], "issue": "PARLIAMENT_FAILED", "severity": "CRITICAL",
                             "detail": f"{type(error).__name__}: {error}"})
            continue
        for finding in policy.findings:
            # The community auditors name their actions in the location, not the detail.
            detail = finding.detail or {"actions": sorted(finding.location.get("actions", []))}
            findings.append({
                "id": item["id"],
                "issue": finding.issue,
                "severity": finding.severity,
                "detail": detail if isinstance(detail, str) else json.dumps(detail, default=str, sort_keys=True),
            })
    json.dump(findings, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
