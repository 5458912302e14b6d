"""The capacity tool's front, over :mod:`model_build.capacity` (the model and the simulator).

``cli`` is ``capacity`` (the fleet simulated for every candidate instance type and count) and
``report`` writes its plan (text, JSON of ``capacity.schema.json``, markdown); ``fit_check`` is
the ``--instance-type`` check of ``validate``, ``build`` and ``publish``.
"""
