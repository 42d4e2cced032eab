"""config stage of the pipeline."""
