"""Tools users run on their own machine: the local endpoint (and its Triton backends).

Nothing here is part of the build runtime: the release and model keys do not hash this folder and
the Lambda image does not need it, so editing a tool never rebuilds or republishes a model.
"""
