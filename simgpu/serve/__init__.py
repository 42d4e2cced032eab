"""Serving: a request-level simulation of LLM (and DLRM) inference on simulated deployments.

``python -m simgpu.serve serving.yaml``: requests arrive (:mod:`.requests`), a scheduler forms each
replica's batches (:mod:`.scheduler`) within its KV cache (:mod:`.kv`), the event loop
(:mod:`.loop`) advances each replica by its batch's time from the inference timer and sends KV
caches between disaggregated pools over the topology; :mod:`.metrics` and :mod:`.outputs` give the
figures and files. :mod:`.spec` reads the serving file, :mod:`.deploy` builds its pools. A DLRM
deployment is served by the dynamic batcher of :mod:`.dlrm` instead.
"""
