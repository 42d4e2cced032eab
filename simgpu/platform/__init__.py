"""platform stage of the pipeline."""
