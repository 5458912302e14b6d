"""The change review: ``plan``, ``releases``, the pull request's gate and the pipeline's plan step.

``plan_cli`` is the front (``plan``, ``releases``); ``plan_verdict`` judges a template change with
the CDK's diff engine (``cfn_diff.js``, run on Node.js); ``plan_security``, ``plan_access`` and
``plan_headline`` say who can do what after the change; ``plan_capacity`` is the capacity line;
``plan_report`` writes the plan (text, JSON of ``plan.schema.json``, markdown) and its digest.
``pr_comment``, ``pr_fetch`` and ``pr_gate`` are the pull request's side over ``github_api``;
``pipeline_plan`` is the delivery pipeline's plan step.
"""
