"""The model build: a models manifest -> Triton tarballs in S3 -> the routes a multi-model endpoint serves.

One subpackage per step of the data's path, each with a narrow interface to the next::

    manifest/       what to build (models.yaml: schema, loading, limits)
    export/         a source -> the model file Triton loads, proven against PyTorch
    artifact/       the model file -> config.pbtxt -> a reproducible tarball -> the pre-publish gate
    text_ensemble/  raw-text targets: the tokenizer step and the ensemble tarball
    pipeline/       the steps above in order, for one model; the local store of built units
    release/        what everything is called (model keys, release ids, the bucket's layout), the
                    store in S3, a release assembled from it, and its routes on the live fleet
    handler/        the Lambda entry points of the deploy (compose pipeline and release)
    tools/          what users run on their machine: smoke test, plan, local endpoint, local S3

Shared modules every unit may import, which import nothing of the package but each other:
``errors`` (typed errors), ``types`` (plain data between the steps), ``reference`` (the reference
``.npz`` format), ``compare`` (the tolerance rule), ``validation_messages`` (the wording of a
refused value) and ``aws_clients`` (the S3 client factory). ``__main__`` is the CLI front
(``python -m model_build``): it composes the units and the tools, and nothing imports it.

Each subpackage's ``__init__`` says what it owns and what it may import ("May import:");
``tests/test_layout.py`` holds every import to those lines, refuses an import cycle (lazy imports
count) and a module longer than its line budget, and checks docs/architecture.md's table against
them. A model's key hashes the code ``pipeline`` reaches (not ``handler``, nor ``release`` beyond
``identity``); the build image holds everything but ``tools`` and ``__main__``
(:func:`model_build.release.identity.runtime_files`).
"""

if __name__ == "model_build":  # the checkout's folder by its own name: `python -m` runs its CLI (triton_mme_cdk.checkout)
    from triton_mme_cdk.checkout import run_by_folder_name

    run_by_folder_name("model_build")
