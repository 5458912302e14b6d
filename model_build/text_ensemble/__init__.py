"""Raw-text targets: a pure-Python tokenizer and the exported model behind one Triton ensemble.

``tokenizer_model`` is the python-backend ``model.py`` copied into the tarball (standard library
and numpy only, so it runs on the SageMaker Triton image's Python); ``ensemble`` renders the
three configs and writes the one tarball. Nothing heavy is imported here: synth stays light.
"""
