"""workload stage of the pipeline."""
