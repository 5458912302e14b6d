"""Capacity: will the models fit the fleet, and how many instances keep them warm.

- ``footprint``: each model's footprint (weights, estimated GPU memory when loaded, host memory,
  disk, load time), recorded by the build in the release index; every coefficient names its source
  and every estimate is labelled as one;
- ``sizing``: footprints before a build, from the sources (local files, a synthetic config's
  parameter count, the hub cache), for synth and ``validate``;
- ``fit``: the checks at synth, ``validate --instance-type`` and build: a model larger than the
  fleet's usable GPU memory is refused, a served set larger than the instance's disk warns;
- ``simulate``: the fleet as caches (GPU memory and disk per instance, LRU eviction, SageMaker's
  routing with spill) under a request stream, for ``python -m model_build capacity`` and the
  capacity line of ``plan``; ``traffic`` (the profile and its seeded requests), ``prices`` (the
  user's price table), ``fleet`` (the candidate search and the target), ``inputs`` (footprints
  and service times as the simulator takes them, the instance shapes). None of these is imported
  by the build, so editing them changes no model key.

Standard library only where synth imports it (``footprint``, ``fit``): the CDK app checks fit
without torch, onnx or transformers.

Owns: what the fleet needs of each model and whether the models fit it: footprints and their
coefficients, the fit checks, the fleet simulation. The instance table is ``gpu_hosts``'s (shared);
this unit never builds or publishes: the build measures and calls it, and the release index
carries the footprints it records.

May import: ``shared``, ``manifest``.
"""
