"""Raw-text targets: the source's fast tokenizer and the exported model behind one Triton ensemble.

``tokenizer_model`` is the python-backend ``model.py`` copied into the tarball (numpy and the
vendored ``tokenizers``); ``served_tokenizer`` loads, checks and serializes the source's tokenizer
as ``AutoTokenizer`` runs it; ``serving_wheel`` pins the ``tokenizers`` wheel the tarball carries
and knows the Python of each Triton image; ``ensemble`` renders the three configs and writes the
one tarball; ``check`` replays strings through it before packaging. ``container``, ``shm`` and
``serving_wheel`` are what synth imports: nothing heavy is imported here.

Owns: the tokenizer step of a raw-text target, its ensemble tarball and the container settings it
needs (checked at synth). The pipeline runs it between the export and the gate.

May import: ``shared``, ``manifest``, ``export``, ``artifact``.
"""
