"""kernels stage of the pipeline."""
