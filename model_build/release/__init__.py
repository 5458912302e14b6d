"""Release: built models -> the bucket the endpoint serves from, and which of them it serves.

- ``identity``: what everything is called: each model's key (the entry, the runtime code, the
  libraries), the release id, the bucket's layout (``_builds/<key>/``, ``served/<target>-<sha12>``,
  ``_releases/<id>/_index.json``, ``_routes/routes.json``; a target's served name is the routes
  format's, :func:`triton_mme_client.routes.served_name`) and the runtime files the keys hash;
- ``transfer``: S3 uploads and server-side copies with checksums and the skip rule;
- ``index``: the release index and the routes document, written and read;
- ``publish``: a set of artifacts under one prefix (each tarball once, index last), and retiring,
  deleting, downloading such a prefix;
- ``store``: the content-addressed store of built models and a release assembled from it;
- ``routes``: the routes document (its format imported from the client distribution,
  ``triton_mme_client.routes``) and the model plan of a change (``python -m model_build plan``);
- ``documents``: a JSON document with a schema, read and checked (the index, the deployed record);
- ``deployed``: the deployed record the routes carry (the fleet's and the data's resources as the
  template renders them), and how two templates are made comparable;
- ``serving``: routing a release on the live fleet, retention, destroy, legacy prefixes;
- ``invariants``: what must hold of a served bucket (every routed target served with its digest's
  bytes, nothing retained deleted, the routes matching an index that exists), written once for the
  fault tests and ``doctor``; ``doctor``: those checks on a live bucket, reported and repaired.

Owns: everything that is in S3 after a build. It never builds: the store's units come from
:mod:`model_build.pipeline`, which imports ``identity`` alone (the store's layout and the key of
a unit). The names of ``identity`` are re-exported here and nothing else: importing this package
must not add the release code to the model part of a key (``runtime_files(MODEL_ENTRY_MODULES)``),
and the S3 modules import boto3; callers import the other modules by name.

May import: ``shared``, ``manifest``.
"""

from triton_mme_cdk.model_build.release.identity import (
    BUILDS_DIR,
    BYTE_LIBRARIES,
    DEFAULT_COMPRESSLEVEL,
    INDEX_NAME,
    PACKAGE_DIR,
    REFERENCE_DIR,
    RELEASES_DIR,
    SERVED_DIR,
    Release,
    build_code_sha256,
    compute_release,
    entry_model_key,
    entry_sha256,
    library_versions,
    model_code_sha256,
    model_key,
    routes_key,
    runtime_files,
    served_prefix,
    store_prefix,
)

__all__ = [
    "BUILDS_DIR",
    "BYTE_LIBRARIES",
    "DEFAULT_COMPRESSLEVEL",
    "INDEX_NAME",
    "PACKAGE_DIR",
    "REFERENCE_DIR",
    "RELEASES_DIR",
    "SERVED_DIR",
    "Release",
    "build_code_sha256",
    "compute_release",
    "entry_model_key",
    "entry_sha256",
    "library_versions",
    "model_code_sha256",
    "model_key",
    "routes_key",
    "runtime_files",
    "served_prefix",
    "store_prefix",
]
